"""Where a phase of the plan does not fit its budget: the largest shapes with which it does (a
micro-batch, a dialogue length, the engine's KV rows, pipeline groups, cache slots, held-out profiles), each candidate
compiled as the plan compiles it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rlver_jax.parallel import sharding, topology
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, bucket
from rlver_jax.train.planner.phases import eval_profiles, run_phases
from rlver_jax.train.planner.setup import GB, abstract_setup
from rlver_jax.train.spec import RunSpec


def _largest(candidates: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The largest of ascending `candidates` for which `fits` holds, by bisection (fits is
    monotone: smaller shapes need less memory); None when none does."""
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


def fitting_shapes(spec: RunSpec, budget: float, phases: Sequence[str], feed_tokens: int,
                   log: Callable[[str], None], hoist_converts: bool = True, host_devices: int | None = None,
                   target: topology.Target | None = None) -> list[str]:
    """Update phases (some of UPDATE): the largest micro-batch, else the longest dialogue, with
    which each of them fits `budget` bytes. ["rollout"]: the rollout engine's most KV rows, else
    the longest dialogue; static calls: the fewest pipeline groups (most dialogues per sampler
    call), else the longest dialogue (no cache) or the most cache slots.
    ["evaluation"]: the most held-out profiles per evaluation. Each candidate is compiled as the
    plan is (for `target`: by the TPU compiler)."""
    s0 = abstract_setup(spec, hoist_converts, host_devices, target)
    shards = math.prod(s0.mesh.shape[a] for a in sharding.BATCH_AXES)

    def total(candidate: RunSpec) -> float:
        worst = max(run_phases(abstract_setup(candidate, hoist_converts, host_devices, target), phases, feed_tokens),
                    key=lambda p: p.total)
        log(f"  search: {worst.name} {worst.total / GB:.2f} GB")
        return worst.total

    if list(phases) == ["evaluation"]:
        field, step, limit = "train.eval_max_profiles", s0.hosts, (eval_profiles(spec) or 1)
        start = step
    elif list(phases) != ["rollout"]:
        rl = s0.rl
        micro = [m for m in range(shards, rl.micro_batch_size) if rl.mini_batch_size % m == 0 and m % shards == 0]
        for m in reversed(micro):
            log(f"  search: micro_batch_size={m}")
            if total(spec.override(**{"rl.micro_batch_size": m})) <= budget:
                return [f"--config.rl.micro_batch_size={m}"]
        out = []
        if micro:
            spec = spec.override(**{"rl.micro_batch_size": micro[0]})
            out.append(f"--config.rl.micro_batch_size={micro[0]}")
        field, step, limit = "rollout.max_total_tokens", spec.loop.length_multiple, s0.seq_len
        start = step
    elif spec.engine.engine == "jax":  # fewer KV rows (dialogues held at once), else shorter dialogues
        out, rows = [], (spec.engine.engine_rows or bucket(spec.loop.dialogues // s0.hosts)) // 2
        while rows >= 1:
            log(f"  search: engine_rows={rows}")
            if total(spec.override(**{"rollout.engine_rows": rows})) <= budget:
                return [f"--config.rollout.engine_rows={rows}"]
            rows //= 2
        spec = spec.override(**{"rollout.engine_rows": 1})
        out.append("--config.rollout.engine_rows=1")
        field, step, limit = "rollout.max_total_tokens", LENGTH_BUCKETS[0], spec.rollout.max_total_tokens
        start = step
    else:
        r, cache_slots, out = spec.rollout, spec.sampling.cache_slots, []
        dialogues = spec.loop.dialogues // s0.hosts  # one host's
        groups = r.pipeline_groups * 2
        while groups <= dialogues:  # fewer dialogues per sampler call
            log(f"  search: pipeline_groups={groups}")
            if total(spec.override(**{"rollout.pipeline_groups": groups})) <= budget:
                return [f"--config.rollout.pipeline_groups={groups}"]
            groups *= 2
        field = "rollout.cache_slots" if cache_slots else "rollout.max_total_tokens"
        step, limit = LENGTH_BUCKETS[0], cache_slots or r.max_total_tokens
        # A cache must hold a turn's generation and the smallest feed (rollout_shapes).
        start = r.max_new_tokens + LENGTH_BUCKETS[0] if cache_slots else step
    out = [] if list(phases) == ["evaluation"] else out

    def fits(n):
        log(f"  search: {field}={n}")
        return total(spec.override(**{field: n})) <= budget

    candidates = [n for n in range(step, limit, step) if n >= start]
    best = _largest(candidates, fits)
    if best is None:
        return out + [f"nothing: {field}={candidates[0] if candidates else limit} needs more than {budget / GB:g} GB"]
    return out + [f"--config.{field}={best}"]
