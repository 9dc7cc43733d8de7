"""A roofline estimate of a train step on a target's chips or cards (TPU, GPU): the compiled programs'
FLOPs and HBM bytes (rlver_jax.train.planner.hlo_cost) against their published peaks, and the MFU it implies.
An estimate, not a measurement.
"""

from __future__ import annotations

import dataclasses

from rlver_jax.train.planner.setup import UPDATE
from rlver_jax.train.planner.phases import rollout_shapes
from rlver_jax.train.planner.plan import Plan


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """A roofline estimate of a train step on the target's chips (not a measurement)."""

    update: float  # seconds: prepare + each model's update program, once each
    rollout_call: float  # seconds of one sampler call at the longest prompt, every row to max_new_tokens
    calls: int  # sampler calls per step on each host: pipeline groups x policy turns
    model_flops: float  # the step's model FLOPs, all devices (6N per trained token, 2N per scored or sampled one)
    update_flops: float  # of which the update's
    devices: int
    peak: float  # FLOP/s per device

    @property
    def step(self) -> float:
        return self.update + self.calls * self.rollout_call

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.devices * self.peak * self.step) if self.step else 0.0

    @property
    def update_mfu(self) -> float:
        return self.update_flops / (self.devices * self.peak * self.update) if self.update else 0.0


def step_estimate(plan: Plan) -> StepEstimate | None:
    """The roofline of a train step from the compiled programs' costs (hlo_cost.program_cost): the
    update's programs once each, and the rollout's sampler program once per pipeline group and
    policy turn (config.simulator.max_turns) on every host at once, each call at the longest prompt
    with every row generating max_new_tokens: an upper bound of the rollout. MFU counts model FLOPs
    (6 x parameters per trained token, 4 x with LoRA, whose base takes no gradient; 2 x per token
    a program only reads or samples; attention left out) against the step's estimate."""
    s, chip = plan.setup, plan.setup.chip
    by_name = {p.name: p for p in plan.phases}
    needed = [by_name[n] for n in (*UPDATE, "rollout") if n in by_name]
    if chip is None or not needed or not all(p.cost is not None for p in needed):
        return None
    update = sum(by_name[n].cost.seconds(chip) for n in UPDATE if n in by_name)
    b, t = s.batch["tokens"].shape
    tokens = b * t
    actor_n = s.update.actor_cfg.num_params()
    critic_n = s.update.critic_cfg.num_params() if s.update.critic_cfg is not None else 0
    train = 4 if s.update.lora.enabled else 6
    epochs = s.rl.ppo_epochs
    forwards = actor_n + critic_n + (actor_n if s.ref is not None and not s.update.lora.enabled else 0)
    update_flops = 0.0
    if "prepare" in by_name:
        update_flops += 2 * forwards * tokens
    if "actor update" in by_name:
        update_flops += train * actor_n * tokens * epochs
    if "critic update" in by_name:
        update_flops += train * critic_n * tokens * epochs
    rollout = by_name.get("rollout")
    shapes = rollout_shapes(s.spec, 512, s.hosts)
    calls = shapes.groups * s.spec.simulator.rules.max_turns if rollout is not None else 0
    call = rollout.cost.seconds(chip) if rollout is not None else 0.0
    sampled = s.hosts * calls * 2 * actor_n * shapes.rows * (shapes.prompt + shapes.new_tokens)
    return StepEstimate(update, call, calls, update_flops + (sampled if rollout is not None else 0.0), update_flops,
                        s.mesh.size, chip.bf16_tflops * 1e12)


def format_roofline(plan: Plan) -> list[str]:
    """The roofline lines of a plan compiled for a target's chip or card (none otherwise)."""
    s, chip = plan.setup, plan.setup.chip
    costed = [p for p in plan.phases if p.cost is not None]
    if chip is None or not costed:
        return []
    lines = [f"roofline   an ESTIMATE, not a measurement: each compiled program's FLOPs and HBM bytes per device "
             f"(loops by their trip counts) against {chip.name}'s published {chip.bf16_tflops:g} TFLOP/s bf16 and "
             f"{chip.hbm_gb_s:g} GB/s",
             f"  {'program':<18}{'TFLOP':>9} {'HBM GB':>9} {'compute':>9} {'memory':>9} {'estimate':>9}  (per device, s)"]
    for p in costed:
        c = p.cost
        compute, memory = c.flops / (chip.bf16_tflops * 1e12), c.bytes / (chip.hbm_gb_s * 1e9)
        extra = f"  {c.unknown_loops} loop(s) of unknown trip count counted once" if c.unknown_loops else ""
        lines.append(f"  {p.name:<18}{c.flops / 1e12:9.2f} {c.bytes / 1e9:9.2f} {compute:9.3f} {memory:9.3f} "
                     f"{c.seconds(chip):9.3f}{extra}")
    est = step_estimate(plan)
    if est is not None:
        rollout = (f" + rollout {est.calls} calls x {est.rollout_call:.2f} s (pipeline groups x "
                   f"{s.spec.simulator.rules.max_turns} turns, each at the longest prompt and every row to "
                   f"max_new_tokens: an upper bound)" if est.calls else "")
        lines.append(f"step       estimate {est.step:.1f} s = update {est.update:.2f} s{rollout}; "
                     f"implied MFU {100 * est.mfu:.1f}% of the step, {100 * est.update_mfu:.1f}% of the update "
                     f"(model FLOPs: 6N per trained token, 2N per read or sampled one)")
    return lines
