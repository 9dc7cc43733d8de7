"""Compile-only GPU targets on any host: the CUDA compiler for a card described, not attached.

With jax's CUDA plugin of the same jax installed in a venv of its own (`pip install -e
'.[gpu-plan]'`; never in the project's venv, where every process would then probe for CUDA),
`gpu_target("h100:8")` gives the 8 compile-only devices of one 8-GPU H100 node: a `Mesh` over them
lowers and compiles jitted programs with the CUDA compiler on a CPU host, and
`compiled.memory_analysis()` is its buffer assignment. Nothing runs; no GPU or driver is needed.

Names are `CARD[:COUNT]`: COUNT is the GPUs of one node (1 to 8; default 1) or `GPUSxNODES`, that
many nodes of that many GPUs (`h100:8x2`: 16 GPUs, each node its own NVLink domain; the nodes'
devices carry their process index). CARD is a row of `CARDS`, whose target description
(a GpuTargetConfig text proto, gpu_targets/, each naming its source) is what XLA would read from
the device; its device kind names the card's published figures (rlver_jax.parallel.chips).

How: jax.experimental.topologies.get_topology_desc(platform="cuda", topology="NODESx1xGPUS",
target_config=<the text proto>) (XLA's GPU plugin: a topology from a description of the target);
JAX_PLATFORMS=cpu first, so that the plugin skips its driver check (without a driver `cuInit`
fails and the plugin would not register).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import re

from rlver_jax.checks import InputError
from rlver_jax.parallel import topology

# card name -> its target description in gpu_targets/
CARDS = {"h100": "h100_sxm.txtpb", "h200": "h200.txtpb", "a100": "a100_sxm_80.txtpb"}
PLUGIN = "jax-cuda12-plugin"
MAX_PER_NODE = 8
VALID_FORMS = (f"CARD[:GPUS] or CARD:GPUSxNODES with CARD one of {', '.join(CARDS)} and 1 to {MAX_PER_NODE} GPUs "
               "a node, e.g. h100:1, h100:8, h200:8, a100:8, h100:8x2")
INSTALL = ("compiling for a GPU needs the CUDA compiler of jax's CUDA plugin, in a venv of its own (never the "
           "project's): python3 -m venv ../gpu-venv && ../gpu-venv/bin/pip install -e '.[gpu-plan]', then "
           "../gpu-venv/bin/python launch/plan.py ... --gpu=...")
_DIR = pathlib.Path(__file__).resolve().parent / "gpu_targets"
# JAX's GPU client holds this fraction of a card's memory unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise.
DEFAULT_MEM_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class GpuTarget(topology.Target):
    """The compile-only devices of `slices` GPU nodes (each its own NVLink domain) of one card."""

    card: str = ""  # a key of CARDS
    memory_bytes: int = 0  # the card's memory as its target description gives it (device_memory_size)

    def host_target(self) -> GpuTarget:
        """One node of this target, for the programs that run on one host's devices (the sampler's)."""
        return self if self.hosts == 1 else gpu_target(f"{self.card}:{self.devices_per_host}")

    def describe(self) -> str:
        nodes = f"{self.hosts} node{'s' if self.hosts > 1 else ''} of {self.devices_per_host}"
        return (f"{self.name}: {len(self.devices)} x {self.device_kind} ({self.chip.name}), {nodes}, "
                f"{self.chip.hbm_gb:g} GB per card ({self.memory_bytes / 1e9:.1f} GB of 1e9 bytes)")

    @property
    def compiler(self) -> str:
        return f"the CUDA compiler ({PLUGIN} {topology.package_version(PLUGIN)}, target gpu_targets/{CARDS[self.card]})"

    def runtime_notes(self, peak: int) -> list[str]:
        """What a run of this plan must set on the card: JAX's GPU client holds 75% of its memory
        unless told otherwise, less than this plan's peak may need."""
        fraction = peak / self.memory_bytes
        if fraction <= DEFAULT_MEM_FRACTION:
            return []
        return [f"JAX's GPU client holds {DEFAULT_MEM_FRACTION:.0%} of the card's memory by default "
                f"({DEFAULT_MEM_FRACTION * self.memory_bytes / 1e9:.1f} GB): this peak needs "
                f"XLA_PYTHON_CLIENT_MEM_FRACTION={min(0.99, fraction + 0.02):.2f} or more in the run's environment"]


def parse_name(name: str) -> tuple[str, int, int]:
    """(card, GPUs per node, nodes) of a GPU target name; InputError naming the valid forms."""
    m = re.fullmatch(r"(\w+)(?::(\d+)(?:x(\d+))?)?", name.strip())
    card, per_node, nodes = (m.group(1), int(m.group(2) or 1), int(m.group(3) or 1)) if m else ("", 0, 0)
    if card not in CARDS or not 1 <= per_node <= MAX_PER_NODE or nodes < 1:
        raise InputError(f"--gpu={name!r} is not a GPU target; use {VALID_FORMS}")
    return card, per_node, nodes


def plugin_available() -> bool:
    """Whether jax's CUDA plugin (the CUDA compiler) is installed."""
    return importlib.util.find_spec("jax_cuda12_plugin") is not None


def target_config(card: str) -> str:
    """The GpuTargetConfig text proto of a card (gpu_targets/)."""
    return (_DIR / CARDS[card]).read_text()


def gpu_target(name: str) -> GpuTarget:
    """The compile-only devices of GPU target `name` (module docstring). Needs jax's CUDA plugin of
    jax's own version (INSTALL); JAX_PLATFORMS is set to cpu unless JAX's backends already started."""
    card, per_node, nodes = parse_name(name)
    if not plugin_available():
        raise InputError(INSTALL)
    import jax
    from jax._src import xla_bridge
    from jax.experimental import topologies

    if topology.package_version(PLUGIN) != jax.__version__:
        raise InputError(f"{PLUGIN} {topology.package_version(PLUGIN)} is not jax's version {jax.__version__}: "
                         f"pip install '{PLUGIN}[with-cuda]=={jax.__version__}' in the GPU-planning venv")
    if not xla_bridge.backends_are_initialized() and not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")  # the plugin registers without looking for a driver
    config = target_config(card)
    try:
        topo = topologies.get_topology_desc(platform="cuda", topology=f"{nodes}x1x{per_node}", target_config=config)
    except Exception as e:  # noqa: BLE001 - the plugin's own message, on one line
        detail = " ".join(str(e).split())[:300]
        raise InputError(f"--gpu={name!r}: {detail} (JAX_PLATFORMS=cpu before JAX starts lets the CUDA plugin "
                         "register without a GPU)") from None
    memory = int(re.search(r"device_memory_size:\s*(\d+)", config).group(1))
    return GpuTarget(name, nodes, tuple(topo.devices), card=card, memory_bytes=memory)
