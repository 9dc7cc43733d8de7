"""configs/capabilities.py and what runs without the graders' extra: the shared policy section,
presets, and the one-line message of a missing extra."""

import pytest

from configs.capabilities import get_config
from configs.eval import get_config as get_eval_config
from rlver_jax.eval.capabilities import extra


@pytest.mark.parametrize("preset,eval_preset", [("default", "sage"), ("tiny", "tiny")])
def test_the_policy_section_is_eval_s_but_greedy(preset, eval_preset):
    ours, theirs = get_config(preset).policy, get_eval_config(eval_preset).policy
    assert sorted(ours.keys()) == sorted(theirs.keys())
    changed = {k for k in ours.keys() if ours[k] != theirs[k]}
    assert changed <= {"temperature", "max_new_tokens", "cache_slots"}
    assert ours.temperature == 0.0


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'big'"):
        get_config("big")


def test_missing_extra_is_one_line():
    with pytest.raises(extra.MissingExtraError,
                       match=r"install the 'capabilities' extra: pip install -e '\.\[capabilities\]'"):
        extra.require("no_such_grader_module", "no-such-grader")


def _imports_within(package_dir, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports, at the top or inside a function."""
    import ast

    modules = {p.stem for p in package_dir.glob("*.py")}
    graph = {}
    for name in modules:
        found = set()
        for node in ast.walk(ast.parse((package_dir / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == package:
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
                found.add(node.module.split(".")[len(package.split("."))])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[len(package.split("."))] for a in node.names
                          if a.name.startswith(package + ".")}
        graph[name] = found - {name}
    return graph


def test_the_capability_modules_import_each_other_without_a_cycle():
    """A cycle (compare and runner once imported each other) works only while every import of it
    stays inside a function; the items file name lives in report, below both."""
    from tests.conftest import REPO

    graph = _imports_within(REPO / "rlver_jax" / "eval" / "capabilities", "rlver_jax.eval.capabilities")
    assert "runner" in graph["compare"] or "compare" in graph["runner"]  # the pair the check is about exists
    state = {}

    def visit(name, path):
        if state.get(name) == "open":
            raise AssertionError(f"import cycle: {' -> '.join(path + [name])}")
        if state.get(name) != "done":
            state[name] = "open"
            for other in sorted(graph[name]):
                visit(other, path + [name])
            state[name] = "done"

    for module in sorted(graph):
        visit(module, [])
