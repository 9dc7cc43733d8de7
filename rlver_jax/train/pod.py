"""A multi-process run that loses a process stops every survivor with one line and exit status
EXIT_RESTART, "restart the job": a cluster scheduler (GKE JobSet, Slurm, XPK) reruns the same
command on every host, which resumes from the newest checkpoint.

Two ways a peer is lost reach a survivor (rlver_jax.parallel.peers watches both):
- frozen (SIGSTOP, a hung kernel, a partition): nothing fails, its heartbeats stop; after
  `mesh.distributed.peer_timeout_s` the watch calls `lost`, which prints and exits at once;
- killed (its sockets close): the next collective fails with a transport error that names no
  process (gloo's "Connection closed by peer"), raised in the loop or in a checkpoint save;
  `explain` tells such an error from others and names the peer whose heartbeats stopped.
A peer's SIGTERM (a preemption) stops every process at the same step with it saved
(rlver_jax.train.interrupts); the survivors then exit with EXIT_RESTART too.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

from rlver_jax.parallel import peers
from rlver_jax.train import checkpoint
from rlver_jax.train.interrupts import EXIT_RESTART

# What a collective with a lost peer raises (gloo on CPU, the coordination service, NCCL, TPU ICI).
_TRANSPORT_ERRORS = ("connection closed by peer", "connection reset by peer", "gloo", "broken pipe",
                     "unavailable:", "deadline_exceeded", "coordination service", "nccl", "heartbeat")


def is_transport_error(error: BaseException) -> bool:
    """Whether `error` (or an exception it was raised from) is a collective's transport failure."""
    seen = 0
    while error is not None and seen < 8:
        text = f"{type(error).__name__}: {error}".lower()
        if any(pattern in text for pattern in _TRANSPORT_ERRORS):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


class PodWatch:
    """The watch of one process of a multi-process run (`start` after jax.distributed.initialize).
    The loop says which step runs (`on_step`); the line names it and the newest checkpoint."""

    def __init__(self, workdir: str | os.PathLike, timeout_s: float):
        self.checkpoints = pathlib.Path(workdir) / "checkpoints"
        self.timeout_s = timeout_s
        self.step: int | None = None
        self._watch: peers.PeerWatch | None = None

    def start(self) -> PodWatch:
        import jax

        self._watch = peers.PeerWatch(peers.coordination_client(), jax.process_index(), jax.process_count(),
                                      timeout_s=self.timeout_s, on_lost=self.lost).start()
        return self

    def on_step(self, step: int) -> None:
        self.step = step

    def stop(self) -> None:
        """The run ended (done, or stopped with every process): peers that leave first are not lost."""
        if self._watch is not None:
            self._watch.stop()

    def line(self, what: str) -> str:
        """The one line: what was lost, at which step, the newest checkpoint, what to rerun."""
        try:
            steps = checkpoint.saved_steps(self.checkpoints)
        except Exception:  # noqa: BLE001 - the line must come out whatever the disk does
            steps = []
        kept = f"the newest checkpoint is step {steps[-1]} in {self.checkpoints}" if steps else "no checkpoint yet"
        where = f" during step {self.step}" if self.step is not None else ""
        return (f"{pathlib.Path(sys.argv[0]).name}: error: {what}{where}; {kept}. Rerun the same command on every "
                f"host to resume (exit {EXIT_RESTART}: restart the job)")

    def lost(self, lost: peers.Lost) -> None:
        """Say who was lost and leave at once: the runtime would abort later with a stack dump, and
        no collective can finish without the peer (called by the watch's thread, or by `explain`)."""
        self._leave(peers.describe(lost))

    def explain(self, error: BaseException) -> None:
        """After `error` left the loop: when it is a collective's transport failure, wait (at most
        the timeout) until the peer whose heartbeats stopped is known, and leave as `lost` does;
        otherwise return (the error is reported as it is)."""
        if self._watch is None or not is_transport_error(error):
            return
        deadline = time.monotonic() + self.timeout_s
        grace = 3 * self._watch.interval_s  # a killed process has beaten its last
        while time.monotonic() < deadline:
            if silent := self._watch.silent_now(grace):
                self.lost(peers.Lost(silent, "was lost: its connection closed", grace))
            time.sleep(self._watch.interval_s / 2)
        self._leave(f"a collective failed ({type(error).__name__}) though every process still answers")

    def _leave(self, what: str) -> None:
        print("\n" + self.line(what), file=sys.stderr, flush=True)  # on a line of its own after a progress bar
        sys.stdout.flush()
        os._exit(EXIT_RESTART)
