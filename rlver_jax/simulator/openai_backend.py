"""The LLM simulator backend: any OpenAI-compatible chat endpoint (SGLang by default).

Every request goes through one asyncio.Semaphore shared by all dialogues of the backend (bounded
concurrency), a per-request timeout, and retries with exponential backoff and jitter on
connection errors, timeouts, 408/409/429 and 5xx. Other HTTP errors (bad model name, missing API
key) are configuration errors and stop the run at once. An answer that breaks the output contract
is requested again (a fresh sample) up to `malformed_retries` times, then SimulatorOutputError.
With `cache_dir` set, answers are recorded and replayed (cache.py).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from typing import TypeVar

import openai
from ml_collections import config_dict

from rlver_jax.simulator import parsing, templates
from rlver_jax.simulator.agent import DialogueState
from rlver_jax.simulator.backend import (Judgement, SimulatorOutputError,
                                         SimulatorUnavailableError, Utterance)
from rlver_jax.simulator.cache import CacheMissError, RequestCache

_RETRY_STATUS = frozenset({408, 409, 429})
_T = TypeVar("_T")


def api_key_from_env(env_var: str) -> str:
    """The key in $env_var; local servers need none, and the client wants a non-empty string."""
    return (os.environ.get(env_var, "") if env_var else "") or "EMPTY"


class OpenAIBackend:
    """Simulated user played by an LLM; configured by the `config.simulator` section."""

    def __init__(self, cfg: config_dict.ConfigDict):
        self.base_url: str = cfg.base_url
        self.model: str = cfg.model
        self.api_key_env: str = cfg.api_key_env
        self.temperature: float = cfg.temperature
        self.max_tokens: int = cfg.max_tokens
        self.timeout_s: float = cfg.timeout_s
        self.max_concurrency: int = cfg.max_concurrency
        self.max_retries: int = cfg.max_retries
        self.backoff_initial_s: float = cfg.backoff_initial_s
        self.backoff_max_s: float = cfg.backoff_max_s
        self.malformed_retries: int = cfg.malformed_retries
        self.replay_only: bool = cfg.cache_replay_only
        if self.replay_only and not cfg.cache_dir:
            raise ValueError("config.simulator.cache_replay_only needs config.simulator.cache_dir")
        for name in ("max_concurrency", "max_retries", "malformed_retries"):
            if cfg[name] < (1 if name == "max_concurrency" else 0):
                raise ValueError(f"config.simulator.{name}={cfg[name]} is out of range")
        self.cache = RequestCache(cfg.cache_dir) if cfg.cache_dir else None
        self._rng = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def _connection(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        # The HTTP client and the semaphore belong to one event loop; a caller that runs
        # successive asyncio.run() calls gets a fresh pair per loop.
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=api_key_from_env(self.api_key_env),
                timeout=self.timeout_s, max_retries=0,  # retries are ours, with our backoff
            )
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._client, self._semaphore

    def _backoff_s(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.backoff_initial_s * 2**attempt) * self._rng.uniform(
            0.5, 1.0)

    async def _post(self, request: dict) -> str:
        client, semaphore = self._connection()
        for attempt in range(self.max_retries + 1):
            try:
                async with semaphore:
                    completion = await client.chat.completions.create(**request)
                # No choices or no content: an empty answer, handled as malformed by the caller.
                return (completion.choices[0].message.content or "") if completion.choices else ""
            except openai.APIConnectionError as e:  # includes timeouts
                error: Exception = e
            except openai.APIStatusError as e:
                if e.status_code not in _RETRY_STATUS and e.status_code < 500:
                    raise SimulatorUnavailableError(
                        f"simulator at {self.base_url} refused the request with HTTP "
                        f"{e.status_code}: {e.message}. Check config.simulator.model "
                        f"({self.model!r}) and the API key in ${self.api_key_env}."
                    ) from e
                error = e
            if attempt < self.max_retries:
                await asyncio.sleep(self._backoff_s(attempt))
        raise SimulatorUnavailableError(
            f"simulator at {self.base_url} failed {self.max_retries + 1} times; last error: "
            f"{error!r}. Is the server up and keeping pace? (config.simulator.timeout_s="
            f"{self.timeout_s}, max_concurrency={self.max_concurrency})"
        ) from error

    async def _complete(self, messages: list[dict[str, str]], sample: int) -> str:
        request = dict(model=self.model, messages=messages, temperature=self.temperature,
                       max_tokens=self.max_tokens)
        key = dict(request, sample=sample)
        if self.cache is not None:
            recorded = self.cache.get(key)
            if recorded is not None:
                return recorded
            if self.replay_only:
                raise CacheMissError(
                    f"no recorded simulator answer in {self.cache.directory} for this request; "
                    "run with the simulator server up and config.simulator.cache_replay_only=False"
                )
        content = await self._post(request)
        if self.cache is not None:
            self.cache.put(key, content)
        return content

    async def _ask(self, messages: list[dict[str, str]],
                   parse: Callable[[str], _T]) -> tuple[_T, str, int]:
        """(parsed answer, raw answer, samples used), retrying malformed answers."""
        raws: list[str] = []
        for sample in range(self.malformed_retries + 1):
            raw = await self._complete(messages, sample)
            try:
                return parse(raw), raw, sample + 1
            except parsing.MalformedOutputError as e:
                raws.append(raw)
                error = e
        raise SimulatorOutputError(
            f"simulator answer malformed {len(raws)} times in a row (last: {error})", raws)

    async def open(self, state: DialogueState) -> Utterance:
        messages = templates.opening_messages(state.profile, language=state.language,
                                              difficulty=state.difficulty)
        parsed, raw, n = await self._ask(messages, parsing.parse_response)
        return Utterance(parsed.utterance, parsed.thoughts, raw, n)

    async def judge(self, state: DialogueState, reply: str) -> Judgement:
        messages = templates.emotion_messages(
            state.profile, language=state.language, difficulty=state.difficulty,
            emotion=state.emotion, history=state.history, reply=reply)
        parsed, raw, n = await self._ask(messages, parsing.parse_change)
        return Judgement(parsed.change, parsed.thoughts, raw, n)

    async def speak(self, state: DialogueState, thoughts: str) -> Utterance:
        messages = templates.reply_messages(
            state.profile, language=state.language, difficulty=state.difficulty,
            band=state.band, thoughts=thoughts, history=state.history)
        parsed, raw, n = await self._ask(messages, parsing.parse_response)
        return Utterance(parsed.utterance, parsed.thoughts, raw, n)

    async def aclose(self) -> None:
        # A client of an earlier, finished event loop cannot be closed from this one; its
        # connections went with that loop.
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.close()
        self._loop = self._client = self._semaphore = None
