"""The seam between the dialogues and what writes their policy turns: a turn's request, the turn,
the `Policy` protocol every turn writer keeps (a rollout engine, a served policy under evaluation),
and the `Engine` protocol of the rollout engines (rlver_jax.engines.table: one row each), which
also take the trainer's weights. No JAX: the served policy and the config checks import it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from rlver_jax.engines.published import Published


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
    """What writes a dialogue's policy turns. How the turns reach it is the caller's to know
    (rollout.episodes.RolloutSettings.continuous: a rollout engine's row says it)."""

    async def act(self, requests: list[TurnRequest]) -> list[PolicyTurn]:
        """One turn for each request (all of one session and one version)."""

    def release(self, session: int) -> None:
        """The dialogues of `session` are over: drop anything kept for them."""


class Engine(Policy, Protocol):
    """A rollout engine (a row of rlver_jax.engines.table.ENGINES): a `Policy` on the trainer's weights."""

    published: Published

    def publish(self, version: int, params: Any, *, private: bool = False) -> None:
        """The parameters of `version` (this process's sampling copy) for the turns that want it.
        `private`: the caller goes on to donate `params` to its update while turns still sample
        (max_staleness > 0): sample on a copy of one's own. An engine that samples elsewhere (a
        server) sends them there and keeps nothing of the caller's either way."""

    def reseed(self, rng: Any) -> None:
        """Turns from now on draw from `rng` (a training batch's key); caches kept so far are dropped."""
