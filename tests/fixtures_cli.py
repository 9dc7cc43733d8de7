"""What the tests of the command line share: a launch/ script run in the test's own process, a free
port, and a stand-in for SGLang's server module.

`run_script` runs a launch/ script in the test's own process, as its command line would run it: it
executes the script as `__main__` (its flags, rlver_jax.cli.program's parsing and error reporting,
absl's app.run and its SystemExit) and returns what a subprocess would (exit status, stdout, stderr),
without a fresh interpreter's ~13 s of imports. What only a fresh process shows (nothing imported
before the flags are parsed, a backend's first log lines, Ctrl-C) stays with the subprocess tests
in tests/cli_test.py and tests/faults_test.py.

Everything the script changes in the process is put back afterwards: the flags it defined (absl's
FLAGS is global, and each script defines its own), program's config-flag names, sys.argv, sys.stdin,
sys.path, the working directory, environment variables, the loggers' levels and handlers, the SIGINT
handler and the JAX settings that launch/ scripts set (the compilation cache, threefry).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import pathlib
import runpy
import signal
import socket
import sys
import textwrap
import traceback
from collections.abc import Iterator

from absl import app, flags
from absl import logging as absl_logging

from rlver_jax.cli import program

REPO = pathlib.Path(__file__).resolve().parents[1]
# JAX settings a launch/ script may change (program.enable_compilation_cache, launch/train.py).
_JAX_SETTINGS = ("jax_enable_compilation_cache", "jax_compilation_cache_dir",
                 "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes",
                 "jax_threefry_partitionable")


@dataclasses.dataclass
class Done:
    """What the script did, named as subprocess.CompletedProcess names it (`args[0]` is the script)."""
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    main_ran: bool  # program.run reached the script's main: False when the flags were refused first


def run_script(script: str, *args: str, env: dict[str, str] | None = None, stdin: str = "") -> Done:
    """`python launch/SCRIPT ARGS` (or `python SCRIPT ARGS` for a path with a folder, from the
    repository root: benchmarks/...) in this process, from the repository root, with `env` added to
    the environment and program.TRACEBACK_ENV removed, reading `stdin`. An exception that escapes
    the script (a traceback on request, or a bug) is printed to stderr with exit status 1, as the
    interpreter would."""
    path = REPO / script if "/" in script else REPO / "launch" / script
    argv = [str(path), *args]
    out, err, ran = io.StringIO(), io.StringIO(), []
    original_main = program._main

    def main_spy(main, main_argv):
        ran.append(True)
        return original_main(main, main_argv)

    with _restored(env, err), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.argv, sys.stdin = list(argv), io.StringIO(stdin)  # a copy: restoring sys.argv keeps `argv`
        program._main = main_spy
        try:
            runpy.run_path(str(path), run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - what the interpreter would print and exit with
            traceback.print_exc()
            code = 1
        finally:
            program._main = original_main
    return Done(argv, code, out.getvalue(), err.getvalue(), bool(ran))


@contextlib.contextmanager
def _restored(env: dict[str, str] | None, err: io.StringIO) -> Iterator[None]:
    import jax
    from jax._src import compilation_cache

    app.define_help_flags()  # absl defines them once per process: they must outlive the script's flags
    saved_flags, was_parsed = set(flags.FLAGS), flags.FLAGS.is_parsed()
    config_names = list(program._config_flag_names)
    saved_argv, saved_path, saved_cwd, saved_env = list(sys.argv), list(sys.path), os.getcwd(), dict(os.environ)
    saved_stdin = sys.stdin
    root = logging.getLogger()
    root_level, root_handlers = root.level, list(root.handlers)
    absl_formatter = absl_logging.get_absl_handler().formatter  # program.quiet_logs replaces it
    names = [*program.QUIET_LOGGERS, "rlver_jax"]
    levels = {name: logging.getLogger(name).level for name in names}
    sigint = signal.getsignal(signal.SIGINT)
    settings = {name: getattr(jax.config, name) for name in _JAX_SETTINGS}
    os.environ.pop(program.TRACEBACK_ENV, None)
    os.environ.update(env or {})
    os.chdir(REPO)
    # The log records a process would print: absl's app.run logs at INFO and up (its handler, made
    # once per process, writes to the stderr of that time, not to `err`).
    root.setLevel(logging.INFO)
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    try:
        yield
    finally:
        root.setLevel(root_level)
        root.handlers[:] = root_handlers
        absl_logging.get_absl_handler().setFormatter(absl_formatter)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:], sys.path[:], sys.stdin = saved_argv, saved_path, saved_stdin
        for name in set(flags.FLAGS) - saved_flags:
            delattr(flags.FLAGS, name)
        if not was_parsed:
            flags.FLAGS.unparse_flags()
        program._config_flag_names[:] = config_names
        signal.signal(signal.SIGINT, sigint)
        for name, value in settings.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()  # whether the persistent cache is used is decided once per process


def assert_one_line_error(done, code: int, *fragments: str) -> None:
    """Exit status `code` and stderr one line `SCRIPT: error: ...` holding each fragment, no
    traceback; `done` from run_script or subprocess.run."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    script = next(pathlib.Path(a).name for a in done.args if str(a).endswith((".py", ".sh")))
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `python -m sglang.launch_server` as launch/serve_simulator.sh starts it: writes its arguments to
# $FAKE_SGLANG_ARGS, then "crashes" (model path `crash`) or answers /health.
FAKE_SGLANG = textwrap.dedent("""
    import argparse, http.server, json, os, sys
    parser = argparse.ArgumentParser()
    for flag in ("--model-path", "--port", "--tp", "--host", "--served-model-name"):
        parser.add_argument(flag)
    args, extra = parser.parse_known_args()
    with open(os.environ["FAKE_SGLANG_ARGS"], "w") as f:
        json.dump({**vars(args), "extra": extra}, f)
    if args.model_path == "crash":
        print("fake sglang: out of memory")
        sys.exit(1)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer((args.host, int(args.port)), Health).serve_forever()
""")


def fake_sglang(root: pathlib.Path) -> pathlib.Path:
    """A PYTHONPATH entry under `root` whose `sglang.launch_server` is FAKE_SGLANG."""
    package = root / "fake" / "sglang"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(FAKE_SGLANG)
    return root / "fake"
