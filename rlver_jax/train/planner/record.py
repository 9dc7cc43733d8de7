"""A plan as data (launch/plan.py --json): the target, each compiled program's memory and cost on
the chip, and the step estimate's terms, for the tables of docs/sharding.md
(benchmarks/plan_tables.py) and for whoever reads the plan's figures off (issue trackers,
speed work): the same numbers the text prints, unrounded.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlver_jax.train.planner.estimate import CaseEstimate
from rlver_jax.train.planner.plan import Plan
from rlver_jax.train.planner.setup import GB
from rlver_jax.train.planner.terms import terms


def _case(c: CaseEstimate) -> dict[str, Any]:
    r = c.rollout
    out = {"name": c.name, "step_s": c.step, "on_policy_s": c.on_policy, "hidden_s": c.hidden,
           "offload_s": c.offload, "update_s": c.update.seconds,
           "update_programs_s": {k: t.seconds for k, t in c.update.programs.items()},
           "update_terms": dataclasses.asdict(c.update.total), "optimizer_steps": c.update.shapes.optimizer_steps,
           "update_rows": c.update.shapes.rows, "update_length": c.update.shapes.length,
           "update_flops": c.update_flops, "rollout_flops": c.rollout_flops}
    if r is not None:
        out.update(rollout_s=r.wall, rollout_device_s=r.device, rollout_waiting_s=r.waiting,
                   rollout_decode_s=r.decode.seconds, rollout_prefill_s=r.prefill.seconds, rollout_calls=r.calls,
                   rollout_terms=dataclasses.asdict(r.decode + r.prefill))
    return out


def plan_record(plan: Plan, label: str = "") -> dict[str, Any]:
    """The plan's figures (module docstring); GB of 1e9 bytes, seconds."""
    s, chip = plan.setup, plan.setup.chip
    programs = {}
    for p in plan.phases:
        row = {"total_gb": p.total / GB, "resident_gb": p.resident / GB, "arguments_gb": p.arguments / GB,
               "temporaries_gb": p.temporaries / GB, "outputs_gb": p.outputs / GB, "compile_s": p.seconds,
               "note": p.note}
        if p.cost is not None and chip is not None:
            row.update(tflop=p.cost.flops / 1e12, hbm_gb=p.cost.bytes / 1e9, seconds=terms(p.cost, chip).seconds,
                       terms=dataclasses.asdict(terms(p.cost, chip)), unknown_loops=p.cost.unknown_loops)
        programs[p.name] = row
    est = plan.estimate
    return {"label": label, "target": s.target.name if s.target is not None else "this host",
            "chip": chip.name if chip is not None else None, "mesh": dict(s.mesh.shape), "algo": s.rl.algo,
            "memory_gb": plan.memory_gb, "fits": plan.fits, "peak_gb": plan.peak.total / GB, "peak": plan.peak.name,
            "suggestions": plan.suggestions, "programs": programs,
            "estimate": None if est is None else {
                "mfu": est.mfu, "update_mfu": est.update_mfu, "lengths": est.lengths,
                "simulator": dataclasses.asdict(est.simulator), "cases": [_case(c) for c in est.cases]}}
