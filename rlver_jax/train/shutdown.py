"""How the training loop stops: after Ctrl-C or SIGTERM, or a simulator down past its outage
budget (the checkpoint of the last complete step, the error saying where it is), when the signal's
clock runs out, and the closing of the producer, the checkpoint manager and the writers after the
loop, with or without an error.
"""

from __future__ import annotations

import logging
import pathlib
import sys
import threading
from collections.abc import Callable
from signal import SIGINT
from typing import Any

from rlver_jax.llm_client import OutageError
from rlver_jax.parallel import hosts
from rlver_jax.rl import train_state
from rlver_jax.rollout.buffer import RolloutBuffer
from rlver_jax.train import checkpoint
from rlver_jax.train.interrupts import StepGuard, TrainingInterrupted, signal_name
from rlver_jax.train.metrics import Writers
from rlver_jax.train.spec import LoopSettings
from rlver_jax.train.workdir import WorkDirLock

log = logging.getLogger(__name__)


def process_signals(signum: int) -> list[int]:
    """Every process's signal number (0: none), in process order (a collective of every process)."""
    return [int(s) for s in hosts.allgather_json(int(signum))]


def expired(signum: int, manager, s: LoopSettings, lock: WorkDirLock | None) -> None:
    """The clock after a signal ran out (interrupts.StepGuard): say what is kept and free the lock;
    the process then exits with the signal's status."""
    try:
        steps = checkpoint.steps_in(manager.directory)
    except Exception:  # noqa: BLE001 - the message must come out whatever the disk does
        steps = []
    kept = f"the checkpoint of step {steps[-1]} is in {manager.directory}" if steps else "no checkpoint was saved"
    print(f"{pathlib.Path(sys.argv[0]).name}: {signal_name(signum)}: stopped {s.stop_within_s:g} s after the signal "
          f"(config.checkpoint.stop_within_s) before the running step could be finished and saved; {kept}. Rerun "
          f"the same command to resume (config.workdir={s.workdir}).", file=sys.stderr, flush=True)
    if lock is not None:
        lock.release()


def interrupted(manager, state: train_state.TrainState | None, torn_step: int | None, record: dict,
                workdir: str, *, sampling: Any = None, exit_status: int = 130,
                signal: int | None = None, peer_signals: dict[int, int] | None = None) -> TrainingInterrupted:
    """After Ctrl-C or SIGTERM (`signal`; or, none here, the other processes' `peer_signals`): save
    the state of the last complete step (with the run's checkpoint `record`, rlver_jax.train.resume,
    and the actor versions of `sampling`) unless a checkpoint of it exists (or it is torn, or there
    is no state yet: then the last checkpoint is kept); the error that says so (`workdir`:
    config.workdir, to resume; `exit_status`: the process's)."""
    where = _keep_last(manager, state, torn_step, record, sampling, signal_name(signal))
    if signal is None and peer_signals:
        what = "; ".join(f"process {i} was {'preempted' if s != SIGINT else 'interrupted'} ({signal_name(s)})"
                         for i, s in sorted(peer_signals.items()))
        rerun = "Rerun the same command on every host"
    else:
        what = "interrupted" if signal in (None, SIGINT) else f"stopped by {signal_name(signal)}"
        rerun = "Rerun the same command" + (" on every host" if peer_signals is not None else "")
    return TrainingInterrupted(f"{what}: {where}. {rerun} to resume (config.workdir={workdir}).", exit_status)


def stopped(error: BaseException, guard: StepGuard, manager, state: train_state.TrainState | None, record: dict,
            workdir: str, sampling: Any = None) -> BaseException | None:
    """What the loop raises after `error` left it: after Ctrl-C or SIGTERM (KeyboardInterrupt)
    `interrupted`'s error, after an outage past its budget `outage`'s, each once the last complete
    step is saved (`record`, `sampling`: its checkpoint's); None for any other error."""
    if isinstance(error, KeyboardInterrupt):
        return interrupted(manager, state, guard.step, record, workdir, sampling=sampling,
                           exit_status=guard.exit_status, signal=guard.signal,
                           peer_signals=guard.peer_signals if guard.processes > 1 else None)
    if isinstance(error, Exception) and (cause := outage_of(error)) is not None:
        return outage(manager, state, guard.step, record, workdir, cause, sampling=sampling,
                      save=guard.processes == 1)
    return None


def outage_of(error: BaseException) -> OutageError | None:
    """The outage past its budget that `error` is, or was raised from (the rollout producer's
    failure, rollout.buffer.RolloutError); None for any other error."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OutageError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def outage(manager, state: train_state.TrainState | None, torn_step: int | None, record: dict, workdir: str,
           error: OutageError, *, sampling: Any = None, save: bool = True) -> OutageError:
    """After the simulator (or another endpoint) stayed down past its outage budget (`error`): save
    the state of the last complete step as `interrupted` does (`save`; a run of several processes
    keeps its last checkpoint instead: a save needs every process at the same point), and the error
    of the same type that says so (exit status 75: the same command resumes)."""
    if save:
        where = _keep_last(manager, state, torn_step, record, sampling, "simulator outage")
    else:
        saved = checkpoint.latest_step(manager)
        where = f"the newest checkpoint is step {saved} in {manager.directory}" if saved is not None else "none saved"
    return type(error)(f"{error}. Stopped: {where}. Rerun the same command to resume (config.workdir={workdir}).")


def _keep_last(manager, state: train_state.TrainState | None, torn_step: int | None, record: dict, sampling: Any,
               why: str) -> str:
    """Save the state of the last complete step unless a checkpoint of it exists (or it is torn, or
    there is no state yet: then the last checkpoint is kept); what is kept, in words."""
    if torn_step is None and state is not None:
        step = int(state.step)  # every step up to here is complete, its metrics written
        if step > 0 and checkpoint.latest_step(manager) != step:
            log.warning("%s: saving the checkpoint of step %d", why, step)
            checkpoint.save(manager, step, state, {"step": step, **record}, force=True, sampling=sampling)
        checkpoint.wait(manager)
    saved = checkpoint.latest_step(manager)
    lost = f"step {torn_step} was cut short and is not kept; " if torn_step is not None else ""
    return lost + (f"the checkpoint of step {saved} is in {manager.directory}" if saved is not None
                   else "no step was completed, nothing is saved")


def shut_down(buffer: RolloutBuffer | None, manager, writers: Writers | None) -> None:
    """Stop the producer, finish pending checkpoint writes, close the writers. Every part runs; when
    the loop failed (a full disk, say), a failure here is logged so that the loop's error is the
    one raised, and the checkpoint manager gets `_CLOSE_AFTER_ERROR_S` to finish (a failed save can
    leave orbax waiting minutes for a signal that never comes)."""
    failing = sys.exc_info()[0] is not None
    save_failed = isinstance(sys.exc_info()[1], checkpoint.CheckpointWriteError)  # said once: not waited for again
    first: BaseException | None = None
    parts = [buffer.close if buffer is not None else None,
             lambda: _bounded(lambda: _close_manager(manager, wait=not save_failed),
                              _CLOSE_AFTER_ERROR_S if failing else None),
             writers.close if writers is not None else None]
    for close in parts:
        if close is None:
            continue
        try:
            close()
        except Exception as e:  # noqa: BLE001 - each part must get its turn
            if failing:
                log.warning("while stopping after an error: %s", e)
            first = first or e
    if first is not None and not failing:
        raise first


_CLOSE_AFTER_ERROR_S = 30.0


def _close_manager(manager, wait: bool = True) -> None:
    """Wait for pending saves, then close the manager, even when the wait fails (its error is
    raised). Without `wait` (a save failed and was reported) the manager is closed and the same
    failure, which closing raises again, is not reported twice."""
    if not wait:
        try:
            manager.close()
        except Exception as e:  # noqa: BLE001 - the failed save, once more
            log.debug("closing the checkpoint manager after a failed save: %s", e)
        return
    try:
        checkpoint.wait(manager)
    finally:
        manager.close()


def _bounded(work: Callable[[], Any], timeout_s: float | None) -> None:
    """Run `work`; with `timeout_s`, in a daemon thread given that long (then left behind, logged)."""
    if timeout_s is None:
        work()
        return
    errors: list[BaseException] = []

    def run():
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)

    thread = threading.Thread(target=run, name="close-checkpoints", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning("the checkpoint manager did not close within %g s; left behind", timeout_s)
    elif errors:
        raise errors[0]
