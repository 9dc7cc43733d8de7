"""The planner's plan of the static engine (engines.static; config.rollout.engine="static"): one
pipeline group's call at the longest prompt, on rlver_jax.sampling.generation: generation (prefill +
decode loop) at a prompt of max_total_tokens when rollout.cache_slots is 0, else the multi-turn
program on a cache of cache_slots, fed `feed_tokens` new tokens, followed by the cache's own
programs at its largest bucket (`... compact`, `... grow`), beside the other pipeline groups' caches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from rlver_jax.parallel import chips
from rlver_jax.sampling import generation
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, MIN_PROMPT_BUCKET, bucket
from rlver_jax.sampling.cache_bound import session_slots
from rlver_jax.train.planner import hlo_cost, lengths, rollout_time, terms
from rlver_jax.train.planner.compiled import OutOfHbm, Phase, compile_program, program_phase
from rlver_jax.train.planner.sampler import Search, sampler_call, section
from rlver_jax.train.planner.setup import GB, Setup, device_bytes
from rlver_jax.train.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class StaticPlan:
    """The static engine's largest shapes on one host (train.planner.sampler.EnginePlan)."""

    rows: int  # dialogues per call (one pipeline group, bucketed as the engine does)
    groups: int  # pipeline groups: sessions whose caches are held at once
    prompt: int  # no cache: the bucketed prompt; with a cache: the bucketed feed
    new_tokens: int
    cache_slots: int  # 0: re-encode every turn
    hosts: int = 1
    evaluation: bool = False

    @property
    def name(self) -> str:
        return "evaluation" if self.evaluation else "rollout"

    @property
    def programs(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        what = "profiles" if self.evaluation else "dialogues"
        per_call = f"{self.rows} {what} per sampler call ({self.groups} pipeline group(s)"
        per_call += f" on each of {self.hosts} hosts)" if self.hosts > 1 else ")"
        if self.cache_slots:
            return (f"{per_call}, KV cache of {self.cache_slots} slots per dialogue kept between turns, "
                    f"{self.prompt} tokens fed + {self.new_tokens} generated per turn")
        return f"{per_call}, prompt {self.prompt} + {self.new_tokens} new tokens, KV cache off (re-encode)"

    def phases(self, s: Setup, host_devices: int | None) -> list[Phase]:
        """The call's program (its activations' rows split over the host mesh's batch axes as the
        engine traces them) and, with a KV cache kept between turns (rows and kv heads split), the
        cache's own programs at its largest bucket: compaction (generation.compact_cache) and
        growth into it (generation.grow_cache)."""
        call = sampler_call(s, self.evaluation, host_devices)
        b, e, name = self.rows, self.prompt, self.name
        ids, mask = call.replicated((b, e), jnp.int32), call.replicated((b, e), jnp.bool_)
        rng, per_row = call.replicated((b, 2), jnp.uint32), call.replicated((b,), jnp.int32)  # row keys
        if not self.cache_slots:
            # generation.generate's settings: the run's, without cache slots.
            compiled, secs = compile_program(s, generation._generate_jit, call.cfg,
                                             dataclasses.replace(call.settings, cache_slots=0), call.host,
                                             call.params, ids, mask, rng, per_row)
            return [program_phase(s, name, compiled, call.held, secs, f"prefill + decode loop, no cache; {call.copy}",
                                  call.host)]
        cache = call.cache(b, self.cache_slots)
        compiled, secs = compile_program(s, generation._continue_jit, call.cfg, call.settings, call.host, call.params,
                                         cache, ids, mask, per_row, rng, per_row)
        # The cache stays on the devices between turns in the layout the program gives it (as it was
        # given, where the TPU compiler built no program).
        cache_out = cache if isinstance(compiled, OutOfHbm) else jax.tree.map(
            lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), cache, compiled.output_shardings[1])
        per_group = device_bytes(cache_out)
        others = call.held + (self.groups - 1) * per_group
        phases = [program_phase(s, name, compiled, others, secs, f"cache {per_group / GB:.2f} GB/device per group of "
                                f"{b}, {self.groups} groups held; {call.copy}", call.host)]
        # The cache's own programs, beside the other groups' caches: compaction at cache_slots, and
        # growth from the next smaller bucket into cache_slots (engines.kv_sessions._make_room).
        compiled, secs = compile_program(s, generation.compact_cache, cache_out)
        phases.append(program_phase(s, f"{name} compact", compiled, others, secs, "KV cache compaction (donated)",
                                    call.host))
        smaller = [x for x in LENGTH_BUCKETS if x < self.cache_slots]
        if smaller:
            compiled, secs = compile_program(s, generation.grow_cache, call.cache(b, smaller[-1]), self.cache_slots)
            phases.append(program_phase(s, f"{name} grow", compiled, others, secs,
                                        f"KV cache growth {smaller[-1]} -> {self.cache_slots} slots", call.host))
        return phases

    def search(self, spec: RunSpec) -> Search:
        """The fewest pipeline groups (most dialogues per call) that fit, else the longest dialogue
        (no cache) or the most cache slots."""
        r, cache_slots = spec.rollout, spec.sampling.cache_slots
        dialogues = spec.loop.dialogues // self.hosts  # one host's
        tries, groups = [], r.pipeline_groups * 2
        while groups <= dialogues:  # fewer dialogues per sampler call
            tries.append({"rollout.pipeline_groups": groups})
            groups *= 2
        field = "rollout.cache_slots" if cache_slots else "rollout.max_total_tokens"
        # A cache must hold a turn's generation and the smallest feed (`plan`).
        start = r.max_new_tokens + LENGTH_BUCKETS[0] if cache_slots else LENGTH_BUCKETS[0]
        return Search(tuple(tries), {}, field, LENGTH_BUCKETS[0], cache_slots or r.max_total_tokens, start)

    def time_rollout(self, costs: Mapping[str, hlo_cost.Cost], chip: chips.Chip, dialogues: lengths.Dialogues,
                     sim: rollout_time.Simulator) -> rollout_time.RolloutTime:
        """One host's rollout on this engine (planner.rollout_time.static): each pipeline group's
        call per turn at the compiled shape (the longest prompt), decoding until its longest reply
        stops: the compiled call's cost, which runs every row to max_new_tokens, in proportion to
        that reply (the decode loop dominates a call), plus the host's fixed cost of a call."""
        whole = terms.terms(costs[self.name], chip)
        call = terms.Terms(op_fixed=chip.call_us * 1e-6)
        return rollout_time.static(dialogues, self.groups, lambda longest: whole.times(longest / self.new_tokens)
                                   + call, sim)


def plan(spec: RunSpec, feed_tokens: int, hosts: int = 1, evaluation: bool = False) -> StaticPlan:
    """The host's dialogues in pipeline groups, each call at the longest prompt: with a KV cache a
    turn's feed (the whole prompt where think mode drops earlier thoughts: each turn's row is
    encoded afresh), which with its generation must fit the cache (engines.kv_sessions)."""
    sec = section(spec, hosts, evaluation)
    r, sampling = sec.rollout, sec.sampling
    groups = min(r.pipeline_groups, sec.dialogues)
    rows = bucket(-(-sec.dialogues // groups))
    cache_slots = sampling.cache_slots
    if cache_slots:
        if r.drop_thoughts:
            feed_tokens = max(feed_tokens, r.max_total_tokens)
        room = [b for b in LENGTH_BUCKETS if b <= cache_slots - sampling.max_new_tokens]
        if not room:
            raise ValueError(f"{sampling.where}cache_slots={cache_slots} leaves no room for a turn of "
                             f"{sampling.where}max_new_tokens={sampling.max_new_tokens}; raise it to "
                             f"{session_slots(r.max_total_tokens, sampling.max_new_tokens)} (sampling.cache_bound)")
        prompt = min(bucket(feed_tokens, LENGTH_BUCKETS), room[-1])
    else:  # the last turn re-encodes a history of up to max_total_tokens
        prompt = bucket(r.max_total_tokens, LENGTH_BUCKETS, MIN_PROMPT_BUCKET)
    return StaticPlan(rows, groups, prompt, sampling.max_new_tokens, cache_slots, hosts, evaluation)
