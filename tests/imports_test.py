"""The package's import graph, read from the source with `ast` (nothing is imported): no cycle
between modules, every import points down (or across) the layering below, and the config readers
reach no ML framework.

Every import counts, those inside functions and `if TYPE_CHECKING:` blocks too: a lazy import is
still a dependency, deferred only to keep start-up light.
"""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "rlver_jax"

# The layering, from the bottom: a module may import modules of its own layer or of a layer below.
# "" is the package's top-level modules; every other entry is a subpackage of rlver_jax.
LAYERS = (
    ("", "checks, files, llm_client, plots, table: shared by all, import nothing of ours above them"),
    ("text", "ChatML token assembly, tokenizers"),
    ("testing", "offline stand-ins the tests and benchmarks share: a scripted server, Qwen2.5's tokenizer"),
    ("models", "the decoder, its configs, Hugging Face I/O"),
    ("parallel", "mesh, shardings, what processes exchange"),
    ("sampling", "batched generation, its settings"),
    ("engines", "the rollout engines: the seam, the engine table, the continuous and the static engine"),
    ("simulator", "simulated users"),
    ("rollout", "policies, dialogues, their records and evaluation"),
    ("rl", "advantages, losses, the train step"),
    ("train", "the training program"),
    ("eval", "the benchmark, reports, export"),
    ("cli", "what the launch/ scripts share"),
)
LEVEL = {name: i for i, (name, _) in enumerate(LAYERS)}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> str:
    """The layer of a module of ours: its subpackage, "" for a top-level module."""
    parts = module.split(".")
    in_subpackage = len(parts) > 2 or (len(parts) == 2 and MODULES[module].name == "__init__.py")
    return parts[1] if in_subpackage else ""


def _resolve(name: str) -> str | None:
    """The module of ours `name` refers to (a module, or the package holding the imported name)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> list[tuple[str, int]]:
    """(module of ours, line) for each import in `module`'s source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.split(".")[0] == "rlver_jax" else None
            if target is not None and target != module:
                out.append((target, node.lineno))
    return out


GRAPH = {m: imports(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in MODULES:
        if v not in index:
            visit(v)
    return found


def _path(module: str) -> str:
    return str(MODULES[module].relative_to(REPO))


def test_every_module_is_in_a_layer():
    unknown = sorted({_layer(m) for m in MODULES} - set(LEVEL))
    assert not unknown, f"subpackages missing from LAYERS: {unknown}"


def test_no_import_cycles():
    problems = []
    for component in _cycles():
        members = set(component)
        arrows = [f"    {_path(m)}:{line} -> {t}" for m in component for t, line in GRAPH[m] if t in members]
        problems.append(f"  cycle {' <-> '.join(component)}:\n" + "\n".join(arrows))
    assert not problems, "import cycles:\n" + "\n".join(problems)


def test_imports_follow_the_layering():
    problems = [f"  {_path(m)}:{line}: {m} ({_layer(m) or 'top level'}) imports {t} ({_layer(t) or 'top level'})"
                for m in MODULES for t, line in GRAPH[m] if LEVEL[_layer(t)] > LEVEL[_layer(m)]]
    order = " < ".join(name or "top level" for name, _ in LAYERS)
    assert not problems, f"imports up the layering ({order}):\n" + "\n".join(problems)


# The config readers check a config before any ML framework is imported (launch/train.py and
# launch/eval.py exit 2 on a bad field within a second; a served evaluation never imports one).
CONFIG_READERS = ("rlver_jax.train.spec", "rlver_jax.eval.spec")
FRAMEWORKS = ("jax", "flax", "optax", "orbax", "transformers", "torch")


def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(encoding="utf-8"), str(MODULES[module]))


def _frameworks_on_import(module: str) -> set[str]:
    """The frameworks `module` imports when it is imported (its top-level statements)."""
    out = set()
    for node in _tree(module).body:
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out & set(FRAMEWORKS)


def _runtime_imports(module: str) -> list[str]:
    """The modules of ours `module` imports, lazy ones too, less those for type checkers only."""
    typing_only = {n.lineno for node in ast.walk(_tree(module))
                   if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
                   for sub in node.body for n in ast.walk(sub) if hasattr(n, "lineno")}
    return [t for t, line in GRAPH[module] if line not in typing_only]


def test_the_config_readers_reach_no_ml_framework():
    """Not even through a lazy import: a config reader below the modules it serves reads settings
    types, never a module that builds a model or a policy."""
    problems = []
    for reader in CONFIG_READERS:
        via, todo = {reader: [reader]}, [reader]
        while todo:
            module = todo.pop()
            if found := _frameworks_on_import(module):
                problems.append(f"  {' -> '.join(via[module])} imports {sorted(found)}")
            for t in _runtime_imports(module):
                if t not in via:
                    via[t] = via[module] + [t]
                    todo.append(t)
    assert not problems, "config readers that reach an ML framework:\n" + "\n".join(problems)
