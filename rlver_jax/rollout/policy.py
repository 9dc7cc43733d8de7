"""Policies that write one dialogue turn for a batch of dialogues: the `Policy` protocol, its
requests and turns, and `OpenAIPolicy`, which asks any OpenAI-compatible chat endpoint (text out,
for scoring served or API models on the same footing). The JAX policy on the trainer's
parameters is rollout.jax_policy.JaxPolicy; nothing here imports JAX, so an evaluation of served
models starts without it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Protocol

from rlver_jax.llm_client import ChatClient, ClientSettings


@dataclasses.dataclass(frozen=True)
class TurnRequest:
    prompt_ids: list[int] | None  # the ChatML history plus "<|im_start|>assistant\n" (token policies)
    messages: list[dict[str, str]]  # the same history as messages (text policies)
    max_new_tokens: int
    # Identity of the dialogue, so a policy can keep its KV cache from turn to turn: `session`
    # (a group of dialogues generated together), `slot` (its row there), `episode` (unique id).
    session: int = 0
    slot: int = 0
    episode: int = 0
    # What the turn's randomness is a function of (with the policy's key): the dialogue's index
    # in its batch (EpisodeRequest.index) and the number of policy turns before this one.
    dialogue: int = 0
    turn: int = 0
    # The parameter version that should write the turn (rollout.versions); one call holds one version.
    version: int = 0


@dataclasses.dataclass(frozen=True)
class PolicyTurn:
    text: str  # the whole sampled turn as text (thinking included), without the stop token
    token_ids: list[int] | None = None  # sampled ids, ending with the stop id when `stopped`
    logprobs: list[float] | None = None  # log-probs of token_ids under the model (temperature 1)
    stopped: bool = True  # ended by a stop token (False: cut by the token budget)
    reencoded: bool = False  # its history did not fit the KV cache kept between turns: encoded afresh
    # The parameter version that wrote it, where the policy resolved the request's to a published
    # one (rollout.buffer.RolloutBuffer.resolve); None: the request's version.
    version: int | None = None


class Policy(Protocol):
    """A policy may also say `continuous = True`: it schedules turns itself, so each dialogue's turn
    goes straight to `act` (rollout.episodes; without the attribute, calls are formed from the
    dialogues then waiting, rollout.ready_batches)."""

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        """One turn for each request (all of one session and one version)."""

    def release(self, session: int) -> None:
        """The dialogues of `session` are over: drop anything kept for them."""


class OpenAIPolicy:
    """A policy served behind an OpenAI-compatible chat API (vLLM, SGLang, a provider), called
    through rlver_jax.llm_client: its timeout, retries and bound on requests in flight."""

    def __init__(self, client: ClientSettings, *, temperature: float = 0.7, max_tokens: int = 1024):
        self.client = ChatClient(client)
        self.temperature, self.max_tokens = temperature, max_tokens

    async def _one(self, req: TurnRequest) -> PolicyTurn:
        answer = await self.client.complete(req.messages, temperature=self.temperature,
                                            max_tokens=min(self.max_tokens, req.max_new_tokens))
        return PolicyTurn(text=answer.text, stopped=answer.finish_reason != "length")

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    def release(self, session: int) -> None:
        """Nothing is kept between turns."""

    async def aclose(self) -> None:
        await self.client.aclose()

