"""How a policy samples its turns (`SamplingSettings`), apart from the sampler itself: training,
evaluation configs and policies name these settings without importing JAX (rlver_jax.sampling.generation
is the one that reads them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlver_jax.checks import check_ranges, named


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """How a policy samples its turns; hashable, the static settings of a compiled generation program.

    stop_ids, pad_id and vocab_limit come from the tokenizer: engines.static.StaticEngine fills them in.
    """

    max_new_tokens: int = 512  # static per compile; requests may ask for fewer
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # 1: off
    top_k: int = 0  # 0: off
    stop_ids: tuple[int, ...] = ()
    pad_id: int = 0
    # Multi-turn rollouts: at most this many KV-cache slots kept per dialogue between turns (0:
    # re-encode the whole history every turn; see engines.kv_sessions). Reuse makes a turn's prefill
    # cost its new tokens only; the cache grows with the dialogue up to this bound: what a session
    # can need is sampling.cache_bound.session_slots (a turn beyond it is encoded afresh).
    cache_slots: int = 0
    # Ids >= vocab_limit are never sampled (0: no limit): Qwen2.5's embedding has 151,936 rows for
    # 151,665 tokenizer entries, and an id without an entry would vanish from the decoded reply
    # while staying in the training sequence.
    vocab_limit: int = 0

    # The config section the settings came from ("config.rollout."), for error messages only.
    where: str = dataclasses.field(default="", compare=False)

    def __post_init__(self):
        check_ranges(named(self, self.where, ("max_new_tokens", "temperature", "top_k", "cache_slots", "top_p",
                                              "vocab_limit")),
                     lowest={"max_new_tokens": 1, "temperature": 0, "top_k": 0, "cache_slots": 0, "vocab_limit": 0},
                     fraction=("top_p",))

    @classmethod
    def from_config(cls, section: Any, where: str) -> SamplingSettings:
        """The sampling fields of a config section (config.rollout, config.policy,
        config.train.eval_policy); `where` names it in errors ("config.rollout.")."""
        return cls(max_new_tokens=section.max_new_tokens, temperature=section.temperature, top_p=section.top_p,
                   top_k=section.top_k, cache_slots=section.cache_slots, where=where)
