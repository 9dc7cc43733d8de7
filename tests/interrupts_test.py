"""Ctrl-C around a training step, piece by piece: StepGuard defers the first Ctrl-C to the step's end,
stops at once the second time or between steps, and gives the previous handler back on close; after
it the loop saves the last complete step once (a torn step keeps the last checkpoint) and says how to
resume; stopping after an error closes every part and raises the loop's error; a resumed run drops
the transcripts of the steps it runs again. The whole story in one training run: training_test.py,
test_interrupts_kills_and_a_full_disk_keep_each_step_once (slow)."""

import logging
import signal
import threading

import flax
import jax.numpy as jnp
import numpy as np
import pytest

from rlver_jax.rollout.transcripts import discard_from
from rlver_jax.train import checkpoint, loop
from rlver_jax.train.interrupts import StepGuard, TrainingInterrupted


@pytest.fixture
def guard():
    before = signal.getsignal(signal.SIGINT)
    guard = StepGuard()
    yield guard
    guard.close()
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


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


def test_the_handler_is_installed_until_close_and_only_from_the_main_thread():
    before = signal.getsignal(signal.SIGINT)
    guard = StepGuard()
    assert signal.getsignal(signal.SIGINT) == guard._on_sigint
    guard.close()
    assert signal.getsignal(signal.SIGINT) is before
    made = []
    thread = threading.Thread(target=lambda: made.append(StepGuard()))  # signal.signal refuses other threads
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGINT) is before and not made[0].torn
    made[0].close()
    assert signal.getsignal(signal.SIGINT) is before


# ----------------------------------------------------------------------------- after the Ctrl-C


@flax.struct.dataclass
class _State:
    """The part of a TrainState `loop._interrupted` reads (`step`), and an array to save."""
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
    error = loop._interrupted(manager, _state(2), torn_step=None, record={"seed": 0}, workdir=str(tmp_path))
    assert saves == [2]  # not written twice
    assert isinstance(error, TrainingInterrupted) and isinstance(error, KeyboardInterrupt)
    assert str(error) == (f"interrupted: the checkpoint of step 2 is in {tmp_path / 'checkpoints'}. Rerun the same "
                          f"command to resume (config.workdir={tmp_path}).")

    # step 3 off the interval
    error = loop._interrupted(manager, _state(3), torn_step=None, record={"seed": 0}, workdir=str(tmp_path))
    assert saves == [2, 3] and checkpoint.saved_steps(tmp_path / "checkpoints") == [2, 3]
    assert f"the checkpoint of step 3 is in {tmp_path / 'checkpoints'}" in str(error)
    restored, meta = checkpoint.restore(manager, 3, _state(0))
    assert meta == {"step": 3, "seed": 0}
    np.testing.assert_array_equal(restored.w, np.full((2, 3), 3.0))


def test_a_torn_step_keeps_the_last_checkpoint(tmp_path, manager, saves):
    checkpoint.save(manager, 2, _state(2), {"step": 2, "seed": 0}, force=True)
    # The state's buffers of a torn step may be donated: the loop must not touch them.
    error = loop._interrupted(manager, state=None, torn_step=4, record={"seed": 0}, workdir=str(tmp_path))
    assert saves == [2] and checkpoint.saved_steps(tmp_path / "checkpoints") == [2]
    assert str(error).startswith(f"interrupted: step 4 was cut short and is not kept; the checkpoint of step 2 "
                                 f"is in {tmp_path / 'checkpoints'}. Rerun the same command")


def test_before_the_first_step_nothing_is_saved(tmp_path, manager, saves):
    error = loop._interrupted(manager, _state(0), torn_step=None, record={"seed": 0}, workdir=str(tmp_path))
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
                loop._shut_down(*parts)  # what the loop's `finally` does
            raise
    assert closed == order
    assert "while stopping after an error: manager.wait failed" in caplog.text

    closed.clear()  # without an error before it, the first failure to stop is the error
    with pytest.raises(OSError, match="manager.wait failed"):
        loop._shut_down(*parts)
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
