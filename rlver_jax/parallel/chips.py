"""The accelerators' published figures, one table for the planner's targets: TPU chips
(rlver_jax.parallel.topology) and GPU cards (rlver_jax.parallel.gpu_topology), keyed by the device
kind jax reports for them; and this host's CPU, measured (rlver_jax.parallel.host_peaks). The
planner's budget is a row's memory and its step estimate weighs a compiled program's FLOPs, HBM
bytes, collectives and kernel grid steps against the row's figures (rlver_jax.train.planner.terms).

Where the figures come from (`SOURCES`, printed with a plan):
  TPU  peak, HBM: Google Cloud TPU system-architecture pages (docs.cloud.google.com/tpu/docs/v4,
       v5e, v5p-training, v6e). ICI: the bandwidth one collective gets is one link's both
       directions, 9e10 (v4), 1e11 (v5e), 2e11 (v5p, v6e) bytes/s, and a ring step costs about
       1 us a hop ("How to Scale Your Model", Austin et al. 2025, part 2: TPUs; consistent with the
       Cloud pages' 400 / 1200 / 800 GB/s bidirectional per v5e / v5p / v6e chip over 4 / 6 / 4
       ports). DCN: 50 Gb/s per v5p chip (Cloud); v5e 2 x 100 Gb/s NICs per 8-chip host (Cloud);
       v4, v6e about 2.5e10 bytes/s per host (the same book) over 4 and 8 chips. PCIe about 1.5e10
       bytes/s per chip, 3.2e10 on v6e (the same book).
  GPU  NVIDIA's data sheets (SXM boards): dense bf16 peak, HBM, NVLink 900 GB/s (H100, H200) and
       600 GB/s (A100) both directions (a ring sends half of it each way); a node's network, DGX
       H100 / H200: 8 x 400 Gb/s ConnectX-7, DGX A100: 8 x 200 Gb/s, one per GPU; PCIe Gen5 / Gen4
       x16.
Assumptions (no published figure): a Pallas TPU kernel's grid step costs 0.35 us of fixed
overhead (the figure models/ragged_attention.py sized its key blocks by); a ring step costs 2 us
of latency on NVLink and 5 us across slices or nodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

SOURCES = ("TPU: Google Cloud TPU system-architecture pages; ICI per link, DCN and PCIe: 'How to Scale Your Model' "
           "(Austin et al. 2025), part 2. GPU: NVIDIA's SXM data sheets, DGX H100/H200/A100 networking")
ASSUMED = "a Pallas grid step 0.35 us; a ring step's latency 2 us on NVLink, 5 us across slices or nodes"


@dataclasses.dataclass(frozen=True)
class Chip:
    """An accelerator's per-device figures (published, or measured for this host's CPU)."""

    name: str  # "v5e", "h100", "cpu"
    device_kind: str  # what jax's devices report: "TPU v5 lite", "NVIDIA H100 80GB HBM3"
    bf16_tflops: float  # peak dense bf16 matmul, TFLOP/s (the CPU: measured in the run's compute dtype)
    hbm_gb_s: float  # HBM bandwidth, GB/s (the CPU: measured streaming bandwidth)
    hbm_gb: float  # memory per device as published (GiB): the planner's default budget, in GB of 1e9 bytes
    near_gb_s: float = 0.0  # GB/s one collective moves per device inside a domain (ICI, NVLink); 0: none
    far_gb_s: float = 0.0  # GB/s per device across domains (DCN between slices, a node's network); 0: none
    host_gb_s: float = 0.0  # GB/s per device to host memory (PCIe): the offload's moves
    near_step_us: float = 0.0  # latency of one ring step inside a domain
    far_step_us: float = 0.0  # latency of one ring step across domains
    grid_step_us: float = 0.0  # fixed cost of a Pallas kernel's grid step (TPU)
    op_us: float = 0.0  # fixed cost of each operation a program runs (the CPU: measured); 0: in the roofline
    call_us: float = 0.0  # fixed cost of a program call from the host (the CPU: measured)
    measured: str = ""  # how a measured row was measured ("": published figures)


_TPU = dict(near_step_us=1.0, grid_step_us=0.35)
CHIPS = {c.device_kind: c for c in (
    Chip("v4", "TPU v4", 275.0, 1228.0, 32.0, near_gb_s=90.0, far_gb_s=25.0 / 4, host_gb_s=15.0, far_step_us=5.0,
         **_TPU),
    Chip("v5e", "TPU v5 lite", 197.0, 819.0, 16.0, near_gb_s=100.0, far_gb_s=25.0 / 8, host_gb_s=15.0,
         far_step_us=5.0, **_TPU),
    Chip("v5p", "TPU v5", 459.0, 2765.0, 95.0, near_gb_s=200.0, far_gb_s=6.25, host_gb_s=15.0, far_step_us=5.0,
         **_TPU),
    Chip("v6e", "TPU v6 lite", 918.0, 1640.0, 32.0, near_gb_s=200.0, far_gb_s=25.0 / 8, host_gb_s=32.0,
         far_step_us=5.0, **_TPU),
    # NVIDIA's data sheets: dense bf16 (without sparsity), SXM boards.
    Chip("h100", "NVIDIA H100 80GB HBM3", 989.0, 3350.0, 80.0, near_gb_s=450.0, far_gb_s=50.0, host_gb_s=64.0,
         near_step_us=2.0, far_step_us=5.0),
    Chip("h200", "NVIDIA H200 141GB HBM3e", 989.0, 4800.0, 141.0, near_gb_s=450.0, far_gb_s=50.0, host_gb_s=64.0,
         near_step_us=2.0, far_step_us=5.0),
    Chip("a100", "NVIDIA A100-SXM4-80GB", 312.0, 2039.0, 80.0, near_gb_s=300.0, far_gb_s=25.0, host_gb_s=32.0,
         near_step_us=2.0, far_step_us=5.0),
)}


def chip_of(device: Any) -> Chip | None:
    """The published figures of a device's chip or card, or None (a CPU, an unknown accelerator)."""
    return CHIPS.get(getattr(device, "device_kind", ""))
