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
from rlver_jax.train.planner import hlo_cost, lengths, rollout_time, terms
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
                                f"decode chunk of {self.decode_chunk} steps; {rows}; {call.copy}", call.host)]
        feed = kv_rows.Feed(per_row, per_row, call.replicated((r, self.chunk), jnp.int32), per_row,
                            call.replicated((r, 2), jnp.uint32), per_row)
        compiled, secs = compile_program(s, kv_rows._chunk_jit, call.cfg, call.settings, call.host,
                                         self.decode_chunk, call.params, cache, state, None, serving, feed)
        phases.append(program_phase(s, f"{self.name} prefill", compiled, call.held, secs,
                                    f"the same with a prefill piece of {self.chunk} tokens for each of {r} rows",
                                    call.host))
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

    def time_rollout(self, costs: Mapping[str, hlo_cost.Cost], chip: chips.Chip, dialogues: lengths.Dialogues,
                     sim: rollout_time.Simulator) -> rollout_time.RolloutTime:
        """One host's rollout on this engine (planner.rollout_time.continuous): a call's decode steps
        cost the decoding program's (`terms`, per step) and its prefill piece what the program with a
        piece costs beyond it, each with the rows' attention reading the rows it serves to their
        fills, to the end of their last key block (half a block past the fill on average:
        hlo_cost.Cost.at_fill, where the ragged kernel reads the rows; off a TPU every slot is
        read), plus the host's fixed cost of a call (this host's CPU, measured)."""
        decode, prefill, whole = costs[self.name], costs[f"{self.name} prefill"], self.rows * self.cache_slots
        call = terms.Terms(op_fixed=chip.call_us * 1e-6)

        def at(cost: hlo_cost.Cost, block: int, slots: float, rows: int) -> terms.Terms:
            return terms.terms(cost.at_fill(min((slots + rows * block / 2) / whole, 1.0)), chip)

        def steps(slots: float, rows: int, n: int) -> terms.Terms:
            return at(decode, ragged_attention.DECODE_KEY_BLOCK, slots, rows).times(n / self.decode_chunk) + call

        def piece(slots: float, rows: int) -> terms.Terms:
            block = ragged_attention.PREFILL_KEY_BLOCK
            return at(prefill, block, slots, rows).beyond(at(decode, block, slots, rows))

        return rollout_time.continuous(dialogues, self.rows, self.decode_chunk, self.chunk, steps, piece, sim)


def plan(spec: RunSpec, feed_tokens: int, hosts: int = 1, evaluation: bool = False) -> ContinuousPlan:
    """The engine's rows: every dialogue of the host (bucketed) unless config.rollout.engine_rows
    bounds them, each of the slots a dialogue can need (sampling.cache_bound.row_slots)."""
    sec, e = section(spec, hosts, evaluation), spec.engine
    prompt = longest_prompt(sec.rollout.max_total_tokens)
    return ContinuousPlan(e.engine_rows or bucket(sec.dialogues), chunk_width(feed_tokens, e.prefill_chunk),
                          sec.sampling.max_new_tokens, row_slots(sec.rollout.max_total_tokens), e.decode_chunk, prompt,
                          hosts, evaluation)
