"""The LLM user: a simulated user played by an LLM, whatever answers it (a interface.Transport: a
served model, openai_transport.OpenAITransport, or one in this process).

It renders the prompts (templates: older turns left out, long texts cut, to keep within
`max_prompt_tokens`), parses the answers (parsing), and asks again (a fresh sample) when an answer
breaks the output contract, up to `malformed_retries` times, then SimulatorOutputError. With
`cache_dir` set, answers are recorded and replayed (cache.py).

Structured outputs (`structured_output="json_schema"`): the emotion and reply steps ask for JSON
under a schema (parsing.change_schema, parsing.UTTERANCE_SCHEMA). Before the first of them, a
start-up probe (PROBE_MESSAGES: one small structured request, `_PROBE_TOKENS` tokens) finds the
spelling the transport takes (parsing.SPELLINGS: `json_schema`, then `json_object` + `schema`) while
the other dialogues wait; the one answered is kept and logged. A transport that refuses both is
reported once (a warning) and the user falls back to text answers for the rest of the run; a
later refusal of a real request (a server that changed its mind) moves on the same way and
re-sends that request. The schema's range is checked here too, whatever the server enforces.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rlver_jax.checks import check_ranges, named
from rlver_jax.llm_client import ResponseFormatRejectedError
from rlver_jax.simulator import parsing, templates
from rlver_jax.simulator.cache import CacheMissError, RequestCache
from rlver_jax.simulator.interface import EmotionJudgement, SimulatorOutputError, Transport, Utterance
from rlver_jax.simulator.state import DialogueState

log = logging.getLogger(__name__)
_T = TypeVar("_T")
Messages = list[dict[str, str]]

STRUCTURED_OUTPUTS = ("off", "json_schema")
_MIN_PROMPT_TOKENS = 1024  # below this not even the instructions and one reply fit
# The start-up probe: its answer is not read, only whether the transport takes its response_format;
# few tokens, so a slow CPU server answers it in seconds.
PROBE_MESSAGES: Messages = [{"role": "user", "content": 'Answer with {"reasoning": "", "utterance": "ok"}.'}]
_PROBE_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class LLMUserSettings:
    """How an LLM user asks: config.simulator's fields of the same names (configs/simulator.py),
    each checked here and named as config.simulator's."""

    temperature: float  # simulator sampling temperature
    max_tokens: int  # per simulator answer
    malformed_retries: int  # fresh samples after an answer breaks the format; then simulator_error
    structured_output: str  # one of STRUCTURED_OUTPUTS
    max_prompt_tokens: int  # estimated prompt tokens per request (templates.prompt_tokens)
    max_utterance_chars: int  # the simulated user's words are cut here
    cache_dir: str  # record/replay directory for simulator answers; "" = off
    cache_replay_only: bool  # answer only from cache_dir, never ask the transport

    def __post_init__(self):
        if self.cache_replay_only and not self.cache_dir:
            raise ValueError("config.simulator.cache_replay_only needs config.simulator.cache_dir")
        if self.structured_output not in STRUCTURED_OUTPUTS:
            raise ValueError(f"config.simulator.structured_output={self.structured_output!r}: use one of "
                             f"{STRUCTURED_OUTPUTS}")
        if self.max_prompt_tokens < _MIN_PROMPT_TOKENS:
            raise ValueError(f"config.simulator.max_prompt_tokens={self.max_prompt_tokens} is too small: use "
                             f"{_MIN_PROMPT_TOKENS} or more (and at most the server's context minus max_tokens)")
        check_ranges(named(self, "config.simulator.", ("temperature", "max_tokens", "malformed_retries",
                                                       "max_utterance_chars")),
                     lowest={"temperature": 0, "max_tokens": 1, "malformed_retries": 0, "max_utterance_chars": 1})

    @classmethod
    def from_config(cls, section: Any) -> LLMUserSettings:
        """The fields of `section` (config.simulator) of the same names."""
        return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls)})


class LLMUser:
    """A simulated user played by the LLM behind `transport`: a interface.Backend."""

    def __init__(self, settings: LLMUserSettings, transport: Transport):
        self.settings = settings
        self.transport = transport
        self.cache = RequestCache(settings.cache_dir) if settings.cache_dir else None
        # The response_format spelling in use (parsing.SPELLINGS); None: text answers.
        self.spelling: str | None = parsing.SPELLINGS[0] if settings.structured_output == "json_schema" else None
        # The spelling is settled once the probe found it; no probe without structured requests or a transport.
        self._settled = self.spelling is None or settings.cache_replay_only
        self._refusals: list[str] = []
        self._probing: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @property
    def structured(self) -> bool:
        return self.spelling is not None

    async def _post(self, messages: Messages, response_format: dict[str, Any] | None,
                    max_tokens: int | None = None) -> str:
        return await self.transport.complete(messages, response_format, temperature=self.settings.temperature,
                                             max_tokens=max_tokens or self.settings.max_tokens)

    async def _complete(self, messages: Messages, response_format: dict[str, Any] | None, sample: int) -> str:
        s = self.settings
        # The full request and the sample index: a retried malformed answer has its own entry.
        key = dict(model=self.transport.model, messages=messages, temperature=s.temperature,
                   max_tokens=s.max_tokens, sample=sample)
        if response_format is not None:  # text requests keep the keys they had before structured outputs
            key["response_format"] = response_format
        if self.cache is not None:
            recorded = self.cache.get(key)
            if recorded is not None:
                return recorded
            if s.cache_replay_only:
                raise CacheMissError(
                    f"no recorded simulator answer in {self.cache.directory} for this request; "
                    "run with the simulator server up and config.simulator.cache_replay_only=False"
                )
        content = await self._post(messages, response_format)
        if self.cache is not None:
            self.cache.put(key, content)
        return content

    def _refused(self, spelling: str, error: ResponseFormatRejectedError) -> None:
        """The transport refused `spelling`: try the next one, or text answers after the last."""
        if self.spelling != spelling:  # concurrent refusals of one spelling count once
            return
        self._refusals.append(f"{spelling}: {error}")
        later = parsing.SPELLINGS[parsing.SPELLINGS.index(spelling) + 1:]
        self.spelling = later[0] if later else None
        if self.spelling is None:
            log.warning("%s; config.simulator.structured_output='json_schema' falls back to text answers "
                        "for the rest of this run", "; ".join(self._refusals))

    def _probe_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._probing is None or self._probing[0] is not loop:
            self._probing = (loop, asyncio.Lock())
        return self._probing[1]

    async def _probe(self) -> None:
        """The start-up probe: one small structured request per spelling, in turn, until one is
        answered; that one is kept (logged), text answers after the last refusal."""
        while self.spelling is not None:
            spelling = self.spelling
            try:
                await self._post(PROBE_MESSAGES, parsing.response_format("utterance", parsing.UTTERANCE_SCHEMA,
                                                                         spelling), _PROBE_TOKENS)
            except ResponseFormatRejectedError as e:
                self._refused(spelling, e)
                continue
            log.info("the simulator server takes response_format type %r (start-up probe); kept for this run",
                     spelling)
            break
        self._settled = True

    async def _request(self, render: Callable[[bool], Messages], schema: tuple[str, dict[str, Any]],
                       sample: int) -> tuple[str, bool]:
        """(raw answer, whether it was asked for as JSON), after the probe."""
        if not self._settled:
            async with self._probe_lock():  # one dialogue probes; the others wait for the spelling
                if not self._settled:
                    await self._probe()
        while True:
            spelling = self.spelling
            fmt = None if spelling is None else parsing.response_format(*schema, spelling)
            try:
                return await self._complete(render(spelling is not None), fmt, sample), spelling is not None
            except ResponseFormatRejectedError as e:
                self._refused(spelling, e)

    async def _ask(self, render: Callable[[bool], Messages], schema: tuple[str, dict[str, Any]],
                   parse_text: Callable[[str], _T], parse_json: Callable[[str], _T]
                   ) -> tuple[_T, str, tuple[str, ...]]:
        """(parsed answer, raw answer, the malformed answers before it), retrying malformed answers;
        `render(structured)` gives the request, `schema` its (name, JSON schema) when structured."""
        raws: list[str] = []
        for sample in range(self.settings.malformed_retries + 1):
            raw, structured = await self._request(render, schema, sample)
            try:
                return (parse_json if structured else parse_text)(raw), raw, tuple(raws)
            except parsing.MalformedOutputError as e:
                raws.append(raw)
                error = e
        raise SimulatorOutputError(
            f"simulator answer malformed {len(raws)} times in a row (last: {error})", raws)

    def _untrusted(self, state: DialogueState, *extra: str) -> Sequence[str]:
        """The texts the prompt quotes: their echoes in an answer do not count."""
        return [m["content"] for m in state.history] + list(extra)

    async def open(self, state: DialogueState) -> Utterance:
        s = self.settings
        parsed, raw, rejected = await self._ask(
            lambda structured: templates.opening_messages(state.profile, language=state.language,
                                                          difficulty=state.difficulty, structured=structured),
            ("utterance", parsing.UTTERANCE_SCHEMA),
            lambda raw: parsing.parse_response(raw, max_chars=s.max_utterance_chars),
            lambda raw: parsing.parse_response_json(raw, max_chars=s.max_utterance_chars,
                                                    placeholders=templates.json_placeholders(state.language)))
        return Utterance(parsed.utterance, parsed.thoughts, raw, len(rejected) + 1, rejected)

    async def judge(self, state: DialogueState, reply: str) -> EmotionJudgement:
        s = self.settings
        untrusted = self._untrusted(state, reply)
        parsed, raw, rejected = await self._ask(
            lambda structured: templates.emotion_messages(
                state.profile, language=state.language, difficulty=state.difficulty, emotion=state.emotion,
                history=state.history, reply=reply, structured=structured, max_prompt_tokens=s.max_prompt_tokens),
            ("emotion_change", parsing.change_schema(state.rules.max_change)),
            lambda raw: parsing.parse_change(raw, untrusted=untrusted),
            lambda raw: parsing.parse_change_json(raw,
                                                  placeholders=templates.json_placeholders(state.language)))
        return EmotionJudgement(parsed.change, parsed.thoughts, raw, len(rejected) + 1, rejected)

    async def speak(self, state: DialogueState, thoughts: str) -> Utterance:
        s = self.settings
        last = state.history[-1] if state.history else None
        last_reply = last["content"] if last is not None and last["role"] == "assistant" else ""
        untrusted = self._untrusted(state, thoughts)
        parsed, raw, rejected = await self._ask(
            lambda structured: templates.reply_messages(
                state.profile, language=state.language, difficulty=state.difficulty, band=state.band,
                thoughts=thoughts, history=state.history, structured=structured,
                max_prompt_tokens=s.max_prompt_tokens),
            ("utterance", parsing.UTTERANCE_SCHEMA),
            lambda raw: parsing.parse_response(raw, untrusted=untrusted, last_reply=last_reply,
                                               max_chars=s.max_utterance_chars),
            lambda raw: parsing.parse_response_json(raw, last_reply=last_reply, max_chars=s.max_utterance_chars,
                                                    placeholders=templates.json_placeholders(state.language)))
        return Utterance(parsed.utterance, parsed.thoughts, raw, len(rejected) + 1, rejected)

    async def aclose(self) -> None:
        await self.transport.aclose()
