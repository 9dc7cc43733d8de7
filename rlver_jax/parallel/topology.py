"""Compile-only TPU targets on any host, and the chips' published figures.

With the `libtpu` package installed (`pip install -e '.[tpu]'`), `tpu_target("v5e:4x4")` gives the
16 compile-only devices of a v5e-16 slice (jax.experimental.topologies): a `Mesh` over them lowers
and compiles jitted programs with the TPU compiler on a CPU host, and `compiled.memory_analysis()`
and `cost_analysis()` are the TPU compiler's. Nothing runs; no TPU is needed. `num_slices=N` gives
N such slices joined over the data-centre network (their devices carry `slice_index`).

Names are `GENERATION:TOPOLOGY`, chips along each ICI dimension: v5e and v6e `AxB` (2x2, 4x4,
8x8, 16x16 ...), v4 and v5p `AxBxC` (2x2x1, 2x2x2, 2x2x4 ...). v4 targets are compiled as a v4
runtime presents them, one device per chip (megacore). Cloud's slice names count TensorCores for
v4 and v5p (v4-32 = v4:2x2x4, 16 chips; v5p-8 = v5p:2x2x1, 4 chips) and chips for v5e and v6e
(v5e-16 = v5e:4x4).

The chips' published figures are rlver_jax.parallel.chips'; GPU targets, the same `Target` compiled
by the CUDA compiler, are rlver_jax.parallel.gpu_topology's.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import importlib.util
import math
import os
import re
from collections.abc import Sequence

from rlver_jax.parallel.chips import CHIPS, Chip

_DIMS = {"v4": 3, "v5p": 3, "v5e": 2, "v6e": 2}  # ICI dimensions in a topology name
_CHIP_CONFIG = {"v4": "megacore"}  # one device per chip, as a v4 runtime presents them
_EXAMPLES = "v5e:2x2, v5e:4x4, v5e:8x8, v6e:4x4, v5p:2x2x1, v5p:2x2x2, v4:2x2x1, v4:2x2x4"
VALID_FORMS = (f"GENERATION:AxB for v5e and v6e, GENERATION:AxBxC for v4 and v5p (chips per ICI dimension; "
               f"a multi-host slice's dimensions are multiples of its hosts' 2x2), e.g. {_EXAMPLES}")


def libtpu_available() -> bool:
    """Whether the `libtpu` package (the TPU compiler) is installed."""
    return importlib.util.find_spec("libtpu") is not None


def _no_tpu_attached() -> bool:
    return not glob.glob("/dev/accel*") and not glob.glob("/dev/vfio/[0-9]*")


@dataclasses.dataclass(frozen=True)
class Target:
    """The devices of `slices` TPU slices of one topology, compile-only."""

    name: str  # "v5e:4x4"
    slices: int
    devices: tuple  # compile-only jax devices: slice-major, each with its process (host) index

    @property
    def chip(self) -> Chip:
        return CHIPS[self.devices[0].device_kind]

    @property
    def device_kind(self) -> str:
        return self.devices[0].device_kind

    @property
    def hosts(self) -> int:
        return len({(getattr(d, "slice_index", 0), d.process_index) for d in self.devices})

    @property
    def devices_per_host(self) -> int:
        return len(self.devices) // self.hosts

    def host_target(self) -> Target:
        """One host's slice of this topology (its 4 chips, a 2x2 or 2x2x1 topology), for programs
        that run on one host's devices (the sampler's): the TPU compiler takes a program over a
        subset of a multi-host topology's devices as a topology of that many devices and rejects
        the subset's device ids, so such programs are compiled for a one-host topology instead."""
        if self.hosts == 1:
            return self
        generation, _ = parse_name(self.name)
        if self.devices_per_host != 4:
            raise ValueError(f"{self.name}: hosts of {self.devices_per_host} devices; one-host programs are "
                             "compiled for hosts of 4 chips only")
        return tpu_target(f"{generation}:{'2x2' if _DIMS[generation] == 2 else '2x2x1'}")

    def describe(self) -> str:
        slices = f"{self.slices} slices of " if self.slices > 1 else ""
        hosts = f"{self.hosts} host{'s' if self.hosts > 1 else ''} of {self.devices_per_host}"
        return (f"{slices}{self.name}: {len(self.devices)} x {self.device_kind} ({self.chip.name}), {hosts}, "
                f"{self.chip.hbm_gb:g} GB HBM per chip")

    @property
    def compiler(self) -> str:
        """The compiler its programs are compiled by, with its version (the plan's `target` line)."""
        return f"the TPU compiler (libtpu {package_version('libtpu')})"

    def runtime_notes(self, peak: int) -> list[str]:
        """What a run of a plan with this per-device `peak` (bytes) must set on the target: nothing
        on a TPU (gpu_topology.GpuTarget's say more)."""
        return []


def parse_name(name: str) -> tuple[str, tuple[int, ...]]:
    """(generation, chips per ICI dimension) of a topology name; ValueError naming the valid forms."""
    m = re.fullmatch(r"(v4|v5e|v5p|v6e):(\d+(?:x\d+)*)", name.strip())
    dims = tuple(int(x) for x in m.group(2).split("x")) if m else ()
    if not m or len(dims) != _DIMS[m.group(1)] or not all(dims):
        raise ValueError(f"--topology={name!r} is not a TPU topology name; use {VALID_FORMS}")
    return m.group(1), dims


def accelerator_type(generation: str, dims: Sequence[int]) -> str:
    """Cloud's accelerator type of one slice (v5p:2x2x2 -> "v5p-16"): v4 and v5p count TensorCores,
    two per chip; v5e (v5litepod) and v6e count chips."""
    chips = math.prod(dims)
    return {"v4": f"v4-{2 * chips}", "v5p": f"v5p-{2 * chips}", "v5e": f"v5litepod-{chips}",
            "v6e": f"v6e-{chips}"}[generation]


def tpu_target(name: str, slices: int = 1) -> Target:
    """The compile-only devices of `slices` slices of TPU topology `name` (module docstring). Needs
    libtpu; several processes may hold it at once (ALLOW_MULTIPLE_LIBTPU_LOAD: nothing runs)."""
    generation, dims = parse_name(name)
    if slices < 1:
        raise ValueError(f"--slices={slices}: use 1 or more TPU slices")
    if not libtpu_available():
        raise ValueError("compiling for a TPU topology needs libtpu: pip install -e '.[tpu]' (libtpu==0.0.52)")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: no process holds a chip
    _hide_cpu_flags_from_libtpu()
    if _no_tpu_attached():  # off a TPU VM libtpu would look for the VM's workers and type in its metadata
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        # Else libtpu prints "Failed to find host bounds ... set env var TPU_ACCELERATOR_TYPE"; the
        # compiled programs do not depend on it (the topology name decides), the first target's names it.
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator_type(generation, dims))
    from jax.experimental import topologies

    kwargs = {"chip_config_name": _CHIP_CONFIG[generation]} if generation in _CHIP_CONFIG else {}
    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=name, num_slices=slices, **kwargs)
    except Exception as e:  # libtpu's own message, on one line
        detail = " ".join(str(e).split())[:300]
        raise ValueError(f"--topology={name!r}: {detail}; use {VALID_FORMS}") from None
    return Target(name, slices, tuple(topo.devices))


def _hide_cpu_flags_from_libtpu() -> None:
    """libtpu aborts the process on a flag in XLA_FLAGS its build does not know, such as some of the
    CPU backend's --xla_cpu_* (tests/conftest.py sets one). The CPU backend reads them first (its
    devices are made here if they were not yet), then they leave the environment libtpu reads."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    cpu = [f for f in flags if f.startswith("--xla_cpu_")]
    if cpu:
        import jax

        jax.devices("cpu")
        os.environ["XLA_FLAGS"] = " ".join(f for f in flags if f not in cpu)


def package_version(name: str) -> str:
    """An installed package's version, or "?" (informational only)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"
