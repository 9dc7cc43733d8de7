"""An endpoint that is down or throttled: its requests wait for it, within a budget (`Outage`).

A served simulator restarts (an SGLang host reloading a 72B model takes 5 to 15 minutes), a proxy
in front of it answers 502/503/504 meanwhile, a hosted API throttles with HTTP 429 and a
Retry-After header: none of these is a failed run. From the first such failure after an answer (a
refused or dropped connection, a status of OUTAGE_STATUS) until the next answer, the endpoint is
down:
- no request is sent before the gate opens: when the server asked (Retry-After), else after a
  backoff doubling from backoff_initial_s to backoff_max_s with each failed try;
- then one request at a time tries it (rlver_jax.inflight admits one while it is down); the first
  answer ends the outage and every waiting request goes;
- the wait is said once when it begins (what is waited for, for how long), then every
  REPORT_EVERY_S, and once more when the endpoint answers again;
- past `outage_budget_s`, or when the server asks to wait beyond it, `exhausted` says why: the
  caller stops with exit status EXIT_TEMPFAIL ("saved, rerun to resume").
The requests are not given up meanwhile: each caller's work goes on where it was.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

log = logging.getLogger(__name__)

EXIT_TEMPFAIL = 75  # sysexits.h's EX_TEMPFAIL: a temporary failure; the same command resumes
OUTAGE_STATUS = frozenset({429, 502, 503, 504})  # throttled, or a proxy whose server is gone
REPORT_EVERY_S = 120.0  # while an endpoint is down, a line this often
DEFAULT_BUDGET_S = 1800.0  # config.simulator.outage_budget_s


class OutageSettings(Protocol):
    """What an outage reads of its endpoint's settings (llm_client.ClientSettings)."""

    @property
    def name(self) -> str: ...  # who answers, for messages: "simulator"

    @property
    def base_url(self) -> str: ...

    @property
    def flag_prefix(self) -> str: ...  # "--config.simulator." or "--"

    @property
    def outage_budget_s(self) -> float: ...

    @property
    def backoff_initial_s(self) -> float: ...

    @property
    def backoff_max_s(self) -> float: ...


def field(settings: OutageSettings, name: str) -> str:
    """How messages name a setting: "config.simulator.outage_budget_s" or "--outage_budget_s"."""
    prefix = settings.flag_prefix
    return (prefix.removeprefix("--") if prefix.startswith("--config.") else prefix) + name


def span(seconds: float) -> str:
    """A duration as a person reads it: "0.3 s", "45 s", "2 min 31 s", "30 min", "1 h 05 min"."""
    if seconds < 9.95:
        return f"{max(0.0, seconds):.1f} s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min" + (f" {seconds % 60} s" if seconds % 60 else "")
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def retry_after_s(headers: Mapping[str, str], now: float) -> float | None:
    """The seconds a response asks to wait before the next request: `retry-after-ms` (OpenAI's),
    else `Retry-After` in seconds or as an HTTP date (`now`: the wall clock, time.time()); None when
    it asks for nothing readable."""
    lower = {k.lower(): v for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            value = float(lower[name]) * scale
        except (KeyError, ValueError, TypeError):
            continue
        if math.isfinite(value):
            return max(0.0, value)
    try:
        when = email.utils.parsedate_to_datetime(lower["retry-after"])
    except (KeyError, ValueError, TypeError, IndexError):
        return None
    return max(0.0, when.timestamp() - now)


def backoff_s(failures: int, initial_s: float, max_s: float) -> float:
    """The wait before the next try of an outage after `failures` failed tries: doubling, capped."""
    return min(max_s, initial_s * 2 ** failures)


class Outage:
    """One endpoint's outage state, shared by every request to it across threads (`clock`: seconds,
    monotonic; `jitter()`: a factor in [0.5, 1] for each backoff, so that many clients do not try
    at the same instant)."""

    def __init__(self, settings: OutageSettings, clock: Callable[[], float] = time.monotonic,
                 jitter: Callable[[], float] = lambda: random.uniform(0.5, 1.0)):
        self.settings = settings
        self.since: float | None = None  # when the outage began; None: the endpoint answers
        self.last_error = ""
        self.alive_at = float("-inf")  # when the server last answered anything (rlver_jax.llm_client)
        self._open_at = float("-inf")  # no request is sent before this
        self._failures = 0  # failed tries sent during this outage
        self._asked = False  # the gate is where the server asked (Retry-After)
        self._reported = float("-inf")
        self._clock, self._jitter = clock, jitter
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.since is not None

    def now(self) -> float:
        return self._clock()

    def failed(self, error: str, retry_after: float | None, sent_at: float) -> None:
        """A request sent at `sent_at` failed with `error` (a refused connection, HTTP 429/5xx as
        OUTAGE_STATUS, no answer at all); `retry_after`: the seconds the server asked to wait."""
        with self._lock:
            now = self._clock()
            first = self.since is None
            if first:
                self.since, self._failures, self._open_at, self._reported = now, 0, float("-inf"), now
            if sent_at >= self.since:  # sent while down: a try that failed (not one already in flight)
                self._failures += 1
            self.last_error = error
            if retry_after is not None:
                self._open_at, self._asked = max(self._open_at, now + retry_after), True
            else:
                s = self.settings
                wait = backoff_s(self._failures, s.backoff_initial_s, s.backoff_max_s) * self._jitter()
                until = min(now + wait, self.since + s.outage_budget_s)  # the last try at the budget's end
                if until > self._open_at:
                    self._open_at, self._asked = until, False
        if first:
            s = self.settings
            log.warning("%s at %s is down or throttled (%s): waiting for it up to %s (%s=%g), trying again %s; "
                        "the requests wait where they are and go on when it answers", s.name, s.base_url, error,
                        span(s.outage_budget_s), field(s, "outage_budget_s"), s.outage_budget_s,
                        f"in {retry_after:g} s as it asks (Retry-After)" if retry_after is not None
                        else f"after a wait doubling up to {s.backoff_max_s:g} s ({field(s, 'backoff_max_s')})")

    def heard(self) -> None:
        """The server answered something (GET /models): it is there, however slow."""
        self.alive_at = self._clock()

    def answered(self, sent_at: float | None = None) -> None:
        """The endpoint answered a request (sent at `sent_at`): the outage, if any, is over, unless
        the request was sent before it began (a throttling server finishes what it had taken)."""
        with self._lock:
            self.alive_at = self._clock()
            if self.since is not None and sent_at is not None and sent_at < self.since:
                return
            since, self.since = self.since, None
        if since is not None:
            s = self.settings
            log.warning("%s at %s answers again after %s down or throttled; going on", s.name, s.base_url,
                        span(self.alive_at - since))

    def wait_s(self) -> float:
        """Seconds until a request may be sent (0: now)."""
        with self._lock:
            return max(0.0, self._open_at - self._clock()) if self.since is not None else 0.0

    def exhausted(self) -> str | None:
        """Why the wait is over, when it is: the budget is spent, or the server asks to wait past
        it; None while there is time left (or no outage). Once it is over the outage is forgotten:
        a later request (a rerun in the same process) tries the endpoint afresh."""
        with self._lock:
            if self.since is None:
                return None
            now, s = self._clock(), self.settings
            end = self.since + s.outage_budget_s
            budget = f"{field(s, 'outage_budget_s')}={s.outage_budget_s:g}"
            if now >= end:
                why = (f"{s.name} at {s.base_url} did not answer for {span(now - self.since)}, the outage budget "
                       f"({budget}); last error: {self.last_error}")
            elif self._asked and self._open_at > end:
                why = (f"{s.name} at {s.base_url} asks to wait {span(self._open_at - now)} more (Retry-After), "
                       f"past the outage budget ({budget}; down for {span(now - self.since)}); last error: "
                       f"{self.last_error}")
            else:
                return None
            self.since = None
            return why

    def report(self) -> None:
        """While down, a line every REPORT_EVERY_S: how long so far, what failed last, how long more."""
        with self._lock:
            now = self._clock()
            if self.since is None or now - self._reported < REPORT_EVERY_S:
                return
            self._reported, since, error = now, self.since, self.last_error
        s = self.settings
        log.warning("%s at %s: still down or throttled after %s (last error: %s); waiting up to %s more", s.name,
                    s.base_url, span(now - since), error, span(since + s.outage_budget_s - now))
