"""The entry points in launch/ as a user meets them: --help and config errors before any JAX import,
one-line errors without a traceback (tracebacks on request), --print_config, flags in any order,
the simulator down, a mismatched evaluation directory, an evaluation whose every dialogue failed in
the simulator, an evaluation of served models without JAX, flax, transformers or torch, and where
serve_simulator.sh writes its log.

Each exit path runs once as a subprocess, where nothing was imported before (exit 2 for a config
error, 1 for a runtime error, 0; Ctrl-C's 130 in tests/faults_test.py); the other one-line errors
run the script's main in this process (tests/fixtures_cli.run_script), which also says whether the
error came before main, so before the library and JAX are imported."""

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from configs import eval as eval_config
from configs import grpo_think
from rlver_jax.cli import program
from rlver_jax.simulator.profiles import DEFAULT_PROFILES, ENGLISH_PROFILES
from tests.conftest import REPO
from tests.fixtures_cli import assert_one_line_error, fake_sglang, free_port, run_script
from tests.fixtures_eval import Servers, profiles_file

TINY = "--config=configs/grpo_think.py:tiny"
ENTRY_POINTS = ("train.py", "eval.py", "export_hf.py", "analyze.py", "chat_with_simulator.py", "view.py")


@pytest.fixture(scope="module")
def no_jax(tmp_path_factory):
    """A PYTHONPATH entry whose `jax` fails to import: what runs with it never imported JAX."""
    root = tmp_path_factory.mktemp("no_jax")
    (root / "jax").mkdir()
    (root / "jax" / "__init__.py").write_text("raise ImportError('jax imported before flag parsing')\n")
    return root


def _run(script, *args, pythonpath=None, timeout=120, **env):
    environ = {k: v for k, v in os.environ.items() if k != program.TRACEBACK_ENV}
    environ.update(JAX_PLATFORMS="cpu", **env)
    if pythonpath is not None:
        environ["PYTHONPATH"] = os.pathsep.join([str(pythonpath), environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(REPO / "launch" / script), *args], capture_output=True, text=True,
                          cwd=REPO, env=environ, timeout=timeout)


def test_config_flags_go_first_and_nothing_else_moves():
    argv = ["p", "--config.rl.kl_coef=0.1", "--verbosity=1", "--config", "f.py:tiny", "--config.seed=2", "--",
            "--config=x"]
    assert program.config_flags_first(argv, ["config"]) == [
        "p", "--config", "f.py:tiny", "--config.rl.kl_coef=0.1", "--verbosity=1", "--config.seed=2", "--", "--config=x"]


def test_what_counts_as_an_expected_error():
    from rlver_jax.sampling.settings import SamplingSettings

    def raised(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            return e
        raise AssertionError("no error")

    assert program.is_expected(raised(lambda: SamplingSettings(max_new_tokens=0)))  # our check of bad input
    assert program.is_expected(raised(lambda: open("/nonexistent/file")))  # a path, wherever it failed
    assert program.is_expected(program.UserError("x"))
    assert not program.is_expected(raised(lambda: np.zeros(3).reshape(2, 2)))  # a ValueError inside a library: a bug
    assert not program.is_expected(raised(lambda: {}["key"]))
    assert not program.is_expected(raised(lambda: [][0]))


def test_compilation_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert program.compilation_cache_dir("auto") == str(tmp_path / "rlver_jax" / "jax")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")
    assert program.compilation_cache_dir("auto") == "/elsewhere"
    assert program.compilation_cache_dir("/mine") == "/mine" and program.compilation_cache_dir("") is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_foo=1 --xla_force_host_platform_device_count=8")  # virtual devices
    assert program.compilation_cache_dir("auto") is None and program.compilation_cache_dir("/mine") is None


@pytest.mark.slow
def test_the_compilation_cache_keeps_even_a_fast_program(tmp_path):
    code = ("import jax, jax.numpy as jnp; from rlver_jax.cli import program; "
            f"program.enable_compilation_cache({str(tmp_path / 'cache')!r}); "
            "jax.jit(lambda x: x * 2 + 1)(jnp.ones(3))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""))  # one CPU device: cache on
    assert done.returncode == 0, done.stderr
    assert any(p.name.startswith("jit_") for p in (tmp_path / "cache").iterdir())


@pytest.mark.slow
def test_help_answers_without_importing_jax(no_jax):
    for script in ENTRY_POINTS:
        t0 = time.perf_counter()
        done = _run(script, "--help", pythonpath=no_jax)
        seconds = time.perf_counter() - t0
        assert "jax imported" not in done.stderr and "flags:" in done.stdout, (script, done.stderr)
        assert seconds < 20, (script, seconds)  # ~0.7 s on an idle machine; a sanity bound on a loaded one


def _docstring_lines(script) -> list[str]:
    """The lines of a launch script's docstring as its source spells them."""
    source = (REPO / "launch" / script).read_text()
    start = source.index('"""') + 3
    return source[start:source.index('"""', start)].splitlines()


def test_help_exits_0_with_the_examples_continuations():
    """--help of every launch script exits 0 (absl's own exits 1) and prints its examples as written:
    a continued example line keeps its backslash. A subprocess per script, about 0.15 s each."""
    scripts = sorted(p.name for p in (REPO / "launch").glob("*.py"))
    continued = 0
    for script in scripts:
        done = _run(script, "--help", timeout=60)
        assert done.returncode == 0, (script, done.returncode, done.stderr)
        printed = [line.rstrip() for line in done.stdout.splitlines()]
        assert any(line.lstrip().startswith((".venv/bin/python launch/", "pip ")) for line in printed), (
            script, done.stdout)
        for line in _docstring_lines(script):
            if line.endswith("\\\\"):
                line = line[:-1]  # a non-raw docstring's escaped backslash prints as one
            if line.endswith(" \\"):
                continued += 1
                assert line.rstrip() in printed, (script, line, done.stdout)
    assert continued >= 10  # train, plan, eval, analyze, capabilities, chat_with_simulator have some
    for flag in ("--helpfull", "-?"):
        assert _run("train.py", flag, timeout=60).returncode == 0, flag


@pytest.mark.slow
def test_a_config_error_is_one_line_and_comes_before_jax(no_jax):
    """Exit 2, in a fresh process that cannot import JAX."""
    assert_one_line_error(_run("train.py", TINY, "--config.rl.algoo=grpo", pythonpath=no_jax), 2,
                          "--config.rl.algoo", "no field 'algoo'", 'did you mean "algo"')


@pytest.mark.parametrize("script, args, fragments", [
    ("train.py", (TINY, "--config.rl.algoo=grpo"), ("--config.rl.algoo", "no field 'algoo'", 'did you mean "algo"')),
    ("train.py", ("--config=configs/grpo_think.py:huge",),
     ("--config=configs/grpo_think.py:huge", "unknown preset 'huge'", "tiny")),
    ("eval.py", ("--config=configs/nowhere.py",), ("--config=configs/nowhere.py", "no such config file")),
    ("train.py", (), ("--config is required",)),
    # A value the field's type does not take: the field, its type and an example, in the config's words.
    ("train.py", (TINY, "--config.rl.gamma=high"), ("--config.rl.gamma=high: config.rl.gamma takes a number, "
                                                     "e.g. --config.rl.gamma=1.0",)),
    ("train.py", (TINY, "--config.train.steps=ten"), ("--config.train.steps=ten: config.train.steps takes an "
                                                       "integer, e.g. --config.train.steps=40",)),
    ("train.py", (TINY, "--config.rollout.think=yes"), ("config.rollout.think takes True or False",
                                                         "e.g. --config.rollout.think=True")),
    # An override without its config file: the flag to add, with the script's own example.
    ("train.py", ("--config.workdir=x",), ("--config.workdir=x: overrides a field of --config, which is not given",
                                           "add --config=configs/grpo_think.py:tiny")),
    ("eval.py", ("--config.workdir=x",), ("add --config=configs/eval.py:tiny",)),
    ("train.py", (TINY, "--config.rl.clip_epsilon=0.1"), ("--config.rl.clip_epsilon", "no field 'clip_epsilon'")),
    # Training's spelling in the simulator chat is refused with the field it lacks, before anything is contacted.
    ("chat_with_simulator.py", ("--config.simulator.base_url=http://127.0.0.1:9/v1",),
     ("--config.simulator.base_url", "no field 'simulator'")),
])
def test_config_errors_are_one_line_and_come_before_main(script, args, fragments):
    """Exit 2 from the flag parsing, before main (which imports the library and JAX) runs."""
    done = run_script(script, *args)
    assert_one_line_error(done, 2, *fragments)
    assert not done.main_ran


# Errors of the spec and its paths (rlver_jax.train.spec), read in main before JAX is imported.
_START_UP_ERRORS = [
    ((TINY, "--config.model.path=/nonexistent"), ("config.model.path='/nonexistent' does not exist", "hf download")),
    ((TINY, "--config.rl.algo=gpro"), ("config.rl.algo='gpro'", "use one of")),
    # The embedded simulator of the tiny preset reads no URL: refused, with the backend and the fix named.
    ((TINY, "--config.simulator.base_url=http://127.0.0.1:39999/v1"),
     ("--config.simulator.base_url set", "--config.simulator.backend='embedded'", "--config.simulator.backend=openai")),
    # The rollout engine's old name, and a field only the static engine reads given to the continuous one.
    ((TINY, "--config.rollout.engine=jax"),
     ("config.rollout.engine='jax' is now called 'continuous'", "--config.rollout.engine=continuous")),
    ((TINY, "--config.rollout.pipeline_groups=2"),
     ("--config.rollout.pipeline_groups set", "--config.rollout.engine=continuous does not read it",
      "--config.rollout.engine=static")),
    (("--config=configs/grpo_think.py:7b",), ("config.model.path is empty for preset 'qwen2.5-7b'",
                                              "config.data.train_profiles is empty")),
    ((TINY, "--config.data.eval_profiles=/nowhere.jsonl"),
     ("config.data.eval_profiles='/nowhere.jsonl': no such file",)),
    # The tests' eight virtual CPU devices (tests/conftest.py), counted from XLA_FLAGS before JAX.
    ((TINY, "--config.mesh.shape=(3,-1,1)"), ("config.mesh.shape=(3, -1, 1)", "does not divide the 8 devices")),
    ((TINY, "--config.mesh.shape=(1,2,1)"), ("multiplies to 2 devices but this run has 8",)),
]


@pytest.mark.parametrize("args, fragments", _START_UP_ERRORS)
def test_start_up_errors_are_one_line_exit_2_and_write_nothing(tmp_path, args, fragments):
    done = run_script("train.py", *args, f"--config.workdir={tmp_path / 'run'}")
    assert_one_line_error(done, 2, *fragments)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_start_up_errors_come_before_jax_within_seconds(no_jax, tmp_path):
    """In a fresh process that cannot import JAX: about 0.5 s each on a loaded 2-core machine (a
    missing model path took 5-13 s, after the imports, before)."""
    for args, fragments in _START_UP_ERRORS[:4]:
        t0 = time.perf_counter()
        done = _run("train.py", *args, f"--config.workdir={tmp_path / 'run'}", pythonpath=no_jax)
        assert_one_line_error(done, 2, *fragments)
        assert time.perf_counter() - t0 < 10, args  # a sanity bound on a loaded machine
    assert not (tmp_path / "run").exists()


# Paths and meshes that launch/eval.py and launch/export_hf.py check before JAX is imported (exit 2).
def _path_errors(tmp_path):
    nowhere, eval_dir = str(tmp_path / "nowhere"), f"--config.workdir={tmp_path / 'eval'}"
    return [
        ("eval.py", ("--config=configs/eval.py:tiny", eval_dir, f"--config.policy.checkpoint={nowhere}"),
         (f"config.policy.checkpoint={nowhere!r}: no such directory",)),
        ("eval.py", ("--config=configs/eval.py:tiny", eval_dir, "--config.mesh.shape=(3,1,1)"),
         ("config.mesh.shape=(3, 1, 1) multiplies to 3 devices but this run has 8",)),
        ("eval.py", (f"--compare={tmp_path / 'a'}", f"--out={tmp_path / 'c'}"),
         (f"--compare={tmp_path / 'a'}: give two or more evaluation directories",)),
        ("export_hf.py", (f"--checkpoint={nowhere}", f"--out={tmp_path / 'hf'}"),
         (f"--checkpoint={nowhere!r}: no such directory",)),
    ]


@pytest.mark.parametrize("case", range(4))
def test_path_and_mesh_errors_of_eval_and_export_are_one_line_exit_2(tmp_path, case):
    script, args, fragments = _path_errors(tmp_path)[case]
    assert_one_line_error(run_script(script, *args), 2, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written


@pytest.mark.slow
def test_path_and_mesh_checks_come_before_jax(no_jax, tmp_path):
    """In fresh processes that cannot import JAX: eval's and export's paths and meshes, training's
    mesh (exit 2). About 1 s each on a loaded 2-core machine (15-33 s, exit 1 for some, before)."""
    cases = [*_path_errors(tmp_path), ("train.py", (TINY, f"--config.workdir={tmp_path / 'run'}",
                                                    "--config.mesh.shape=(1,3,1)"), ("multiplies to 3 devices",))]
    for script, args, fragments in cases:
        t0 = time.perf_counter()
        assert_one_line_error(_run(script, *args, pythonpath=no_jax), 2, *fragments)
        assert time.perf_counter() - t0 < 10, (script, args)  # a sanity bound on a loaded machine
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_device_count_is_known_before_jax_only_on_the_cpu(monkeypatch):
    """JAX_PLATFORMS=cpu: XLA_FLAGS' host device count (or JAX_NUM_CPU_DEVICES); any other platform
    named, or an accelerator's plugin that JAX may pick: unknown until JAX counts."""
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    assert program.known_device_count()[0] == 4
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "2")
    assert program.known_device_count()[0] == 2
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES")
    assert program.known_device_count()[0] == 1
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert program.known_device_count() is None
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(program, "_other_pjrt_plugins", lambda: True)  # a GPU's plugin installed
    assert program.known_device_count() is None


def test_an_evaluation_refuses_an_unread_simulator_field_and_a_failed_start_writes_no_setup(tmp_path):
    done = run_script("eval.py", "--config=configs/eval.py:tiny", f"--config.workdir={tmp_path / 'a'}",
                      "--config.simulator.model=q72")
    assert_one_line_error(done, 2, "--config.simulator.model set", "--config.simulator.backend=openai")
    assert not done.stdout and not (tmp_path / "a").exists()
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = run_script("eval.py", "--config=configs/eval.py:tiny", f"--config.workdir={tmp_path / 'b'}",
                      "--config.simulator.backend=openai", f"--config.simulator.base_url={url}")
    assert done.returncode == 1 and f"no server answers at --config.simulator.base_url={url}" in done.stderr
    assert not (tmp_path / "b" / "setup.json").exists()  # written once the simulator answered


def test_an_evaluation_refuses_the_engines_old_name_and_a_field_its_engine_does_not_read(tmp_path):
    for flag, fragments in (("--config.policy.engine=jax", ("config.policy.engine='jax' is now called 'continuous'",
                                                            "--config.policy.engine=continuous")),
                            ("--config.policy.cache_slots=64", ("--config.policy.cache_slots set",
                                                                "--config.policy.engine=static"))):
        done = run_script("eval.py", "--config=configs/eval.py:tiny", f"--config.workdir={tmp_path}", flag)
        assert_one_line_error(done, 2, *fragments)
    assert not tmp_path.joinpath("setup.json").exists()


def test_a_simulator_field_counts_where_the_backend_reads_it():
    """The embedded backend reads neither the endpoint nor the answer format; the served one reads all."""
    from rlver_jax.simulator.settings import check_read

    check_read("openai", {"base_url", "model", "timeout_s"})
    check_read("embedded", {"difficulty", "language", "max_turns", "initial_emotion"})
    with pytest.raises(ValueError, match=r"--config\.simulator\.model --config\.simulator\.timeout_s set"):
        check_read("embedded", {"timeout_s", "model", "difficulty"})


@pytest.mark.parametrize("env, flag", [({program.TRACEBACK_ENV: "1"}, ()), ({}, ("--verbosity=1",))])
def test_a_config_error_shows_its_traceback_on_request(env, flag):
    done = run_script("train.py", TINY, "--config.rl.algoo=grpo", *flag, env=env)
    assert done.returncode != 0 and "Traceback" in done.stderr and "algoo" in done.stderr


def _fields(section: dict, prefix: str = "") -> list[str]:
    """The dotted paths of the fields of a config's plain dict (ConfigDict.to_dict)."""
    return [path for key, value in section.items()
            for path in (_fields(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"])]


@pytest.mark.slow
def test_print_config_shows_every_field_with_its_comment_and_flags_come_in_any_order(no_jax):
    # The override before --config: ml_collections alone refuses that order.
    done = _run("train.py", "--config.rl.kl_coef=0.01", "--config=configs/grpo_think.py:tiny", "--print_config",
                pythonpath=no_jax)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "# --config=configs/grpo_think.py:tiny with 1 override(s)"
    printed = [line.split(" = ", 1)[0] for line in lines[1:]]
    assert sorted(printed) == sorted(_fields(grpo_think.get_config("tiny").to_dict()))  # every field, once
    assert list(dict.fromkeys(path.split(".")[0] for path in printed)) == [  # in configs/base.py's order
        "workdir", "seed", "compilation_cache_dir", "model", "lora", "critic", "mesh", "simulator", "data", "rollout",
        "rl", "optim", "train", "checkpoint"]
    assert all("  # " in line for line in lines[1:]), [line for line in lines[1:] if "  # " not in line]
    assert "rl.kl_coef = 0.01  (--config.rl.kl_coef)  # paper: no KL; non-zero builds a frozen reference model" \
        in lines
    assert "simulator.max_turns = 1  # policy turns: 8 in training, 10 rounds in SAGE; the CPU presets: 1 in think" \
        in done.stdout  # the tiny preset's own reason after the field's comment


def test_print_config_of_the_evaluation_shows_every_field_with_its_comment():
    done = run_script("eval.py", "--print_config", "--config=configs/eval.py:tiny")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()[1:]
    printed = sorted(line.split(" = ", 1)[0] for line in lines)
    assert printed == sorted(_fields(eval_config.get_config("tiny").to_dict()))
    assert all("  # " in line for line in lines), [line for line in lines if "  # " not in line]


# A quoted value ("auto", `wandb sync`, 'fsdp'), its apostrophes (the run's) aside.
_QUOTED = re.compile(r"\"[^\"]*\"|`[^`]*`|(?<!\w)'[^']*'")
_SENTENCE_END = re.compile(r"[.!?] +[A-Z\"'`]")
_PRIVATE_CONSTANT = re.compile(r"(?<![\w.])_[A-Z][A-Z0-9]*_[A-Z0-9_]*\b")


def _not_one_sentence(comment: str) -> str | None:
    """What makes a printed comment more than one sentence of values: a second sentence starting
    outside quotes, or a private constant named instead of its value; None when neither is there."""
    bare = _QUOTED.sub(lambda m: m[0][0] + "x" * (len(m[0]) - 2) + m[0][-1], comment)  # quotes kept, text masked
    found = _SENTENCE_END.search(bare) or _PRIVATE_CONSTANT.search(comment)
    return comment[found.start():found.start() + 40] if found else None


def test_the_one_sentence_check_finds_a_second_sentence_and_a_private_constant():
    assert _not_one_sentence('off. Always off on virtual devices') and _not_one_sentence('off. "auto" is')
    assert _not_one_sentence("7b_lora: 8 (_LORA_1GPU_DIALOGUES_PER_CALL)")
    assert _not_one_sentence('"auto" = the cache (shared; docs/cli.md); "" = off, at 0.5 s. A few') is not None
    assert _not_one_sentence('"Stop. Now" ends it; the run\'s `wandb sync. X` and \'a. B\' (rl.PRESETS)') is None


@pytest.mark.parametrize("script, config", [("train.py", f"configs/{name}.py:tiny") for name in (
    "ppo_think", "ppo_nothink", "grpo_think", "grpo_nothink")] + [("eval.py", "configs/eval.py:tiny")])
def test_every_printed_comment_is_one_sentence_of_values(script, config):
    """One short sentence a field (semicolons and parentheses within it), values rather than the
    names of private constants; the details are in docs/."""
    done = run_script(script, "--print_config", f"--config={config}")
    assert done.returncode == 0, done.stderr
    comments = dict(line.split("  # ", 1) for line in done.stdout.strip().splitlines()[1:])
    assert len(comments) > 20
    assert {path: found for path, text in comments.items() if (found := _not_one_sentence(text))} == {}


def test_the_eval_config_names_the_shipped_profiles_without_importing_them():
    assert eval_config.SHIPPED_PROFILES == DEFAULT_PROFILES.resolve()
    assert eval_config.ENGLISH_PROFILES == ENGLISH_PROFILES.resolve()


@pytest.mark.slow
def test_chat_with_the_simulator_down_names_its_own_flags(no_jax):
    """Exit 1, in a fresh process that cannot import JAX (the chat never needs it)."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = _run("chat_with_simulator.py", "--profile=0", f"--config.base_url={url}",
                "--config=configs/simulator.py:eval", pythonpath=no_jax)
    assert_one_line_error(done, 1, f"no server answers at --config.base_url={url}", "--config.backend=embedded")
    assert "--config.simulator." not in done.stderr


def test_train_with_the_simulator_down(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = run_script("train.py", TINY, f"--config.workdir={tmp_path / 'run'}", "--config.simulator.backend=openai",
                      f"--config.simulator.base_url={url}")
    assert_one_line_error(done, 1, f"no server answers at --config.simulator.base_url={url}", "serve_simulator.sh")
    assert not (tmp_path / "run").exists()  # a failed start leaves no new work directory behind


def test_a_start_that_fails_after_writing_its_config_leaves_no_new_work_directory(tmp_path):
    """Profiles whose opening fills the row are refused after config.json and the tiny tokenizer are
    written: a work directory the start made goes again, one that was there before stays."""
    args = (TINY, "--config.rollout.max_total_tokens=64")
    done = run_script("train.py", *args, f"--config.workdir={tmp_path / 'new'}")
    assert_one_line_error(done, 2, "would end before the policy spoke")
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    assert run_script("train.py", *args, f"--config.workdir={tmp_path / 'old'}").returncode == 2
    assert (tmp_path / "old").is_dir()


def test_export_of_a_run_without_its_tokenizer(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "1").mkdir(parents=True)  # a finished step's folder (before JAX: one is there)
    (run / "config.json").write_text(grpo_think.get_config("tiny").to_json_best_effort())
    done = run_script("export_hf.py", f"--checkpoint={run}", f"--out={tmp_path / 'hf'}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr  # a path that does not exist
    assert (done.stderr.startswith("export_hf.py: error: the run's tokenizer: ")
            and str(run / "tokenizer") in done.stderr)


def test_quiet_logs_hide_the_backend_probe_line():
    """JAX's INFO line about a TPU it did not find (where JAX_PLATFORMS does not name the platform)
    stays quiet without --verbosity, like every library INFO log of QUIET_LOGGERS."""
    loggers = [logging.getLogger(name) for name in ("jax", "rlver_jax")]
    levels = [logger.level for logger in loggers]
    try:
        program.quiet_logs()
        assert not logging.getLogger("jax._src.xla_bridge").isEnabledFor(logging.INFO)
        assert logging.getLogger("rlver_jax.train.loop").isEnabledFor(logging.INFO)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def test_the_tpu_probe_is_skipped_only_where_no_tpu_can_be(monkeypatch):
    """JAX_PLATFORMS=cpu is set before JAX is imported only off a TPU (no device file, PCI chip or TPU
    setting), where JAX_PLATFORMS is unset, libtpu is installed and no other PJRT plugin is."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed: JAX has no TPU to probe")
    monkeypatch.delitem(sys.modules, "jax", raising=False)  # as in a launch script's fresh process
    monkeypatch.setattr(program, "tpu_may_be_attached", lambda: False)
    monkeypatch.delenv("PJRT_NAMES_AND_LIBRARY_PATHS", raising=False)
    monkeypatch.delenv("JAX_PLATFORMS")
    assert program.skip_tpu_probe() and os.environ["JAX_PLATFORMS"] == "cpu"
    monkeypatch.setenv("JAX_PLATFORMS", "")  # the user's own choice, even JAX's default: kept
    assert not program.skip_tpu_probe() and os.environ["JAX_PLATFORMS"] == ""
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setenv("PJRT_NAMES_AND_LIBRARY_PATHS", "cuda:/x/pjrt_c_api_gpu_plugin.so")  # another plugin
    assert not program.skip_tpu_probe() and "JAX_PLATFORMS" not in os.environ
    monkeypatch.delenv("PJRT_NAMES_AND_LIBRARY_PATHS")
    monkeypatch.setattr(program, "tpu_may_be_attached", lambda: True)  # a TPU VM: JAX's own choice
    assert not program.skip_tpu_probe() and "JAX_PLATFORMS" not in os.environ
    monkeypatch.undo()
    for name in program._TPU_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_NAME", "my-tpu-vm")
    assert program.tpu_may_be_attached()


def test_eval_refuses_a_directory_of_another_set_up(tmp_path):
    workdir = tmp_path / "eval"
    workdir.mkdir()
    (workdir / "setup.json").write_text(json.dumps({"seed": 7}))
    (workdir / "transcripts.jsonl").write_text(json.dumps({"profile_id": "x"}) + "\n")
    done = run_script("eval.py", "--config=configs/eval.py:tiny", f"--config.workdir={workdir}")
    assert_one_line_error(done, 1, "holds results of a different set-up", "seed: 7 -> 0", "Use a new work directory")


def test_eval_exits_non_zero_when_every_dialogue_is_a_simulator_error(tmp_path):
    def evaluate(workdir, names):
        return run_script("eval.py", "--config=configs/eval.py", f"--config.workdir={tmp_path / workdir}",
                          f"--config.eval.profiles={profiles_file(tmp_path, names)}", "--config.eval.group_size=1",
                          "--config.policy.backend=openai", f"--config.policy.base_url={servers.policy.base_url}",
                          f"--config.simulator.base_url={servers.simulator.base_url}",
                          "--config.simulator.malformed_retries=0")

    with Servers() as servers:  # P5's simulated user answers malformed text
        failed = evaluate("all", ("P5",))
        partly = evaluate("some", ("P1", "P5"))
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert "every one of the 1 dialogues ended in a simulator error, so nothing was scored" in failed.stderr
    assert "Most common cause (1x): " in failed.stderr and str(tmp_path / "all" / "transcripts.jsonl") in failed.stderr
    assert partly.returncode == 0, partly.stderr
    assert "*** WARNING: 1 of 2 dialogues ended in a simulator error" in partly.stderr
    assert "score 100.0  success 1  failure 0  n 1  simulator errors 1" in partly.stdout
    assert f"  policy {json.loads((tmp_path / 'some' / 'sentient.json').read_text())['run']['policy']} (no-think)" \
        in partly.stdout  # the line names what was evaluated
    assert "HTTP Request" not in partly.stderr  # httpx logs each simulator request at INFO: quiet


@pytest.mark.slow
def test_eval_of_served_models_imports_no_ml_framework(tmp_path):
    """Policy and simulator served, one process: launch/eval.py plays and reports without importing
    jax, flax, transformers or torch (each ~1-3 s of start-up). Each is shadowed by a package that
    stops the program on import with an error no `except ImportError` swallows."""
    shadow = tmp_path / "shadow"
    for name in ("jax", "flax", "transformers", "torch"):
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(f"raise SystemExit('{name} imported by a served evaluation')\n")
    with Servers() as servers:
        done = _run("eval.py", "--config=configs/eval.py", f"--config.workdir={tmp_path / 'eval'}",
                    f"--config.eval.profiles={profiles_file(tmp_path, ('P1',))}",
                    "--config.policy.backend=openai", f"--config.policy.base_url={servers.policy.base_url}",
                    f"--config.simulator.base_url={servers.simulator.base_url}", pythonpath=shadow)
    assert done.returncode == 0 and "imported by a served evaluation" not in done.stderr, done.stderr
    assert "n 1  simulator errors 0" in done.stdout, done.stdout


@pytest.mark.slow
def test_serve_simulator_logs_to_the_ignored_logs_folder(tmp_path):
    port = free_port()
    log = REPO / "logs" / f"simulator_{port}.log"
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(fake_sglang(tmp_path)),
               FAKE_SGLANG_ARGS=str(tmp_path / "args.json"))
    try:
        done = subprocess.run(["bash", str(REPO / "launch" / "serve_simulator.sh"), "--model-path", "crash",
                               "--port", str(port)], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
        assert done.returncode == 1 and f"log {log}" in done.stderr and "out of memory" in log.read_text()
        ignored = subprocess.run(["git", "check-ignore", "-q", str(log)], cwd=REPO)
        assert ignored.returncode == 0  # git status stays clean
    finally:
        log.unlink(missing_ok=True)
