"""The one OpenAI-compatible chat client: the simulated user, a policy under test and the LLM judge
all talk to their servers (SGLang, vLLM, any provider) through it, and the start-up check asks it
first whether a server can serve.

One policy for every request, at most `max_concurrency` of them in flight:
- Down is waited for: a server that refuses or drops connections or answers HTTP 429/502/503/504
  (restarting, behind a proxy, throttling) is waited for as it asks (Retry-After) or with a backoff
  doubling up to `backoff_max_s`, one request at a time trying it, for at most `outage_budget_s`
  (rlver_jax.outage); past it OutageError, whose exit status (75) says "rerun to resume". The
  requests are not given up meanwhile: a dialogue goes on where it was.
- Slow is not down: a request unanswered after `timeout_s` asks the server whether it is there
  (GET /models). While it answers, the request goes on waiting (it is never sent again while the
  server may still be working on it) and the bound on requests in flight halves; a server that
  answers neither is down, as above.
- HTTP 408/409 and the other 5xx are retried with exponential backoff and jitter up to
  `max_retries` times (but 501/505: the server does not speak this API).
The bound on requests in flight adapts (`inflight.aimd`): it halves when the server shows itself
overloaded (a request past `timeout_s`, HTTP 429/503) and grows back as answers come. HTTP 400,
413 and 422 are about the one request (too long for the model's context, a content filter):
RequestRejectedError, which a caller may record against that request and go on (the simulator
marks the dialogue `simulator_error`, the judge records a judge error). Any other HTTP error (wrong
model name, missing or rejected key) stops the run at once with the fix. All raise
EndpointUnavailableError (RequestRejectedError and OutageError are ones). What a caller does with
a bad answer (the simulator's re-sampling, the judge's re-asking) is its own business.

Clients built from equal ClientSettings share one bound on requests in flight, and one outage,
across threads and event loops (training's in-loop evaluation and its rollout producer talk to one
simulator). Retries and changes of the bound are logged, each at most once per `inflight.LOG_EVERY_S`
per endpoint (how many, the last error); rlver_jax.inflight holds the bound and the counts a
progress bar shows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # openai (0.3-0.7 s to import) loads with the first request or check, so that the
    import openai  # settings of a config (ClientSettings) are checked without it (launch/train.py)

from rlver_jax.checks import check_ranges, named
from rlver_jax.inflight import LOG_EVERY_S, EndpointBound, Slot, notify, shared_bound
from rlver_jax.outage import (
    DEFAULT_BUDGET_S,
    EXIT_TEMPFAIL,
    OUTAGE_STATUS,
    REPORT_EVERY_S,
    Outage,
    field,
    retry_after_s,
    span,
)

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409})  # and every 5xx but _NOT_THIS_API and OUTAGE_STATUS
_NOT_THIS_API = frozenset({501, 505})  # not implemented: retrying cannot help
_REQUEST_STATUS = frozenset({400, 413, 422})  # about this request: context length, content filter, ...
_CHECK_TIMEOUT_S = 30.0  # the start-up check waits at most this long
_ALIVE_MIN_S = 5.0  # whether a server is there, asked after timeout_s, gets at least this long (a loaded host)
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_START_HINT = ("Start an OpenAI-compatible server for the model (e.g. `python -m sglang.launch_server "
               "--model-path MODEL --port PORT`)")


class EndpointUnavailableError(RuntimeError):
    """The server is down, refuses the key, or does not serve the model (after retries)."""


class OutageError(EndpointUnavailableError):
    """The server stayed down or throttled past its outage budget (rlver_jax.outage). A run that
    stops on it keeps what it finished and exits with `exit_status`: the same command resumes."""

    exit_status = EXIT_TEMPFAIL


def restated(error: EndpointUnavailableError, message: str) -> EndpointUnavailableError:
    """`error` told again as `message` (with what is saved and how to resume), keeping its exit
    status: an OutageError stays one."""
    return (OutageError if isinstance(error, OutageError) else EndpointUnavailableError)(message)


class _NoAnswer(Exception):
    """A request unanswered past timeout_s, and the server does not answer GET /models either."""


class _GateClosed(Exception):
    """The endpoint went down while this request waited for its slot: it waits again, unsent."""


class ResponseFormatRejectedError(EndpointUnavailableError):
    """The server refused a request for its `response_format` (structured outputs unsupported)."""


def _rejects_response_format(e: openai.APIStatusError) -> bool:
    """An HTTP error whose message is about the structured-output parameter, whatever its status
    (OpenAI: 400 "Invalid parameter: 'response_format'...", TGI: "unknown variant `json_schema`",
    llama-cpp-python: 500, a validation error naming `response_format`); a 400/422/501 that names
    a "schema" or "grammar" is one too."""
    message = str(e.message).lower()
    if any(word in message for word in ("response_format", "json_schema")):
        return True
    return e.status_code in (400, 422, 501) and any(word in message for word in ("schema", "grammar"))


class RequestRejectedError(EndpointUnavailableError):
    """The server refused this one request (HTTP 400, 413 or 422: too long for the model's context,
    stopped by a content filter, ...); other requests may well succeed."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def api_key(env_var: str) -> str:
    """The key in $env_var; local servers need none, and the client wants a non-empty string."""
    return (os.environ.get(env_var, "") if env_var else "") or "EMPTY"


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """Where one chat endpoint is and how to call it; `flag_prefix` + a field name is the flag that
    sets it (e.g. "--config.simulator." or "--"), so every error names what to change."""

    name: str  # who answers, for messages: "simulator", "policy endpoint", "judge"
    flag_prefix: str
    base_url: str
    model: str  # the served model name
    api_key_env: str  # environment variable holding the key; "" or unset: no key
    timeout_s: float  # after this long without an answer, is the server there (GET /models)? then wait on
    max_concurrency: int  # requests in flight at once, shared by every caller of the client
    max_retries: int  # retries after HTTP 408/409 or a 5xx other than 502/503/504
    backoff_initial_s: float = 1.0  # first retry waits about this long, doubling each time
    backoff_max_s: float = 30.0  # cap of one wait
    outage_budget_s: float = DEFAULT_BUDGET_S  # wait this long for a server that is down or throttling

    def __post_init__(self):
        # Errors name the config field ("config.simulator.timeout_s") or the flag ("--timeout_s").
        check_ranges(named(self, field(self, ""), ("max_concurrency", "max_retries", "backoff_initial_s",
                                                   "backoff_max_s", "timeout_s", "outage_budget_s")),
                     lowest={"max_concurrency": 1, "max_retries": 0, "backoff_initial_s": 0, "backoff_max_s": 0,
                             "outage_budget_s": 0},
                     positive=("timeout_s",))

    @classmethod
    def from_config(cls, section: Any, *, name: str, flag_prefix: str,
                    max_concurrency: int | None = None) -> ClientSettings:
        """The endpoint fields of a config section (config.simulator, config.policy) or of any
        settings with those fields (the judge's); `max_concurrency` in place of the section's. A
        section without `outage_budget_s` (config.policy, the judge's) waits DEFAULT_BUDGET_S."""
        return cls(name=name, flag_prefix=flag_prefix, base_url=section.base_url, model=section.model,
                   api_key_env=section.api_key_env, timeout_s=section.timeout_s,
                   max_concurrency=section.max_concurrency if max_concurrency is None else max_concurrency,
                   max_retries=section.max_retries, backoff_initial_s=section.backoff_initial_s,
                   backoff_max_s=section.backoff_max_s,
                   outage_budget_s=getattr(section, "outage_budget_s", DEFAULT_BUDGET_S))


@dataclasses.dataclass(frozen=True)
class Completion:
    text: str  # "" when the server sent no choice or no content
    finish_reason: str | None  # "stop", "length", ...; None without a choice


def _sendable(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The messages with lone surrogates (text read back from JSON escapes) replaced by U+FFFD: a
    request body must be UTF-8, and the HTTP client would fail on them."""
    if not any(_LONE_SURROGATE.search(m.get("content") or "") for m in messages):
        return messages
    return [{**m, "content": _LONE_SURROGATE.sub("\ufffd", m["content"])} if m.get("content") else m
            for m in messages]


class ChatClient:
    """Chat completions under the retry policy of the module docstring.

    The HTTP client belongs to one event loop; a caller that runs successive asyncio.run() calls
    gets a fresh one per loop, so one ChatClient may outlive many loops. The bound on requests in
    flight is shared with every client of equal settings, in any thread.
    """

    def __init__(self, settings: ClientSettings):
        self.settings = settings
        self._rng = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._limit = shared_bound(settings)

    def _connection(self) -> tuple[openai.AsyncOpenAI, EndpointBound]:
        import openai

        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            s = self.settings
            # No read timeout: a request past timeout_s is ours to judge (`_answer`); retries are ours.
            self._client = openai.AsyncOpenAI(base_url=s.base_url, api_key=api_key(s.api_key_env),
                                              timeout=openai.Timeout(None, connect=min(s.timeout_s, _CHECK_TIMEOUT_S)),
                                              max_retries=0)
            self._loop = loop
        return self._client, self._limit

    def _backoff_s(self, attempt: int) -> float:
        """The wait after failed attempt `attempt` (0-based): doubling, capped, jittered to 50-100%."""
        s = self.settings
        return min(s.backoff_max_s, s.backoff_initial_s * 2**attempt) * self._rng.uniform(0.5, 1.0)

    def _log_retry(self, error: Exception) -> None:
        """Count a retry; say so at once for the first, then at most every LOG_EVERY_S."""
        limit, now = self._limit, time.monotonic()
        limit.retried += 1
        limit.unlogged += 1
        limit.last_error = _describe(error)
        notify()
        if now - limit.last_log >= LOG_EVERY_S:
            s = self.settings
            log.warning("%s at %s: %d request(s) retried since the last report (%d in flight of at most %d now, "
                        "%d answered, %d retries in all); last error: %s. Each request is retried up to %d times "
                        "(%smax_retries)", s.name, s.base_url, limit.unlogged, limit.in_flight, int(limit.limit),
                        limit.answered, limit.retried, limit.last_error, s.max_retries, s.flag_prefix)
            limit.unlogged, limit.last_log = 0, now

    async def complete(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int,
                       response_format: dict | None = None) -> Completion:
        """One answer of the model, however long the server is slow, and while it is down or
        throttled for at most outage_budget_s (then OutageError); EndpointUnavailableError once
        retrying cannot help (RequestRejectedError when the server refused this request only,
        ResponseFormatRejectedError when it refused `response_format`, sent when given)."""
        import openai

        messages = _sendable(messages)
        client, limit = self._connection()
        s, outage = self.settings, limit.outage
        body = dict(model=s.model, messages=messages, temperature=temperature, max_tokens=max_tokens,
                    **({} if response_format is None else {"response_format": response_format}))
        attempt = 0
        while True:
            await _wait_for(outage)
            sent_at = outage.now()
            try:
                async with limit.slot() as held:
                    if outage.wait_s() > 0:  # the endpoint went down while this request waited for its slot
                        raise _GateClosed
                    sent_at = held.sent_at = outage.now()
                    return _completion(await self._answer(client, body, held), s)
            except _GateClosed:
                continue
            except (openai.APIConnectionError, openai.APIStatusError, _NoAnswer) as e:
                error: Exception = e
            self._refuse(error, response_format)
            if _is_outage(error):
                outage.failed(_describe(error), _retry_after(error), sent_at)
                limit.retried += 1
                notify()
                continue
            if attempt >= s.max_retries:
                raise EndpointUnavailableError(
                    f"{s.name} at {s.base_url} failed {s.max_retries + 1} times; last error: {error!r}. Is the "
                    f"server up and working? ({s.flag_prefix}max_retries={s.max_retries})") from error
            self._log_retry(error)
            await asyncio.sleep(self._backoff_s(attempt))
            attempt += 1

    def _refuse(self, error: Exception, response_format: dict | None) -> None:
        """Raise the error of an HTTP status that retrying cannot help."""
        import openai

        if not isinstance(error, openai.APIStatusError):
            return
        s, status = self.settings, error.status_code
        if response_format is not None and _rejects_response_format(error):
            raise ResponseFormatRejectedError(
                f"{s.name} at {s.base_url} refused response_format (HTTP {status}: {error.message})") from error
        if status in _NOT_THIS_API or (status not in _RETRY_STATUS | OUTAGE_STATUS and status < 500):
            message = (f"{s.name} at {s.base_url} refused the request with HTTP {status}: {error.message}. "
                       f"{_refusal_hint(s, status)}")
            if status in _REQUEST_STATUS:
                raise RequestRejectedError(message, status) from error
            raise EndpointUnavailableError(message) from error

    async def _answer(self, client: openai.AsyncOpenAI, body: dict, held: Slot) -> bytes:
        """The body of the server's answer to `body`. Past each timeout_s without one, the server is
        asked whether it is there: while it is, the request waits on (slow is not down; `held`
        tells the bound to send fewer meanwhile), up to outage_budget_s; when it is not, _NoAnswer."""
        s, outage = self.settings, self._limit.outage
        # post(), not chat.completions.create(): create() first walks the messages through openai's
        # type transform (~6 ms of CPU for a 20-message dialogue), and the body is read as JSON, not
        # built into openai's ChatCompletion model (~0.3 ms): CPU on the one event loop thread every
        # dialogue's requests share.
        task = asyncio.ensure_future(client.post("/chat/completions", body=body, cast_to=bytes))
        started = outage.now()
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=s.timeout_s)
                if done:
                    return task.result()
                waited = outage.now() - started
                if not await self._alive(client):
                    raise _NoAnswer(f"no answer within {span(waited)}, and none to GET /models either")
                if waited >= s.outage_budget_s:
                    raise OutageError(f"{s.name} at {s.base_url} has not answered a request for {span(waited)} "
                                      f"though it answers GET /models: past the outage budget "
                                      f"({field(s, 'outage_budget_s')}={s.outage_budget_s:g})")
                held.slow()
                self._log_slow(waited)
        finally:
            if not task.done():
                task.cancel()

    async def _alive(self, client: openai.AsyncOpenAI) -> bool:
        """Whether the server answers GET /models (with anything, even a refusal) within timeout_s
        (5 s at least, 30 s at most); an answer within the last such interval counts."""
        import openai

        outage, wait = self._limit.outage, min(max(self.settings.timeout_s, _ALIVE_MIN_S), _CHECK_TIMEOUT_S)
        if outage.now() - outage.alive_at < wait:
            return True
        try:
            await client.get("/models", cast_to=bytes, options={"timeout": wait})
        except openai.APIStatusError:
            pass  # it answered, if only to refuse
        except openai.APIConnectionError:
            return False
        outage.heard()
        return True

    def _log_slow(self, waited: float) -> None:
        """Say, at most every LOG_EVERY_S, that a request waits on a server that is there."""
        limit, now = self._limit, time.monotonic()
        if now - limit.last_slow_log < LOG_EVERY_S:
            return
        limit.last_slow_log = now
        s = self.settings
        log.warning("%s at %s: a request has waited %s (%stimeout_s=%g); the server answers GET /models, so it is "
                    "slow, not down: the request waits on (not sent twice) and fewer are sent meanwhile (%d in "
                    "flight now)", s.name, s.base_url, span(waited), s.flag_prefix, s.timeout_s, limit.in_flight)

    async def aclose(self) -> None:
        # A client of an earlier, finished event loop cannot be closed from this one; its
        # connections went with that loop.
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.close()
        self._loop = self._client = None


def _completion(raw: bytes, s: ClientSettings) -> Completion:
    """The first choice of a chat completion's JSON body; EndpointUnavailableError when the body is
    none (a proxy's page, another API)."""
    try:
        choices = json.loads(raw)["choices"]
        if not choices:
            return Completion("", None)
        choice = choices[0]
        return Completion((choice.get("message") or {}).get("content") or "", choice.get("finish_reason"))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise EndpointUnavailableError(
            f"{s.name} at {s.base_url} answered with a body that is no chat completion: {raw[:200]!r}. Point "
            f"{s.flag_prefix}base_url at an OpenAI-compatible server (its URL usually ends in /v1).") from e


async def _wait_for(outage: Outage) -> None:
    """Wait while the endpoint is down and its gate closed (a line every REPORT_EVERY_S); OutageError
    once the outage budget is spent or the server asks to wait past it."""
    while True:
        if (why := outage.exhausted()) is not None:
            raise OutageError(why)
        wait = outage.wait_s()
        if wait <= 0:
            return
        outage.report()
        await asyncio.sleep(min(wait, REPORT_EVERY_S))


def _is_outage(error: Exception) -> bool:
    """Down or throttled: no connection, no answer at all, or HTTP 429/502/503/504."""
    import openai

    return isinstance(error, (openai.APIConnectionError, _NoAnswer)) or (
        isinstance(error, openai.APIStatusError) and error.status_code in OUTAGE_STATUS)


def _retry_after(error: Exception) -> float | None:
    """The seconds an HTTP error's response asks to wait (Retry-After), None when it asks nothing."""
    import openai

    if isinstance(error, openai.APIStatusError):
        return retry_after_s(error.response.headers, time.time())
    return None


def _describe(error: Exception) -> str:
    import openai

    if isinstance(error, openai.APITimeoutError):
        return "no connection within the timeout"
    if isinstance(error, openai.APIStatusError):
        return f"HTTP {error.status_code}: {error.message}"
    if isinstance(error, openai.APIConnectionError):
        return f"connection failed ({error.__cause__ or error})"
    if isinstance(error, _NoAnswer):
        return str(error)
    return f"{error.__class__.__name__}: {error}"


def _refusal_hint(s: ClientSettings, status: int) -> str:
    if status in _NOT_THIS_API:
        return (f"The server does not implement the OpenAI chat API: point {s.flag_prefix}base_url at an "
                "OpenAI-compatible server (its URL usually ends in /v1).")
    if status in _REQUEST_STATUS:
        return ("Only this request was refused (e.g. too long for the model's context, or stopped by a content "
                f"filter). Check {s.flag_prefix}model ({s.model!r}) and the API key in ${s.api_key_env} if every "
                "request is.")
    if status in (401, 403):
        return (f"Put the key in the environment variable ${s.api_key_env} (named by {s.flag_prefix}api_key_env) "
                f"or fix {s.flag_prefix}base_url.")
    if status == 404:
        return f"Check {s.flag_prefix}model ({s.model!r}) and {s.flag_prefix}base_url."
    return f"Check {s.flag_prefix}model ({s.model!r}) and the API key in ${s.api_key_env}."


def served_models(s: ClientSettings) -> list[str] | None:
    """The model ids the server at s.base_url lists now (GET /models), for the record of what
    answered (rlver_jax.eval.protocol); None when it does not answer or list them."""
    import openai

    client = openai.OpenAI(base_url=s.base_url, api_key=api_key(s.api_key_env),
                           timeout=min(s.timeout_s, _CHECK_TIMEOUT_S), max_retries=0)
    try:
        return [m.id for m in client.models.list()]
    except openai.OpenAIError:
        return None
    finally:
        client.close()


def check_chat_endpoint(s: ClientSettings, *, start_hint: str = _START_HINT, wait: bool = False) -> None:
    """Before a run: one GET /models. Raises EndpointUnavailableError naming the flags to fix when no
    server listens (and how to start one), rejects the key, or lists models without ours. A server
    that takes the connection but does not answer in time is busy or still loading, not down: a
    warning says so and the run goes on. With `wait` (a run started before: its rerun after an
    outage) a server that is down or throttled is waited for as requests wait for it, up to
    outage_budget_s (then OutageError, exit status 75)."""
    import openai

    client = openai.OpenAI(base_url=s.base_url, api_key=api_key(s.api_key_env),
                           timeout=min(s.timeout_s, _CHECK_TIMEOUT_S), max_retries=0)
    prefix, base_url = s.flag_prefix, s.base_url
    try:
        served = _models(client, Outage(s) if wait else None)
    except openai.APITimeoutError:
        log.warning("%s at %sbase_url=%s took the connection but did not answer GET /models within %g s: it is "
                    "up but busy (serving other requests) or still loading the model. Going on: a request waits "
                    "as long as the server is there", s.name, prefix, base_url, min(s.timeout_s, _CHECK_TIMEOUT_S))
        return
    except openai.APIConnectionError as e:
        raise EndpointUnavailableError(
            f"no server answers at {prefix}base_url={base_url} ({e.__cause__ or e.__class__.__name__}). {start_hint}, "
            f"or point {prefix}base_url at a running one") from e
    except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
        raise EndpointUnavailableError(
            f"the server at {base_url} rejected the API key (HTTP {e.status_code}); put the key in the "
            f"environment variable ${s.api_key_env} (named by {prefix}api_key_env)") from e
    except openai.NotFoundError:
        return  # up, but it does not list its models: nothing more to check
    except openai.APIStatusError as e:
        raise EndpointUnavailableError(f"the server at {base_url} answered HTTP {e.status_code}: {e.message}") from e
    finally:
        client.close()
    if served and s.model not in served:
        raise EndpointUnavailableError(
            f"the server at {base_url} serves {served}, not {prefix}model={s.model!r}; set it to one of those")


def _models(client: openai.OpenAI, outage: Outage | None) -> list[str]:
    """The model ids GET /models lists; with `outage`, while the server is down or throttled it is
    asked again as the outage paces it (OutageError past its budget)."""
    import openai

    while True:
        sent = time.monotonic()
        try:
            served = [m.id for m in client.models.list()]
            if outage is not None:
                outage.answered()  # says so, after an outage
            return served
        except (openai.APIConnectionError, openai.APIStatusError) as e:
            if outage is None or isinstance(e, openai.APITimeoutError) or not _is_outage(e):
                raise
            outage.failed(_describe(e), _retry_after(e), sent)
        while (why := outage.exhausted()) is None and (wait := outage.wait_s()) > 0:
            outage.report()
            time.sleep(min(wait, REPORT_EVERY_S))
        if why is not None:
            raise OutageError(why)
