"""Ctrl-C in the training loop: a step is finished or not begun, never torn.

A train step's update donates the state's buffers, so an interrupt that lands inside a step
leaves no state to save ("Array has been deleted"), and one during the step's evaluation loses its
metrics line. `StepGuard` defers the first SIGINT that comes during a step until the step is done
(update, metrics, transcripts, evaluation, checkpoint) and raises KeyboardInterrupt then; between
steps (waiting for rollouts) it raises at once. A second SIGINT during a step stops at once: the
step is torn, and the last checkpoint is what is kept.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C; the message says what was saved and how to resume."""


class StepGuard:
    """Installs its SIGINT handler when made (main thread only; elsewhere it only keeps count),
    until `close()`. `begin_step(step)` ... `end_step()` bracket a step."""

    def __init__(self):
        self.step: int | None = None  # the step running, None between steps
        self._pending = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    @property
    def torn(self) -> bool:
        """Whether a step was running when the loop stopped (its work is incomplete)."""
        return self.step is not None

    def begin_step(self, step: int) -> None:
        self.step = step

    def end_step(self) -> None:
        """The step is complete; raises the KeyboardInterrupt deferred during it."""
        self.step = None
        if self._pending:
            raise KeyboardInterrupt

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_sigint(self, signum, frame) -> None:
        if self.step is None or self._pending:
            raise KeyboardInterrupt
        self._pending = True
        log.warning("Ctrl-C: finishing step %d (update, metrics, transcripts, evaluation, checkpoint) before "
                    "stopping; press Ctrl-C again to stop at once and lose this step", self.step)
