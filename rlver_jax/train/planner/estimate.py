"""A train step's time on the plan's chips, term by term (an estimate, not a measurement), from
the compiled programs' costs (planner.terms) and the step's dialogues played out
(planner.lengths, planner.rollout_time):

  rollout    the slowest host's dialogues to their end: the engine's decode and prefill calls
             (their compute, HBM traffic, collectives, Pallas grid steps) and, between a
             dialogue's turns, the simulator's answers (the host idles while every dialogue in
             flight waits for its user);
  update     prepare, then each model's program: its loop of optimizer steps (epochs x
             mini-batches, each of its micro-batches) counted by its trip count, at the step's
             shapes (planner.rows); a mini-batch of padding rows only is skipped (lax.cond),
             so a model's program counts the mini-batches with real rows only;
  offload    the state's moves between host and device memory (config.train.offload) over the
             chip's host link.
With rollout.max_staleness >= 1 the next batch's rollout runs during this update: the update
fills the device's idle time in the rollout (the simulator's waits), so a step takes the longer
of the rollout's wall time and its device time plus the update.

Two cases, each with its own shapes: every reply at max_new_tokens (the bound) and replies drawn
from a lognormal (planner.lengths.Lengths).
"""

from __future__ import annotations

import dataclasses

from rlver_jax.parallel.chips import Chip
from rlver_jax.train.planner.hlo_cost import Cost
from rlver_jax.train.planner.lengths import Dialogues
from rlver_jax.train.planner.rollout_time import RolloutTime, Simulator
from rlver_jax.train.planner.rows import UpdateShapes
from rlver_jax.train.planner.terms import Terms, terms


@dataclasses.dataclass(frozen=True)
class Case:
    """A step's dialogues as the estimate plays them, and the update's compiled costs at their shapes."""

    name: str  # "every reply at max_new_tokens", "lognormal replies"
    hosts: list[Dialogues]  # each host's dialogues
    shapes: UpdateShapes
    costs: dict[str, Cost]  # the update's programs ("prepare", "actor update", "critic update") at `shapes`
    compiled_apart: bool = False  # compiled at its own shapes (not the memory plan's)


@dataclasses.dataclass(frozen=True)
class UpdateTime:
    """The update's programs of one step, each run once (a model's loop of optimizer steps within)."""

    shapes: UpdateShapes
    programs: dict[str, Terms]

    @property
    def total(self) -> Terms:
        return sum(self.programs.values(), Terms())

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.programs.values())


@dataclasses.dataclass(frozen=True)
class CaseEstimate:
    """One case's step: its rollout (the slowest host's), update and offload, in seconds."""

    name: str
    rollout: RolloutTime | None  # None: not estimated (an engine off the devices)
    update: UpdateTime
    offload: float
    staleness: int  # config.rollout.max_staleness
    update_flops: float  # the update's model FLOPs, every device (6N a trained token, 4N with LoRA; 2N a read one)
    rollout_flops: float  # the rollout's, every host (2N a sampled or fed token)

    @property
    def rollout_wall(self) -> float:
        return self.rollout.wall if self.rollout is not None else 0.0

    @property
    def on_policy(self) -> float:
        """The step with max_staleness 0: rollout, then update, then the state's moves."""
        return self.rollout_wall + self.update.seconds + self.offload

    @property
    def overlapped(self) -> float:
        """The step with max_staleness >= 1: the update fills the rollout's idle device time."""
        if self.rollout is None:
            return self.on_policy
        return max(self.rollout_wall, self.rollout.device + self.update.seconds + self.offload)

    @property
    def step(self) -> float:
        """The step as configured (config.rollout.max_staleness)."""
        return self.overlapped if self.staleness else self.on_policy

    @property
    def hidden(self) -> float:
        """What max_staleness >= 1 hides of the on-policy step."""
        return self.on_policy - self.overlapped


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """The step estimate of a plan: its cases (the first every reply at max_new_tokens), the chip
    and what it assumed."""

    cases: list[CaseEstimate]
    chip: Chip
    devices: int
    simulator: Simulator
    lengths: str  # the length assumptions, in words

    @property
    def bound(self) -> CaseEstimate:
        return self.cases[0]

    @property
    def step(self) -> float:
        return self.bound.step

    def _peak(self, seconds: float) -> float:
        return self.devices * self.chip.bf16_tflops * 1e12 * seconds

    @property
    def mfu(self) -> float:
        """Model FLOPs over the step (every reply at max) at the chips' peak."""
        c = self.bound
        return (c.update_flops + c.rollout_flops) / self._peak(c.step) if c.step else 0.0

    @property
    def update_mfu(self) -> float:
        c = self.bound
        return c.update_flops / self._peak(c.update.seconds) if c.update.seconds else 0.0


def update_time(case: Case, chip: Chip) -> UpdateTime:
    """The update's programs at `case.shapes` on `chip`: each model's program counts the mini-batches
    with real rows only (its loop runs every mini-batch, the padding ones skipped)."""
    shapes, out = case.shapes, {}
    for name, cost in case.costs.items():
        t = terms(cost, chip)
        out[name] = t if name == "prepare" else t.times(shapes.optimizer_steps / max(1, shapes.loop_steps))
    return UpdateTime(shapes, out)
