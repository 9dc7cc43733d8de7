"""What the planner compiles for: a training spec's abstract run (rlver_jax.train.abstract_run, what
build_run loads weights into) with the step's abstract batch and update inputs, on this host's
devices or a TPU topology's or GPU target's compile-only devices (`target`: rlver_jax.parallel.topology,
gpu_topology); and the
bytes of the train state that stay on the devices through each phase (`resident`) or cross
between host and device memory in a step (`crossing_bytes`) under config.train.offload.

The memory plan's update shapes are the worst case of a run (`worst_shapes`): every dialogue
plays every turn, each training row (a dialogue's, or a turn's with think_history "drop") at the
bucketed max_total_tokens, every token scored (the widest policy_positions). The step estimate
compiles the update again where the rows' planned lengths give other shapes (planner.rows).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.models import attention
from rlver_jax.parallel import chips, sharding, topology
from rlver_jax.rl import offload, train_state
from rlver_jax.rl.batch import TrainBatch
from rlver_jax.rl.settings import RLSettings
from rlver_jax.sampling.buckets import bucket
from rlver_jax.train.abstract_run import AbstractRun, abstract_run
from rlver_jax.train.planner.rows import UpdateShapes, update_shapes
from rlver_jax.train.spec import RunSpec

PHASES = ("prepare", "actor update", "critic update", "rollout", "evaluation")
SAMPLERS = PHASES[3:]  # the sampler's phases (each with its KV cache's programs)
UPDATE = PHASES[:3]  # the train step's programs
GB = 1e9  # budgets and figures in GB of 1e9 bytes (a "16 GB" chip holds 16 GiB: ~7% headroom)


@dataclasses.dataclass(frozen=True)
class Setup:
    """The abstract run of a spec (what build_run loads weights into) with the step's abstract batch."""

    run: AbstractRun
    batch: dict  # the train batch (TrainBatch.arrays()), split over the batch axes
    inputs: dict  # what the model programs read: prepare_step's update inputs ...
    rows: Any  # ... and mini-batch rows
    compiler_options: dict | None = None  # see abstract_setup(hoist_converts=...)
    host_devices: int | None = None  # devices per host for the rollout's layout; None: all of them
    target: topology.Target | None = None  # a TPU or GPU target compiled for, or None: this host's devices
    shapes: UpdateShapes | None = None  # the update's shapes the batch has
    host_chip: chips.Chip | None = None  # this host's CPU, measured (parallel.host_peaks): the chip off a target

    @property
    def spec(self) -> RunSpec:
        return self.run.spec

    @property
    def rl(self) -> RLSettings:
        return self.run.spec.rl

    @property
    def mesh(self) -> Mesh:
        return self.run.mesh

    @property
    def update(self):
        return self.run.update

    @property
    def state(self) -> train_state.TrainState:
        return self.run.state

    @property
    def ref(self) -> Any | None:
        """The frozen weights' shapes (a KL term's reference; LoRA's base), or None."""
        return self.run.frozen

    @property
    def hosts(self) -> int:
        return self.mesh.size // (self.host_devices or self.mesh.size)

    @property
    def platform(self) -> str:
        """What the programs are compiled for: "tpu" or "gpu" for a target's devices, else this host's."""
        return sharding.mesh_platform(self.mesh)

    @property
    def chip(self) -> chips.Chip | None:
        """The published figures of the devices' chip or card (a target's), this host's measured
        CPU where the plan has them, or None."""
        return chips.chip_of(self.mesh.devices.flat[0]) or self.host_chip

    @property
    def seq_len(self) -> int:
        return self.batch["tokens"].shape[1]

    @property
    def models(self) -> train_state.TrainState:
        return self.state.models()

    @property
    def frozen(self):
        """The frozen weights as the prepare program takes them (rlver_jax.rl.update.Frozen)."""
        return self.update.frozen(self.ref)

    @property
    def base(self):
        """What the model programs read besides their model: LoRA's base (an argument), else nothing."""
        return self.frozen.base()

    @property
    def offload(self) -> str:
        return self.update.offload

    def in_host_memory(self, stage: str) -> list[str]:
        """The state's parts that config.train.offload keeps in host memory at `stage` (offload.STAGES)."""
        present = tuple(p for p in offload.PARTS if getattr(self.state, p) is not None)
        return offload.in_host_memory(self.offload, stage, present)


def device_bytes(tree: Any) -> int:
    """Bytes of one device's shards of a tree of ShapeDtypeStructs with shardings."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(sharding.BATCH_AXES))


def worst_shapes(spec: RunSpec, hosts: int = 1) -> UpdateShapes:
    """The update of the longest step: every dialogue plays every turn (simulator.max_turns), each
    training row at max_total_tokens, bucketed."""
    rows = spec.simulator.rules.max_turns if spec.rollout.drop_thoughts else 1
    per_host = max(1, spec.loop.dialogues // hosts) * rows
    t = bucket(spec.rollout.max_total_tokens, multiple=spec.loop.length_multiple)
    return update_shapes(spec, [[spec.rollout.max_total_tokens] * per_host] * hosts, hosts, t)


def abstract_batch(shapes: UpdateShapes, mesh: Mesh) -> dict:
    """The train batch of `shapes` (padded rows: R rows of T tokens), every token a policy token (the
    widest policy_positions). Packed rows' layouts (planner.rows.LAYOUTS) add their arrays here."""
    b, t = shapes.rows, shapes.length
    ones, zeros = np.ones((b, t), np.float32), np.zeros((b, t), np.float32)
    batch = TrainBatch(tokens=zeros.astype(np.int32), attention_mask=ones.astype(np.int32), policy_mask=ones,
                       rewards=zeros, sample_logprobs=zeros, group=np.arange(b, dtype=np.int32),
                       dialogue=np.arange(b, dtype=np.int32))
    sh = _batch_sharding(mesh)
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh) for k, v in batch.arrays().items()}


# XLA:CPU computes in fp32 what it holds in bf16: the backward loop over layers converts the stack
# of bf16 layer inputs that remat saves, and loop-invariant code motion hoists that conversion out
# of the loop, holding an fp32 copy of the whole stack (28 layers x T x width x 4 bytes; 6 GB at
# 7B and 15,360 tokens). TPUs and GPUs compute in bf16 and make no such copy.
_NO_HOISTING = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


def abstract_setup(spec: RunSpec, hoist_converts: bool = True, host_devices: int | None = None,
                   target: topology.Target | None = None, shapes: UpdateShapes | None = None,
                   host_chip: chips.Chip | None = None) -> Setup:
    """The abstract run of `spec` (rlver_jax.train.abstract_run, as build_run makes it) and the
    step's abstract batch (`shapes`, default `worst_shapes`) and update inputs, on this host's
    devices or a target's (`target`: compile-only devices; `host_devices` then defaults to its
    hosts' and must equal them). `host_chip`: this host's CPU measured, for a step estimate off a
    target.

    hoist_converts=False on CPU compiles without XLA's loop-invariant code motion (_NO_HOISTING),
    a nearer estimate of bf16 accelerators than XLA:CPU's own figures (True: exactly XLA:CPU's)."""
    if target is not None:
        if host_devices not in (None, target.devices_per_host):
            raise ValueError(f"--host_devices={host_devices}: the hosts of {target.name} have "
                             f"{target.devices_per_host} devices; leave it out with --topology or --gpu")
        host_devices = target.devices_per_host
    run = abstract_run(spec, any_preset=True, devices=None if target is None else target.devices)
    # A model the target cannot run (cudnn attention on a TPU, splash on a CPU) is one line, here.
    t = bucket(spec.rollout.max_total_tokens, multiple=spec.loop.length_multiple)
    attention.resolve(run.actor_cfg.attention, t, run.actor_cfg.jnp_dtype, sharding.mesh_platform(run.mesh))
    cpu = sharding.mesh_platform(run.mesh) == "cpu"
    options = None if hoist_converts or not cpu else _NO_HOISTING
    hosts = run.mesh.size // (host_devices or run.mesh.size)
    shapes = shapes or worst_shapes(spec, hosts)
    batch = abstract_batch(shapes, run.mesh)
    inputs, rows, _, _ = run.update.prepare.eval_shape(run.state.models(), run.update.frozen(run.frozen), batch)
    return Setup(run, batch, inputs, rows, options, host_devices, target, shapes, host_chip)


def _parts(s: Setup, parts: Sequence[str]) -> int:
    return device_bytes([getattr(s.state, p) for p in parts])


def resident(s: Setup, phase: str, mode: str | None = None) -> int:
    """Bytes per device held through `phase` outside its program's arguments, with the state's
    parts where offload `mode` (default: the run's, config.train.offload) has them."""
    on = offload.OFFLOAD[mode or s.offload]
    if phase == "prepare":  # it reads the models: the rest of what is on the devices
        return _parts(s, [p for p in on["prepare"] if p not in offload.READS["prepare"]])
    if phase in ("actor update", "critic update"):
        model = phase.split()[0]
        idle = [p for p in on[model] if p not in offload.READS[model]]
        ref = None if s.base is not None else s.ref  # LoRA's base is an argument
        return device_bytes((s.state.rng, ref, s.batch)) + _parts(s, idle)
    # the rollout, between steps: the sampler reads its own copy
    return device_bytes((s.state.step, s.state.rng, s.ref)) + _parts(s, on["rest"])


def crossing_bytes(s: Setup, mode: str | None = None) -> int:
    """Bytes per device that cross between host and device memory in a train step under offload
    `mode` (offload.place from stage to stage, from rest back to rest)."""
    on = offload.OFFLOAD[mode or s.offload]
    stages = ["rest", "prepare", "actor"] + (["critic"] if s.state.critic is not None else []) + ["rest"]
    return sum(_parts(s, set(on[a]) ^ set(on[b])) for a, b in zip(stages, stages[1:]))
