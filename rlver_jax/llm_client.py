"""The one OpenAI-compatible chat client: the simulated user, a policy under test and the LLM judge
all talk to their servers (SGLang, vLLM, any provider) through it, and the start-up check asks it
first whether a server can serve.

One policy for every request: at most `max_concurrency` requests in flight, a per-request
timeout, and up to `max_retries` retries with exponential backoff and jitter on connection errors,
timeouts, HTTP 408/409/429 and 5xx (but 501/505: the server does not speak this API). The bound on
requests in flight adapts (`inflight.aimd`): it halves when timeouts or HTTP 429/503 show the server
overloaded and grows back as answers come, so a server that answers one request at a time is not
sent 64 that time out in its queue; a retry after a timeout waits at least `timeout_s`. HTTP 400,
413 and 422 are about the one request (too long for the model's context, stopped by a content
filter, a value the server rejects): RequestRejectedError, which a caller may record against that
request and go on (the simulator marks the dialogue `simulator_error`, the judge records a judge
error). Any other HTTP error (wrong model name, missing or rejected key) is a configuration error
that stops the run at once with the fix. All raise EndpointUnavailableError (RequestRejectedError
is one): a caller that does not handle a rejection stops. What a caller does with a bad answer
(the simulator's re-sampling, the judge's re-asking) is its own business.

Clients built from equal ClientSettings share one bound on requests in flight across threads and
event loops (training's in-loop evaluation and its rollout producer talk to one simulator). Retries
and changes of the bound are logged, each at most once per `inflight.LOG_EVERY_S` per endpoint (how
many, the last error); rlver_jax.inflight holds the bound and the counts a progress bar shows.
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
from rlver_jax.inflight import LOG_EVERY_S, EndpointBound, notify, shared_bound

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 429})  # and every 5xx but _NOT_THIS_API
_NOT_THIS_API = frozenset({501, 505})  # not implemented: retrying cannot help
_REQUEST_STATUS = frozenset({400, 413, 422})  # about this request: context length, content filter, ...
_CHECK_TIMEOUT_S = 30.0  # the start-up check waits at most this long
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_START_HINT = ("Start an OpenAI-compatible server for the model (e.g. `python -m sglang.launch_server "
               "--model-path MODEL --port PORT`)")


class EndpointUnavailableError(RuntimeError):
    """The server is down, refuses the key, or does not serve the model (after retries)."""


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
    timeout_s: float  # per request
    max_concurrency: int  # requests in flight at once, shared by every caller of the client
    max_retries: int  # retries after a connection error, a timeout, 408/409/429 or 5xx
    backoff_initial_s: float = 1.0  # first retry waits about this long, doubling each time
    backoff_max_s: float = 30.0  # cap of one wait

    def __post_init__(self):
        # Errors name the config field ("config.simulator.timeout_s") or the flag ("--timeout_s").
        where = self.flag_prefix.removeprefix("--") if self.flag_prefix.startswith("--config.") else self.flag_prefix
        check_ranges(named(self, where, ("max_concurrency", "max_retries", "backoff_initial_s", "backoff_max_s",
                                         "timeout_s")),
                     lowest={"max_concurrency": 1, "max_retries": 0, "backoff_initial_s": 0, "backoff_max_s": 0},
                     positive=("timeout_s",))

    @classmethod
    def from_config(cls, section: Any, *, name: str, flag_prefix: str,
                    max_concurrency: int | None = None) -> ClientSettings:
        """The endpoint fields of a config section (config.simulator, config.policy) or of any
        settings with those fields (the judge's); `max_concurrency` in place of the section's."""
        return cls(name=name, flag_prefix=flag_prefix, base_url=section.base_url, model=section.model,
                   api_key_env=section.api_key_env, timeout_s=section.timeout_s,
                   max_concurrency=section.max_concurrency if max_concurrency is None else max_concurrency,
                   max_retries=section.max_retries, backoff_initial_s=section.backoff_initial_s,
                   backoff_max_s=section.backoff_max_s)


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
            self._client = openai.AsyncOpenAI(base_url=s.base_url, api_key=api_key(s.api_key_env),
                                              timeout=s.timeout_s, max_retries=0)  # retries are ours
            self._loop = loop
        return self._client, self._limit

    def _backoff_s(self, attempt: int, error: Exception) -> float:
        """The wait after failed attempt `attempt` (0-based): doubling, capped, jittered to 50-100%.
        After a timeout at least timeout_s: a server that cannot cancel the abandoned request (most
        cannot) may work on it about as long as it kept it queued, and a retry sent at once would
        queue behind it and hand the server the same work twice."""
        import openai

        s = self.settings
        wait = min(s.backoff_max_s, s.backoff_initial_s * 2**attempt)
        if isinstance(error, openai.APITimeoutError):
            wait = max(wait, s.timeout_s)
        return wait * self._rng.uniform(0.5, 1.0)

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
                        "%d answered, %d retries in all); last error: %s. Slow is not down: each request may take "
                        "up to %s s (%stimeout_s) and is retried up to %d times", s.name, s.base_url,
                        limit.unlogged, limit.in_flight, int(limit.limit), limit.answered, limit.retried,
                        limit.last_error, s.timeout_s, s.flag_prefix, s.max_retries)
            limit.unlogged, limit.last_log = 0, now

    async def complete(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int,
                       response_format: dict | None = None) -> Completion:
        """One answer of the model; EndpointUnavailableError once retrying cannot help
        (RequestRejectedError when the server refused this request only, ResponseFormatRejectedError
        when it refused `response_format`, sent when given)."""
        import openai

        messages = _sendable(messages)
        client, limit = self._connection()
        s = self.settings
        body = dict(model=s.model, messages=messages, temperature=temperature, max_tokens=max_tokens,
                    **({} if response_format is None else {"response_format": response_format}))
        for attempt in range(s.max_retries + 1):
            try:
                async with limit.slot():
                    # post(), not chat.completions.create(): create() first walks the messages
                    # through openai's type transform (~6 ms of CPU for a 20-message dialogue),
                    # and the body is read as JSON, not built into openai's ChatCompletion model
                    # (~0.3 ms): CPU on the one event loop thread every dialogue's requests share.
                    raw = await client.post("/chat/completions", body=body, cast_to=bytes)
                return _completion(raw, s)
            except openai.APIConnectionError as e:  # includes timeouts
                error: Exception = e
            except openai.APIStatusError as e:
                status = e.status_code
                if response_format is not None and _rejects_response_format(e):
                    raise ResponseFormatRejectedError(
                        f"{s.name} at {s.base_url} refused response_format (HTTP {status}: {e.message})") from e
                if status in _NOT_THIS_API or (status not in _RETRY_STATUS and status < 500):
                    message = (f"{s.name} at {s.base_url} refused the request with HTTP {status}: {e.message}. "
                               f"{_refusal_hint(s, status)}")
                    if status in _REQUEST_STATUS:
                        raise RequestRejectedError(message, status) from e
                    raise EndpointUnavailableError(message) from e
                error = e
            if attempt < s.max_retries:
                self._log_retry(error)
                await asyncio.sleep(self._backoff_s(attempt, error))
        raise EndpointUnavailableError(
            f"{s.name} at {s.base_url} failed {s.max_retries + 1} times; last error: {error!r}. Is the server "
            f"up and keeping pace? ({s.flag_prefix}timeout_s={s.timeout_s}, at most {s.max_concurrency} "
            "requests in flight)") from error

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


def _describe(error: Exception) -> str:
    import openai

    if isinstance(error, openai.APITimeoutError):
        return "no answer within the timeout"
    if isinstance(error, openai.APIStatusError):
        return f"HTTP {error.status_code}: {error.message}"
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


def check_chat_endpoint(s: ClientSettings, *, start_hint: str = _START_HINT) -> None:
    """Before a run: one GET /models. Raises EndpointUnavailableError naming the flags to fix when no
    server listens (and how to start one), rejects the key, or lists models without ours. A server
    that takes the connection but does not answer in time is busy or still loading, not down: a
    warning says so and the run goes on (its requests are retried, and the retries logged)."""
    import openai

    client = openai.OpenAI(base_url=s.base_url, api_key=api_key(s.api_key_env),
                           timeout=min(s.timeout_s, _CHECK_TIMEOUT_S), max_retries=0)
    prefix, base_url = s.flag_prefix, s.base_url
    try:
        served = [m.id for m in client.models.list()]
    except openai.APITimeoutError:
        log.warning("%s at %sbase_url=%s took the connection but did not answer GET /models within %g s: it is "
                    "up but busy (serving other requests) or still loading the model. Going on: requests wait up "
                    "to %s s each (%stimeout_s) and are retried; retries are logged", s.name, prefix, base_url,
                    min(s.timeout_s, _CHECK_TIMEOUT_S), s.timeout_s, prefix)
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
