"""Each process's copy of the policy for sampling (`SamplingLayout`): replicated across processes,
split over the process's own devices by the rules table (rlver_jax.parallel.sharding), in the
compute dtype, so generation never waits on another host; and `on_device`, the parameters that
wait in host memory (config.train.offload) brought to the devices for a program that reads them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.parallel.sharding import MESH_AXES, Params, RulesLike, param_shardings, resolve_rules


def on_device(params: Params) -> Params:
    """`params` with every leaf in the devices' memory: where any waits in host memory
    (config.train.offload "state"), the tree comes to the devices in its own layout (new buffers);
    else `params` itself."""
    if any(x.sharding.memory_kind not in (None, "device") for x in jax.tree.leaves(params)):
        return jax.device_put(params, jax.tree.map(lambda x: x.sharding.with_memory_kind("device"), params))
    return params


@dataclasses.dataclass(frozen=True)
class SamplingLayout:
    """Where each process keeps its copy of the policy for sampling: replicated across processes,
    split over the process's own devices by the rules table, in the sampling dtype. Generation
    on it never waits on another host.

    `hosts` is a mesh over every device with one `data` row per process, shape (processes,
    local devices / tensor, tensor); the copy is placed on it with nothing on `data` (so every
    process holds all of it) and each process keeps its own row, the mesh `local` of its local
    devices. `tensor` is the training mesh's where it divides the local device count (else their
    greatest common divisor); the rest of the local devices split like `fsdp`.
    """

    hosts: Mesh
    local: Mesh
    shardings: Params  # NamedShardings on `hosts`
    local_shardings: Params  # the same specs on `local`
    dtype: Any  # the sampling dtype (the model's compute dtype)

    @classmethod
    def create(cls, config: Qwen2Config, mesh: Mesh, rules: RulesLike,
               devices: Sequence[jax.Device] = ()) -> "SamplingLayout":
        """The layout of the model `config` sampled in `config.dtype`, beside the training `mesh`:
        on the mesh's devices, or on `devices` (the sampler's group of a split run,
        parallel.device_groups), each process on its own of them."""
        by_process: dict[int, list[jax.Device]] = {}
        for d in sorted(devices or mesh.devices.flat, key=lambda d: d.id):
            by_process.setdefault(d.process_index, []).append(d)
        local_count = len(by_process[jax.process_index()])
        if len({len(v) for v in by_process.values()}) != 1:
            raise ValueError(f"processes hold different numbers of devices: "
                             f"{ {p: len(v) for p, v in sorted(by_process.items())} }")
        tensor = math.gcd(mesh.shape["tensor"], local_count)
        grid = np.array([by_process[p] for p in sorted(by_process)]).reshape(
            len(by_process), local_count // tensor, tensor)
        axis_types = (AxisType.Auto,) * len(MESH_AXES)
        hosts = Mesh(grid, MESH_AXES, axis_types=axis_types)
        row = sorted(by_process).index(jax.process_index())
        local = Mesh(grid[row:row + 1], MESH_AXES, axis_types=axis_types)
        table = {name: tuple(a for a in axes if a != "data") for name, axes in resolve_rules(rules).items()}
        shardings = param_shardings(config, hosts, table)
        local_shardings = jax.tree.map(lambda s: NamedSharding(local, s.spec), shardings)
        return cls(hosts, local, shardings, local_shardings, config.jnp_dtype)

    def copy(self, params: Params) -> Params:
        """This process's sampling copy of `params` (in any layout, e.g. the train state's
        actor): cast where they are, then resharded on device into `hosts`, of which this process
        keeps its row. Fresh buffers, never aliasing `params` (which an update may donate). A
        collective: every process calls it at the same point, with the same global params.
        Params in host memory (config.train.offload "state") come to the devices in their own
        layout first, for as long as the copy takes."""
        params = on_device(params)
        same_dtype = all(x.dtype == self.dtype for x in jax.tree.leaves(params))
        if not same_dtype:
            params = _cast(params, self.dtype)
        placed = jax.device_put(params, self.shardings, donate=not same_dtype, may_alias=False if same_dtype else None)

        def keep_local(x: jax.Array, local_sharding: NamedSharding) -> jax.Array:
            return jax.make_array_from_single_device_arrays(
                x.shape, local_sharding, [s.data for s in x.addressable_shards])

        return jax.tree.map(keep_local, placed, self.local_shardings)

    def device_bytes(self, config: Qwen2Config) -> int:
        """Bytes of the sampling copy on each of a process's devices (the most loaded one)."""
        per_device: dict[Any, int] = {}
        for leaf, sh in zip(jax.tree.leaves(qwen2.abstract_params(config)), jax.tree.leaves(self.local_shardings)):
            size = math.prod(sh.shard_shape(leaf.shape)) * np.dtype(self.dtype).itemsize
            for d in sh.addressable_devices:
                per_device[d] = per_device.get(d, 0) + size
        return max(per_device.values())


@functools.partial(jax.jit, static_argnums=(1,))
def _cast(params: Params, dtype) -> Params:
    return jax.tree.map(lambda x: x.astype(dtype), params)
