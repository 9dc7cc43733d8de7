"""Which parameter version writes each policy turn of a batch: the version schedule (issue 41).

Versions count trainer updates (version v: the parameters after v updates). A training batch i
(consumed by train step i) under max_staleness s writes turn k of every dialogue (k: the policy
turns before it) with version

  min(i - s + k, last),  last = i - 1 when s >= 1, i when s = 0,

so a dialogue starts on the oldest version the bound allows and moves to newer ones while it is in
flight ("partial rollouts"), never past i - 1: that version is published when step i - 2 ends, so
batch i never waits for the update of step i - 1, which is the overlap that max_staleness buys.
s = 0 (first = last = i) and s = 1 (first = last = i - 1) are whole-batch versions; without
partial rollouts every turn uses the first version (rollout.partial_rollouts False, an ablation).

A version that was never published (those below 0 at the start of a run; those a resume's
checkpoint lacks) resolves to the smallest published one at or above it (rollout.buffer). The
schedule is a function of (batch index, turn) alone, never of timing, so a batch's dialogues are
a pure function of (seed, step) and resume stays exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

# (version wanted) -> (version used, its parameters), blocking until one is published
# (rollout.buffer.RolloutBuffer.resolve).
Resolve = Callable[[int], tuple[int, Any]]


@dataclasses.dataclass(frozen=True)
class VersionSchedule:
    """Turn k is written by version min(first + k, last); an evaluation is first == last == step."""

    first: int
    last: int

    def __post_init__(self):
        if self.last < self.first:
            raise ValueError(f"version schedule {self.first}..{self.last}: its last version precedes its first")

    @classmethod
    def fixed(cls, version: int) -> VersionSchedule:
        """Every turn by `version` (an evaluation of one step's parameters)."""
        return cls(version, version)

    @classmethod
    def for_batch(cls, index: int, max_staleness: int, partial: bool) -> VersionSchedule:
        """The schedule of training batch `index` (the module docstring)."""
        if max_staleness < 0:
            raise ValueError(f"config.rollout.max_staleness={max_staleness} must be >= 0")
        first = index - max_staleness
        if not partial or max_staleness <= 1:
            return cls(first, first)
        return cls(first, index - 1)

    def version(self, turn: int) -> int:
        """The version that writes turn `turn` (0-based count of the policy turns before it)."""
        return min(self.first + turn, self.last)
