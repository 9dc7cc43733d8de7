"""The LLM simulator backend: any OpenAI-compatible chat endpoint (SGLang by default).

Requests go through llm_client.ChatClient (one semaphore shared by all dialogues of the backend,
a per-request timeout, retries with backoff on connection errors, timeouts, 408/409/429 and 5xx;
other HTTP errors stop the run at once); its EndpointUnavailableError becomes
SimulatorUnavailableError. An answer that breaks the output contract is requested again (a fresh
sample) up to `malformed_retries` times, then SimulatorOutputError. With `cache_dir` set, answers
are recorded and replayed (cache.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rlver_jax.llm_client import ChatClient, EndpointUnavailableError, RequestRejectedError
from rlver_jax.simulator import parsing, templates
from rlver_jax.simulator.backend import (EmotionJudgement, SimulatorOutputError, SimulatorRequestError,
                                         SimulatorUnavailableError, Utterance)
from rlver_jax.simulator.cache import CacheMissError, RequestCache
from rlver_jax.simulator.settings import SimulatorSettings
from rlver_jax.simulator.state import DialogueState

_T = TypeVar("_T")


class OpenAIBackend:
    """Simulated user played by an LLM."""

    def __init__(self, settings: SimulatorSettings):
        self.settings = settings
        self.client = ChatClient(settings.client)
        self.cache = RequestCache(settings.cache_dir) if settings.cache_dir else None

    async def _post(self, messages: list[dict[str, str]]) -> str:
        try:
            completion = await self.client.complete(messages, temperature=self.settings.temperature,
                                                    max_tokens=self.settings.max_tokens)
        except RequestRejectedError as e:  # this dialogue's request only: the dialogue ends, the run goes on
            raise SimulatorRequestError(str(e)) from e
        except EndpointUnavailableError as e:
            raise SimulatorUnavailableError(str(e)) from e
        # No choices or no content: an empty answer, handled as malformed by the caller.
        return completion.text

    async def _complete(self, messages: list[dict[str, str]], sample: int) -> str:
        s = self.settings
        # The full request and the sample index: a retried malformed answer has its own entry.
        key = dict(model=s.client.model, messages=messages, temperature=s.temperature,
                   max_tokens=s.max_tokens, sample=sample)
        if self.cache is not None:
            recorded = self.cache.get(key)
            if recorded is not None:
                return recorded
            if s.cache_replay_only:
                raise CacheMissError(
                    f"no recorded simulator answer in {self.cache.directory} for this request; "
                    "run with the simulator server up and config.simulator.cache_replay_only=False"
                )
        content = await self._post(messages)
        if self.cache is not None:
            self.cache.put(key, content)
        return content

    async def _ask(self, messages: list[dict[str, str]],
                   parse: Callable[[str], _T]) -> tuple[_T, str, int]:
        """(parsed answer, raw answer, samples used), retrying malformed answers."""
        raws: list[str] = []
        for sample in range(self.settings.malformed_retries + 1):
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

    async def judge(self, state: DialogueState, reply: str) -> EmotionJudgement:
        messages = templates.emotion_messages(
            state.profile, language=state.language, difficulty=state.difficulty,
            emotion=state.emotion, history=state.history, reply=reply)
        parsed, raw, n = await self._ask(messages, parsing.parse_change)
        return EmotionJudgement(parsed.change, parsed.thoughts, raw, n)

    async def speak(self, state: DialogueState, thoughts: str) -> Utterance:
        messages = templates.reply_messages(
            state.profile, language=state.language, difficulty=state.difficulty,
            band=state.band, thoughts=thoughts, history=state.history)
        parsed, raw, n = await self._ask(messages, parsing.parse_response)
        return Utterance(parsed.utterance, parsed.thoughts, raw, n)

    async def aclose(self) -> None:
        await self.client.aclose()
