"""A compiled program's time on a chip, term by term (an estimate, not a measurement): its FLOPs
at the chip's peak and its HBM bytes at the chip's bandwidth (the roofline: the larger), its
collectives' bytes over the link their group spans (ICI or NVLink inside a slice or node, DCN or
the node's network across) with each ring step's latency, its Pallas kernels' grid steps at their
fixed cost and, where the chip has one (this host's CPU, measured), a fixed cost per operation.

What overlaps: the collectives the compiler scheduled asynchronously (`*-start` ... `*-done`) are
assumed hidden behind the program's compute and HBM time (the larger of the three counts); the
synchronous ones, the ring latencies, the grid steps and the per-operation costs are added.
"""

from __future__ import annotations

import dataclasses

from rlver_jax.parallel.chips import Chip
from rlver_jax.train.planner.hlo_cost import Cost

OVERLAP = ("asynchronous collectives (*-start/*-done) overlap compute and HBM traffic; synchronous ones, ring "
           "latencies, kernel grid steps and per-operation costs add")


@dataclasses.dataclass(frozen=True)
class Terms:
    """Seconds per device of one run of a program (or of several: `times`, `+`)."""

    compute: float = 0.0  # FLOPs at the peak
    memory: float = 0.0  # HBM bytes at the bandwidth
    overlapped: float = 0.0  # asynchronous collectives' bytes over their links
    collectives: float = 0.0  # synchronous collectives' bytes over their links
    latency: float = 0.0  # the collectives' ring steps x the link's step latency
    kernel_fixed: float = 0.0  # Pallas grid steps x the fixed cost of one
    op_fixed: float = 0.0  # operations x the fixed cost of one (this host's CPU)

    @property
    def seconds(self) -> float:
        return max(self.compute, self.memory, self.overlapped) + self.added

    @property
    def added(self) -> float:
        """What the roofline leaves out and the estimate adds."""
        return self.collectives + self.latency + self.kernel_fixed + self.op_fixed

    @property
    def communication(self) -> float:
        """The collectives' time, overlapped or not, with their latency."""
        return self.overlapped + self.collectives + self.latency

    def times(self, n: float) -> Terms:
        return Terms(**{f.name: n * getattr(self, f.name) for f in dataclasses.fields(self)})

    def __add__(self, other: Terms) -> Terms:
        return Terms(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})

    def beyond(self, other: Terms) -> Terms:
        """What this program adds to `other` (a part of it), term by term, none below 0."""
        return Terms(**{f.name: max(getattr(self, f.name) - getattr(other, f.name), 0.0)
                        for f in dataclasses.fields(self)})


def terms(cost: Cost, chip: Chip) -> Terms:
    """The terms of one run of a program of cost `cost` on `chip` (module docstring). Collectives
    between virtual devices of one host (no link in the chip's row) move at its memory bandwidth."""
    near = (chip.near_gb_s or chip.hbm_gb_s) * 1e9
    far = (chip.far_gb_s or chip.near_gb_s or chip.hbm_gb_s) * 1e9
    return Terms(compute=cost.flops / (chip.bf16_tflops * 1e12), memory=cost.bytes / (chip.hbm_gb_s * 1e9),
                 overlapped=cost.near_async / near + cost.far_async / far,
                 collectives=cost.near_sync / near + cost.far_sync / far,
                 latency=(cost.near_steps * chip.near_step_us + cost.far_steps * chip.far_step_us) * 1e-6,
                 kernel_fixed=cost.grid_steps * chip.grid_step_us * 1e-6, op_fixed=cost.ops * chip.op_us * 1e-6)
