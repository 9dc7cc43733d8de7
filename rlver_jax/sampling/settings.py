"""How a policy samples its turns (`SamplingSettings`), apart from the sampler itself: training,
evaluation configs and policies name these settings without importing JAX (rlver_jax.sampling.generation
is the one that reads them)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """How a policy samples its turns; hashable, the static settings of a compiled generation program.

    stop_ids, pad_id and vocab_limit come from the tokenizer: rollout.jax_policy.JaxPolicy fills them in.
    """

    max_new_tokens: int = 512  # static per compile; requests may ask for fewer
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # 1: off
    top_k: int = 0  # 0: off
    stop_ids: tuple[int, ...] = ()
    pad_id: int = 0
    # Multi-turn rollouts: at most this many KV-cache slots kept per dialogue between turns (0:
    # re-encode the whole history every turn; see rollout.kv_sessions). Reuse makes a turn's prefill
    # cost its new tokens only; the cache grows with the dialogue up to this bound: what a session
    # can need is rollout.cache_bound.session_slots (a turn beyond it is encoded afresh).
    cache_slots: int = 0
    # Ids >= vocab_limit are never sampled (0: no limit): Qwen2.5's embedding has 151,936 rows for
    # 151,665 tokenizer entries, and an id without an entry would vanish from the decoded reply
    # while staying in the training sequence.
    vocab_limit: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be at least 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 is greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 is off)")
        if self.cache_slots < 0:
            raise ValueError(f"cache_slots={self.cache_slots} must be >= 0 (0 is off)")
        if self.vocab_limit < 0:
            raise ValueError(f"vocab_limit={self.vocab_limit} must be >= 0 (0 is no limit)")
