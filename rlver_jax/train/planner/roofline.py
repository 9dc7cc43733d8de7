"""A roofline estimate of a train step on a target's chips or cards (TPU, GPU): the compiled programs'
FLOPs and HBM bytes (rlver_jax.train.planner.hlo_cost) against their published peaks, and the MFU it implies.
An estimate, not a measurement.
"""

from __future__ import annotations

import dataclasses

from rlver_jax.train.planner.plan import Plan
from rlver_jax.train.planner.sampler import rollout_shapes
from rlver_jax.train.planner.setup import UPDATE


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """A roofline estimate of a train step on the target's chips (not a measurement)."""

    update: float  # seconds: prepare + each model's update program, once each
    rollout: float  # seconds of the step's rollout (every host at once), every reply to max_new_tokens
    expected: float  # the same with replies of the plan's expected length
    how: str  # the rollout's arithmetic, in words
    model_flops: float  # the step's model FLOPs, all devices (6N per trained token, 2N per scored or sampled one)
    update_flops: float  # of which the update's
    devices: int
    peak: float  # FLOP/s per device

    @property
    def step(self) -> float:
        return self.update + self.rollout

    @property
    def step_expected(self) -> float:
        return self.update + self.expected

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.devices * self.peak * self.step) if self.step else 0.0

    @property
    def update_mfu(self) -> float:
        return self.update_flops / (self.devices * self.peak * self.update) if self.update else 0.0


def step_estimate(plan: Plan) -> StepEstimate | None:
    """The roofline of a train step from the compiled programs' costs (hlo_cost.program_cost): the
    update's programs once each, and the rollout engine's programs (its plan's `rollout_seconds`)
    on every host at once: with every reply at max_new_tokens, an upper bound, and at the plan's
    expected reply length. MFU counts model FLOPs (6 x parameters per trained token, 4 x with LoRA, whose base
    takes no gradient; 2 x per token a program only reads or samples; attention left out) against
    the step's estimate with every reply at max_new_tokens."""
    s, chip = plan.setup, plan.setup.chip
    by_name = {p.name: p for p in plan.phases}
    shapes = rollout_shapes(s.spec, plan.feed_tokens, s.hosts)
    sampler = shapes.programs  # the engine's programs its estimate reads (none for a served engine)
    needed = [by_name[n] for n in UPDATE if n in by_name] + [by_name[n] for n in sampler if n in by_name]
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
    rollout, expected, how, sampled = 0.0, 0.0, "", 0.0
    estimate = shapes.rollout_seconds(
        {n: by_name[n].cost for n in sampler}, chip, turns=s.spec.simulator.rules.max_turns,
        dialogues=max(1, s.spec.loop.dialogues // s.hosts), feed_tokens=plan.feed_tokens,
        expected=plan.expected_reply_tokens) if all(n in by_name for n in sampler) else None
    if estimate is not None:  # the rollout on every host at once
        rollout, expected, how, host_tokens = estimate
        sampled = s.hosts * 2 * actor_n * host_tokens
    return StepEstimate(update, rollout, expected, how, update_flops + sampled, update_flops, s.mesh.size,
                        chip.bf16_tflops * 1e12)


def format_roofline(plan: Plan) -> list[str]:
    """The roofline lines of a plan compiled for a target's chip or card (none otherwise)."""
    chip = plan.setup.chip
    costed = [p for p in plan.phases if p.cost is not None]
    if chip is None or not costed:
        return []
    lines = [f"roofline   an ESTIMATE, not a measurement: each compiled program's FLOPs and HBM bytes per device "
             f"(loops by their trip counts) against {chip.name}'s published {chip.bf16_tflops:g} TFLOP/s bf16 and "
             f"{chip.hbm_gb_s:g} GB/s",
             f"  {'program':<18}{'TFLOP':>9} {'HBM GB':>9} {'compute':>9} {'memory':>9} {'estimate':>9}  "
             f"(per device, s)"]
    for p in costed:
        c = p.cost
        compute, memory = c.flops / (chip.bf16_tflops * 1e12), c.bytes / (chip.hbm_gb_s * 1e9)
        extra = f"  {c.unknown_loops} loop(s) of unknown trip count counted once" if c.unknown_loops else ""
        lines.append(f"  {p.name:<18}{c.flops / 1e12:9.2f} {c.bytes / 1e9:9.2f} {compute:9.3f} {memory:9.3f} "
                     f"{c.seconds(chip):9.3f}{extra}")
    est = step_estimate(plan)
    if est is not None:
        rollout = f" + rollout {est.rollout:.1f} s = {est.how}" if est.how else ""
        lines.append(f"step       estimate {est.step:.1f} s = update {est.update:.2f} s{rollout}, every reply at "
                     f"max_new_tokens (an upper bound); implied MFU {100 * est.mfu:.1f}% of the step, "
                     f"{100 * est.update_mfu:.1f}% of the update (model FLOPs: 6N per trained token, 2N per read or "
                     f"sampled one)")
        if est.how:
            lines.append(f"step       estimate {est.step_expected:.1f} s with replies of {plan.expected_reply_tokens} "
                         f"tokens on average (--expected_reply_tokens): rollout {est.expected:.1f} s")
    return lines
