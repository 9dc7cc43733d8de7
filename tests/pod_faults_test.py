"""A two-process run (docs/pods.md's commands, 4 CPU devices each) that loses a process, the way a
TPU slice or a GPU node meets its faults: the survivor stops within a bounded time with one line
naming the process and exit status 75 (restart the job), and the pair started again resumes.

One run goes through every fault in turn (killed, frozen, preempted), each time restarted on the
same work directory, then finishes: four launches of the pair instead of six. A kill or a freeze
reaches the whole process, its launcher's watch and the run (rlver_jax/cli/watchdog.py), as a
host's death would; a preemption's SIGTERM goes to the command's process alone, which passes it on.
Losing the coordinator is its own pair, stopped before it trains."""

import os
import signal
import time

import pytest

from rlver_jax.cli import program
from tests.multihost_training_test import SMALL, check_each_once, finish, metrics, start

CONFIG = "configs/grpo_think.py:tiny"
STEPS = 6
OVERRIDES = SMALL + ["--config.rollout.profiles_per_step=2", "--config.mesh.shape=(1,-1,2)",
                     f"--config.train.steps={STEPS}", "--config.checkpoint.save_every=1", "--config.train.eval_every=0",
                     "--config.mesh.distributed.peer_timeout_s=10"]


def _after_steps(workdir, steps: int, procs, timeout: float = 600) -> None:
    """Wait until process 0 has written the metrics of `steps` steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (workdir / "metrics.jsonl").exists() and len(metrics(workdir)) >= steps:
            return
        assert all(p.poll() is None for p in procs), [p.communicate()[0][-3000:] for p in procs]
        time.sleep(0.5)
    raise AssertionError(f"no metrics of {steps} steps within {timeout} s")


def _survivor(proc, timeout: float = 180) -> tuple[int, str, float]:
    """Process 0's exit status, last line and seconds to exit."""
    t0 = time.monotonic()
    log = proc.communicate(timeout=timeout)[0]
    return proc.returncode, [line for line in log.splitlines() if line.strip()][-1], time.monotonic() - t0


@pytest.mark.slow
def test_a_pod_that_loses_a_process_says_so_and_resumes(tmp_path):
    workdir = tmp_path / "pod"
    restart = program.EXIT_RESTART

    # Killed (a host that dies: its sockets close) after step 2.
    pair = start(CONFIG, workdir, OVERRIDES)
    _after_steps(workdir, 2, pair)
    os.killpg(pair[1].pid, signal.SIGKILL)
    code, last, seconds = _survivor(pair[0])
    assert code == restart and seconds < 180, last
    # A collective that fails first says the connection closed; a survivor outside any collective
    # for peer_timeout_s (host work on a loaded machine) meets the silence first: both name process 1.
    assert any(f"process 1 was lost: {why}" in last for why in ("its connection closed", "it stopped answering"))
    assert "Rerun the same command on every host" in last, last
    assert "during step" in last and "the newest checkpoint is step" in last, last
    print(f"killed: {seconds:.1f} s: {last}")
    pair[1].wait()
    done = len(metrics(workdir))

    # Frozen (SIGSTOP: a hung kernel, a partition; its sockets stay open) after one more step.
    pair = start(CONFIG, workdir, OVERRIDES)
    _after_steps(workdir, done + 1, pair)
    os.killpg(pair[1].pid, signal.SIGSTOP)
    try:
        code, last, seconds = _survivor(pair[0])
    finally:
        os.killpg(pair[1].pid, signal.SIGKILL)
        pair[1].wait()
    assert code == restart and seconds < 180, last
    assert "process 1 was lost: it stopped answering (no heartbeat for" in last, last
    print(f"frozen: {seconds:.1f} s: {last}")
    done = len(metrics(workdir))

    # Preempted (SIGTERM to process 1 alone): both stop at the same step with it saved.
    assert done < STEPS - 1
    pair = start(CONFIG, workdir, OVERRIDES)
    _after_steps(workdir, done + 1, pair)
    pair[1].send_signal(signal.SIGTERM)
    (code0, log0), (code1, log1) = finish(pair, check=False, timeout=300)
    assert code1 == program.EXIT_TERMINATED, log1[-2000:]
    assert code0 == restart and "process 1 was preempted (SIGTERM)" in log0, log0[-2000:]
    assert "Rerun the same command on every host to resume" in log0
    print("preempted:", [line for line in log0.splitlines() if "preempted" in line][-1])

    # Started again, the pair finishes, each step once.
    finish(start(CONFIG, workdir, OVERRIDES))
    check_each_once(workdir, steps=STEPS, dialogues=8, n=4)


@pytest.mark.slow
def test_losing_the_coordinator_ends_the_other_process_with_one_line_and_75(tmp_path):
    """Process 0 (it runs JAX's coordination service) killed once both processes are up: JAX's
    runtime aborts process 1 with a C++ stack and 134; its launcher's watch says so in one line
    naming process 0, exit 75, at once."""
    workdir = tmp_path / "pod"
    pair = start(CONFIG, workdir, OVERRIDES)
    deadline = time.monotonic() + 300
    while not (workdir / ".lock").exists():  # process 0 holds the work directory: both joined the run
        assert time.monotonic() < deadline and all(p.poll() is None for p in pair), pair[1].communicate()[0][-3000:]
        time.sleep(0.2)
    os.killpg(pair[0].pid, signal.SIGKILL)
    code, last, seconds = _survivor(pair[1])
    pair[0].wait()
    assert code == program.EXIT_RESTART and seconds < 180, last
    assert last.startswith("train.py: error: process 0 (the coordinator at 127.0.0.1:") and (
        "was lost: the JAX distributed service it ran stopped answering" in last
        and f"Rerun the same command on every host to resume (config.workdir={workdir}; exit 75" in last), last
    print(f"coordinator killed: {seconds:.1f} s: {last}")
