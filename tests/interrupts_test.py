"""Ctrl-C and SIGTERM around a training step, piece by piece: StepGuard defers the first signal to
the step's end, stops at once the second time or between steps, abandons an interruptible part (the
in-loop evaluation), lets several processes agree to stop together, ends the process with the
signal's status when the clock (stop_within_s) runs out, and gives the previous handlers back on
close; after it the loop saves the last complete step once (a torn step keeps the last checkpoint)
and says how to resume; stopping after an error closes every part and raises the loop's error; a
resumed run drops the transcripts of the steps it runs again. The whole story in one training run:
training_test.py, test_interrupts_kills_and_a_full_disk_keep_each_step_once (slow)."""

import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time

import flax
import jax.numpy as jnp
import numpy as np
import pytest

from rlver_jax.cli import program
from rlver_jax.rollout.buffer import RolloutError
from rlver_jax.rollout.transcripts import discard_from
from rlver_jax.simulator import SimulatorOutageError
from rlver_jax.train import checkpoint, interrupts, shutdown
from rlver_jax.train.interrupts import EXIT_RESTART, StepGuard, TrainingInterrupted
from tests.conftest import REPO


@pytest.fixture
def guard():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    guard = StepGuard()
    yield guard
    guard.close()
    assert {s: signal.getsignal(s) for s in before} == before  # the previous handlers are back


def _ctrl_c_deferred():
    """Ctrl-C that must not interrupt: a KeyboardInterrupt here fails the test instead of ending pytest."""
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        pytest.fail("the first Ctrl-C during a step stopped the step at once")


def test_the_first_ctrl_c_during_a_step_is_raised_when_the_step_ends(guard):
    guard.begin_step(3)
    _ctrl_c_deferred()
    assert guard.step == 3  # the step goes on
    with pytest.raises(KeyboardInterrupt):
        guard.end_step()
    assert not guard.torn and guard.step is None


def test_sigterm_during_a_step_is_deferred_like_ctrl_c_and_exits_143(guard):
    guard.begin_step(1)
    try:
        signal.raise_signal(signal.SIGTERM)
    except KeyboardInterrupt:
        pytest.fail("SIGTERM during a step stopped the step at once")
    assert guard.stopping and guard.signal == signal.SIGTERM and guard.exit_status == 143
    with pytest.raises(KeyboardInterrupt):
        guard.end_step()


def test_a_sigterm_delivered_twice_counts_once_a_second_ctrl_c_stops_at_once(guard, monkeypatch):
    """A scheduler signals every process of the job and the launcher's watch passes its own on
    (rlver_jax/cli/watchdog.py): the run gets one SIGTERM twice, within interrupts.REPEAT_S."""
    guard.begin_step(1)
    try:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    except KeyboardInterrupt:
        pytest.fail("a SIGTERM delivered twice stopped the step at once")
    monkeypatch.setattr(interrupts.time, "monotonic", lambda: guard._first_at + interrupts.REPEAT_S + 1)
    with pytest.raises(KeyboardInterrupt):  # later, another SIGTERM is a second signal
        signal.raise_signal(signal.SIGTERM)


def test_a_signal_in_an_interruptible_part_abandons_it_and_still_stops_at_the_step_end(guard):
    guard.begin_step(2)
    with pytest.raises(KeyboardInterrupt):
        with guard.interruptible():  # the in-loop evaluation
            signal.raise_signal(signal.SIGINT)
    assert guard.stopping and guard.step == 2  # the step goes on to its metrics and checkpoint
    with pytest.raises(KeyboardInterrupt):
        guard.end_step()


def test_several_processes_stop_together_at_an_agreed_point():
    """A signal is never raised where it lands: each process asks at the same points whether any
    process was signalled, and by what (here the collective puts process 1's SIGTERM beside what is sent).
    The process that was not signalled learns which peer was and exits with the restart status."""
    sent = []

    def agree(signum):
        sent.append(signum)
        return [signum, int(signal.SIGTERM)]  # process 0 sends `signum`; process 1 was sent SIGTERM

    guard = StepGuard(processes=2, agree=lambda signum: sent.append(signum) or [0, signum], process_index=1)
    try:
        signal.raise_signal(signal.SIGTERM)  # between steps: no KeyboardInterrupt here
        assert guard.stopping and guard.stop_agreed() and sent == [signal.SIGTERM]
        assert guard.peer_signals == {} and guard.exit_status == 143
        quiet = StepGuard(processes=2, agree=agree, process_index=0)  # process 0's view
        quiet.begin_step(3)
        with pytest.raises(KeyboardInterrupt):  # not signalled itself, it stops when the others agree
            quiet.end_step()
        assert sent == [signal.SIGTERM, 0]
        assert quiet.peer_signals == {1: signal.SIGTERM} and quiet.exit_status == EXIT_RESTART == 75
        quiet.close()
    finally:
        guard.close()


_CLOCK = """
import signal, sys, time
from rlver_jax.train.interrupts import StepGuard
guard = StepGuard(stop_within_s=0.5, on_expiry=lambda s: print("expired", s, flush=True))
guard.begin_step(7)
signal.raise_signal(signal.SIGTERM)
time.sleep(30)  # a step that does not end in time
print("not reached")
"""


def test_the_clock_after_a_signal_ends_the_process_with_its_status():
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_CLOCK)], capture_output=True, text=True, timeout=60,
                         cwd=REPO)
    assert out.returncode == 143 and out.stdout == f"expired {int(signal.SIGTERM)}\n", out.stderr
    assert time.monotonic() - start < 20


def test_ctrl_c_between_steps_stops_at_once(guard):
    guard.begin_step(0)
    guard.end_step()  # no Ctrl-C: nothing raised
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert not guard.torn


def test_a_second_ctrl_c_during_a_step_stops_at_once_and_the_step_is_torn(guard):
    guard.begin_step(4)
    _ctrl_c_deferred()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert guard.torn and guard.step == 4


def test_the_handlers_are_installed_until_close_and_only_from_the_main_thread():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    guard = StepGuard()
    assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == guard._on_signal
    guard.close()
    assert {s: signal.getsignal(s) for s in before} == before
    made = []
    thread = threading.Thread(target=lambda: made.append(StepGuard()))  # signal.signal refuses other threads
    thread.start()
    thread.join()
    assert {s: signal.getsignal(s) for s in before} == before and not made[0].torn
    made[0].close()
    assert {s: signal.getsignal(s) for s in before} == before


# ----------------------------------------------------------------------------- after the Ctrl-C


@flax.struct.dataclass
class _State:
    """The part of a TrainState `shutdown.interrupted` reads (`step`), and an array to save."""
    step: jnp.ndarray
    w: jnp.ndarray


@pytest.fixture
def manager(tmp_path):
    manager = checkpoint.make_manager(tmp_path / "checkpoints", save_every=2, keep=5, async_save=False)
    yield manager
    manager.close()


@pytest.fixture
def saves(monkeypatch):
    """The steps checkpoint.save is called with (and saves)."""
    calls = []
    save = checkpoint.save

    def spy(manager, step, *args, **kw):
        calls.append(step)
        return save(manager, step, *args, **kw)

    monkeypatch.setattr(checkpoint, "save", spy)
    return calls


def _state(step):
    return _State(step=jnp.asarray(step, jnp.int32), w=jnp.full((2, 3), float(step)))


def test_after_a_complete_step_its_checkpoint_is_saved_once(tmp_path, manager, saves):
    checkpoint.save(manager, 2, _state(2), {"step": 2, "seed": 0}, force=True)  # what the loop wrote at step 1's end
    error = shutdown.interrupted(manager, _state(2), torn_step=None, record={"seed": 0}, workdir=str(tmp_path))
    assert saves == [2]  # not written twice
    assert isinstance(error, TrainingInterrupted) and isinstance(error, KeyboardInterrupt)
    assert str(error) == (f"interrupted: the checkpoint of step 2 is in {tmp_path / 'checkpoints'}. Rerun the same "
                          f"command to resume (config.workdir={tmp_path}).")

    # step 3 off the interval
    error = shutdown.interrupted(manager, _state(3), torn_step=None, record={"seed": 0}, workdir=str(tmp_path))
    assert saves == [2, 3] and checkpoint.saved_steps(tmp_path / "checkpoints") == [2, 3]
    assert f"the checkpoint of step 3 is in {tmp_path / 'checkpoints'}" in str(error)
    restored, meta = checkpoint.restore(manager, 3, _state(0))
    assert meta == {"step": 3, "seed": 0}
    np.testing.assert_array_equal(restored.w, np.full((2, 3), 3.0))


def test_a_torn_step_keeps_the_last_checkpoint(tmp_path, manager, saves):
    checkpoint.save(manager, 2, _state(2), {"step": 2, "seed": 0}, force=True)
    # The state's buffers of a torn step may be donated: the loop must not touch them.
    error = shutdown.interrupted(manager, state=None, torn_step=4, record={"seed": 0}, workdir=str(tmp_path))
    assert saves == [2] and checkpoint.saved_steps(tmp_path / "checkpoints") == [2]
    assert str(error).startswith(f"interrupted: step 4 was cut short and is not kept; the checkpoint of step 2 "
                                 f"is in {tmp_path / 'checkpoints'}. Rerun the same command")


def test_after_sigterm_the_message_and_status_say_so(tmp_path, manager, saves):
    error = shutdown.interrupted(manager, _state(2), torn_step=None, record={"seed": 0}, workdir=str(tmp_path),
                              exit_status=143, signal=signal.SIGTERM)
    assert saves == [2] and error.exit_status == 143
    assert str(error).startswith(f"stopped by SIGTERM: the checkpoint of step 2 is in {tmp_path / 'checkpoints'}")
    # no state yet: nothing saved
    assert shutdown.interrupted(manager, None, None, {}, str(tmp_path)).exit_status == 130


def test_a_simulator_down_past_its_budget_saves_the_last_step_and_exits_75(tmp_path, manager, saves):
    """The rollout producer's SimulatorOutageError (wrapped as buffer.get raises it): saved as for
    SIGTERM, told as the outage with where the checkpoint is, exit status 75; in a step, the step
    is lost; another error is not the loop's to turn into a stop."""
    outage = SimulatorOutageError("simulator at http://sim/v1 did not answer for 30 min, the outage budget "
                                  "(config.simulator.outage_budget_s=1800); last error: connection failed")
    try:
        raise RolloutError("rollout producer failed") from outage
    except RolloutError as e:
        wrapped = e
    guard = StepGuard()
    guard.close()
    error = shutdown.stopped(wrapped, guard, manager, _state(3), {"seed": 0}, str(tmp_path))
    assert saves == [3] and isinstance(error, SimulatorOutageError) and program.exit_status(error) == 75
    assert str(error) == (f"{outage}. Stopped: the checkpoint of step 3 is in {tmp_path / 'checkpoints'}. Rerun "
                          f"the same command to resume (config.workdir={tmp_path}).")
    guard.begin_step(4)  # the in-loop evaluation of step 4 met it: step 4 is lost
    error = shutdown.stopped(outage, guard, manager, _state(4), {"seed": 0}, str(tmp_path))
    assert saves == [3] and "Stopped: step 4 was cut short and is not kept; the checkpoint of step 3" in str(error)
    assert shutdown.stopped(ValueError("a bug"), guard, manager, _state(4), {}, str(tmp_path)) is None


def test_before_the_first_step_nothing_is_saved(tmp_path, manager, saves):
    error = shutdown.interrupted(manager, _state(0), torn_step=None, record={"seed": 0}, workdir=str(tmp_path))
    assert saves == [] and checkpoint.saved_steps(tmp_path / "checkpoints") == []
    assert str(error).startswith("interrupted: no step was completed, nothing is saved. Rerun the same command")


class _Part:
    """The rollout buffer, checkpoint manager or writers: records what is closed in `closed`,
    fails where told."""

    def __init__(self, name, closed, fail=()):
        self.name, self.closed, self.fail = name, closed, fail

    def _done(self, what):
        self.closed.append(f"{self.name}.{what}")
        if what in self.fail:
            raise OSError(f"{self.name}.{what} failed")

    def close(self):
        self._done("close")

    def wait_until_finished(self):
        self._done("wait")


def test_stopping_closes_every_part_and_keeps_the_loops_error(caplog):
    closed = []
    parts = _Part("buffer", closed), _Part("manager", closed, fail=("wait",)), _Part("writers", closed)
    order = ["buffer.close", "manager.wait", "manager.close", "writers.close"]
    with pytest.raises(OSError, match="No space left"):
        try:
            raise OSError("No space left on device")
        except OSError:
            with caplog.at_level(logging.WARNING):
                shutdown.shut_down(*parts)  # what the loop's `finally` does
            raise
    assert closed == order
    assert "while stopping after an error: a checkpoint could not be written" in caplog.text
    assert "manager.wait failed" in caplog.text

    closed.clear()  # without an error before it, the first failure to stop is the error
    with pytest.raises(checkpoint.CheckpointWriteError, match="manager.wait failed"):
        shutdown.shut_down(*parts)
    assert closed == order


def test_a_resumed_run_drops_the_transcripts_of_the_steps_it_runs_again(tmp_path):
    names = ["eval_000001.jsonl", "eval_000003.jsonl", "train_000000.jsonl", "train_000001.jsonl",
             "train_000002.jsonl", "train_000003.jsonl", "notes.txt"]
    for name in names:
        (tmp_path / name).write_text("{}\n")
    removed = discard_from(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["eval_000003.jsonl", "train_000002.jsonl", "train_000003.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_000001.jsonl", "notes.txt", "train_000000.jsonl",
                                                          "train_000001.jsonl"]
    assert discard_from(tmp_path / "absent", 0) == []
