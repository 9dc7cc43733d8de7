"""The one OpenAI-compatible chat client: the simulated user, a policy under test and the LLM judge
all talk to their servers (SGLang, vLLM, any provider) through it, and the start-up check asks it
first whether a server can serve.

One policy for every request: at most `max_concurrency` requests in flight (one asyncio.Semaphore
per client), a per-request timeout, and up to `max_retries` retries with exponential backoff and
jitter on connection errors, timeouts, HTTP 408/409/429 and 5xx. Any other HTTP error (wrong model
name, missing or rejected key) is a configuration error: it stops the run at once with the fix.
Both failures raise EndpointUnavailableError; what a caller does with a bad answer (the
simulator's re-sampling, the judge's re-asking) is its own business.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random

import openai
from openai.types.chat import ChatCompletion

_RETRY_STATUS = frozenset({408, 409, 429})  # and every 5xx
_CHECK_TIMEOUT_S = 30.0  # the start-up check waits at most this long
_START_HINT = ("Start an OpenAI-compatible server for the model (e.g. `python -m sglang.launch_server "
               "--model-path MODEL --port PORT`)")


class EndpointUnavailableError(RuntimeError):
    """The server is down, refuses the key, or does not serve the model (after retries)."""


class ResponseFormatRejectedError(EndpointUnavailableError):
    """The server refused a request for its `response_format` (structured outputs unsupported)."""


def _rejects_response_format(e: openai.APIStatusError) -> bool:
    """A 400/422/501 whose message is about the structured-output parameter (OpenAI: "Invalid
    parameter: 'response_format'...", TGI: "unknown variant `json_schema`", others: "schema" or
    "grammar")."""
    return e.status_code in (400, 422, 501) and any(
        word in str(e.message).lower() for word in ("response_format", "json_schema", "schema", "grammar"))


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
        for field, low in (("max_concurrency", 1), ("max_retries", 0)):
            if getattr(self, field) < low:
                raise ValueError(f"{self.flag_prefix}{field}={getattr(self, field)} is out of range: "
                                 f"use {low} or more")


@dataclasses.dataclass(frozen=True)
class Completion:
    text: str  # "" when the server sent no choice or no content
    finish_reason: str | None  # "stop", "length", ...; None without a choice


class ChatClient:
    """Chat completions under the retry policy of the module docstring.

    The HTTP client and the semaphore belong to one event loop; a caller that runs successive
    asyncio.run() calls gets a fresh pair per loop, so one ChatClient may outlive many loops.
    """

    def __init__(self, settings: ClientSettings):
        self.settings = settings
        self._rng = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def _connection(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            s = self.settings
            self._client = openai.AsyncOpenAI(base_url=s.base_url, api_key=api_key(s.api_key_env),
                                              timeout=s.timeout_s, max_retries=0)  # retries are ours
            self._semaphore = asyncio.Semaphore(s.max_concurrency)
            self._loop = loop
        return self._client, self._semaphore

    def _backoff_s(self, attempt: int) -> float:
        """The wait after failed attempt `attempt` (0-based): doubling, capped, jittered to 50-100%."""
        s = self.settings
        return min(s.backoff_max_s, s.backoff_initial_s * 2**attempt) * self._rng.uniform(0.5, 1.0)

    async def complete(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int,
                       response_format: dict | None = None) -> Completion:
        """One answer of the model; EndpointUnavailableError once retrying cannot help, and
        ResponseFormatRejectedError when the server refuses `response_format` (sent when given)."""
        client, semaphore = self._connection()
        s = self.settings
        body = dict(model=s.model, messages=messages, temperature=temperature, max_tokens=max_tokens,
                    **({} if response_format is None else {"response_format": response_format}))
        for attempt in range(s.max_retries + 1):
            try:
                async with semaphore:
                    # post(), not chat.completions.create(): create() first walks the messages
                    # through openai's type transform, ~6 ms of CPU for a 20-message dialogue,
                    # on the one event loop thread every dialogue's requests share.
                    answer = await client.post("/chat/completions", body=body, cast_to=ChatCompletion)
                if not answer.choices:
                    return Completion("", None)
                choice = answer.choices[0]
                return Completion(choice.message.content or "", choice.finish_reason)
            except openai.APIConnectionError as e:  # includes timeouts
                error: Exception = e
            except openai.APIStatusError as e:
                if response_format is not None and _rejects_response_format(e):
                    raise ResponseFormatRejectedError(
                        f"{s.name} at {s.base_url} refused response_format (HTTP {e.status_code}: {e.message})") from e
                if e.status_code not in _RETRY_STATUS and e.status_code < 500:
                    raise EndpointUnavailableError(
                        f"{s.name} at {s.base_url} refused the request with HTTP {e.status_code}: {e.message}. "
                        f"{_refusal_hint(s, e.status_code)}") from e
                error = e
            if attempt < s.max_retries:
                await asyncio.sleep(self._backoff_s(attempt))
        raise EndpointUnavailableError(
            f"{s.name} at {s.base_url} failed {s.max_retries + 1} times; last error: {error!r}. Is the server "
            f"up and keeping pace? ({s.flag_prefix}timeout_s={s.timeout_s}, at most {s.max_concurrency} "
            "requests in flight)") from error

    async def aclose(self) -> None:
        # A client of an earlier, finished event loop cannot be closed from this one; its
        # connections went with that loop.
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.close()
        self._loop = self._client = self._semaphore = None


def _refusal_hint(s: ClientSettings, status: int) -> str:
    if status in (401, 403):
        return (f"Put the key in the environment variable ${s.api_key_env} (named by {s.flag_prefix}api_key_env) "
                f"or fix {s.flag_prefix}base_url.")
    if status == 404:
        return f"Check {s.flag_prefix}model ({s.model!r}) and {s.flag_prefix}base_url."
    return f"Check {s.flag_prefix}model ({s.model!r}) and the API key in ${s.api_key_env}."


def check_chat_endpoint(s: ClientSettings, *, start_hint: str = _START_HINT) -> None:
    """Before a run: one GET /models. Raises EndpointUnavailableError naming the flags to fix when the
    server does not answer (and how to start one), rejects the key, or lists models without ours."""
    client = openai.OpenAI(base_url=s.base_url, api_key=api_key(s.api_key_env),
                           timeout=min(s.timeout_s, _CHECK_TIMEOUT_S), max_retries=0)
    prefix, base_url = s.flag_prefix, s.base_url
    try:
        served = [m.id for m in client.models.list()]
    except openai.APIConnectionError as e:
        raise EndpointUnavailableError(
            f"no server answers at {prefix}base_url={base_url} ({e.__class__.__name__}). {start_hint}, "
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
