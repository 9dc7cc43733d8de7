"""Generated code, run where it can harm nothing: each program in a child process
(sandbox_child.py, `python -I`) that confines itself before the program runs (a network
namespace without interfaces where permitted, resource limits, Landlock allowing writes only in
its scratch directory, a seccomp filter refusing new processes, programs and sockets, the
`nobody` user as root, an audit hook refusing processes, sockets, native code and writes outside
its scratch directory), in a session of its own that is killed, whole, at the wall-clock limit.
A program that loops forever costs its limit; one that calls os.system fails its test. Which
layers took effect is part of each result (Outcome.layers).

The wall-clock limit is LiveCodeBench's own global timeout for a program,
(test_timeout_s + 1) x tests + 5 s (livecodebench.evaluation.compute_code_generation_metrics
.check_correctness), so a run's time is bounded by the limits, not by the programs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

_CHILD = pathlib.Path(__file__).with_name("sandbox_child.py")
_NOBODY = 65534
_STDOUT_CAP = 1 << 20  # bytes of a program's output kept (the result line is the last one)


@dataclasses.dataclass(frozen=True)
class Limits:
    test_timeout_s: int = 6  # per test case (LiveCodeBench's default)
    memory_mb: int = 4096  # address space of the child (LiveCodeBench's reliability_guard: 4 GB)
    file_mb: int = 16  # largest file the program may write (in its scratch directory)
    max_processes: int = 64  # RLIMIT_NPROC of the child's user (forks are refused anyway)
    scratch_root: str = ""  # where scratch directories are made; "" = the system's temporary directory

    def wall_s(self, tests: int) -> float:
        return (self.test_timeout_s + 1) * max(1, tests) + 5

    def __post_init__(self):
        for field in ("test_timeout_s", "memory_mb", "file_mb", "max_processes"):
            if getattr(self, field) < 1:
                raise ValueError(f"config.code.{field}={getattr(self, field)} must be at least 1")


@dataclasses.dataclass(frozen=True)
class Outcome:
    results: list[Any]  # LiveCodeBench's per-test results (True passed; False wrong; -1 timeout; -2..-4 errors)
    metadata: dict[str, Any]
    wall_s: float
    killed: bool  # past the wall-clock limit: every test counts as failed
    layers: dict[str, bool]  # which confinement layers took effect (network_namespace, nobody)


async def run_program(code: str, input_output: str, limits: Limits) -> Outcome:
    """Grade `code` on LiveCodeBench's `input_output` (its JSON: inputs, outputs, fn_name) in a
    confined child process."""
    tests = len(json.loads(input_output)["inputs"])
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="rlver_sandbox_", dir=limits.scratch_root or None))
    if os.geteuid() == 0:
        os.chown(scratch, _NOBODY, _NOBODY)  # the child drops to nobody; only here may it write
    wall = limits.wall_s(tests)
    task = {"code": code, "input_output": input_output, "scratch": str(scratch), "memory_mb": limits.memory_mb,
            "cpu_s": int(wall) + 1, "file_mb": limits.file_mb, "max_processes": limits.max_processes,
            "test_timeout_s": limits.test_timeout_s}
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", str(_CHILD), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, cwd=scratch, start_new_session=True, env={"PATH": "/usr/bin:/bin"})
    try:
        stdout = await asyncio.wait_for(_exchange(proc, json.dumps(task).encode()), wall)
        killed = False
    except asyncio.TimeoutError:
        stdout, killed = b"", True
    finally:
        _kill_session(proc.pid)
        await proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.monotonic() - start
    parsed = None if killed else _result_line(stdout)
    if parsed is None:  # killed at the limit, or died without a result (memory, CPU): all tests failed
        why = "wall-clock limit" if killed else f"exit status {proc.returncode}"
        return Outcome([-1] * tests, {"error_message": f"no result ({why})"}, elapsed, killed, {})
    return Outcome(parsed["results"], parsed["metadata"], elapsed, False, parsed["layers"])


async def _exchange(proc: asyncio.subprocess.Process, task: bytes) -> bytes:
    """Send the task, then read the child's stdout to its end, keeping only the last
    _STDOUT_CAP bytes (a program printing without end costs no memory here)."""
    proc.stdin.write(task)
    await proc.stdin.drain()
    proc.stdin.close()
    kept = b""
    while chunk := await proc.stdout.read(1 << 16):
        kept = (kept + chunk)[-_STDOUT_CAP:]
    await proc.wait()
    return kept


def _kill_session(pid: int) -> None:
    """SIGKILL the child's whole session (whatever it started); no error if it is gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _result_line(stdout: bytes) -> dict[str, Any] | None:
    from rlver_jax.eval.capabilities.sandbox_child import MARKER

    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER):])
            except ValueError:
                return None
    return None
