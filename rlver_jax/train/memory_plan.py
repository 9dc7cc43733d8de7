"""Per-device memory of the programs a training run executes, compiled ahead of time from abstract
shapes, without allocating a weight (launch/plan.py).

The planner takes a training config's spec (the same file and overrides as launch/train.py) and
builds the abstract run that `build_run` loads weights into (rlver_jax.train.abstract_run), so the
programs it compiles are the ones training runs (tests/plan_test.py checks that both lower to one
program each). Every input is a `jax.ShapeDtypeStruct` carrying the run's sharding. The phases:

  prepare        the train step's first program (`update.prepare_step`): old (and reference)
                 log-probs, values, advantages; it reads the models, not their AdamW states.
  actor update   the actor's program (`update.model_epochs`): epochs x mini-batches of actor
                 updates with micro-batch accumulation, its params and AdamW state donated.
  critic update  the same for the critic (PPO). config.train.offload says which of the state's
                 parts wait in host memory in each (rlver_jax.rl.offload).
                 A run's update phase is these three programs, one after another: its peak is theirs.
  rollout        the sampler's jitted program for one pipeline group at the longest prompt:
                 generation (prefill + decode loop) at a prompt of max_total_tokens when
                 rollout.cache_slots is 0, else the multi-turn program on a cache of
                 cache_slots, fed `feed_tokens` new tokens. It runs on one host's sampling copy
                 of the actor (sharding.SamplingLayout: replicated across hosts, split over the
                 host's `host_devices` devices, in the compute dtype) on that host's share of
                 the dialogues, beside the train state.

  evaluation     the in-loop evaluation's sampler program (config.train.eval_policy) on the same
                 copy, one host's share of the held-out profiles per call.
With the KV cache on, a sampler phase is followed by the cache's own programs at its largest
bucket (`... compact`, `... grow`).

Compiled for a TPU topology (`target`: rlver_jax.parallel.topology, compile-only devices on any
host), every figure is the TPU compiler's: the memory of each program, the offload's transfers
(programs between HBM and pinned host memory, memory kinds as the TPU compiler takes them), and a
roofline estimate of each program's time (`topology.program_cost`).

A phase's per-device total = resident + arguments + temporaries + outputs not aliased to donated
arguments; `resident` is what stays on the device through the phase without being an argument of
its program: the rest of the train state on the devices (not what config.train.offload puts in
host memory: `resident`), the placed batch during the updates and, with the KV cache on, the
caches of the other pipeline groups. Update shapes are the worst case of a run: every dialogue of the batch at the
bucketed max_total_tokens, every token scored (the widest policy_positions).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlver_jax.train.abstract_run import AbstractRun, abstract_run
from rlver_jax.train.spec import RunSpec
from rlver_jax.sampling import generation
from rlver_jax.parallel import sharding, topology
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, MIN_PROMPT_BUCKET, bucket
from rlver_jax.rollout.cache_bound import session_slots
from rlver_jax.models import attention, qwen2
from rlver_jax.rl import offload, train_state
from rlver_jax.rl.settings import RLSettings
from rlver_jax.rl.batch import TrainBatch

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
    target: topology.Target | None = None  # a TPU topology compiled for, or None: this host's devices

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
        """What the programs are compiled for: "tpu" for a topology's devices, else this host's."""
        return sharding.mesh_platform(self.mesh)

    @property
    def chip(self) -> topology.Chip | None:
        """The published figures of the devices' chip (TPUs), or None."""
        return topology.chip_of(self.mesh.devices.flat[0])

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
    cost: topology.Cost | None = None  # FLOPs and HBM bytes per device (compiled for a TPU chip)

    @property
    def total(self) -> int:
        return self.resident + self.arguments + self.temporaries + self.outputs


@dataclasses.dataclass(frozen=True)
class Transfer:
    """The offload's moves into one stage (rl.offload.place), compiled: per device, bytes the
    programs write to host memory and to the devices, and the moves' temporaries."""

    stage: str  # the stage the state arrives at (offload.STAGES)
    to_host: int
    to_device: int
    temporaries: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class Plan:
    setup: Setup
    phases: list[Phase]
    memory_gb: float
    sizes: dict[str, int]  # per-device bytes of the state's parts and the batch
    rollout: str  # the rollout phase's shapes, in words
    suggestions: list[str] = dataclasses.field(default_factory=list)  # the largest shapes that fit
    transfers: list[Transfer] | None = None  # the offload's moves as compiled (TPU), else None
    at_rest: tuple[int, int] | None = None  # (device, host) bytes of the state between steps, compiled
    evaluation: str = ""  # the evaluation phase's shapes, in words ("": none)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.memory_gb * GB


def device_bytes(tree: Any) -> int:
    """Bytes of one device's shards of a tree of ShapeDtypeStructs with shardings."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(sharding.BATCH_AXES))


def abstract_batch(spec: RunSpec, mesh: Mesh) -> dict:
    """The train batch of the longest dialogues: profiles_per_step x n rows of bucketed
    max_total_tokens, every token a policy token (the widest policy_positions)."""
    b = spec.loop.dialogues
    t = bucket(spec.rollout.max_total_tokens, multiple=spec.loop.length_multiple)
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
                   target: topology.Target | None = None) -> Setup:
    """The abstract run of `spec` (rlver_jax.train.abstract_run, as build_run makes it) and the
    step's abstract batch and update inputs, on this host's devices or a TPU topology's (`target`:
    compile-only devices; `host_devices` then defaults to its hosts' and must equal them).

    hoist_converts=False on CPU compiles without XLA's loop-invariant code motion (_NO_HOISTING),
    a nearer estimate of bf16 accelerators than XLA:CPU's own figures (True: exactly XLA:CPU's)."""
    if target is not None:
        if host_devices not in (None, target.devices_per_host):
            raise ValueError(f"--host_devices={host_devices}: the hosts of {target.name} have "
                             f"{target.devices_per_host} devices; leave it out with --topology")
        host_devices = target.devices_per_host
    run = abstract_run(spec, any_preset=True, devices=None if target is None else target.devices)
    # A model the target cannot run (cudnn attention on a TPU, splash on a CPU) is one line, here.
    t = bucket(spec.rollout.max_total_tokens, multiple=spec.loop.length_multiple)
    attention.resolve(run.actor_cfg.attention, t, run.actor_cfg.jnp_dtype, sharding.mesh_platform(run.mesh))
    cpu = sharding.mesh_platform(run.mesh) == "cpu"
    options = None if hoist_converts or not cpu else _NO_HOISTING
    batch = abstract_batch(spec, run.mesh)
    inputs, rows, _, _ = run.update.prepare.eval_shape(run.state.models(), run.update.frozen(run.frozen), batch)
    return Setup(run, batch, inputs, rows, options, host_devices, target)


@dataclasses.dataclass(frozen=True)
class _OutOfHbm:
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


_HBM_OOM = re.compile(r"CompileTimeHbmOom.*?temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)",
                      re.S)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _compile(s: Setup, jitted, *args):
    t0 = time.perf_counter()
    try:
        compiled = jitted.lower(*args).compile(compiler_options=s.compiler_options)
    except jax.errors.JaxRuntimeError as e:  # the TPU compiler rejects a program that cannot fit
        m = _HBM_OOM.search(str(e))
        if m is None:
            raise
        arguments = device_bytes([x for x in jax.tree.leaves(args) if isinstance(x, jax.ShapeDtypeStruct)])
        compiled = _OutOfHbm(arguments, int(float(m.group(1)) * _UNITS[m.group(2)]),
                             int(float(m.group(3)) * _UNITS[m.group(4)]))
    return compiled, time.perf_counter() - t0


def _phase(s: Setup, name: str, compiled, resident: int, seconds: float, note: str = "") -> Phase:
    mem = compiled.memory_analysis()  # per device: the compiled program is one SPMD partition
    if isinstance(compiled, _OutOfHbm):
        note = (f"OUT OF HBM: the TPU compiler needs {mem.temp_size_in_bytes / 2**30:.2f} GiB of temporaries, has "
                f"{mem.available / 2**30:.2f} GiB (temporaries from its message, no program built); {note}")
    cost = None
    if s.chip is not None and not isinstance(compiled, _OutOfHbm):
        try:
            cost = topology.program_cost(compiled)
        except jax.errors.JaxRuntimeError as e:  # jaxlib cannot print every module libtpu builds
            note = f"no roofline: the compiled module has no HLO text here ({str(e).splitlines()[0][:80]}); {note}"
    return Phase(name, resident, mem.argument_size_in_bytes, mem.temp_size_in_bytes,
                 mem.output_size_in_bytes - mem.alias_size_in_bytes, seconds, note, cost)


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


def prepare_phase(s: Setup) -> Phase:
    compiled, secs = _compile(s, s.update.prepare, s.models, s.frozen, s.batch)
    return _phase(s, "prepare", compiled, resident(s, "prepare"), secs, "old/ref log-probs, values, advantages")


def model_update_phase(s: Setup, name: str) -> Phase:
    """The `actor update` or `critic update` program: every mini-batch of the step, its model's
    params and AdamW state donated. Resident: the run key, the reference, the placed batch and
    what config.train.offload leaves on the devices of the rest of the state."""
    model = name.split()[0]
    fn = dict(s.update.model_programs())[model]
    compiled, secs = _compile(s, fn, s.state.step, *s.state.model(model), s.base, s.inputs, s.rows)
    note = f"{s.rows.shape[0]} mini-batch(es)"
    if s.in_host_memory(model):
        note += f"; in host memory: {', '.join(s.in_host_memory(model))}"
    return _phase(s, name, compiled, resident(s, name), secs, note)


def transfer_plan(s: Setup) -> tuple[list[Transfer], tuple[int, int]] | None:
    """The offload's moves of a train step (rl.offload.place from stage to stage, rest back to rest)
    compiled as programs whose outputs carry memory kinds, as the TPU compiler takes them: each
    stage's parts leaving the devices (outputs in pinned host memory), then those arriving. Per
    device, from the compiler's memory analysis: what each stage writes to host memory and to the
    devices, and the moves' own temporaries; and (device, host) bytes of the state between steps.
    None off TPU (XLA:CPU has no host memory space: crossing_bytes counts the shards instead) or
    without offload."""
    if s.offload == "none" or s.platform != "tpu":
        return None
    present = tuple(p for p in offload.PARTS if getattr(s.state, p) is not None)
    stages = ["rest", "prepare", "actor"] + (["critic"] if s.state.critic is not None else []) + ["rest"]

    def compiled(parts: list[str], to_host: bool):
        trees = [getattr(s.state, p) for p in parts]
        shardings = [jax.tree.map(lambda x: x.sharding, t) for t in trees]
        source = offload.in_host_kind(shardings) if not to_host else shardings
        dest = offload.in_host_kind(shardings) if to_host else shardings
        args = sharding.with_shardings(trees, source)
        t0 = time.perf_counter()
        out = jax.jit(lambda x: x, out_shardings=dest).lower(args).compile()
        return out.memory_analysis(), time.perf_counter() - t0

    transfers = []
    for before, after in zip(stages, stages[1:]):
        out, into = offload.moves(s.offload, before, after, present)
        to_host = to_device = temps = 0
        secs = 0.0
        if out:
            mem, t = compiled(out, True)
            to_host, temps, secs = mem.host_output_size_in_bytes, max(temps, mem.temp_size_in_bytes), secs + t
        if into:
            mem, t = compiled(into, False)
            to_device, temps, secs = mem.output_size_in_bytes, max(temps, mem.temp_size_in_bytes), secs + t
        transfers.append(Transfer(after, to_host, to_device, temps, secs))
    # The state between steps: each part in its memory at rest.
    on = offload.OFFLOAD[s.offload]["rest"]
    shardings = jax.tree.map(lambda x: x.sharding, s.state)
    rest = s.state.replace(**{p: sharding.with_shardings(getattr(s.state, p), offload.in_host_kind(
        getattr(shardings, p))) for p in present if p not in on})
    mem = jax.jit(lambda x: x).lower(rest).compile().memory_analysis()
    return transfers, (mem.argument_size_in_bytes, mem.host_argument_size_in_bytes)


# ----------------------------------------------------------------------------- rollout


@dataclasses.dataclass(frozen=True)
class RolloutShapes:
    rows: int  # dialogues per sampler call (one pipeline group, bucketed as the sampler does)
    groups: int  # pipeline groups: sessions whose caches are held at once
    prompt: int  # no cache: the bucketed prompt; with a cache: the bucketed feed
    new_tokens: int
    cache_slots: int  # 0: re-encode every turn
    hosts: int = 1  # processes, each sampling its share of the dialogues on its own devices
    evaluation: bool = False  # the in-loop evaluation's sampler (config.train.eval_policy)


def eval_profiles(spec: RunSpec) -> int | None:
    """How many held-out profiles the in-loop evaluation plays (0: it does not run; None: a profile
    file this host cannot read, without config.train.eval_max_profiles)."""
    if not spec.loop.eval_every:
        return 0
    d, cap = spec.data, spec.loop.eval_max_profiles
    if d.eval_profiles:
        if not os.path.exists(d.eval_profiles):
            return cap or None
        with open(d.eval_profiles) as f:
            n = sum(1 for line in f if line.strip())
    else:
        n = d.eval_holdout
    return min(n, cap) if cap else n


def rollout_shapes(spec: RunSpec, feed_tokens: int, hosts: int = 1, evaluation: bool = False) -> RolloutShapes:
    """The sampler's largest shapes on one host: the training rollout's (config.rollout), or with
    `evaluation` the in-loop evaluation's (config.train.eval_policy: one call for the host's share
    of the held-out profiles)."""
    if evaluation:
        r, sampling = spec.eval.rollout, spec.eval.sampling
        dialogues = max(1, -(-(eval_profiles(spec) or 1) // hosts))  # hosts.share: the largest share
    else:
        r, sampling = spec.rollout, spec.sampling
        dialogues = max(1, spec.loop.dialogues // hosts)  # one host's share (Run.own_dialogues)
    groups = min(r.pipeline_groups, dialogues)
    rows = bucket(-(-dialogues // groups))
    cache_slots = sampling.cache_slots
    if cache_slots:  # a turn's feed and generation must fit the cache (rollout.kv_sessions)
        if r.think and r.think_history == "drop":  # each turn's row is encoded afresh: the whole prompt
            feed_tokens = max(feed_tokens, r.max_total_tokens)
        room = [b for b in LENGTH_BUCKETS if b <= cache_slots - sampling.max_new_tokens]
        if not room:
            raise ValueError(f"config.rollout.cache_slots={cache_slots} leaves no room for a turn of "
                             f"config.rollout.max_new_tokens={sampling.max_new_tokens}; raise it to "
                             f"{session_slots(r.max_total_tokens, sampling.max_new_tokens)} (rollout.cache_bound)")
        prompt = min(bucket(feed_tokens, LENGTH_BUCKETS), room[-1])
    else:  # the last turn re-encodes a history of up to max_total_tokens
        prompt = bucket(r.max_total_tokens, LENGTH_BUCKETS, MIN_PROMPT_BUCKET)
    return RolloutShapes(rows, groups, prompt, sampling.max_new_tokens, cache_slots, hosts, evaluation)


def describe_rollout(shapes: RolloutShapes) -> str:
    what = "profiles" if shapes.evaluation else "dialogues"
    per_call = f"{shapes.rows} {what} per sampler call ({shapes.groups} pipeline group(s)"
    per_call += f" on each of {shapes.hosts} hosts)" if shapes.hosts > 1 else ")"
    if shapes.cache_slots:
        return (f"{per_call}, KV cache of {shapes.cache_slots} slots per dialogue kept between turns, "
                f"{shapes.prompt} tokens fed + {shapes.new_tokens} generated per turn")
    return f"{per_call}, prompt {shapes.prompt} + {shapes.new_tokens} new tokens, KV cache off (re-encode)"


def sampling_layout(s: Setup, host_devices: int | None = None) -> sharding.SamplingLayout:
    """The host-local sampling layout of the run (sharding.SamplingLayout) on one host of
    `host_devices` devices (default: every device is one host's), beside the training mesh; on a
    TPU topology, its first host's devices."""
    n = host_devices or s.mesh.size
    if s.mesh.size % n:
        raise ValueError(f"--host_devices={n} does not divide the {s.mesh.size} devices of the mesh")
    tensor = math.gcd(s.mesh.shape["tensor"], n)
    # On a TPU topology of several hosts: a one-host topology's devices (Target.host_target).
    devices = list(s.mesh.devices.flat)[:n] if s.target is None else list(s.target.host_target().devices)
    host = sharding.make_mesh((1, n // tensor, tensor), devices)
    return sharding.SamplingLayout.create(s.update.actor_cfg, host, s.spec.mesh.rules)


def _cache_sharding(mesh: Mesh, cache) -> Any:
    """The KV cache's rows over the batch axes and kv heads over `tensor`, where they divide."""
    shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)

    def one(x):
        spec = [None] * x.ndim
        if x.ndim >= 2:
            row = 1 if x.ndim == 5 else 0  # k, v [L, B, S, K, H]; mask [B, S]
            spec[row] = sharding.BATCH_AXES if x.shape[row] % shards == 0 else None
            if x.ndim == 5 and x.shape[3] % mesh.shape["tensor"] == 0:
                spec[3] = "tensor"
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P(*spec)))

    return jax.tree.map(one, cache)


def rollout_phase(s: Setup, shapes: RolloutShapes, host_devices: int | None = None) -> Phase:
    """The sampler's own jitted program (rlver_jax.sampling.generation) on one host's sampling copy of the
    actor (`sampling_layout`: the compute dtype, split over the host's devices), its activations'
    rows split over the host mesh's batch axes as the sampler traces them. Token ids come from the
    host (replicated); a KV cache kept between turns has its rows and kv heads split."""
    return sampler_phases(s, shapes, host_devices)[0]


def sampler_phases(s: Setup, shapes: RolloutShapes, host_devices: int | None = None) -> list[Phase]:
    """`rollout_phase`'s program (the training rollout's, or with shapes.evaluation the in-loop
    evaluation's) and, with a KV cache kept between turns, the cache's own programs at its largest
    bucket: compaction (generation.compact_cache) and growth into it (generation.grow_cache)."""
    cfg = s.update.actor_cfg
    name = "evaluation" if shapes.evaluation else "rollout"
    # JaxPolicy fills stop and pad ids from the tokenizer; their values do not change the program.
    settings = dataclasses.replace(s.spec.eval.sampling if shapes.evaluation else s.spec.sampling,
                                   stop_ids=(0, 1), pad_id=0)
    layout = sampling_layout(s, host_devices)
    host = layout.local
    params = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, layout.dtype, sharding=sh),
                          qwen2.abstract_params(cfg), layout.local_shardings)
    b, e = shapes.rows, shapes.prompt
    replicated = NamedSharding(host, P())
    sds = functools.partial(jax.ShapeDtypeStruct, sharding=replicated)
    ids, mask, rng = sds((b, e), jnp.int32), sds((b, e), jnp.bool_), sds((b, 2), jnp.uint32)  # row keys
    held = resident(s, "rollout")  # what of the train state rests on the devices
    copy = (f"sampling copy {device_bytes(params) / GB:.2f} GB/device ({layout.dtype.__name__}, "
            f"{host.size} devices per host)")
    if not shapes.cache_slots:
        # generation.generate's settings: the run's, without cache slots.
        compiled, secs = _compile(s, generation._generate_jit, cfg, dataclasses.replace(settings, cache_slots=0), host,
                                  params, ids, mask, rng)
        return [_phase(s, name, compiled, held, secs, f"prefill + decode loop, no cache; {copy}")]
    cache = _cache_sharding(host, jax.eval_shape(lambda: qwen2.init_cache(cfg, b, shapes.cache_slots)))
    compiled, secs = _compile(s, generation._continue_jit, cfg, settings, host, params, cache, ids, mask,
                              sds((b,), jnp.int32), rng)
    # The cache stays on the devices between turns in the layout the program gives it (as it was
    # given, where the TPU compiler built no program).
    cache_out = cache if isinstance(compiled, _OutOfHbm) else jax.tree.map(
        lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), cache, compiled.output_shardings[1])
    per_group = device_bytes(cache_out)
    others = held + (shapes.groups - 1) * per_group
    phases = [_phase(s, name, compiled, others, secs,
                     f"cache {per_group / GB:.2f} GB/device per group of {b}, {shapes.groups} groups held; {copy}")]
    # The cache's own programs, beside the other groups' caches: compaction at cache_slots, and
    # growth from the next smaller bucket into cache_slots (rollout.kv_sessions._make_room).
    compiled, secs = _compile(s, generation.compact_cache, cache_out)
    phases.append(_phase(s, f"{name} compact", compiled, others, secs, "KV cache compaction (donated)"))
    smaller = [x for x in LENGTH_BUCKETS if x < shapes.cache_slots]
    if smaller:
        small = _cache_sharding(host, jax.eval_shape(lambda: qwen2.init_cache(cfg, b, smaller[-1])))
        compiled, secs = _compile(s, generation.grow_cache, small, shapes.cache_slots)
        phases.append(_phase(s, f"{name} grow", compiled, others, secs,
                             f"KV cache growth {smaller[-1]} -> {shapes.cache_slots} slots"))
    return phases


# ----------------------------------------------------------------------------- the plan


def run_phases(s: Setup, phases: Sequence[str], feed_tokens: int) -> list[Phase]:
    out = []
    for name in phases:
        if name == "critic update" and not s.rl.uses_critic:
            continue
        if name == "prepare":
            out.append(prepare_phase(s))
        elif name in ("actor update", "critic update"):
            out.append(model_update_phase(s, name))
        elif name == "rollout":
            out += sampler_phases(s, rollout_shapes(s.spec, feed_tokens, s.hosts), s.host_devices)
        elif name == "evaluation":
            if eval_profiles(s.spec):
                out += sampler_phases(s, rollout_shapes(s.spec, feed_tokens, s.hosts, evaluation=True),
                                      s.host_devices)
        else:
            raise ValueError(f"unknown phase {name!r}; use some of {PHASES}")
    return out


def _kind(name: str) -> str:
    """The phase of PHASES a compiled program belongs to ("rollout compact" -> "rollout")."""
    return name if name in PHASES else name.split()[0]


def _largest(candidates: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The largest of ascending `candidates` for which `fits` holds, by bisection (fits is
    monotone: smaller shapes need less memory); None when none does."""
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


def _search(spec: RunSpec, budget: float, phases: Sequence[str], feed_tokens: int,
            log: Callable[[str], None], hoist_converts: bool = True, host_devices: int | None = None,
            target: topology.Target | None = None) -> list[str]:
    """Update phases (some of UPDATE): the largest micro-batch, else the longest dialogue, with
    which each of them fits `budget` bytes. ["rollout"]: the fewest pipeline groups (most
    dialogues per sampler call), else the longest dialogue (no cache) or the most cache slots.
    ["evaluation"]: the most held-out profiles per evaluation. Each candidate is compiled as the
    plan is (for `target`: by the TPU compiler)."""
    s0 = abstract_setup(spec, hoist_converts, host_devices, target)
    shards = math.prod(s0.mesh.shape[a] for a in sharding.BATCH_AXES)

    def total(candidate: RunSpec) -> float:
        worst = max(run_phases(abstract_setup(candidate, hoist_converts, host_devices, target), phases, feed_tokens),
                    key=lambda p: p.total)
        log(f"  search: {worst.name} {worst.total / GB:.2f} GB")
        return worst.total

    if list(phases) == ["evaluation"]:
        field, step, limit = "train.eval_max_profiles", s0.hosts, (eval_profiles(spec) or 1)
        start = step
    elif list(phases) != ["rollout"]:
        rl = s0.rl
        micro = [m for m in range(shards, rl.micro_batch_size) if rl.mini_batch_size % m == 0 and m % shards == 0]
        for m in reversed(micro):
            log(f"  search: micro_batch_size={m}")
            if total(spec.override(**{"rl.micro_batch_size": m})) <= budget:
                return [f"--config.rl.micro_batch_size={m}"]
        out = []
        if micro:
            spec = spec.override(**{"rl.micro_batch_size": micro[0]})
            out.append(f"--config.rl.micro_batch_size={micro[0]}")
        field, step, limit = "rollout.max_total_tokens", spec.loop.length_multiple, s0.seq_len
        start = step
    else:
        r, cache_slots, out = spec.rollout, spec.sampling.cache_slots, []
        dialogues = spec.loop.dialogues // s0.hosts  # one host's
        groups = r.pipeline_groups * 2
        while groups <= dialogues:  # fewer dialogues per sampler call
            log(f"  search: pipeline_groups={groups}")
            if total(spec.override(**{"rollout.pipeline_groups": groups})) <= budget:
                return [f"--config.rollout.pipeline_groups={groups}"]
            groups *= 2
        field = "rollout.cache_slots" if cache_slots else "rollout.max_total_tokens"
        step, limit = LENGTH_BUCKETS[0], cache_slots or r.max_total_tokens
        # A cache must hold a turn's generation and the smallest feed (rollout_shapes).
        start = r.max_new_tokens + LENGTH_BUCKETS[0] if cache_slots else step
    out = [] if list(phases) == ["evaluation"] else out

    def fits(n):
        log(f"  search: {field}={n}")
        return total(spec.override(**{field: n})) <= budget

    candidates = [n for n in range(step, limit, step) if n >= start]
    best = _largest(candidates, fits)
    if best is None:
        return out + [f"nothing: {field}={candidates[0] if candidates else limit} needs more than {budget / GB:g} GB"]
    return out + [f"--config.{field}={best}"]


def plan(spec: RunSpec, memory_gb: float | None = 16.0, phases: Sequence[str] = PHASES,
         feed_tokens: int = 512, search: bool = True, log: Callable[[str], None] = lambda _: None,
         hoist_converts: bool = True, host_devices: int | None = None,
         target: topology.Target | None = None) -> Plan:
    """Compile the phases of `spec`'s run and, with `search`, find the largest shapes that fit
    wherever the update (any of its programs), the rollout or the evaluation does not. `target`:
    compile for a TPU topology's devices (rlver_jax.parallel.topology) instead of this host's;
    `memory_gb` None: the target chip's HBM (16 off TPU)."""
    s = abstract_setup(spec, hoist_converts, host_devices, target)
    if memory_gb is None:
        memory_gb = s.chip.hbm_gb if s.chip is not None else 16.0
    trained = "adapters" if s.update.lora.enabled else "params"  # LoRA: a critic's value head among them
    sizes = {f"actor {trained}": device_bytes(s.state.actor), "actor AdamW state": device_bytes(s.state.actor_opt)}
    if s.state.critic is not None:
        sizes.update({f"critic {trained}": device_bytes(s.state.critic),
                      "critic AdamW state": device_bytes(s.state.critic_opt)})
    if s.ref is not None:
        sizes["frozen base" if s.update.lora.enabled else "reference params"] = device_bytes(s.ref)
    sizes["train batch"] = device_bytes(s.batch)
    done = []
    for name in phases:
        log(f"compiling {name} ...")
        for p in run_phases(s, [name], feed_tokens):
            done.append(p)
            log(f"  {p.name}: resident {p.resident / GB:.3f} + arguments {p.arguments / GB:.3f} + temporaries "
                f"{p.temporaries / GB:.3f} + outputs {p.outputs / GB:.3f} = {p.total / GB:.3f} GB/device, "
                f"compiled in {p.seconds:.1f} s")
    evaluation = ""
    if "evaluation" in phases:
        n = eval_profiles(spec)
        evaluation = ("off (config.train.eval_every=0 or no held-out profiles)" if n == 0 else
                      f"profiles unknown ({spec.data.eval_profiles} not here): set config.train.eval_max_profiles"
                      if n is None else describe_rollout(rollout_shapes(spec, feed_tokens, s.hosts, evaluation=True))
                      + f"; {n} held-out profiles")
    moved = transfer_plan(s)
    result = Plan(s, done, memory_gb, sizes, describe_rollout(rollout_shapes(spec, feed_tokens, s.hosts)),
                  transfers=moved and moved[0], at_rest=moved and moved[1], evaluation=evaluation)
    if search:
        over = [p.name for p in done if p.total > memory_gb * GB]
        for label, names in (("update", [n for n in over if n in UPDATE]),
                             *((k, sorted({_kind(n) for n in over if _kind(n) == k})) for k in SAMPLERS)):
            if names:
                log(f"{', '.join(names)} does not fit: searching")
                found = _search(spec, memory_gb * GB, names, feed_tokens, log, hoist_converts, host_devices, target)
                result.suggestions.append(f"{label}: {' '.join(found)}")
    return result
def format_plan(plan: Plan, label: str = "") -> str:
    s = plan.setup
    p, rl, mesh = s.update, s.rl, s.mesh
    actor = p.actor_cfg
    shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
    impl = attention.resolve(actor.attention, s.seq_len, actor.jnp_dtype, s.platform)
    where = "here" if s.target is None else f"on {s.target.device_kind}"
    models = f"actor {actor.num_params() / 1e6:,.1f}M"
    if p.critic_cfg is not None:
        models += f" + critic {p.critic_cfg.num_params() / 1e6:,.1f}M (no LM head)"
    if p.lora.enabled:
        lora = p.lora
        models += (f"; LoRA rank {lora.rank} (alpha {lora.alpha:g}) on {','.join(lora.targets)} of one frozen base in "
                   f"{lora.base_dtype}, also the reference")
    elif s.ref is not None:
        models += " + reference"
    b, t = s.batch["tokens"].shape
    unit, scale = ("GB", GB) if plan.peak.total >= GB else ("MB", 1e6)
    width = max([15] + [len(ph.name) + 1 for ph in plan.phases])
    lines = [
        f"plan       {label or s.spec.model.preset}: {rl.algo}, {models} parameters; "
        f"param_dtype={actor.param_dtype} dtype={actor.dtype} remat={actor.remat} scan_layers={actor.scan_layers} "
        f"attention={actor.attention} ({impl} {where})",
        *([f"target     {s.target.describe()}; compiled by the TPU compiler (libtpu {_libtpu_version()}), "
           "compile-only devices on this host"] if s.target is not None else []),
        f"mesh       {dict(mesh.shape)} = {mesh.size} {mesh.devices.flat[0].platform} devices; rules={s.spec.mesh.rules}",
        f"update     {b} dialogues x {t} tokens, every token scored; mini-batch {rl.mini_batch_size} "
        f"{'dialogues' if rl.batch_size else 'rows'}, micro-batch "
        f"{rl.micro_batch_size} ({rl.micro_batch_size / shards:g} per batch shard), {rl.ppo_epochs} epoch(s), "
        f"log-prob chunk {rl.logprob_chunk}",
        *([f"note       micro-batch {rl.micro_batch_size} does not split over the {shards} batch shards: XLA "
           f"spreads its rows as it can (try --config.rl.micro_batch_size={shards * max(1, rl.micro_batch_size // shards)})"]
          if rl.micro_batch_size % shards else []),
        f"rollout    {plan.rollout}; the host-local sampling layout {dict(sampling_layout(s, s.host_devices).local.shape)}",
        *([f"evaluation {plan.evaluation}"] if plan.evaluation else []),
        *([f"compiler   {s.compiler_options} (XLA:CPU's fp32 copies of bf16 saved activations left out)"]
          if s.compiler_options else []),
        f"state per device ({unit}): " + ", ".join(f"{k} {v / scale:.3f}" for k, v in plan.sizes.items()),
        f"per device ({unit}){' ' * (width - 13)}{'resident':>9} {'arguments':>9} {'temps':>9} {'outputs':>9} {'total':>9} {'compile':>8}",
    ]
    for ph in plan.phases:
        lines.append(f"  {ph.name:<{width}}{ph.resident / scale:9.3f} {ph.arguments / scale:9.3f} "
                     f"{ph.temporaries / scale:9.3f} {ph.outputs / scale:9.3f} {ph.total / scale:9.3f} "
                     f"{ph.seconds:7.1f}s  {ph.note}")
    if s.offload != "none":
        away = {stage: s.in_host_memory(stage) for stage in offload.STAGES}
        label = {"prepare": "prepare", "actor": "actor update", "critic": "critic update", "rest": "between steps"}
        where = "; ".join(f"{label[st]}: {', '.join(ps) or 'nothing'}"
                          for st, ps in away.items() if st != "critic" or s.state.critic is not None)
        copy = (" + the actor's params for the sampling copy" if "actor" in away["rest"] else "")
        lines.append(f"offload    {s.offload}: in host memory ({where}); {crossing_bytes(s) / scale:.3f} {unit}/device "
                     f"cross between host and device per step{copy}")
        if plan.transfers is not None:
            to_host, to_device = (sum(getattr(x, f) for x in plan.transfers) for f in ("to_host", "to_device"))
            temps = max(x.temporaries for x in plan.transfers)
            device, host = plan.at_rest
            lines.append(f"offload    the moves compiled by the TPU compiler (memory kinds device / {offload.HOST_MEMORY}): "
                         f"{to_host / scale:.3f} {unit}/device to host memory and {to_device / scale:.3f} back per step, "
                         f"moves' temporaries up to {temps / scale:.3f}; between steps {host / scale:.3f} {unit}/device "
                         f"in host memory, {device / scale:.3f} on the device")
    else:
        lines.append("offload    none; with --config.train.offload=state: " + ", ".join(
            f"{ph.name} {(ph.total - resident(s, ph.name) + resident(s, ph.name, 'state')) / scale:.3f}"
            for ph in plan.phases) + f" {unit}")
    update = [ph for ph in plan.phases if ph.name in UPDATE]
    if update:
        top = max(update, key=lambda ph: ph.total)
        lines.append(f"update     peak {top.total / scale:.3f} {unit} ({top.name}): "
                     f"{'fits' if top.total <= plan.memory_gb * GB else 'does NOT fit'} in {plan.memory_gb:g} GB")
    peak = plan.peak
    verdict = "fits" if plan.fits else "does NOT fit"
    lines.append(f"peak       {peak.total / scale:.3f} {unit} ({peak.name}): {verdict} in {plan.memory_gb:g} GB per device")
    lines += [f"           {ph.name}: {ph.total / GB:.3f} GB does not fit" for ph in plan.phases
              if ph.total > plan.memory_gb * GB]
    lines += [f"fits with  {x}" for x in plan.suggestions]
    lines += format_roofline(plan)
    return "\n".join(lines)


def _libtpu_version() -> str:
    try:
        from importlib.metadata import version
        return version("libtpu")
    except Exception:  # noqa: BLE001 - informational only
        return "?"


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """A roofline estimate of a train step on the target's chips (not a measurement)."""

    update: float  # seconds: prepare + each model's update program, once each
    rollout_call: float  # seconds of one sampler call at the longest prompt, every row to max_new_tokens
    calls: int  # sampler calls per step on each host: pipeline groups x policy turns
    model_flops: float  # the step's model FLOPs, all devices (6N per trained token, 2N per scored or sampled one)
    update_flops: float  # of which the update's
    devices: int
    peak: float  # FLOP/s per device

    @property
    def step(self) -> float:
        return self.update + self.calls * self.rollout_call

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.devices * self.peak * self.step) if self.step else 0.0

    @property
    def update_mfu(self) -> float:
        return self.update_flops / (self.devices * self.peak * self.update) if self.update else 0.0


def step_estimate(plan: Plan) -> StepEstimate | None:
    """The roofline of a train step from the compiled programs' costs (topology.program_cost): the
    update's programs once each, and the rollout's sampler program once per pipeline group and
    policy turn (config.simulator.max_turns) on every host at once, each call at the longest prompt
    with every row generating max_new_tokens: an upper bound of the rollout. MFU counts model FLOPs
    (6 x parameters per trained token, 4 x with LoRA, whose base takes no gradient; 2 x per token
    a program only reads or samples; attention left out) against the step's estimate."""
    s, chip = plan.setup, plan.setup.chip
    by_name = {p.name: p for p in plan.phases}
    needed = [by_name[n] for n in (*UPDATE, "rollout") if n in by_name]
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
    rollout = by_name.get("rollout")
    shapes = rollout_shapes(s.spec, 512, s.hosts)
    calls = shapes.groups * s.spec.simulator.rules.max_turns if rollout is not None else 0
    call = rollout.cost.seconds(chip) if rollout is not None else 0.0
    sampled = s.hosts * calls * 2 * actor_n * shapes.rows * (shapes.prompt + shapes.new_tokens)
    return StepEstimate(update, call, calls, update_flops + (sampled if rollout is not None else 0.0), update_flops,
                        s.mesh.size, chip.bf16_tflops * 1e12)


def format_roofline(plan: Plan) -> list[str]:
    """The roofline lines of a plan compiled for a TPU chip (none otherwise)."""
    s, chip = plan.setup, plan.setup.chip
    costed = [p for p in plan.phases if p.cost is not None]
    if chip is None or not costed:
        return []
    lines = [f"roofline   an ESTIMATE, not a measurement: each compiled program's FLOPs and HBM bytes per device "
             f"(loops by their trip counts) against {chip.name}'s published {chip.bf16_tflops:g} TFLOP/s bf16 and "
             f"{chip.hbm_gb_s:g} GB/s",
             f"  {'program':<18}{'TFLOP':>9} {'HBM GB':>9} {'compute':>9} {'memory':>9} {'estimate':>9}  (per device, s)"]
    for p in costed:
        c = p.cost
        compute, memory = c.flops / (chip.bf16_tflops * 1e12), c.bytes / (chip.hbm_gb_s * 1e9)
        extra = f"  {c.unknown_loops} loop(s) of unknown trip count counted once" if c.unknown_loops else ""
        lines.append(f"  {p.name:<18}{c.flops / 1e12:9.2f} {c.bytes / 1e9:9.2f} {compute:9.3f} {memory:9.3f} "
                     f"{c.seconds(chip):9.3f}{extra}")
    est = step_estimate(plan)
    if est is not None:
        rollout = (f" + rollout {est.calls} calls x {est.rollout_call:.2f} s (pipeline groups x "
                   f"{s.spec.simulator.rules.max_turns} turns, each at the longest prompt and every row to "
                   f"max_new_tokens: an upper bound)" if est.calls else "")
        lines.append(f"step       estimate {est.step:.1f} s = update {est.update:.2f} s{rollout}; "
                     f"implied MFU {100 * est.mfu:.1f}% of the step, {100 * est.update_mfu:.1f}% of the update "
                     f"(model FLOPs: 6N per trained token, 2N per read or sampled one)")
    return lines
