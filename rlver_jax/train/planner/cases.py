"""The plan's step estimate built (planner.estimate): each case's dialogues played from the config
and the length assumptions (planner.lengths), the update compiled at each case's shapes where
they differ from the memory plan's (one program per distinct shape: a model's optimizer steps are
one program's loop, counted by its trip count), the rollout timed on the engine's compiled
programs (its plan's `time_rollout`) and the simulator's figure (planner.simulated_user).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rlver_jax.parallel.chips import Chip
from rlver_jax.train.planner import lengths as lengths_lib
from rlver_jax.train.planner.compiled import Phase
from rlver_jax.train.planner.estimate import Case, CaseEstimate, StepEstimate, update_time
from rlver_jax.train.planner.phases import run_phases
from rlver_jax.train.planner.rows import update_shapes
from rlver_jax.train.planner.sampler import rollout_shapes
from rlver_jax.train.planner.setup import UPDATE, Setup, abstract_setup, crossing_bytes
from rlver_jax.train.planner.simulated_user import simulator

CASES = (("every reply at max_new_tokens", True), ("lognormal replies", False))


def _model_flops(s: Setup, tokens: int) -> float:
    """The update's model FLOPs over `tokens` trained tokens: prepare reads them (2N each model it
    runs), each model trains on them every epoch (6N, 4N with LoRA, whose base takes no gradient)."""
    u = s.update
    actor = u.actor_cfg.num_params()
    critic = u.critic_cfg.num_params() if u.critic_cfg is not None else 0
    train = 4 if u.lora.enabled else 6
    reads = actor + critic + (actor if s.ref is not None and not u.lora.enabled else 0)
    return tokens * (2 * reads + train * (actor + critic) * s.rl.ppo_epochs)


def build(s: Setup, done: list[Phase], lengths: lengths_lib.Lengths, log: Callable[[str], None]
          ) -> tuple[StepEstimate | None, list[Case]]:
    """The step estimate of the plan whose memory-plan phases are `done` (None without a chip or
    without the update's programs), and its cases."""
    chip: Chip | None = s.chip
    by_name = {p.name: p for p in done}
    update = [n for n in UPDATE if n != "critic update" or s.rl.uses_critic]
    if chip is None or not all(n in by_name and by_name[n].cost is not None for n in update):
        return None, []
    spec, hosts = s.spec, s.hosts
    per_host = max(1, spec.loop.dialogues // hosts)
    engine = rollout_shapes(spec, lengths.feed, hosts)
    sampler = {n: by_name[n].cost for n in engine.programs if n in by_name and by_name[n].cost is not None}
    sim = simulator(spec)
    compiled = {(s.shapes.rows, s.shapes.length): {n: by_name[n].cost for n in update}}
    cases, estimates = [], []
    for name, at_max in CASES:
        played = [lengths_lib.play(per_host, spec.simulator.rules.max_turns, spec.sampling.max_new_tokens,
                                   spec.rollout.max_total_tokens, spec.rollout.drop_thoughts,
                                   dataclasses.replace(lengths, seed=lengths.seed + h), at_max) for h in range(hosts)]
        shapes = update_shapes(spec, [d.rows() for d in played], hosts)
        key = (shapes.rows, shapes.length)
        if key not in compiled:  # another shape: its programs compiled for their cost
            log(f"compiling the update at {shapes.rows} rows x {shapes.length} tokens ({name}) ...")
            other = abstract_setup(spec, s.compiler_options is None, s.host_devices, s.target, shapes, s.host_chip)
            compiled[key] = {p.name: p.cost for p in run_phases(other, update, lengths.feed)}
        case = Case(name, played, shapes, compiled[key], key != (s.shapes.rows, s.shapes.length))
        cases.append(case)
        rollouts = [engine.time_rollout(sampler, chip, d, sim) for d in played] if len(sampler) == len(
            engine.programs) else []
        slowest = max(rollouts, key=lambda r: r.wall) if rollouts and rollouts[0] is not None else None
        moved = crossing_bytes(s) / (chip.host_gb_s * 1e9) if chip.host_gb_s else 0.0
        actor = s.update.actor_cfg.num_params()
        sampled = 2 * actor * sum(r.sampled + r.fed for r in rollouts) if slowest is not None else 0.0
        estimates.append(CaseEstimate(name, slowest, update_time(case, chip), moved, spec.loop.max_staleness,
                                      _model_flops(s, shapes.tokens), sampled))
    est = StepEstimate(estimates, chip, s.mesh.size, sim, lengths.describe(spec.sampling.max_new_tokens))
    return est, cases
