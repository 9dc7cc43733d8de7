"""A roofline estimate of a train step on a target's chips or cards (TPU, GPU): the compiled programs'
FLOPs and HBM bytes (rlver_jax.train.planner.hlo_cost) against their published peaks, and the MFU it implies.
An estimate, not a measurement.
"""

from __future__ import annotations

import dataclasses

from rlver_jax.models import ragged_attention
from rlver_jax.train.planner.phases import rollout_shapes
from rlver_jax.train.planner.plan import Plan
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


def _rollout(plan: Plan, by_name: dict, shapes, chip) -> tuple[float, float, str, float]:
    """(seconds with every reply at max_new_tokens, seconds at the expected length, the arithmetic
    in words, tokens each host samples or feeds) of a step's rollout on every host at once.

    The rollout engine: each turn, every dialogue of the host decodes in one batch of its rows
    (the chunks' steps: the reply's tokens, times dialogues / rows), a reply costing its own
    tokens, then its feed is prefilled in chunks; the rows' attention kernel reads each row to its
    fill (hlo_cost.Cost.at_fill), assumed the longest prompt every turn (RolloutShapes.fill) plus
    the reply's mean position while decoding, the longest prompt while prefilling, each to the
    end of its key block (half a block past the fill on average). Static calls:
    each pipeline group's call per turn at the longest prompt, each call costing its longest row:
    max_new_tokens either way."""
    s = plan.setup
    turns, new = s.spec.simulator.rules.max_turns, shapes.new_tokens
    dialogues = max(1, s.spec.loop.dialogues // s.hosts)
    if shapes.engine:
        decode, slots = by_name["rollout"].cost, shapes.cache_slots

        def read(reply: float) -> float:  # slots a decode step reads of a row, to the end of its last key block
            return shapes.fill + reply / 2 + ragged_attention.DECODE_KEY_BLOCK / 2

        def step(reply: int) -> float:  # a decode step at the rows' mean fill over a reply of `reply` tokens
            return decode.at_fill(read(reply) / slots).seconds(chip) / shapes.decode_chunk

        chunks = -(-plan.feed_tokens // shapes.prompt)
        prefill = by_name["rollout prefill"].cost.at_fill(
            (shapes.fill + ragged_attention.PREFILL_KEY_BLOCK / 2) / slots).seconds(chip) * chunks
        waves = max(1.0, dialogues / shapes.rows)

        def seconds(reply: int) -> float:
            return turns * (reply * waves * step(reply) + prefill)

        whole = decode.seconds(chip) / shapes.decode_chunk
        how = (f"{turns} turns x ({new} tokens x {waves:g} wave(s) of {shapes.rows} rows x {step(new) * 1e3:.1f} ms "
               f"a decode step + prefill {prefill:.2f} s); the cached attention reads each row to its fill, "
               f"assumed the longest prompt ({shapes.fill} tokens) every turn plus the reply's mean position, "
               f"to the end of its key block: {read(new) / slots:.0%} of its {slots} slots (every row whole: "
               f"{whole * 1e3:.1f} ms a decode step)")
        return (seconds(new), seconds(plan.expected_reply_tokens), how,
                turns * dialogues * (plan.feed_tokens + new))
    calls = shapes.groups * turns
    call = by_name["rollout"].cost.seconds(chip)
    how = (f"{calls} calls x {call:.2f} s (pipeline groups x {turns} turns, each at the longest prompt, a call "
           f"costing its longest row: every reply's length gives max_new_tokens)")
    return calls * call, calls * call, how, calls * shapes.rows * (shapes.prompt + new)


def step_estimate(plan: Plan) -> StepEstimate | None:
    """The roofline of a train step from the compiled programs' costs (hlo_cost.program_cost): the
    update's programs once each, and the rollout's sampler programs (`_rollout`) on every host at
    once: with every reply at max_new_tokens, an upper bound, and at the plan's expected reply
    length. MFU counts model FLOPs (6 x parameters per trained token, 4 x with LoRA, whose base
    takes no gradient; 2 x per token a program only reads or samples; attention left out) against
    the step's estimate with every reply at max_new_tokens."""
    s, chip = plan.setup, plan.setup.chip
    by_name = {p.name: p for p in plan.phases}
    shapes = rollout_shapes(s.spec, plan.feed_tokens, s.hosts)
    sampler = ("rollout", "rollout prefill") if shapes.engine else ("rollout",)
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
    if all(n in by_name for n in sampler):
        rollout, expected, how, host_tokens = _rollout(plan, by_name, shapes, chip)
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
