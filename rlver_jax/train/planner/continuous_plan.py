"""The planner's plan of the continuous engine (engines.continuous; config.rollout.engine="continuous"):
every dialogue of the host in one engine, on a fixed set of KV rows (config.rollout.engine_rows,
else every dialogue of the host), each holding a dialogue's whole history (the longest prompt plus
a turn's tokens). Its program (rlver_jax.sampling.kv_rows.chunk), compiled twice: a call of
rollout.decode_chunk decode steps over every row at once, and the same call with a prefill piece
(rollout.prefill_chunk tokens, at most the `feed_tokens` of a turn) for every row in its first
step, each the most a call runs over.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax.numpy as jnp

from rlver_jax.engines.continuous import chunk_width
from rlver_jax.models import ragged_attention
from rlver_jax.parallel import chips
from rlver_jax.sampling import kv_rows
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, bucket
from rlver_jax.sampling.cache_bound import longest_prompt, row_slots
from rlver_jax.train.planner import hlo_cost
from rlver_jax.train.planner.compiled import Phase, compile_program, program_phase
from rlver_jax.train.planner.sampler import Search, sampler_call, section
from rlver_jax.train.planner.setup import GB, Setup, device_bytes
from rlver_jax.train.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class ContinuousPlan:
    """The continuous engine's largest shapes on one host (train.planner.sampler.EnginePlan)."""

    rows: int  # KV rows
    chunk: int  # the prefill chunk's tokens
    new_tokens: int  # at most, a reply
    cache_slots: int  # each KV row's slots
    decode_chunk: int  # decode steps per call
    fill: int  # a row's fill as its reply starts, every turn at the longest prompt
    hosts: int = 1
    evaluation: bool = False

    @property
    def name(self) -> str:
        return "evaluation" if self.evaluation else "rollout"

    @property
    def programs(self) -> tuple[str, ...]:
        return self.name, f"{self.name} prefill"

    def describe(self) -> str:
        what = "profile" if self.evaluation else "dialogue"
        hosts = f" on each of {self.hosts} hosts" if self.hosts > 1 else ""
        return (f"rollout engine{hosts}: {self.rows} KV rows of {self.cache_slots} slots (one per {what}, its whole "
                f"history kept between turns), decode chunks of {self.decode_chunk} steps over the rows with a reply "
                f"in progress, prefill chunks of {self.chunk} tokens, up to {self.new_tokens} tokens a reply")

    def phases(self, s: Setup, host_devices: int | None) -> list[Phase]:
        """A decode call, then a call with a prefill piece for every row, each over every row
        (nothing gathered); the rows' cache and state donated and held between turns."""
        call = sampler_call(s, self.evaluation, host_devices)
        r = self.rows
        cache = call.cache(r, self.cache_slots)
        per_row = call.replicated((r,), jnp.int32)
        state = kv_rows.RowState(*[per_row] * 4, call.replicated((r, 2), jnp.uint32), call.replicated((r,), jnp.bool_))
        serving = call.replicated((r,), jnp.bool_)
        compiled, secs = compile_program(s, kv_rows._chunk_jit, call.cfg, call.settings, call.host,
                                         self.decode_chunk, call.params, cache, state, None, serving, None)
        rows = (f"{r} KV rows x {self.cache_slots} slots, {device_bytes(cache) / GB:.2f} GB/device (donated, "
                f"held between turns)")
        phases = [program_phase(s, self.name, compiled, call.held, secs,
                                f"decode chunk of {self.decode_chunk} steps; {rows}; {call.copy}")]
        feed = kv_rows.Feed(per_row, per_row, call.replicated((r, self.chunk), jnp.int32), per_row,
                            call.replicated((r, 2), jnp.uint32), per_row)
        compiled, secs = compile_program(s, kv_rows._chunk_jit, call.cfg, call.settings, call.host,
                                         self.decode_chunk, call.params, cache, state, None, serving, feed)
        phases.append(program_phase(s, f"{self.name} prefill", compiled, call.held, secs,
                                    f"the same with a prefill piece of {self.chunk} tokens for each of {r} rows"))
        return phases

    def search(self, spec: RunSpec) -> Search:
        """Fewer KV rows (dialogues held at once), down to one; else shorter dialogues."""
        halved = []
        rows = self.rows // 2
        while rows >= 1:
            halved.append({"rollout.engine_rows": rows})
            rows //= 2
        return Search(tuple(halved), {"rollout.engine_rows": 1}, "rollout.max_total_tokens", LENGTH_BUCKETS[0],
                      spec.rollout.max_total_tokens, LENGTH_BUCKETS[0])

    def rollout_seconds(self, costs: Mapping[str, hlo_cost.Cost], chip: chips.Chip, *, turns: int, dialogues: int,
                        feed_tokens: int, expected: int) -> tuple[float, float, str, float]:
        """Each turn, every dialogue of the host decodes in one batch of its rows (the chunks' steps:
        the reply's tokens, times dialogues / rows), a reply costing its own tokens, and its feed is
        prefilled in pieces, each costing what a call with a piece costs beyond a decoding call
        (the decode steps beside the piece are counted with the reply's); the rows' attention kernel
        reads each row to its fill (hlo_cost.Cost.at_fill), assumed the longest prompt every turn
        (`fill`) plus the reply's mean position while decoding, the longest prompt while
        prefilling, each to the end of its key block (half a block past the fill on average), at
        most the whole row."""
        decode, slots, new = costs[self.name], self.cache_slots, self.new_tokens

        def read(reply: float) -> float:  # slots a decode step reads of a row, to the end of its last key block
            return min(self.fill + reply / 2 + ragged_attention.DECODE_KEY_BLOCK / 2, slots)

        def step(reply: int) -> float:  # a decode step at the rows' mean fill over a reply of `reply` tokens
            return decode.at_fill(read(reply) / slots).seconds(chip) / self.decode_chunk

        chunks = -(-feed_tokens // self.chunk)
        fill = min(self.fill + ragged_attention.PREFILL_KEY_BLOCK / 2, slots) / slots
        prefill = max(costs[f"{self.name} prefill"].at_fill(fill).seconds(chip) - decode.at_fill(fill).seconds(chip),
                      0.0) * chunks
        waves = max(1.0, dialogues / self.rows)

        def seconds(reply: int) -> float:
            return turns * (reply * waves * step(reply) + prefill)

        whole = decode.seconds(chip) / self.decode_chunk
        how = (f"{turns} turns x ({new} tokens x {waves:g} wave(s) of {self.rows} rows x {step(new) * 1e3:.1f} ms "
               f"a decode step + prefill {prefill:.2f} s); the cached attention reads each row to its fill, "
               f"assumed the longest prompt ({self.fill} tokens) every turn plus the reply's mean position, "
               f"to the end of its key block: {read(new) / slots:.0%} of its {slots} slots (every row whole: "
               f"{whole * 1e3:.1f} ms a decode step)")
        return seconds(new), seconds(expected), how, turns * dialogues * (feed_tokens + new)


def plan(spec: RunSpec, feed_tokens: int, hosts: int = 1, evaluation: bool = False) -> ContinuousPlan:
    """The engine's rows: every dialogue of the host (bucketed) unless config.rollout.engine_rows
    bounds them, each of the slots a dialogue can need (sampling.cache_bound.row_slots)."""
    sec, e = section(spec, hosts, evaluation), spec.engine
    prompt = longest_prompt(sec.rollout.max_total_tokens)
    return ContinuousPlan(e.engine_rows or bucket(sec.dialogues), chunk_width(feed_tokens, e.prefill_chunk),
                          sec.sampling.max_new_tokens, row_slots(sec.rollout.max_total_tokens), e.decode_chunk, prompt,
                          hosts, evaluation)
