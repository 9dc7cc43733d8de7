"""How many requests an endpoint has in flight: one bound per endpoint, shared across threads and
event loops, that adapts to the server's pace (`aimd`) and admits one request at a time while the
endpoint is down (its `outage`, rlver_jax.outage), and the counts a progress bar shows (`activity`,
`show_requests`). rlver_jax.llm_client sends every request under its endpoint's bound.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Protocol

from rlver_jax.outage import Outage, OutageSettings, span

log = logging.getLogger(__name__)

_CONGESTION_STATUS = frozenset({429, 503})  # with timeouts: the server is overloaded, send less
LOG_EVERY_S = 30.0  # at most one retry (or bound) log line per endpoint this often


class Endpoint(OutageSettings, Hashable, Protocol):
    """What a bound reads of its endpoint's settings (llm_client.ClientSettings); equal settings
    share one bound."""

    @property
    def max_concurrency(self) -> int: ...  # the ceiling; flag_prefix + "max_concurrency" sets it


def aimd(limit: float, in_flight: int, ceiling: int, congested: bool) -> float:
    """The next bound on requests in flight (additive increase, multiplicative decrease, as TCP's
    congestion window): a congestion signal halves what was in flight (the bound, or fewer when
    fewer were sent: RFC 5681 halves the flight size), an answer adds 1/limit (about one more
    request in flight per `limit` answers); always within [1, ceiling]."""
    if congested:
        return max(1.0, min(limit, in_flight) / 2)
    return min(float(ceiling), limit + 1 / limit)


def congestion(error: BaseException) -> bool:
    """A sign the server is overloaded: no answer within the timeout, HTTP 429 or 503."""
    import openai

    return isinstance(error, openai.APITimeoutError) or (
        isinstance(error, openai.APIStatusError) and error.status_code in _CONGESTION_STATUS)


class Slot:
    """One request's place among those in flight (`EndpointBound.slot`)."""

    def __init__(self, bound: EndpointBound, admitted: int, during_outage: bool):
        self._bound, self._admitted = bound, admitted
        self.during_outage = during_outage  # admitted while the endpoint was down: a try, not a sign of load
        self.congested = False
        self.sent_at: float | None = None  # when the request went (its outage's clock), told by the sender

    def slow(self) -> None:
        """The request has waited past timeout_s and the server is still there: it is overloaded,
        so the bound falls (once per request) while this request goes on waiting."""
        if not self.congested and not self.during_outage:
            self.congested = True
            self._bound._settle(self._admitted, congested=True)


class EndpointBound:
    """The requests in flight across threads and event loops (an asyncio.Semaphore belongs to one
    loop), first come first served, at most `limit`: it starts at max_concurrency, halves when the
    server shows congestion (timeouts, 429, 503) and grows back as answers come (`aimd`). Only a
    request admitted after the last halving can halve it again: the ones already in flight were
    sent under the old bound, and a burst of their timeouts says nothing about the new one. While
    the endpoint is down (`outage`) one request at a time tries it, and its failures leave the
    bound be. Also the endpoint's counts: in flight, answered, retried, and what the retry log has
    yet to say."""

    def __init__(self, settings: Endpoint):
        self.settings = settings
        self.outage = Outage(settings)
        self.limit = float(settings.max_concurrency)
        self.in_flight = self.answered = self.retried = 0
        self.unlogged, self.last_log, self.last_error = 0, float("-inf"), ""
        self.last_slow_log = float("-inf")  # when llm_client last said a request waits on a slow server
        self._halvings = 0  # how many times the bound was halved; a request notes it when admitted
        self._logged_limit, self._last_limit_log = settings.max_concurrency, float("-inf")
        self._lock = threading.Lock()
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = collections.deque()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Slot]:
        """Holds one of the requests in flight; what the request ends with moves the bound, and
        its answer ends an outage."""
        held = Slot(self, await self._acquire(), self.outage.down)
        try:
            yield held
        except BaseException as e:
            # Other errors (a 500, a refusal, a cancellation) leave the bound be, and so do the
            # failed tries of an outage: the outage paces them.
            if congestion(e) and not held.congested and not held.during_outage:
                self._settle(held._admitted, congested=True)
            raise
        else:
            self.answered += 1
            self.outage.answered(held.sent_at)
            self._settle(held._admitted, congested=False)  # admits the waiters an outage held back
        finally:
            self._release()

    def _capacity(self) -> int:
        """Requests that may be in flight now: one while the endpoint is down, else the bound."""
        return 1 if self.outage.down else int(self.limit)

    async def _acquire(self) -> int:
        """Waits for a free slot; returns the halvings so far."""
        loop = asyncio.get_running_loop()
        with self._lock:
            free = self.in_flight < self._capacity() and not self._waiters
            if free:
                self.in_flight += 1
                admitted = self._halvings
            else:
                waiter = (loop, loop.create_future())
                self._waiters.append(waiter)
        if free:
            notify()
            return admitted
        try:
            await waiter[1]
        except asyncio.CancelledError:
            with self._lock:
                queued = waiter in self._waiters
                if queued:
                    self._waiters.remove(waiter)
            if not queued and waiter[1].done() and not waiter[1].cancelled():
                self._release()  # the slot was handed over as the waiter was cancelled: pass it on
            raise
        return self._halvings

    def _settle(self, admitted: int, *, congested: bool) -> None:
        """Moves the bound by what a request admitted at `admitted` halvings ended with."""
        with self._lock:
            if congested and admitted < self._halvings:
                return  # sent under a bound already halved since
            self._halvings += congested
            self.limit = aimd(self.limit, self.in_flight, self.settings.max_concurrency, congested)
            self._admit()
        self._log_limit()

    def _log_limit(self) -> None:
        """Says when the whole bound changed, at most once per LOG_EVERY_S."""
        now, current = time.monotonic(), int(self.limit)
        if current == self._logged_limit or now - self._last_limit_log < LOG_EVERY_S:
            return
        s = self.settings
        log.warning("%s at %s: now at most %d request(s) in flight (was %d; %smax_concurrency=%d): the bound halves "
                    "on requests past timeout_s and HTTP 429/503 and grows back by one per that many answers", s.name,
                    s.base_url, current, self._logged_limit, s.flag_prefix, s.max_concurrency)
        self._logged_limit, self._last_limit_log = current, now

    def _release(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self._admit()
        notify()

    def _admit(self) -> None:
        """Hands free slots straight to the waiters, oldest first (under the lock)."""
        while self._waiters and self.in_flight < self._capacity():
            loop, future = self._waiters.popleft()
            try:
                loop.call_soon_threadsafe(self._hand_over, future)
            except RuntimeError:  # its event loop has closed: no one waits there any more
                continue
            self.in_flight += 1

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _hand_over(self, future: asyncio.Future) -> None:
        if future.done():  # cancelled meanwhile
            self._release()
        else:
            future.set_result(None)


# One bound per distinct endpoint settings in use; a client holds its own strongly.
_LIMITS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_LIMITS_LOCK = threading.Lock()
_LISTENERS: list[Callable[[], None]] = []


def shared_bound(settings: Endpoint) -> EndpointBound:
    with _LIMITS_LOCK:
        limit = _LIMITS.get(settings)
        if limit is None:
            limit = _LIMITS[settings] = EndpointBound(settings)
        return limit


def show_requests(bar, label: str) -> Callable[[], None]:
    """Show activity() in a tqdm `bar`'s description ("label (simulator 8 in flight, 120 done)"),
    refreshed from any thread at most twice a second as requests start and end, so a slow server
    shows as slow rather than as silence. Returns the function that stops it."""
    shown = [0.0]

    def show() -> None:
        now = time.monotonic()
        if now - shown[0] >= 0.5:
            shown[0] = now
            requests = activity()
            bar.set_description_str(f"{label} ({requests})" if requests else label)

    def stop() -> None:
        if show in _LISTENERS:
            _LISTENERS.remove(show)

    if not getattr(bar, "disable", False):
        _LISTENERS.append(show)
    return stop


def notify() -> None:
    for callback in list(_LISTENERS):
        callback()


def activity() -> str:
    """Requests of every endpoint in use, e.g. "simulator 64 in flight (30 waiting), 120 done, 2
    retried", "simulator down for 2 min 5 s, 120 done"; "" before any request."""
    with _LIMITS_LOCK:
        items = [(s.name, limit) for s, limit in _LIMITS.items()]
    parts = [f"{name} {_state(limit)}, {limit.answered} done" + (f", {limit.retried} retried" if limit.retried else "")
             for name, limit in items if limit.in_flight or limit.answered or limit.outage.down]
    return "; ".join(parts)


def _state(limit: EndpointBound) -> str:
    """"down for 2 min 5 s" while the endpoint is down, else its requests in flight and waiting."""
    if (since := limit.outage.since) is not None:
        return f"down for {span(limit.outage.now() - since)}"
    return f"{limit.in_flight} in flight" + (f" ({limit.waiting} waiting)" if limit.waiting else "")
