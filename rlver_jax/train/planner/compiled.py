"""A program compiled from abstract shapes into a `Phase`: its per-device memory (the compiler's
memory analysis) and, compiled for a target's chip or card, its cost (rlver_jax.train.planner.hlo_cost).
Shared by the train step's phases (phases.py) and each rollout engine's plan (continuous_plan.py,
static_plan.py).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import jax

from rlver_jax.parallel import sharding
from rlver_jax.train.planner import hlo_cost
from rlver_jax.train.planner.setup import Setup, device_bytes


@dataclasses.dataclass(frozen=True)
class Phase:
    """Per-device bytes of one compiled program."""

    name: str
    resident: int  # held through the phase outside the program's arguments
    arguments: int
    temporaries: int
    outputs: int  # not aliased to donated arguments
    seconds: float  # lowering + compilation
    note: str = ""
    cost: hlo_cost.Cost | None = None  # FLOPs and HBM bytes per device (compiled for a target's chip or card)

    @property
    def total(self) -> int:
        return self.resident + self.arguments + self.temporaries + self.outputs


@dataclasses.dataclass(frozen=True)
class OutOfHbm:
    """A program the TPU compiler refused to build because its buffers exceed the chip's HBM
    ("CompileTimeHbmOom"): its arguments (the shard arithmetic) and the temporaries the compiler
    said it needs, in place of a compiled program's memory analysis."""

    argument_size_in_bytes: int
    temp_size_in_bytes: int
    available: int  # the HBM the compiler had, bytes
    output_size_in_bytes: int = 0
    alias_size_in_bytes: int = 0

    def memory_analysis(self):
        return self


_HBM_OOM = re.compile(r"CompileTimeHbmOom.*?temporaries \(([\d.]+)([KMGT]?)\) "
                      r"exceeds available HBM \(([\d.]+)([KMGT]?)\)", re.S)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def compile_program(s: Setup, jitted, *args):
    """(the compiled program, or OutOfHbm where the TPU compiler refused it; seconds to lower and compile)."""
    t0 = time.perf_counter()
    try:
        compiled = jitted.lower(*args).compile(compiler_options=s.compiler_options)
    except jax.errors.JaxRuntimeError as e:  # the TPU compiler rejects a program that cannot fit
        m = _HBM_OOM.search(str(e))
        if m is None:
            raise
        arguments = device_bytes([x for x in jax.tree.leaves(args) if isinstance(x, jax.ShapeDtypeStruct)])
        compiled = OutOfHbm(arguments, int(float(m.group(1)) * _UNITS[m.group(2)]),
                            int(float(m.group(3)) * _UNITS[m.group(4)]))
    return compiled, time.perf_counter() - t0


def domains(mesh: Any) -> list[int]:
    """Each device's link domain, by the program's device ids (the mesh's devices in order): its
    TPU slice (ICI inside, DCN between), its GPU node (NVLink inside, the network between), else one."""
    devices = list(mesh.devices.flat)
    if sharding.mesh_platform(mesh) == "tpu":
        return [getattr(d, "slice_index", 0) for d in devices]
    if sharding.mesh_platform(mesh) == "gpu":
        return [d.process_index for d in devices]
    return [0] * len(devices)


def program_phase(s: Setup, name: str, compiled, resident: int, seconds: float, note: str = "",
                  mesh: Any = None) -> Phase:
    """The Phase of a program `compile_program` gave, with `resident` bytes held beside it; its
    collectives' links by `mesh`'s devices (default: the run's)."""
    mem = compiled.memory_analysis()  # per device: the compiled program is one SPMD partition
    if isinstance(compiled, OutOfHbm):
        note = (f"OUT OF HBM: the TPU compiler needs {mem.temp_size_in_bytes / 2**30:.2f} GiB of temporaries, has "
                f"{mem.available / 2**30:.2f} GiB (temporaries from its message, no program built); {note}")
    cost = None
    if s.chip is not None and not isinstance(compiled, OutOfHbm):
        try:
            cost = hlo_cost.program_cost(compiled, domains(s.mesh if mesh is None else mesh))
        except jax.errors.JaxRuntimeError as e:  # jaxlib cannot print every module libtpu builds
            note = f"no roofline: the compiled module has no HLO text here ({str(e).splitlines()[0][:80]}); {note}"
    return Phase(name, resident, mem.argument_size_in_bytes, mem.temp_size_in_bytes,
                 mem.output_size_in_bytes - mem.alias_size_in_bytes, seconds, note, cost)
