"""Ctrl-C and SIGTERM in the training loop: a step is finished or not begun, never torn, and the
checkpoint is written within a bounded time.

A train step's update donates the state's buffers, so an interrupt that lands inside a step
leaves no state to save ("Array has been deleted"), and one during the step's evaluation loses its
metrics line. `StepGuard` handles SIGINT (Ctrl-C) and SIGTERM (what a cloud preemption, Kubernetes
or Slurm send before they kill) alike: the first one during a step is deferred until the step is
done (update, metrics, transcripts, checkpoint; the in-loop evaluation is skipped, `stopping`) and
raised then as KeyboardInterrupt; between steps (waiting for rollouts) it is raised at once. A
second signal during a step stops at once: the step is torn, and the last checkpoint is what is
kept (but a SIGTERM within REPEAT_S of the first is the same one, delivered twice).

The first signal also starts a clock: if the process has not ended `stop_within_s` seconds later
(a step or a save slower than a preemption notice allows), `on_expiry` is called (it says what is
kept) and the process exits at once with the signal's status, keeping the last complete
checkpoint, rather than being killed mid-write by the platform.

On several processes (`processes > 1`) a signal is never raised where it lands: every process must
stop at the same step and save its shards together. The loop asks `stop_agreed()` at two points of
every step, which every process reaches in the same order (after the batch arrives, when the step
ends); the processes exchange which of them was signalled by what, and all stop together. A process
signalled while waiting for rollouts stops waiting (`stopping`) and goes to that point at once. A
process that stops for a peer's signal (`peer_signals`) exits with EXIT_RESTART, the job's restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from rlver_jax.outage import EXIT_TEMPFAIL

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The exit status of a run stopped by each signal (the shell's 128 + the signal's number).
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}
# The exit status of a process whose peer was lost or preempted (rlver_jax.train.pod), or whose
# simulator was down past its outage budget: rerun the same command (on every host) to resume.
EXIT_RESTART = EXIT_TEMPFAIL


# A SIGTERM again this soon after the first is the same one: a scheduler signals every process of
# the job, and the launcher's watch (rlver_jax/cli/watchdog.py) passes its own on to the run.
REPEAT_S = 2.0


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C or SIGTERM; the message says what was saved and how to resume,
    `exit_status` is 130 (SIGINT) or 143 (SIGTERM)."""

    def __init__(self, message: str, exit_status: int = 130):
        super().__init__(message)
        self.exit_status = exit_status


def signal_name(signum: int | None) -> str:
    return {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}.get(signum, "a signal")


class StepGuard:
    """Installs its SIGINT and SIGTERM handlers when made (main thread only; elsewhere it only keeps
    count), until `close()`. `begin_step(step)` ... `end_step()` bracket a step.

    `stop_within_s`: the bound from the first signal to the end of the process (see the module
    docstring); `on_expiry(signum)` runs when it passes, before the exit. `agree(signum)`: with several
    processes, the collective that returns every process's signal number (0: none), in process
    order; `process_index`: this process's place in it."""

    def __init__(self, stop_within_s: float | None = None, on_expiry: Callable[[int], None] | None = None,
                 processes: int = 1, agree: Callable[[int], list[int]] | None = None, process_index: int = 0):
        self.step: int | None = None  # the step running, None between steps
        self.signal: int | None = None  # the first signal received
        self._pending = False
        self._previous: dict[int, object] = {}
        self.stop_within_s = stop_within_s
        self.on_expiry = on_expiry
        self.processes = processes
        self.process_index = process_index
        self.peer_signals: dict[int, int] = {}  # the other processes' signals, as last agreed
        self._agree = agree or (lambda signum: [signum])
        self._timer: threading.Timer | None = None
        self._first_at = float("-inf")  # when the first signal came
        self._interruptible = False
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)

    @property
    def torn(self) -> bool:
        """Whether a step was running when the loop stopped (its work is incomplete)."""
        return self.step is not None

    @property
    def stopping(self) -> bool:
        """A signal came: the loop finishes what it must and skips what it may (the in-loop evaluation)."""
        return self._pending

    @property
    def exit_status(self) -> int:
        """The signal's status; stopped for a peer's signal alone, EXIT_RESTART."""
        if self.signal is None and self.peer_signals:
            return EXIT_RESTART
        return EXIT_STATUS.get(self.signal, 130)

    def begin_step(self, step: int) -> None:
        self.step = step

    def end_step(self) -> None:
        """The step is complete; raises the KeyboardInterrupt deferred during it (with several
        processes: when any process was signalled)."""
        self.step = None
        if self.stop_agreed():
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A part of a step that may be abandoned (the in-loop evaluation): the first signal in it is
        raised at once, as KeyboardInterrupt, and still stops the loop when the step ends."""
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    def stop_agreed(self) -> bool:
        """Whether to stop here: this process was signalled, or (several processes; a collective)
        any was."""
        if self.processes <= 1:
            return self._pending
        signals = self._agree(self.signal or 0 if self._pending else 0)
        self.peer_signals = {i: s for i, s in enumerate(signals) if s and i != self.process_index}
        return any(signals)

    def close(self) -> None:
        """Give the previous handlers back. The clock keeps running: the saving after a signal
        happens after close, and is bounded too."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def cancel_clock(self) -> None:
        """Stop the clock (the process is about to end on its own)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_signal(self, signum, frame) -> None:
        first = self.signal is None
        if not first and signum == self.signal == signal.SIGTERM and time.monotonic() - self._first_at < REPEAT_S:
            return  # the same SIGTERM, delivered twice
        if first:
            self.signal, self._first_at = signum, time.monotonic()
            self._start_clock(signum)
        if self.processes > 1 and first:
            self._pending = True  # every process stops at the same agreed point
            log.warning("%s: stopping at the end of %s, with every process", signal_name(signum),
                        f"step {self.step}" if self.step is not None else "the wait for rollouts")
            return
        if self.step is None or self._pending:
            raise KeyboardInterrupt
        self._pending = True
        if self._interruptible:
            raise KeyboardInterrupt
        log.warning("%s: finishing step %d (update, metrics, transcripts, checkpoint) before stopping; send it "
                    "again to stop at once and lose this step", signal_name(signum), self.step)

    def _start_clock(self, signum: int) -> None:
        if not self.stop_within_s:
            return
        self._timer = threading.Timer(self.stop_within_s, self._expire, args=(signum,))
        self._timer.daemon = True
        self._timer.start()

    def _expire(self, signum: int) -> None:
        try:
            if self.on_expiry is not None:
                self.on_expiry(signum)
        finally:
            sys.stderr.flush()
            os._exit(EXIT_STATUS.get(signum, 130))
