"""The small interface every simulator backend implements, its results and its errors, and the
transport an LLM user speaks through.

A backend turns a dialogue state (state.py) into the simulated user's judgements and words; the
emotion state machine (agent.py) decides what they mean. The backends are the rows of
backends.BACKENDS: an LLM user (llm_user.LLMUser: prompts, parsing, retries, cache) over a
`Transport` (openai_transport.OpenAITransport: an OpenAI-compatible server), and
embedded.EmbeddedBackend (deterministic rules, no network).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from rlver_jax.llm_client import EndpointUnavailableError, OutageError
from rlver_jax.simulator.state import DialogueState


@dataclasses.dataclass(frozen=True)
class EmotionJudgement:
    """Result of the emotion step."""

    change: int  # proposed emotion change, before clipping
    thoughts: str  # the simulator's analysis
    raw: str  # the raw answer that was parsed
    attempts: int = 1  # answers requested, counting malformed ones that were retried
    rejected: tuple[str, ...] = ()  # the malformed answers before `raw`, oldest first


@dataclasses.dataclass(frozen=True)
class Utterance:
    """Result of the reply or opening step."""

    text: str  # the simulated user's words
    thoughts: str
    raw: str
    attempts: int = 1
    rejected: tuple[str, ...] = ()  # the malformed answers before `raw`, oldest first


class SimulatorOutputError(RuntimeError):
    """The simulator kept answering outside the output contract; the dialogue is unusable."""

    def __init__(self, message: str, raw_outputs: list[str]):
        super().__init__(message)
        self.raw_outputs = raw_outputs  # every rejected answer, oldest first; never empty


class SimulatorRequestError(SimulatorOutputError):
    """The simulator's server refused one request of a dialogue (llm_client.RequestRejectedError:
    HTTP 400/413/422, e.g. a prompt too long for its context, a content filter). Like a malformed
    answer it ends only that dialogue, as `simulator_error`; the run goes on."""

    def __init__(self, message: str):
        super().__init__(message, [""])  # no answer came


class SimulatorUnavailableError(EndpointUnavailableError):
    """The simulator service could not be reached or refused the request (after retries)."""


class SimulatorOutageError(SimulatorUnavailableError, OutageError):
    """The simulator stayed down or throttled past config.simulator.outage_budget_s; a run stopped
    by it keeps what it finished and exits with status 75 (OutageError.exit_status): rerun to resume."""


class Backend(Protocol):
    """What the state machine asks of a simulated user.

    Each method may raise SimulatorOutputError (a malformed answer, or SimulatorRequestError for a
    refused request: the dialogue is then marked `simulator_error`) or SimulatorUnavailableError
    (the run cannot go on; it propagates; SimulatorOutageError: past the outage budget).
    """

    async def open(self, state: DialogueState) -> Utterance:
        """The user's first words, for profiles without `first_talk`."""

    async def judge(self, state: DialogueState, reply: str) -> EmotionJudgement:
        """Emotion step: how the policy's `reply` to `state.history` moves the user's mood."""

    async def speak(self, state: DialogueState, thoughts: str) -> Utterance:
        """Reply step: the user's next words; `state` already holds the reply and new emotion."""

    async def aclose(self) -> None:
        """Releases network resources."""


class Transport(Protocol):
    """Where an LLM user's requests go: a served model (openai_transport.OpenAITransport) or one
    answering in this process. The LLM user renders the prompts, parses and re-asks; a transport
    only answers."""

    model: str  # what answers: its answers are cached under this name (cache.RequestCache keys)

    async def complete(self, messages: list[dict[str, str]], response_format: dict[str, Any] | None, *,
                       temperature: float, max_tokens: int) -> str:
        """The text of one answer to the chat `messages` ("" when none came), sampled at
        `temperature`, at most `max_tokens` tokens, under `response_format` (an OpenAI
        response_format: a JSON schema; None: text). Raises SimulatorRequestError when this one
        request was refused (its dialogue ends), SimulatorUnavailableError when no answer can come
        (the run stops), and llm_client.ResponseFormatRejectedError when `response_format` is not
        taken (the LLM user asks in its next spelling, or in text)."""

    async def aclose(self) -> None:
        """Releases what it holds (connections)."""
