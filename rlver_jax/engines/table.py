"""The rollout engines: one row per `config.rollout.engine` (an evaluation's `config.policy.engine`
chooses from the same rows), and the settings of the chosen one. Free of JAX, so the config checks
read the table first.

An engine is a `Policy` (engines.seam: `act`, `release`) that also takes the trainer's weights,
`publish(version, params, private=...)` (its weight sync: engines.published.Published keeps the
versions a turn may want), and each training batch's key, `reseed(rng)`. Its row says how it is
built, which config fields it reads (a field it does not read, set on the command line, is
refused with the engines that do read it), whether it schedules turns itself, how the planner
plans it and the banner's words; the config checks, the planner, the rollout settings, the banner
and the protocol card read the row, never the name. A served engine (SGLang, vLLM, sglang-jax:
nothing sampled on the trainer's devices, the weights pushed to the server in `publish`) is a
class with these methods and one more row (docs/architecture.md, "How to add a rollout engine").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from rlver_jax.checks import check_ranges, named
from rlver_jax.engines.seam import Engine
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, bucket
from rlver_jax.sampling.cache_bound import row_slots
from rlver_jax.table import Table, imported


@dataclasses.dataclass(frozen=True)
class EngineRow:
    """One engine. `build`: its class by import path, built as cls(model_cfg, chat_tokens,
    sampling_settings, engine_settings, rng). `reads`: the fields of its config section it reads
    beyond every engine's sampling fields (temperature, max_new_tokens, ...). `continuous`: it
    schedules turns itself, so each dialogue's turn goes straight in; else calls are formed from
    the dialogues then waiting (rollout.ready_batches). `plan`: the planner's function by import
    path, (spec, feed_tokens, hosts, evaluation) -> the engine's plan (train.planner.sampler.EnginePlan).
    `summary`: the banner's words."""

    build: str
    reads: frozenset[str]
    continuous: bool
    plan: str
    summary: str

    def engine_class(self) -> type:
        return imported(self.build)


ENGINES: Table[EngineRow] = Table("config.rollout.engine", {
    "continuous": EngineRow(
        build="rlver_jax.engines.continuous.ContinuousEngine",
        reads=frozenset({"engine_rows", "decode_chunk", "prefill_chunk"}), continuous=True,
        plan="rlver_jax.train.planner.continuous_plan.plan",
        summary="continuous batching on the trainer's weights: each turn enters a KV row between decode chunks, "
                "prefilled in chunks, and its reply leaves as it stops"),
    "static": EngineRow(
        build="rlver_jax.engines.static.StaticEngine",
        reads=frozenset({"pipeline_groups", "batch_wait_s", "cache_slots"}), continuous=False,
        plan="rlver_jax.train.planner.static_plan.plan",
        summary="static calls of the dialogues then waiting on the trainer's weights, each decoded until its "
                "longest reply stops"),
}, also=("config.policy.engine",), renamed={"jax": "continuous"}, summary=lambda row: row.summary)


def engine_fields() -> frozenset[str]:
    """The fields of a config section some engine reads beyond the sampling fields (and `engine`)."""
    return frozenset({"engine"}).union(*(row.reads for row in ENGINES.values()))


def check_read(engine: str, given: Collection[str], where: str, engine_flag: str = "") -> None:
    """Refuse the fields of section `where` ("config.rollout.") set on the command line (`given`,
    their names in the section) that some engine reads but `engine` does not, naming the engines
    that do. `engine_flag`: the field that chose the engine (default: the section's `engine`). An
    unknown engine is left to its own check."""
    if engine not in ENGINES:
        return
    unread = sorted(f for f in given if f in engine_fields() - ENGINES[engine].reads - {"engine"})
    if not unread:
        return
    chose = engine_flag or f"{where}engine"
    flags, them = " ".join(f"--{where}{f}" for f in unread), "it" if len(unread) == 1 else "them"
    readers = " or ".join(f"--{chose}={name}" for name in ENGINES.where(lambda row: set(unread) <= row.reads))
    raise ValueError(f"{flags} set, but --{chose}={engine} does not read {them}: add "
                     f"{readers or 'an engine that does'} to use {them}, or drop {flags}")


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """The rollout engine and its own fields (config.rollout.engine, engine_rows, decode_chunk,
    prefill_chunk). The fields the static engine reads stay with their readers: how calls are formed
    (rollout.episodes.RolloutSettings: pipeline_groups, batch_wait_s) and the KV cache kept between
    turns (sampling.settings.SamplingSettings.cache_slots)."""

    engine: str = "continuous"  # a row of ENGINES
    # KV-cache rows (dialogues held at once); 0: as many as the dialogues in flight, grown by powers of two.
    engine_rows: int = 0
    decode_chunk: int = 8  # decode steps between two chances for turns to enter and replies to leave
    prefill_chunk: int = 256  # most new tokens a row writes in one prefill call (a long prompt stalls no one)
    # The most slots a row can need (a dialogue's max_total_tokens, sampling.cache_bound.row_slots): the
    # rows hold it from the start (0: no bound: they grow by the length buckets).
    row_slots: int = 0

    where: str = dataclasses.field(default="config.rollout.", compare=False)  # the config section, for errors

    def __post_init__(self):
        ENGINES.row(self.engine, f"{self.where}engine")
        check_ranges(named(self, self.where, ("engine_rows", "decode_chunk", "prefill_chunk", "row_slots")),
                     lowest={"engine_rows": 0, "decode_chunk": 1, "prefill_chunk": 1, "row_slots": 0})

    @property
    def row(self) -> EngineRow:
        return ENGINES[self.engine]

    @classmethod
    def from_config(cls, section: Any, where: str, given: Collection[str] = ()) -> EngineSettings:
        """The engine fields of a config section (config.rollout, config.policy); `given`: the
        section's fields the command line set, refused where the engine does not read them (`check_read`)."""
        check_read(section.engine, given, where)
        return cls(engine=section.engine, engine_rows=section.engine_rows, decode_chunk=section.decode_chunk,
                   prefill_chunk=section.prefill_chunk, row_slots=row_slots(section.max_total_tokens), where=where)

    def slots_for(self, needed: int) -> int:
        """The slots the rows hold for a turn that needs `needed`: row_slots, the most a dialogue can
        need (a row is read to its fill, so the slots past it cost memory, not time); a turn beyond
        it (row_slots 0, or a request from outside a TokenHistory), its length bucket."""
        return self.row_slots if needed <= self.row_slots else bucket(needed, LENGTH_BUCKETS)

    def build(self, model_cfg: Any, chat_tokens: Any, sampling: Any, rng: Any) -> Engine:
        """The engine (no weights yet: `publish` them)."""
        return self.row.engine_class()(model_cfg, chat_tokens, sampling, self, rng)
