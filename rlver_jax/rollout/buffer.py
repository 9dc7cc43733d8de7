"""The async rollout buffer: a producer thread keeps dialogues in flight while the trainer trains.

Versions count trainer updates: the parameters after update s are version s + 1. Batch i is
consumed by train step i; turn k of each of its dialogues is written by the version
rollout.versions.VersionSchedule.for_batch(i, max_staleness, partial) gives it:
  max_staleness = 0: batch i waits for version i (strictly on-policy, the paper's setting);
  max_staleness = 1: batch i + 1 is generated with version i while the trainer updates to i + 1;
  max_staleness >= 2 with partial rollouts: a dialogue of batch i starts on version
    i - max_staleness and each later turn takes the next version, up to i - 1: dialogues in
    flight when the weights change continue under the new weights.
The buffer publishes each version into the engine (engines.seam.Engine.publish, its weight
sync), which keeps them (engines.published.Published). No JAX here: with max_staleness > 0 the
engine samples while the trainer's update donates the published parameters, so it takes them as
`private` and keeps a copy of its own. A batch starts once its first version is
published (the oldest one when that one never was: the first batches of a run); a turn whose
version is not published yet waits for it in the sampler (`Published.resolve`). The versions are
a function of (batch index, turn), not of timing, so a run resumed at step S that publishes the
versions S - max_staleness .. S (the checkpoint holds them) samples what the uninterrupted run
sampled. Queues are bounded, and an exception in the producer is raised in the consumer (as
RolloutError, caused by it). `close()` cancels the batch in progress and wakes the turns waiting
for a version, so stopping a run does not wait for its dialogues to end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rlver_jax.engines.seam import Engine
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.versions import VersionSchedule

# (batch index, its version schedule) -> the batch's dialogues.
MakeBatch = Callable[[int, VersionSchedule], Awaitable[list[DialogueSequence]]]


@dataclasses.dataclass
class RolloutBatch:
    index: int  # the train step that consumes it
    version: int  # the parameter version of its dialogues' first turns
    sequences: list[DialogueSequence]
    seconds: float  # wall time spent producing it


class RolloutError(RuntimeError):
    """The rollout producer failed; the producer's exception is the __cause__."""


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class RolloutBuffer:
    """Produces batch after batch with `make_batch(index, schedule)` in its own thread and event
    loop, its turns sampled by `sampler`; `get()` returns them in order. `partial`: dialogues move
    to newer versions while in flight (rollout.versions; config.rollout.partial_rollouts)."""

    def __init__(self, make_batch: MakeBatch, sampler: Engine, *, max_staleness: int, partial: bool = True,
                 start_index: int = 0, finalize: Callable[[], Awaitable[None]] | None = None):
        if max_staleness < 0:
            raise ValueError(f"config.rollout.max_staleness={max_staleness} must be >= 0")
        self._make_batch = make_batch
        self._sampler = sampler
        self._finalize = finalize  # run in the producer's event loop when it stops (close clients)
        self.max_staleness, self.partial = max_staleness, partial
        self._next_index = start_index
        self._queue: queue.Queue = queue.Queue(maxsize=max(max_staleness, 1))
        self._cond = threading.Condition()
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None  # the batch in progress
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def publish(self, version: int, params: Any) -> None:
        """Publish `params` (version `version`) into the engine, for the turns that want it.

        The trainer's update donates its parameters. With max_staleness = 0 the producer has
        finished sampling before the next update starts, so the engine samples on them directly;
        with max_staleness > 0 it samples while the trainer updates: `private`, a copy of its own."""
        self._sampler.publish(version, params, private=self.max_staleness > 0)
        if not self._thread.is_alive() and not self._stop:
            self._thread.start()

    def resolve(self, wanted: int) -> tuple[int, Any]:
        """The sampler's (version, parameters) for a turn wanting `wanted` (engines.published.Published.resolve)."""
        return self._sampler.published.resolve(wanted)

    def get(self, timeout: float | None = None, until: Callable[[], bool] | None = None) -> RolloutBatch | None:
        """The next batch; re-raises the producer's exception if it failed. None when `until()`
        turns true while waiting (checked every 0.2 s)."""
        while True:
            try:
                item = self._queue.get(timeout=(0.2 if until is not None else 1.0) if timeout is None else timeout)
                break
            except queue.Empty:
                if timeout is not None:
                    raise TimeoutError(f"no rollout batch within {timeout} s") from None
                if until is not None and until():
                    return None
                if not self._thread.is_alive():
                    raise RuntimeError("the rollout producer stopped without a batch or an error")
        if isinstance(item, _Failure):
            raise RolloutError(f"rollout producer failed: {item.exc!r}") from item.exc
        return item

    def close(self) -> None:
        with self._cond:
            self._stop = True
            loop, task = self._loop, self._task
        self._sampler.published.close()  # wakes the turns waiting for a version
        if task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has closed: nothing is in progress
                pass
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            while True:
                index = self._next_index
                schedule = VersionSchedule.for_batch(index, self.max_staleness, self.partial)
                version, _ = self.resolve(schedule.first)  # the batch starts once its first turns can
                self._sampler.published.retire_below(schedule.first)  # no later turn needs them
                start = time.perf_counter()
                with self._cond:
                    if self._stop:
                        return
                    task = self._task = loop.create_task(self._make_batch(index, schedule))
                seqs = loop.run_until_complete(task)
                with self._cond:
                    self._task = None
                batch = RolloutBatch(index, version, seqs, time.perf_counter() - start)
                while not self._stop:
                    try:
                        self._queue.put(batch, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                self._next_index += 1
        except BaseException as exc:  # surfaces in get(), never a silent hang
            if not self._stop:
                self._queue.put(_Failure(exc))
        finally:
            if self._finalize is not None:
                loop.run_until_complete(self._finalize())
            _cancel_pending(loop)
            loop.close()


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what still runs on `loop` and let it unwind (as asyncio.run does before closing a
    loop): the rollout engine's serving task outlives a cancelled batch, and a task left pending
    when its loop closes is reported on stderr after the trainer's last line."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

