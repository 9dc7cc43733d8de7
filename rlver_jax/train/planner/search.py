"""Where a phase of the plan does not fit its budget: the largest shapes with which it does (a
micro-batch, a dialogue length, what the rollout engine's plan offers: the continuous engine's KV
rows, the static engine's pipeline groups and cache slots; held-out profiles), each candidate
compiled as the plan compiles it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rlver_jax.parallel import sharding, topology
from rlver_jax.train.planner.phases import run_phases
from rlver_jax.train.planner.sampler import eval_profiles, rollout_shapes
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


def _flags(fields: dict) -> list[str]:
    return [f"--config.{k}={v}" for k, v in fields.items()]


def fitting_shapes(spec: RunSpec, budget: float, phases: Sequence[str], feed_tokens: int,
                   log: Callable[[str], None], hoist_converts: bool = True, host_devices: int | None = None,
                   target: topology.Target | None = None) -> list[str]:
    """Update phases (some of UPDATE): the largest micro-batch, else the longest dialogue, with
    which each of them fits `budget` bytes. ["rollout"]: what the engine's plan offers
    (train.planner.sampler.Search: the continuous engine's most KV rows, else the longest dialogue;
    the static engine's fewest pipeline groups, else the longest dialogue or the most cache slots).
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
    else:  # the rollout: the engine's own shapes first (its plan's `search`), then a field to shrink
        found = rollout_shapes(spec, feed_tokens, s0.hosts).search(spec)
        for tried in found.tries:
            log(f"  search: {' '.join(_flags(tried))}")
            if total(spec.override(**tried)) <= budget:
                return _flags(tried)
        out = _flags(found.kept)
        spec = spec.override(**found.kept) if found.kept else spec
        field, step, limit, start = found.field, found.step, found.limit, found.start
    out = [] if list(phases) == ["evaluation"] else out

    def fits(n):
        log(f"  search: {field}={n}")
        return total(spec.override(**{field: n})) <= budget

    candidates = [n for n in range(step, limit, step) if n >= start]
    best = _largest(candidates, fits)
    if best is None:
        return out + [f"nothing: {field}={candidates[0] if candidates else limit} needs more than {budget / GB:g} GB"]
    return out + [f"--config.{field}={best}"]
