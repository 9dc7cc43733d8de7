"""The accelerators' published figures, one table for the planner's targets: TPU chips
(rlver_jax.parallel.topology) and GPU cards (rlver_jax.parallel.gpu_topology), keyed by the device
kind jax reports for them. The planner's budget is a row's memory and its roofline weighs a
compiled program's FLOPs and HBM bytes against the row's peaks (rlver_jax.train.planner.hlo_cost).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Chip:
    """An accelerator's published per-device figures."""

    name: str  # "v5e", "h100"
    device_kind: str  # what jax's devices report: "TPU v5 lite", "NVIDIA H100 80GB HBM3"
    bf16_tflops: float  # peak dense bf16 matmul, TFLOP/s
    hbm_gb_s: float  # HBM bandwidth, GB/s
    hbm_gb: float  # memory per device as published (GiB): the planner's default budget, in GB of 1e9 bytes


CHIPS = {c.device_kind: c for c in (
    Chip("v4", "TPU v4", 275.0, 1228.0, 32.0),
    Chip("v5e", "TPU v5 lite", 197.0, 819.0, 16.0),
    Chip("v5p", "TPU v5", 459.0, 2765.0, 95.0),
    Chip("v6e", "TPU v6 lite", 918.0, 1640.0, 32.0),
    # NVIDIA's data sheets: dense bf16 (without sparsity), SXM boards.
    Chip("h100", "NVIDIA H100 80GB HBM3", 989.0, 3350.0, 80.0),
    Chip("h200", "NVIDIA H200 141GB HBM3e", 989.0, 4800.0, 141.0),
    Chip("a100", "NVIDIA A100-SXM4-80GB", 312.0, 2039.0, 80.0),
)}


def chip_of(device: Any) -> Chip | None:
    """The published figures of a device's chip or card, or None (a CPU, an unknown accelerator)."""
    return CHIPS.get(getattr(device, "device_kind", ""))
