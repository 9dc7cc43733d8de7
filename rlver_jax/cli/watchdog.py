"""The launcher's watch of a multi-process run: the command's own process runs the program as its
child and reads its end, so that losing the coordinator ends every other process with one line and
exit status 75 ("restart the job"), not the runtime's abort.

Process 0 of a multi-process JAX run (jax.distributed) hosts the coordination service. When that
process dies, JAX's runtime in every other process notices within a second (its poll of the service
fails) and aborts: exit status 134 and a C++ stack on stderr, the line that says why buried above
it. The runtime's callback for it (`missed_heartbeat_callback`) fails in jaxlib 0.10.2 (std::bad_cast,
tried by hand), and an abort cannot be caught inside the process. So launch/train.py and
launch/eval.py, started as one process of several (launch/tpu_pod.sh, docs/pods.md's commands), run
their own command again as a child (`run_watched`). The child's stdout goes straight through; its
stderr through `StderrFilter`, which holds back the runtime's log lines (glog's "E1207
10:00:00.000000 123 file.cc:42] ...") until a line of ours follows them, and everything from a fatal
one on. When the child dies of the distributed service's fatal error, the parent drops that stack
and says in one line that process 0 was lost (or what the service said), exiting 75; any other end
of the child is passed on as it is: its held lines, its status.

Signals: a SIGTERM to the parent alone (Kubernetes' to a container's first process) is passed to
the child; Ctrl-C in a terminal reaches both, and the parent leaves it to the child. On Linux the
child dies with the parent (PR_SET_PDEATHSIG): a kill -9 of the command ends the run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from rlver_jax.outage import EXIT_TEMPFAIL

WATCHED_ENV = "RLVER_WATCHED"  # set in the child: it is the run, not its watch
# A glog line of the runtime (severity, date, time, thread, file:line), and what may start one (a
# line cut short by a read: held until it is whole).
_GLOG = re.compile(rb"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\s:]+:\d+\] ")
_GLOG_START = re.compile(rb"[IWEF](\d|\Z)")
_SERVICE_FATAL = b"JAX distributed service detected fatal errors"
_LEADER_GONE = (b"Failed to send RPC to coordination service", b"leader task")  # the service itself is gone


class StderrFilter:
    """The child's stderr as it comes (`feed`), less the runtime's log lines held back (`finish`
    gives them); `fatal`: the runtime's fatal line, once one came."""

    def __init__(self):
        self.fatal: bytes | None = None
        self._tail = b""  # an incomplete line
        self._held: list[bytes] = []

    def feed(self, data: bytes) -> bytes:
        """What to write now of `data` (and of what came before it)."""
        *lines, self._tail = (self._tail + data).split(b"\n")
        out = [self._line(line + b"\n") for line in lines]
        if self._tail and self.fatal is None and not _GLOG_START.match(self._tail):
            out.append(self._release() + self._tail)  # a progress bar's "\r..." goes out at once
            self._tail = b""
        return b"".join(out)

    def finish(self) -> bytes:
        """Everything held back (the child has ended and no line replaces it)."""
        held, self._tail = self._release() + self._tail, b""
        return held

    @property
    def service_failed(self) -> bool:
        """The runtime ended the child for the distributed service's fatal error."""
        return self.fatal is not None and _SERVICE_FATAL in self.fatal

    @property
    def coordinator_lost(self) -> bool:
        """...because the service, which process 0 ran, stopped answering."""
        return self.service_failed and any(words in self.fatal for words in _LEADER_GONE)

    def _line(self, line: bytes) -> bytes:
        if self.fatal is None and not _GLOG.match(line):
            return self._release() + line
        self._held.append(line)
        if self.fatal is None and line[:1] == b"F":
            self.fatal = line
        return b""

    def _release(self) -> bytes:
        held, self._held = b"".join(self._held), []
        return held


def lost_line(prog: str, f: StderrFilter, coordinator: str | None, rerun: str) -> str:
    """The one line after the child died of the distributed service's fatal error."""
    if f.coordinator_lost:
        at = f" at {coordinator}" if coordinator else ""
        what = (f"process 0 (the coordinator{at}) was lost: the JAX distributed service it ran stopped answering "
                "(its process ended or its host is unreachable), and this process stopped with it")
    else:
        status = f.fatal.split(b"absl::Status: ", 1)[-1].split(b". ", 1)[0].decode(errors="replace").strip()
        what = f"JAX's distributed service stopped this process ({status}): another process failed"
    return (f"{prog}: error: {what}. Rerun the same command on every host to resume ({rerun}; exit {EXIT_TEMPFAIL}: "
            "restart the job)")


def run_watched(coordinator: str | None, rerun: str, *, keep_runtime_log: bool = False,
                command: list[str] | None = None) -> int | None:
    """In the command's own process: run the same command (`command`: another) as a child under
    the watch (module docstring) and return the status to exit with; None in the child, which runs
    the program. `coordinator`: process 0's address, for the line; `rerun`: what the line says
    resumes (the work directory); `keep_runtime_log`: write the runtime's stack too (--verbosity=1)."""
    if os.environ.get(WATCHED_ENV):
        return None
    command = command or [sys.executable, *sys.orig_argv[1:]]
    child = subprocess.Popen(command, env={**os.environ, WATCHED_ENV: "1"},
                             stderr=subprocess.PIPE, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum)),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    f, out = StderrFilter(), sys.stderr.buffer
    try:
        while chunk := os.read(child.stderr.fileno(), 1 << 16):
            out.write(f.feed(chunk))
            out.flush()
        status = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if status in (-signal.SIGABRT, 128 + signal.SIGABRT) and f.service_failed:
        if keep_runtime_log:
            out.write(f.finish())
        out.flush()
        print(lost_line(os.path.basename(sys.argv[0]), f, coordinator, rerun), file=sys.stderr, flush=True)
        return EXIT_TEMPFAIL
    out.write(f.finish())
    out.flush()
    return 128 - status if status < 0 else status


def _die_with_parent() -> None:
    """In the child, before it runs: die with SIGKILL when the parent dies (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
