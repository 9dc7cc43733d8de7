"""What the plans of the rollout engines share: the planner's `rollout` and `evaluation` phases are
planned by the engine's own plan (`EnginePlan`), which the engine's row names by import path
(rlver_jax.engines.table.EngineRow.plan: continuous_plan.py, static_plan.py), over what every plan
reads here: the dialogues and settings of the phase (`section`), the host-local sampling layout,
a KV cache's sharding and the abstract inputs of a sampler program (`sampler_call`).

A sampler phase runs on one host's sampling copy of the actor (SamplingLayout: replicated across
hosts, split over the host's `host_devices` devices, in the compute dtype) on that host's share
of the dialogues, beside what of the train state rests on the devices. An engine that samples
off the trainer's devices (a served one) names `off_device_plan`: no program, its row's words.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.engines.table import ENGINES
from rlver_jax.models import qwen2
from rlver_jax.parallel import chips, sharding
from rlver_jax.parallel.sampling_copy import SamplingLayout
from rlver_jax.rollout.episodes import RolloutSettings
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.table import imported
from rlver_jax.train.planner import hlo_cost, lengths, rollout_time
from rlver_jax.train.planner.compiled import Phase
from rlver_jax.train.planner.setup import GB, Setup, device_bytes, resident
from rlver_jax.train.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class Search:
    """Where an engine's rollout phase does not fit its budget (train.planner.search): the overrides
    (dotted config fields) tried first, in order, the first that fits being the answer; those kept
    when none does; then the largest `field` from `start` in steps of `step` below `limit` that fits."""

    tries: tuple[dict[str, Any], ...]
    kept: dict[str, Any]
    field: str
    step: int
    limit: int
    start: int


class EnginePlan(Protocol):
    """An engine's plan of one sampler phase (the training rollout's, or with `evaluation` the
    in-loop evaluation's), made by the function its row names: (spec, feed_tokens, hosts,
    evaluation) -> EnginePlan, `feed_tokens` being the tokens a turn feeds into a KV cache kept
    between turns (launch/plan.py --feed_tokens)."""

    hosts: int  # processes, each sampling its share of the dialogues on its own devices
    evaluation: bool

    @property
    def programs(self) -> tuple[str, ...]:
        """The phases `phases` compiles whose costs `time_rollout` reads."""

    def describe(self) -> str:
        """The phase's shapes in words (the plan's text)."""

    def phases(self, s: Setup, host_devices: int | None) -> list[Phase]:
        """The engine's programs compiled at the phase's largest shapes (none for a served engine)."""

    def search(self, spec: RunSpec) -> Search:
        """Where the rollout phase does not fit: the engine's shapes to try, then the field to shrink."""

    def time_rollout(self, costs: Mapping[str, hlo_cost.Cost], chip: chips.Chip, dialogues: lengths.Dialogues,
                     sim: rollout_time.Simulator) -> rollout_time.RolloutTime | None:
        """One host's rollout (every host at once) of `dialogues` (their turns' contexts and
        replies) against the simulator `sim`, from the compiled programs' `costs` (`programs`'):
        planner.rollout_time; None where it is not estimated."""


@dataclasses.dataclass(frozen=True)
class OffDevicePlan:
    """The plan of an engine that samples off the trainer's devices (a served one: SGLang, vLLM):
    no program compiled here, no roofline; its row's words say what it is."""

    words: str
    hosts: int = 1
    evaluation: bool = False
    programs: ClassVar[tuple[str, ...]] = ()

    def describe(self) -> str:
        return f"{self.words}; nothing sampled on the trainer's devices"

    def phases(self, s: Setup, host_devices: int | None) -> list[Phase]:
        return []

    def search(self, spec: RunSpec) -> Search:
        raise ValueError(f"{self.words} compiles no program here: nothing to search")

    def time_rollout(self, costs: Mapping[str, hlo_cost.Cost], chip: chips.Chip, dialogues: lengths.Dialogues,
                     sim: rollout_time.Simulator) -> None:
        return None


def off_device_plan(spec: RunSpec, feed_tokens: int, hosts: int = 1, evaluation: bool = False) -> OffDevicePlan:
    """The plan a served engine's row names (EngineRow.plan): "NAME engine (its row's words)"."""
    del feed_tokens
    return OffDevicePlan(f"{spec.engine.engine} engine ({spec.engine.row.summary})", hosts, evaluation)


def rollout_shapes(spec: RunSpec, feed_tokens: int, hosts: int = 1, evaluation: bool = False) -> EnginePlan:
    """The plan of the run's engine (config.rollout.engine's row) for its training rollout, or with
    `evaluation` the in-loop evaluation's (config.train.eval_policy: one host's share of the
    held-out profiles)."""
    make: Callable[..., EnginePlan] = imported(ENGINES[spec.engine.engine].plan)
    return make(spec, feed_tokens, hosts, evaluation)


@dataclasses.dataclass(frozen=True)
class Section:
    """What a sampler phase samples: the dialogue and sampling settings and one host's dialogues."""

    rollout: RolloutSettings
    sampling: SamplingSettings
    dialogues: int


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


def section(spec: RunSpec, hosts: int, evaluation: bool) -> Section:
    """The training rollout's (config.rollout: one host's share of a step's dialogues), or with
    `evaluation` the in-loop evaluation's (config.train.eval_policy: one call for the host's share
    of the held-out profiles)."""
    if evaluation:
        return Section(spec.eval.rollout, spec.eval.sampling,
                       max(1, -(-(eval_profiles(spec) or 1) // hosts)))  # hosts.share: the largest share
    return Section(spec.rollout, spec.sampling, max(1, spec.loop.dialogues // hosts))  # Run.own_dialogues


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


def cache_sharding(mesh: Mesh, cache) -> Any:
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


@dataclasses.dataclass(frozen=True)
class SamplerCall:
    """The abstract inputs every sampler program of a phase shares (`sampler_call`)."""

    name: str  # the phase: "rollout" or "evaluation"
    cfg: Any  # the actor's architecture
    settings: SamplingSettings  # the phase's, with stand-in stop and pad ids (their values change no program)
    host: Mesh  # one host's sampling mesh
    params: Any  # the sampling copy, abstract, in its host-local shardings
    held: int  # what of the train state rests on the devices through the phase
    copy: str  # the sampling copy in words

    def replicated(self, shape: tuple[int, ...], dtype) -> jax.ShapeDtypeStruct:
        """A host input (token ids, keys, counts), replicated over the host's devices."""
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(self.host, P()))

    def cache(self, rows: int, slots: int) -> Any:
        """An abstract KV cache of `rows` x `slots`, sharded as `cache_sharding` says."""
        return cache_sharding(self.host, jax.eval_shape(functools.partial(qwen2.init_cache, self.cfg, rows, slots)))


def sampler_call(s: Setup, evaluation: bool, host_devices: int | None) -> SamplerCall:
    """The sampler's inputs on one host's sampling copy of the actor (`sampling_layout`: the compute
    dtype, split over the host's devices): token ids and keys come from the host (replicated)."""
    layout = sampling_layout(s, host_devices)
    params = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, layout.dtype, sharding=sh),
                          qwen2.abstract_params(s.update.actor_cfg), layout.local_shardings)
    settings = dataclasses.replace(s.spec.eval.sampling if evaluation else s.spec.sampling, stop_ids=(0, 1), pad_id=0)
    copy = (f"sampling copy {device_bytes(params) / GB:.2f} GB/device ({layout.dtype.__name__}, "
            f"{layout.local.size} devices per host)")
    return SamplerCall("evaluation" if evaluation else "rollout", s.update.actor_cfg, settings, layout.local, params,
                       resident(s, "rollout"), copy)
