"""The README's and docs/' commands and links as written, so they cannot drift: every command of a
```bash block that runs a launch/ or benchmarks/ script runs it with the venv's python and names a
script that exists; a launch/ command uses flags the script defines and a config file, preset and
fields the config has; the README's commands with a config resolve it for real (`--print_config`
added: no JAX, no run); every relative link and anchor points at something that exists; the README
stays a front page; the quick start's training command runs as written, every metric it logs has a
row in docs/metrics.md, and its rerun answers before JAX is imported (slow)."""

import functools
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from rlver_jax.cli import program
from tests.conftest import REPO
from tests.fixtures_cli import run_script

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
PYTHON = ".venv/bin/python"
# The GPU-planning venv's (jax's CUDA plugin, never in the project's venv): launch/plan.py --gpu only.
GPU_PLAN_PYTHON = "../gpu-venv/bin/python"
_SEPARATORS = {"&&", "&", ";", "|", "||"}
_SCRIPT = re.compile(r"(launch|benchmarks)/\w+\.py")


def readme_commands(text: str) -> list[tuple[str, list[str], str]]:
    """(interpreter, [script, *args], source line) of every launch/*.py command in the README's
    bash blocks, continuations joined, comments dropped; an interpreter inside `launch/tpu_pod.sh ...
    --` is the pod's (its venv is activated there). A block line of overrides alone (`--config.x=1`)
    is given as arguments of `launch/train.py --config=configs/ppo_think.py`, as the README says."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r" *\\\n\s*", " ", block).splitlines():
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError:  # a line of a multi-line `python -c "..."` program: no launch/ command
                continue
            if tokens and tokens[0].startswith("--config."):
                found.append((PYTHON, ["launch/train.py", "--config=configs/ppo_think.py", *tokens], line))
                continue
            pod = "launch/tpu_pod.sh" in tokens
            for i, token in enumerate(tokens):
                if _SCRIPT.fullmatch(token) and i > 0 and tokens[i - 1].endswith("python"):
                    end = next((j for j in range(i, len(tokens)) if tokens[j] in _SEPARATORS), len(tokens))
                    found.append(("pod" if pod else tokens[i - 1], tokens[i:end], line))
    return found


README_COMMANDS = readme_commands(README.read_text())
COMMANDS = [(python, args, f"{page.relative_to(REPO)}: {line}")
            for page in PAGES for python, args, line in readme_commands(page.read_text())]
LAUNCH_COMMANDS = [c for c in COMMANDS if c[1][0].startswith("launch/")]


def test_the_parser_reads_continuations_comments_and_background_jobs():
    text = ("```bash\nA=1 .venv/bin/python launch/train.py --config=c.py:tiny \\\n    --config.seed=2 &  # note\n"
            "B=2 .venv/bin/python launch/train.py --config=c.py &\n--config.rl.algo=grpo   # ablation\n```\n")
    assert readme_commands(text) == [
        (PYTHON, ["launch/train.py", "--config=c.py:tiny", "--config.seed=2"],
         "A=1 .venv/bin/python launch/train.py --config=c.py:tiny --config.seed=2 &  # note"),
        (PYTHON, ["launch/train.py", "--config=c.py"], "B=2 .venv/bin/python launch/train.py --config=c.py &"),
        (PYTHON, ["launch/train.py", "--config=configs/ppo_think.py", "--config.rl.algo=grpo"],
         "--config.rl.algo=grpo   # ablation")]


def test_the_docs_have_commands_of_every_kind():
    scripts = {args[0] for _, args, _ in COMMANDS}
    assert {"launch/train.py", "launch/eval.py", "launch/plan.py", "launch/view.py", "launch/fetch_smollm2.py",
            "launch/chat_with_simulator.py", "launch/export_hf.py", "launch/analyze.py",
            "launch/capabilities.py"} <= scripts
    assert len(COMMANDS) >= 100  # 154 on 2026-12-07


def test_the_readme_is_a_front_page():
    """At most 250 lines; the four everyday commands (train, eval, plan for a TPU slice, compare); no
    prose sentence over 40 words."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    lines = [" ".join(args) for _, args, _ in README_COMMANDS]
    for needle in ("launch/train.py", "launch/eval.py --config=", "launch/plan.py --config=", "--topology=",
                   "launch/eval.py --compare="):
        assert any(needle in line for line in lines), needle
    prose = re.sub(r"```.*?```", ".", text, flags=re.S)
    prose = "\n".join("." if line.startswith(("|", "#", "[", "!")) else line for line in prose.splitlines())
    for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(*])", " ".join(prose.split())):
        assert len(sentence.split()) <= 40, sentence


_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_resolves(page):
    """Every relative link (and image) points at a file that exists, and every #anchor at a heading."""
    for match in _LINK.finditer(page.read_text()):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.name}: {target}"


@pytest.mark.parametrize("python, args, line", COMMANDS, ids=[c[2][:60] for c in COMMANDS])
def test_every_command_uses_the_venv_and_a_script_that_exists(python, args, line):
    gpu_plan = python == GPU_PLAN_PYTHON and args[0] == "launch/plan.py" and any(a.startswith("--gpu=") for a in args)
    assert python in (PYTHON, "pod") or gpu_plan, f"not the venv's python: {line}"
    assert (REPO / args[0]).is_file(), line


def _help(script: str) -> str:
    done = run_script(script, "--help")
    assert done.returncode == 0, done.stderr
    return done.stdout


_HELP: dict[str, str] = {}


@functools.cache
def _config(value: str):
    """The ConfigDict of `--config=FILE[:PRESET]`, from the config file's own get_config."""
    path, _, preset = value.partition(":")
    spec = importlib.util.spec_from_file_location(f"readme_config_{abs(hash(path))}", REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO))
    return module.get_config(preset or None)


_DEFAULT_CONFIG = {"launch/chat_with_simulator.py": "configs/simulator.py"}


@pytest.mark.parametrize("python, args, line", LAUNCH_COMMANDS, ids=[c[2][:60] for c in LAUNCH_COMMANDS])
def test_every_flag_and_config_field_exists(python, args, line):
    """Each flag is one the script defines (its --help lists it); each --config.FIELD is a field of
    the config the command names."""
    script, flags_given = args[0], [a for a in args[1:] if a.startswith("--")]
    if script not in _HELP:
        _HELP[script] = _help(script.removeprefix("launch/"))
    config_file = next((a.split("=", 1)[1] for a in flags_given if a.startswith("--config=")),
                       _DEFAULT_CONFIG.get(script))
    # A config elided in the text (`--config=...`, `$ARGS`) leaves its fields unchecked.
    concrete = config_file and "..." not in config_file and "..." not in args and not any("$" in a for a in args)
    config = _config(config_file) if concrete else None
    for flag in flags_given:
        name = flag[2:].split("=", 1)[0]
        if name.startswith("config.") and config is None:
            continue
        if name.startswith("config."):
            node = config
            for part in name.split(".")[1:]:
                assert part in node, f"{flag}: no such field in {config_file}: {line}"
                node = node[part]
        else:
            bare = name.removeprefix("no")  # --noFLAG of a boolean flag
            assert (re.search(rf"--(\[no\])?{re.escape(name)}:", _HELP[script])
                    or re.search(rf"--\[no\]{re.escape(bare)}:", _HELP[script])), f"{flag} is not a flag of {script}"


_CONFIGURED = [c for c in README_COMMANDS if any(a.startswith("--config=") for a in c[1])]


@pytest.mark.parametrize("python, args, line", _CONFIGURED, ids=[c[2][:60] for c in _CONFIGURED])
def test_every_configured_command_resolves_its_config(python, args, line):
    """Run as written with --print_config added: the config file, its preset and every override
    resolve (exit 0) without starting anything."""
    done = run_script(args[0].removeprefix("launch/"), *args[1:], "--print_config")
    assert done.returncode == 0, (line, done.stderr)
    assert not done.stderr.strip(), done.stderr


@pytest.mark.slow
def test_the_quick_start_trains_as_written(tmp_path):
    """The quick start's main job, as written but for its work directory (an override after it), in
    a fresh process as a user starts it: one CPU device (not the tests' eight virtual ones, which
    make it twice as slow), no JAX_PLATFORMS, its compilation cache in the test's directory. Where
    libtpu is installed (the test extra) and no TPU is, it prints no libtpu warning about
    TPU_ACCELERATOR_TYPE or worker hostnames (JAX's probe of libtpu also took 6 s)."""
    [(_, args, line)] = [c for c in README_COMMANDS if "--config.workdir=runs/tiny --config.train.steps=10" in c[2]]
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", program.TRACEBACK_ENV)}
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "cache")
    env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    done = subprocess.run([sys.executable, *args, f"--config.workdir={tmp_path / 'tiny'}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"outputs in {tmp_path / 'tiny'}" in done.stdout and "simulator  embedded" in done.stdout
    assert "= 1 cpu device(s)" in done.stdout, done.stdout[:2000]
    metrics = [json.loads(line) for line in (tmp_path / "tiny" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 10  # --config.train.steps=10
    # Every key the run logged has its row in the metrics glossary.
    glossary = set(re.findall(r"^\| `([^`]+)` \|", (REPO / "docs" / "metrics.md").read_text(), re.M))
    assert not {k for m in metrics for k in m} - glossary, sorted({k for m in metrics for k in m} - glossary)
    # Rerun, finished: answered before JAX is imported (a `jax` that cannot be imported), no resume.
    (tmp_path / "no_jax" / "jax").mkdir(parents=True)
    (tmp_path / "no_jax" / "jax" / "__init__.py").write_text("raise ImportError('jax imported')\n")
    again = subprocess.run([sys.executable, *args, f"--config.workdir={tmp_path / 'tiny'}"], cwd=REPO,
                           capture_output=True, text=True, timeout=120,
                           env={**env, "PYTHONPATH": str(tmp_path / "no_jax")})
    assert again.returncode == 0 and not again.stderr, again.stderr
    assert again.stdout.startswith(f"nothing left to train: {tmp_path / 'tiny' / 'checkpoints'} holds step 10 of "
                                   "config.train.steps=10"), again.stdout
    if not program.tpu_may_be_attached():
        noise = [line for line in done.stderr.splitlines()
                 if any(word in line for word in ("libtpu", "TPU_ACCELERATOR_TYPE", "worker hostname", "TPU backend"))]
        assert not noise, noise
