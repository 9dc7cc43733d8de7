"""The sampler seam: what rolls out a policy's turns on the trainer's weights, one row per
`config.rollout.engine`; free of JAX, so the config checks read the table first.

A sampler is a `Policy` (engines.seam: `act`, `release`) that also takes the trainer's weights,
`publish(version, params)` (engines.published.Published: a turn samples with the version its
request wants), and each training batch's key, `reseed(rng)`. Its `continuous` says whether it
schedules turns itself (each dialogue's turn goes straight in) or wants calls formed from the
dialogues then waiting (rollout.ready_batches). A new engine (SGLang, vLLM, sglang-jax behind a
server) is a class with these methods, its weights synced in `publish`, and one row below.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from rlver_jax.checks import check_ranges, named
from rlver_jax.engines.seam import Engine
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, bucket
from rlver_jax.sampling.cache_bound import longest_prompt


@dataclasses.dataclass(frozen=True)
class SamplerRow:
    """One engine: its class by import path ("package.module.Class", imported when built), built
    as cls(model_cfg, chat_tokens, sampling_settings, engine_settings, rng); the banner's words."""

    path: str
    summary: str

    def load(self) -> type:
        module, _, name = self.path.rpartition(".")
        return getattr(importlib.import_module(module), name)


SAMPLERS: dict[str, SamplerRow] = {
    "jax": SamplerRow("rlver_jax.engines.continuous.ContinuousEngine",
                      "continuous batching on the trainer's weights: KV slots, chunked prefill, replies leave "
                      "as they stop"),
    "static": SamplerRow("rlver_jax.engines.static.StaticEngine",
                         "static calls of the dialogues then waiting, each decoded until its longest reply stops"),
}


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """How the rollout engine runs (config.rollout.engine*, decode_chunk, prefill_chunk)."""

    engine: str = "jax"  # a row of SAMPLERS
    # KV-cache rows (dialogues held at once); 0: as many as the dialogues in flight, grown by powers of two.
    engine_rows: int = 0
    decode_chunk: int = 8  # decode steps between two chances for turns to enter and replies to leave
    prefill_chunk: int = 256  # most new tokens a row writes in one prefill call (a long prompt stalls no one)
    # The most slots a row can need (the longest prompt and a whole reply, sampling.cache_bound), a
    # multiple of 128: the rows' slots grow by the length buckets up to it (0: no bound).
    row_slots: int = 0

    where: str = dataclasses.field(default="config.rollout.", compare=False)  # the config section, for errors

    def __post_init__(self):
        if self.engine not in SAMPLERS:
            raise ValueError(f"{self.where}engine={self.engine!r}; use one of {tuple(SAMPLERS)}")
        check_ranges(named(self, self.where, ("engine_rows", "decode_chunk", "prefill_chunk", "row_slots")),
                     lowest={"engine_rows": 0, "decode_chunk": 1, "prefill_chunk": 1, "row_slots": 0})

    @classmethod
    def from_config(cls, section: Any, where: str) -> EngineSettings:
        """The engine fields of a config section (config.rollout, config.policy)."""
        most = longest_prompt(section.max_total_tokens) + section.max_new_tokens
        return cls(engine=section.engine, engine_rows=section.engine_rows, decode_chunk=section.decode_chunk,
                   prefill_chunk=section.prefill_chunk, row_slots=bucket(most, multiple=128), where=where)

    def slots_for(self, needed: int) -> int:
        """The slots rows grow to for a turn that needs `needed`: its length bucket, at most row_slots
        (where the turn fits them)."""
        slots = bucket(needed, LENGTH_BUCKETS)
        return min(slots, self.row_slots) if needed <= self.row_slots else slots

    def build(self, model_cfg: Any, chat_tokens: Any, sampling: Any, rng: Any) -> Engine:
        """The sampler of this engine (no weights yet: `publish` them)."""
        return SAMPLERS[self.engine].load()(model_cfg, chat_tokens, sampling, self, rng)
