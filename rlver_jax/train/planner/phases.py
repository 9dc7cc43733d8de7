"""The programs a training run executes, each compiled from abstract shapes (every input a
`jax.ShapeDtypeStruct` carrying the run's sharding) into a `Phase`: its per-device memory and,
compiled for a target's chip or card, its cost (rlver_jax.train.planner.hlo_cost). The phases:

  prepare        the train step's first program (`update.prepare_step`): old (and reference)
                 log-probs, values, advantages; it reads the models, not their AdamW states.
  actor update   the actor's program (`update.model_epochs`): epochs x mini-batches of actor
                 updates with micro-batch accumulation, its params and AdamW state donated.
  critic update  the same for the critic (PPO). config.train.offload says which of the state's
                 parts wait in host memory in each (rlver_jax.rl.offload).
                 A run's update phase is these three programs, one after another: its peak is theirs.
  rollout        the sampler's jitted programs. The rollout engine (config.rollout.engine="jax",
                 rlver_jax.sampling.kv_rows): one decode chunk (rollout.decode_chunk steps) over
                 every KV row at once (rollout.engine_rows, else every dialogue of the host),
                 each row holding a dialogue's whole history (the longest prompt plus a turn's
                 tokens), then `rollout prefill`, a prefill chunk (rollout.prefill_chunk tokens,
                 at most the `feed_tokens` of a turn) into every row. Static calls ("static"):
                 one pipeline group's call at the longest prompt: generation (prefill + decode
                 loop) at a prompt of max_total_tokens when rollout.cache_slots is 0, else the
                 multi-turn program on a cache of cache_slots, fed `feed_tokens` new tokens.
                 Either runs on one host's sampling copy of the actor (SamplingLayout:
                 replicated across hosts, split over the host's `host_devices` devices, in the
                 compute dtype) on that host's share of the dialogues, beside the train state.

  evaluation     the in-loop evaluation's sampler program (config.train.eval_policy) on the same
                 copy, one host's share of the held-out profiles per call.
With the KV cache on, a sampler phase is followed by the cache's own programs at its largest
bucket (`... compact`, `... grow`).

Compiled for a TPU topology, every figure is the TPU compiler's: the memory of each program, the
offload's transfers (`transfer_plan`: programs between HBM and pinned host memory, memory kinds as
the TPU compiler takes them), and each program's cost for the roofline; for a GPU target the CUDA
compiler's, the offload's moves by the shard arithmetic (`transfer_plan`).

A phase's per-device total = resident + arguments + temporaries + outputs not aliased to donated
arguments; `resident` is what stays on the device through the phase without being an argument of
its program: the rest of the train state on the devices (not what config.train.offload puts in
host memory: `setup.resident`), the placed batch during the updates and, with the KV cache on, the
caches of the other pipeline groups.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.engines.continuous import chunk_width
from rlver_jax.models import qwen2
from rlver_jax.parallel import sharding
from rlver_jax.parallel.sampling_copy import SamplingLayout
from rlver_jax.rl import offload
from rlver_jax.sampling import generation
from rlver_jax.sampling import kv_rows as engine_programs
from rlver_jax.sampling.buckets import LENGTH_BUCKETS, MIN_PROMPT_BUCKET, bucket
from rlver_jax.sampling.cache_bound import longest_prompt, session_slots
from rlver_jax.train.planner import hlo_cost
from rlver_jax.train.planner.setup import GB, PHASES, Setup, device_bytes, resident
from rlver_jax.train.spec import RunSpec


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
class Transfer:
    """The offload's moves into one stage (rl.offload.place), compiled: per device, bytes the
    programs write to host memory and to the devices, and the moves' temporaries."""

    stage: str  # the stage the state arrives at (offload.STAGES)
    to_host: int
    to_device: int
    temporaries: int
    seconds: float


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


_HBM_OOM = re.compile(r"CompileTimeHbmOom.*?temporaries \(([\d.]+)([KMGT]?)\) "
                      r"exceeds available HBM \(([\d.]+)([KMGT]?)\)", re.S)
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
            cost = hlo_cost.program_cost(compiled)
        except jax.errors.JaxRuntimeError as e:  # jaxlib cannot print every module libtpu builds
            note = f"no roofline: the compiled module has no HLO text here ({str(e).splitlines()[0][:80]}); {note}"
    return Phase(name, resident, mem.argument_size_in_bytes, mem.temp_size_in_bytes,
                 mem.output_size_in_bytes - mem.alias_size_in_bytes, seconds, note, cost)


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
    None off TPU (XLA:CPU has no host memory space, and jax lowers a `pinned_host` output for the
    CUDA compiler's compile-only devices, which have no memories, as a device one: crossing_bytes
    counts the shards instead) or without offload."""
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


# ----------------------------------------------------------------------------- the sampler


@dataclasses.dataclass(frozen=True)
class RolloutShapes:
    rows: int  # dialogues per sampler call (one pipeline group, bucketed as the sampler does); engine: its KV rows
    groups: int  # pipeline groups: sessions whose caches are held at once (the engine: 1)
    prompt: int  # no cache: the bucketed prompt; with a cache: the bucketed feed; engine: the prefill chunk
    new_tokens: int
    cache_slots: int  # 0: re-encode every turn; engine: each row's slots
    hosts: int = 1  # processes, each sampling its share of the dialogues on its own devices
    evaluation: bool = False  # the in-loop evaluation's sampler (config.train.eval_policy)
    decode_chunk: int = 0  # the rollout engine's decode steps per call; 0: static calls
    fill: int = 0  # engine: a row's fill as its reply starts, every turn at the longest prompt

    @property
    def engine(self) -> bool:
        return self.decode_chunk > 0


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
    if spec.engine.engine == "jax":  # every dialogue of the host in one engine (engines.continuous)
        e = spec.engine
        rows = e.engine_rows or bucket(dialogues)
        # A row holds a dialogue's whole history: the longest prompt and a turn's tokens (engines.continuous._enter).
        prompt = longest_prompt(r.max_total_tokens)
        slots = e.slots_for(prompt + sampling.max_new_tokens)
        chunk = chunk_width(feed_tokens, e.prefill_chunk)
        return RolloutShapes(rows, 1, chunk, sampling.max_new_tokens, slots, hosts, evaluation, e.decode_chunk, prompt)
    groups = min(r.pipeline_groups, dialogues)
    rows = bucket(-(-dialogues // groups))
    cache_slots = sampling.cache_slots
    if cache_slots:  # a turn's feed and generation must fit the cache (engines.kv_sessions)
        if r.think and r.think_history == "drop":  # each turn's row is encoded afresh: the whole prompt
            feed_tokens = max(feed_tokens, r.max_total_tokens)
        room = [b for b in LENGTH_BUCKETS if b <= cache_slots - sampling.max_new_tokens]
        if not room:
            raise ValueError(f"config.rollout.cache_slots={cache_slots} leaves no room for a turn of "
                             f"config.rollout.max_new_tokens={sampling.max_new_tokens}; raise it to "
                             f"{session_slots(r.max_total_tokens, sampling.max_new_tokens)} (sampling.cache_bound)")
        prompt = min(bucket(feed_tokens, LENGTH_BUCKETS), room[-1])
    else:  # the last turn re-encodes a history of up to max_total_tokens
        prompt = bucket(r.max_total_tokens, LENGTH_BUCKETS, MIN_PROMPT_BUCKET)
    return RolloutShapes(rows, groups, prompt, sampling.max_new_tokens, cache_slots, hosts, evaluation)


def describe_rollout(shapes: RolloutShapes) -> str:
    what = "profiles" if shapes.evaluation else "dialogues"
    if shapes.engine:
        hosts = f" on each of {shapes.hosts} hosts" if shapes.hosts > 1 else ""
        return (f"rollout engine{hosts}: {shapes.rows} KV rows of {shapes.cache_slots} slots (one per {what[:-1]}, "
                f"its whole history kept between turns), decode chunks of {shapes.decode_chunk} steps over the rows "
                f"with a reply in progress, prefill chunks of {shapes.prompt} tokens, up to {shapes.new_tokens} "
                f"tokens a reply")
    per_call = f"{shapes.rows} {what} per sampler call ({shapes.groups} pipeline group(s)"
    per_call += f" on each of {shapes.hosts} hosts)" if shapes.hosts > 1 else ")"
    if shapes.cache_slots:
        return (f"{per_call}, KV cache of {shapes.cache_slots} slots per dialogue kept between turns, "
                f"{shapes.prompt} tokens fed + {shapes.new_tokens} generated per turn")
    return f"{per_call}, prompt {shapes.prompt} + {shapes.new_tokens} new tokens, KV cache off (re-encode)"


def sampling_layout(s: Setup, host_devices: int | None = None) -> SamplingLayout:
    """The host-local sampling layout of the run (rlver_jax.parallel.sampling_copy) on one host of
    `host_devices` devices (default: every device is one host's), beside the training mesh; on a
    target of several hosts, one host's devices."""
    n = host_devices or s.mesh.size
    if s.mesh.size % n:
        raise ValueError(f"--host_devices={n} does not divide the {s.mesh.size} devices of the mesh")
    tensor = math.gcd(s.mesh.shape["tensor"], n)
    # On a target of several hosts: a one-host target's devices (Target.host_target).
    devices = list(s.mesh.devices.flat)[:n] if s.target is None else list(s.target.host_target().devices)
    host = sharding.make_mesh((1, n // tensor, tensor), devices)
    return SamplingLayout.create(s.update.actor_cfg, host, s.spec.mesh.rules)


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
    # StaticEngine fills stop and pad ids from the tokenizer; their values do not change the program.
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
    if shapes.engine:
        return _engine_phases(s, shapes, name, settings, host, params, held, copy)
    if not shapes.cache_slots:
        # generation.generate's settings: the run's, without cache slots.
        compiled, secs = _compile(s, generation._generate_jit, cfg, dataclasses.replace(settings, cache_slots=0), host,
                                  params, ids, mask, rng, sds((b,), jnp.int32))
        return [_phase(s, name, compiled, held, secs, f"prefill + decode loop, no cache; {copy}")]
    cache = _cache_sharding(host, jax.eval_shape(lambda: qwen2.init_cache(cfg, b, shapes.cache_slots)))
    compiled, secs = _compile(s, generation._continue_jit, cfg, settings, host, params, cache, ids, mask,
                              sds((b,), jnp.int32), rng, sds((b,), jnp.int32))
    # The cache stays on the devices between turns in the layout the program gives it (as it was
    # given, where the TPU compiler built no program).
    cache_out = cache if isinstance(compiled, _OutOfHbm) else jax.tree.map(
        lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), cache, compiled.output_shardings[1])
    per_group = device_bytes(cache_out)
    others = held + (shapes.groups - 1) * per_group
    phases = [_phase(s, name, compiled, others, secs,
                     f"cache {per_group / GB:.2f} GB/device per group of {b}, {shapes.groups} groups held; {copy}")]
    # The cache's own programs, beside the other groups' caches: compaction at cache_slots, and
    # growth from the next smaller bucket into cache_slots (engines.kv_sessions._make_room).
    compiled, secs = _compile(s, generation.compact_cache, cache_out)
    phases.append(_phase(s, f"{name} compact", compiled, others, secs, "KV cache compaction (donated)"))
    smaller = [x for x in LENGTH_BUCKETS if x < shapes.cache_slots]
    if smaller:
        small = _cache_sharding(host, jax.eval_shape(lambda: qwen2.init_cache(cfg, b, smaller[-1])))
        compiled, secs = _compile(s, generation.grow_cache, small, shapes.cache_slots)
        phases.append(_phase(s, f"{name} grow", compiled, others, secs,
                             f"KV cache growth {smaller[-1]} -> {shapes.cache_slots} slots"))
    return phases


def _engine_phases(s: Setup, shapes: RolloutShapes, name: str, settings, host: Mesh, params, held: int,
                   copy: str) -> list[Phase]:
    """The rollout engine's programs (rlver_jax.sampling.kv_rows) on its KV rows: a decode chunk, then
    a prefill chunk, each over every row (the most a call runs over; nothing gathered)."""
    cfg = s.update.actor_cfg
    r, c = shapes.rows, shapes.prompt
    cache = _cache_sharding(host, jax.eval_shape(lambda: qwen2.init_cache(cfg, r, shapes.cache_slots)))
    sds = functools.partial(jax.ShapeDtypeStruct, sharding=NamedSharding(host, P()))
    per_row = sds((r,), jnp.int32)
    keys = sds((r, 2), jnp.uint32)
    compiled, secs = _compile(s, engine_programs._decode_jit, cfg, settings, host, shapes.decode_chunk, params, cache,
                              None, per_row, per_row, per_row, per_row, keys)
    rows = (f"{r} KV rows x {shapes.cache_slots} slots, {device_bytes(cache) / GB:.2f} GB/device (donated, "
            f"held between turns)")
    phases = [_phase(s, name, compiled, held, secs, f"decode chunk of {shapes.decode_chunk} steps; {rows}; {copy}")]
    compiled, secs = _compile(s, engine_programs._prefill_jit, cfg, settings, host, params, cache, None, per_row,
                              sds((r, c), jnp.int32), per_row, keys)
    phases.append(_phase(s, f"{name} prefill", compiled, held, secs, f"prefill chunk of {c} tokens into {r} rows"))
    return phases


# ----------------------------------------------------------------------------- the phases by name


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
