"""The small interface every simulator backend implements, its results and its errors.

A backend turns a dialogue state (state.py) into the simulated user's judgements and words; the
emotion state machine (agent.py) decides what they mean. Backends: openai_backend.OpenAIBackend
(an LLM behind an OpenAI-compatible API) and embedded.EmbeddedBackend (deterministic rules, no
network).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from rlver_jax.llm_client import EndpointUnavailableError
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


class Backend(Protocol):
    """What the state machine asks of a simulated user.

    Each method may raise SimulatorOutputError (a malformed answer, or SimulatorRequestError for a
    refused request: the dialogue is then marked `simulator_error`) or SimulatorUnavailableError
    (the run cannot go on; it propagates).
    """

    async def open(self, state: DialogueState) -> Utterance:
        """The user's first words, for profiles without `first_talk`."""

    async def judge(self, state: DialogueState, reply: str) -> EmotionJudgement:
        """Emotion step: how the policy's `reply` to `state.history` moves the user's mood."""

    async def speak(self, state: DialogueState, thoughts: str) -> Utterance:
        """Reply step: the user's next words; `state` already holds the reply and new emotion."""

    async def aclose(self) -> None:
        """Releases network resources."""
