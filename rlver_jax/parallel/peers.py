"""Whether the other processes of a multi-process run are still there: heartbeats through JAX's
coordination service, watched by a thread of each process.

JAX's runtime notices a lost process too, but late and loudly: a collective with a killed peer
fails with a transport error that names no process (gloo's "Connection closed by peer"), and a
frozen peer (SIGSTOP, a hung kernel, a partition: its sockets stay open) makes the survivors abort
in C++ a minute or more later, with a stack dump and a core-dump status. A cluster scheduler needs
a prompt exit with a status that means "restart me" and a line that names the cause.

Each process publishes a counter under its own key every `interval_s`; its watcher reads the
others'. A peer whose counter has not moved for `timeout_s` stopped answering (frozen or dead);
the coordinator itself (process 0, where the service lives) is lost when the service stops
answering. The watcher then calls `on_lost` once (the launch script prints its line and exits).
JAX's own heartbeat timeout is set above `timeout_s` (`runtime_heartbeat_s`), so this comes first.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

_KEY = "rlver_jax/alive/{}"


class KeyValueClient(Protocol):
    """The part of JAX's DistributedRuntimeClient the watch uses."""

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = ...) -> None: ...

    def key_value_try_get(self, key: str) -> str: ...


@dataclasses.dataclass(frozen=True)
class Lost:
    """Which processes were lost and how: "was lost: it stopped answering" (no heartbeat for the
    timeout), "was lost: its connection closed" (a collective failed) or "the coordinator stopped
    answering" (the service itself is gone)."""

    processes: tuple[int, ...]
    why: str
    silent_s: float  # how long they had been silent when the watch gave up on them


def runtime_heartbeat_s(timeout_s: float) -> int:
    """JAX's own heartbeat timeout for a watch of `timeout_s`: long enough that the watch, which
    reports in one line, always speaks first (the runtime aborts with a stack dump)."""
    return int(timeout_s) + 60


def silent_peers(last_change: Mapping[int, float], now: float, timeout_s: float) -> tuple[int, ...]:
    """The processes whose heartbeat last moved more than `timeout_s` before `now`."""
    return tuple(sorted(p for p, t in last_change.items() if now - t > timeout_s))


class PeerWatch:
    """A daemon thread that beats for `process_id` and watches the other processes of
    `num_processes` (`start`); `on_lost(Lost)` is called once, from that thread."""

    def __init__(self, client: KeyValueClient, process_id: int, num_processes: int, *, timeout_s: float,
                 on_lost: Callable[[Lost], None], interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._client, self._me, self._n = client, process_id, num_processes
        self.timeout_s = timeout_s
        self.interval_s = interval_s or min(2.0, timeout_s / 5)
        self._on_lost, self._clock = on_lost, clock
        self._beats = 0
        self._seen: dict[int, str | None] = {p: None for p in range(num_processes) if p != process_id}
        self._last_change = {p: clock() for p in self._seen}
        self._service_ok = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-watch", daemon=True)
        self.lost: Lost | None = None

    def start(self) -> PeerWatch:
        self.beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> None:
        """Publish this process's next heartbeat and read the others' (one round of the thread)."""
        now = self._clock()
        try:
            self._beats += 1
            self._client.key_value_set(_KEY.format(self._me), str(self._beats), allow_overwrite=True)
            for p in self._seen:
                value = _try_get(self._client, _KEY.format(p))
                if value != self._seen[p] and value is not None:
                    self._seen[p], self._last_change[p] = value, now
            self._service_ok = now
        except Exception:  # noqa: BLE001 - the service is unreachable: judged by time below
            pass

    def check(self) -> Lost | None:
        """Who is lost now, if anyone (pure over the recorded times)."""
        now = self._clock()
        if self._me != 0 and now - self._service_ok > self.timeout_s:
            return Lost((0,), "the coordinator stopped answering", now - self._service_ok)
        if silent := silent_peers(self._last_change, now, self.timeout_s):
            return Lost(silent, "was lost: it stopped answering", max(now - self._last_change[p] for p in silent))
        return None

    def silent_now(self, within_s: float) -> tuple[int, ...]:
        """The peers silent for more than `within_s` (a few heartbeats): after a collective failed,
        the peer whose process is gone (a killed process beats no more), without waiting for the
        full timeout."""
        return silent_peers(self._last_change, self._clock(), within_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()
            if (lost := self.check()) is not None and self.lost is None:
                self.lost = lost
                self._on_lost(lost)
                return


def _try_get(client: KeyValueClient, key: str) -> str | None:
    """The value under `key`, None while a peer has not published it yet. Raises when the service
    itself cannot be reached (a missing key is a NotFound the service answered)."""
    try:
        return client.key_value_try_get(key)
    except Exception as e:  # noqa: BLE001 - the runtime's errors have no public type
        if "NOT_FOUND" in str(e).upper() or "not found" in str(e):
            return None
        raise


def describe(lost: Lost) -> str:
    """"process 1 was lost: it stopped answering (no heartbeat for 31 s)", for the launch script's line."""
    who = ", ".join(map(str, lost.processes))
    noun = "process" if len(lost.processes) == 1 else "processes"
    if lost.why.startswith("the coordinator"):
        return f"{lost.why} (process 0, no answer for {lost.silent_s:.0f} s)"
    return f"{noun} {who} {lost.why} (no heartbeat for {lost.silent_s:.0f} s)"


def coordination_client() -> Any:
    """JAX's coordination-service client of this process (after jax.distributed.initialize)."""
    from jax._src import distributed

    return distributed.global_state.client

