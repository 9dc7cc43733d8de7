"""Device meshes, logical-axis sharding rules, sharded placement, and multi-host start-up.

The mesh axes are fixed: `data` (parameters replicated, batch split), `fsdp` (parameters,
optimizer state and batch split; weights are all-gathered layer by layer) and `tensor`
(Megatron-style split of heads, MLP width and vocabulary inside every layer). The model names
each parameter dimension with a logical axis (`qwen2.logical_axes`); one rules table, a config
field (`mesh.rules`), maps logical names to mesh axes. Batches, and the activations of model
calls inside `jit_sharded`, are split over `BATCH_AXES` on their leading dimension.

Indivisible dimensions: a parameter dimension whose size is not a multiple of its mesh axes'
product keeps the longest prefix of those axes that divides it (possibly none: replicated) and a
warning is logged once, e.g. the tiny model's 2 kv heads on tensor=4. Replicating a small
dimension costs memory, never correctness. Batches are never replicated silently: a batch size
that the batch axes do not divide is an error.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.parallel.distributed import DistributedSettings
from rlver_jax.parallel.mesh_shape import MESH_AXES, resolve_mesh_shape

Params = Any
# A preset name, (logical_name, mesh axes) pairs, or a table from `resolve_rules`.
RulesLike = str | Sequence[Sequence[Any]] | Mapping[str, Any]

BATCH_AXES = ("data", "fsdp")
# Every logical name the model uses appears in every preset, so a preset works for any mesh
# shape; axes of size 1 shard nothing.
# `sequence` names an activation dimension, not a parameter's: the token axis of the residual
# stream between decoder layers (what remat saves per layer). Split over `tensor` (Megatron's
# sequence parallelism) each device keeps 1/tensor of it; inside a layer XLA gathers the tokens
# for the head- and MLP-split matmuls. Optional in an explicit rules list (absent: not split).
# `lora_rank` is the rank axis of LoRA adapters (models/lora.py): tiny, never split.
RULE_PRESETS: dict[str, tuple[tuple[str, Any], ...]] = {
    # ZeRO-3 style: every matrix split along its model-width dimension.
    "fsdp": (
        ("vocab", None), ("embed", "fsdp"), ("heads", None), ("kv_heads", None),
        ("head_dim", None), ("mlp", None), ("norm", None), ("layers", None), ("sequence", None),
        ("lora_rank", None)),
    # Megatron style: attention heads, MLP width and vocabulary split; model width replicated.
    "tensor": (
        ("vocab", "tensor"), ("embed", None), ("heads", "tensor"), ("kv_heads", "tensor"),
        ("head_dim", None), ("mlp", "tensor"), ("norm", None), ("layers", None), ("sequence", "tensor"),
        ("lora_rank", None)),
    # Both: model width over fsdp, the Megatron dimensions over tensor.
    "fsdp_tensor": (
        ("vocab", "tensor"), ("embed", "fsdp"), ("heads", "tensor"), ("kv_heads", "tensor"),
        ("head_dim", None), ("mlp", "tensor"), ("norm", None), ("layers", None), ("sequence", "tensor"),
        ("lora_rank", None)),
}

_log = logging.getLogger(__name__)
_warned: set[tuple] = set()


# ----------------------------------------------------------------------------- mesh


def _dcn_split(shape: tuple[int, int, int], num_slices: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(per-slice ICI shape, DCN shape): the data axis spans slices, the only traffic it carries
    is one gradient all-reduce per step, which the slow data-centre network can afford."""
    if shape[0] % num_slices:
        raise ValueError(
            f"mesh.shape={shape} on {num_slices} TPU slices: the data axis spans the slices, so "
            f"mesh.shape[0] must be a multiple of {num_slices}")
    return (shape[0] // num_slices, shape[1], shape[2]), (num_slices, 1, 1)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The ('data', 'fsdp', 'tensor') mesh of `mesh.shape` over all (or the given) devices.

    Device order follows the hardware: `jax.make_mesh` lays axes on the ICI topology (the last
    axis, tensor, on the closest devices); across TPU slices, `data` runs over DCN.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(shape, len(devices))
    axis_types = (AxisType.Auto,) * len(MESH_AXES)  # shardings chosen by jit, not by array types
    num_slices = len({getattr(d, "slice_index", 0) for d in devices})
    if num_slices > 1:
        ici, dcn = _dcn_split(shape, num_slices)
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
        return Mesh(grid, MESH_AXES, axis_types=axis_types)
    return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)


# ----------------------------------------------------------------------------- rules


def resolve_rules(rules: RulesLike) -> dict[str, tuple[str, ...]]:
    """`mesh.rules` (a preset name or (logical_name, mesh axes) pairs) as {logical: mesh axes}."""
    if isinstance(rules, str):
        if rules not in RULE_PRESETS:
            raise ValueError(
                f"mesh.rules={rules!r} is not a preset; use one of {sorted(RULE_PRESETS)} or a list "
                f"of (logical_name, mesh_axis | None | tuple of mesh axes) pairs")
        rules = RULE_PRESETS[rules]
    elif isinstance(rules, Mapping):
        rules = rules.items()
    table: dict[str, tuple[str, ...]] = {}
    for pair in rules:
        if len(pair) != 2 or not isinstance(pair[0], str):
            raise ValueError(f"mesh.rules entry {pair!r} is not a (logical_name, mesh axes) pair")
        name, axes = pair
        if name in table:
            raise ValueError(f"mesh.rules names logical axis {name!r} twice; keep one entry")
        axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        unknown = [a for a in axes if a not in MESH_AXES]
        if unknown or len(set(axes)) != len(axes):
            raise ValueError(
                f"mesh.rules maps {name!r} to {axes}; use distinct mesh axes from {MESH_AXES} or None")
        table[name] = axes
    return table


def _divisible_prefix(axes: tuple[str, ...], size: int, mesh: Mesh) -> tuple[str, ...]:
    for n in range(len(axes), 0, -1):
        if size % math.prod(mesh.shape[a] for a in axes[:n]) == 0:
            return axes[:n]
    return ()


def logical_to_mesh(logical: P, shape: Sequence[int], mesh: Mesh, rules: RulesLike, name: str = "array") -> P:
    """The mesh PartitionSpec of an array whose dimensions carry the logical names `logical`."""
    table = resolve_rules(rules)
    if len(logical) != len(shape):
        raise ValueError(f"{name}: logical axes {logical} do not match its shape {tuple(shape)}")
    used: dict[str, str] = {}
    spec = []
    for logical_name, size in zip(logical, shape):
        if logical_name is None:
            spec.append(None)
            continue
        if logical_name not in table:
            raise ValueError(
                f"logical axis {logical_name!r} of {name} has no rule in mesh.rules; add "
                f"({logical_name!r}, None) to replicate it, or map it to mesh axes from {MESH_AXES}")
        axes = table[logical_name]
        for a in axes:
            if a in used:
                raise ValueError(
                    f"mesh.rules map both {used[a]!r} and {logical_name!r} of {name} to mesh axis "
                    f"{a!r}; a mesh axis can split only one dimension of an array")
            used[a] = logical_name
        kept = _divisible_prefix(axes, size, mesh)
        if kept != axes:
            key = (logical_name, size, axes, tuple(mesh.shape.items()))
            if key not in _warned:
                _warned.add(key)
                _log.warning(
                    "logical axis %r (size %d, e.g. %s) is not divisible by mesh axes %s of sizes %s; "
                    "split over %s instead", logical_name, size, name, axes,
                    [mesh.shape[a] for a in axes], kept or "none (replicated)")
        spec.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return P(*spec)


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def param_shardings(config: Qwen2Config, mesh: Mesh, rules: RulesLike) -> Params:
    """A NamedSharding for every parameter of the model `config` (same tree as the params)."""
    return tree_shardings(qwen2.logical_axes(config), qwen2.abstract_params(config), mesh, rules)


def tree_shardings(logical: Any, abstract: Any, mesh: Mesh, rules: RulesLike) -> Any:
    """A NamedSharding for every leaf of `abstract` from its logical axes (`logical`, the same tree
    of PartitionSpecs of logical names: a model's, or LoRA adapters')."""
    table = resolve_rules(rules)
    return jax.tree_util.tree_map_with_path(
        lambda path, spec, leaf: NamedSharding(
            mesh, logical_to_mesh(spec, leaf.shape, mesh, table, _path_name(path))),
        logical, abstract, is_leaf=lambda x: isinstance(x, P))


def with_shardings(tree: Any, shardings: Any = None) -> Any:
    """`jax.ShapeDtypeStruct`s (shape, dtype of `tree`'s leaves) carrying `shardings`, or with
    `shardings` None each array's own sharding (other leaves kept as they are): the abstract
    inputs for ahead-of-time compilation and for restoring checkpoints onto a mesh, so a restore
    allocates nothing twice."""
    if shardings is None:
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) if isinstance(x, jax.Array) else x,
            tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def init_sharded_params(config: Qwen2Config, rng: jax.Array, mesh: Mesh | None = None,
                        rules: RulesLike | None = None, *, shardings: Params | None = None) -> Params:
    """Random parameters created directly in their shards (never whole on one device): the
    `param_shardings` of (mesh, rules), or `shardings` when the caller has computed them."""
    if (shardings is None) == (mesh is None or rules is None):
        raise ValueError("init_sharded_params takes either mesh and rules, or shardings")
    if shardings is None:
        shardings = param_shardings(config, mesh, rules)
    return init_in_shards(qwen2.init_params, config, rng, shardings)


def init_in_shards(init: Callable[[Any, jax.Array], Params], static: Any, rng: jax.Array, shardings: Params) -> Params:
    """`init(static, rng)` (`static` hashable: what the parameters' shapes follow from) jitted so that
    each leaf is created in its shard of `shardings`. One program per (init, static, shardings) in a
    process: a second run of the same model (a resume, a test's second run) does not compile again."""
    leaves, treedef = jax.tree.flatten(shardings)
    return _init_program(init, static, treedef, tuple(leaves))(rng)


@functools.lru_cache(maxsize=16)  # programs, never arrays
def _init_program(init: Callable, static: Any, treedef: Any, leaves: tuple) -> Callable:
    return jax.jit(functools.partial(init, static), out_shardings=jax.tree.unflatten(treedef, leaves))


# ----------------------------------------------------------------------------- optimizer state


def opt_state_shardings(optimizer: optax.GradientTransformation, params: Params, shardings: Params) -> Any:
    """Shardings of `optimizer.init(params)`: every sub-tree shaped like the params (Adam moments,
    accumulated gradients) takes the parameter shardings, every other leaf (step counts) is
    replicated. `params` may be arrays or `jax.ShapeDtypeStruct`s."""
    mesh = jax.tree.leaves(shardings)[0].mesh
    replicated = NamedSharding(mesh, P())
    param_def = jax.tree.structure(params)
    param_shapes = [x.shape for x in jax.tree.leaves(params)]

    def mirrors_params(node) -> bool:
        return (jax.tree.structure(node) == param_def
                and [x.shape for x in jax.tree.leaves(node)] == param_shapes)

    def assign(node):
        if mirrors_params(node):
            return shardings
        if node.ndim:  # an optimizer with non-mirrored state (e.g. factored moments)
            _log.warning("optimizer state leaf of shape %s does not mirror a parameter; replicated", node.shape)
        return replicated

    state = jax.eval_shape(optimizer.init, params)
    return jax.tree.map(assign, state, is_leaf=mirrors_params)


def init_opt_state(optimizer: optax.GradientTransformation, params: Params, shardings: Params,
                   opt_shardings: Any | None = None) -> Any:
    """`optimizer.init(params)` created directly in its shards: `opt_shardings`, by default
    `opt_state_shardings(optimizer, params, shardings)`."""
    out = opt_state_shardings(optimizer, params, shardings) if opt_shardings is None else opt_shardings
    return jax.jit(optimizer.init, in_shardings=(shardings,), out_shardings=out)(params)


# ----------------------------------------------------------------------------- batches


def _batch_shards(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_shardings(mesh: Mesh, batch: Any) -> Any:
    """Shardings for a global batch: leading dimension over BATCH_AXES; 0-d leaves replicated."""
    n = _batch_shards(mesh)

    def one(x) -> NamedSharding:
        if not np.ndim(x):
            return NamedSharding(mesh, P())
        if np.shape(x)[0] % n:
            raise ValueError(
                f"a batch of {np.shape(x)[0]} rows does not split over mesh axes {BATCH_AXES} "
                f"({n} shards, mesh.shape={tuple(mesh.shape.values())}); make the batch size a multiple of {n}")
        return NamedSharding(mesh, P(BATCH_AXES))

    return jax.tree.map(one, batch)


def _local_row_blocks(mesh: Mesh) -> list[int]:
    """Indices of the batch shards held by this process's devices, in row order."""
    n = _batch_shards(mesh)
    index_map = NamedSharding(mesh, P(BATCH_AXES)).addressable_devices_indices_map((n,))
    return sorted({idx[0].start or 0 for idx in index_map.values()})


def host_batch_rows(mesh: Mesh, global_batch_size: int) -> np.ndarray:
    """Rows of a global batch that this process loads and passes to `shard_host_batch`, in order.

    Each host reads only these rows of its data. When every host's devices form one block of
    the batch axes (single host; GPU nodes; `make_mesh` on most pods) this is the contiguous
    slice process_index/process_count of the batch.
    """
    n = _batch_shards(mesh)
    if global_batch_size % n:
        raise ValueError(
            f"global batch size {global_batch_size} does not split over mesh axes {BATCH_AXES} "
            f"({n} shards); make it a multiple of {n}")
    per = global_batch_size // n
    return np.concatenate([np.arange(b * per, (b + 1) * per) for b in _local_row_blocks(mesh)])


def row_processes(mesh: Mesh, global_batch_size: int) -> np.ndarray:
    """int [B]: the process whose devices hold each row of a global batch split over BATCH_AXES.

    Computed from the mesh alone (no collective), so every process knows every process's rows
    and can check them before anything waits on another process. Each row must live on one
    process (so that each contributes only rows it produced): a batch split that two processes
    share, i.e. a tensor axis across processes, is an error naming the fix.
    """
    host_batch_rows(mesh, global_batch_size)  # the divisibility check and its message
    owner = np.full(global_batch_size, -1)
    index_map = NamedSharding(mesh, P(BATCH_AXES)).devices_indices_map((global_batch_size,))
    for device, (rows,) in index_map.items():
        held = owner[rows]
        if np.any((held != -1) & (held != device.process_index)):
            raise ValueError(
                f"mesh.shape={tuple(mesh.shape.values())}: processes {sorted({int(held.max()), device.process_index})} "
                f"would share rows of the batch; the batch axes {BATCH_AXES} must split over the "
                f"{jax.process_count()} processes: keep the tensor axis within a host (tensor <= "
                f"{jax.local_device_count()} local devices) and data x fsdp a multiple of {jax.process_count()}")
        owner[rows] = device.process_index
    return owner


def shard_host_batch(mesh: Mesh, batch: Any) -> Any:
    """Place this process's rows of a batch (numpy pytree, rows from `host_batch_rows`) on the
    mesh as global arrays split over BATCH_AXES; single-process: the whole batch."""
    local_blocks = len(_local_row_blocks(mesh))
    n = _batch_shards(mesh)

    def place(x):
        x = np.asarray(x)
        if not x.ndim:
            return jax.make_array_from_process_local_data(NamedSharding(mesh, P()), x, ())
        if x.shape[0] % local_blocks:
            raise ValueError(
                f"this process passed {x.shape[0]} rows, not a multiple of the {local_blocks} batch "
                f"shards on its devices; pass the rows from host_batch_rows")
        global_shape = (x.shape[0] // local_blocks * n,) + x.shape[1:]
        return jax.make_array_from_process_local_data(NamedSharding(mesh, P(BATCH_AXES)), x, global_shape)

    return jax.tree.map(place, batch)


# ----------------------------------------------------------------------------- jit


@contextlib.contextmanager
def split_activations(mesh: Mesh, sequence_axes: tuple[str, ...] = ()):
    """Trace a model under `mesh`: a Flax method interceptor that pins the leading (batch)
    dimension of every module call's first argument and array result (token ids, hidden states
    [B, T, D], logits) to BATCH_AXES, other dimensions left to XLA, inside the mesh's abstract
    context (`jax.sharding.use_abstract_mesh`). Without the pin, XLA's propagation follows the
    FSDP-split embedding table and splits the model width instead, replicating the batch on every
    device (0.5B, 16 devices: 85 GB of temporaries per device instead of 12). The model stays free
    of sharding. The context tells the model what it is compiled for (the attention kernel:
    rlver_jax.models.attention.target_platform) and gives a kernel's `shard_map` its mesh; it
    changes no XLA program by itself (the lowered HLO is the same with and without it).

    With `sequence_axes` (the `sequence` rule), the residual stream a decoder layer takes and
    returns without a KV cache ([B, T, D], the carry that remat saves) also has its tokens split
    over those axes where they divide T."""
    n = _batch_shards(mesh)
    s = math.prod(mesh.shape[a] for a in sequence_axes)

    def split(x):
        if isinstance(x, jax.Array) and x.ndim >= 2 and x.shape[0] % n == 0:
            spec = P(BATCH_AXES, *[P.UNCONSTRAINED] * (x.ndim - 1))
            return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
        return x

    def split_residual(carry):  # a DecoderLayer carry: (x [B, T, D], cache or None)
        x, cache = carry
        if cache is not None or x.shape[0] % n or x.shape[1] % s:
            return carry
        spec = P(BATCH_AXES, sequence_axes[0] if len(sequence_axes) == 1 else sequence_axes, None)
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec)), cache

    def interceptor(next_fun, args, kwargs, context):
        if s > 1 and isinstance(context.module, qwen2.DecoderLayer) and context.method_name == "__call__":
            out, extra = next_fun(split_residual(args[0]), *args[1:], **kwargs)
            return split_residual(out), extra
        if args:
            args = (split(args[0]),) + tuple(args[1:])
        return split(next_fun(*args, **kwargs))

    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.intercept_methods(interceptor):
        yield


def mesh_platform(mesh: Mesh) -> str:
    """The platform of a mesh's devices ("cpu", "gpu", "tpu")."""
    platform = mesh.devices.flat[0].platform
    return "gpu" if platform in ("cuda", "rocm") else platform


def sequence_axes(mesh: Mesh, rules: RulesLike | None) -> tuple[str, ...]:
    """The mesh axes of size > 1 that the `sequence` rule splits the residual stream over."""
    if rules is None:
        return ()
    return tuple(a for a in resolve_rules(rules).get("sequence", ()) if mesh.shape[a] > 1)


def jit_sharded(
    fn: Callable,
    in_shardings: Any,
    out_shardings: Any,
    donate_argnums: int | Sequence[int] = (),
    rules: RulesLike | None = None,
) -> Any:
    """`jax.jit(fn)` with explicit in/out shardings, donated buffers, and the batch dimension of
    model activations kept split over BATCH_AXES while `fn` is traced (with `rules`, also the
    residual stream's tokens over the `sequence` rule's axes). The result also serves
    `.lower(...).compile()`. All shardings must be NamedShardings of one mesh (None leaves: XLA
    chooses): a mix of meshes would make XLA reshard silently on every call."""
    leaves = jax.tree.leaves((in_shardings, out_shardings))
    meshes = {s.mesh for s in leaves if isinstance(s, NamedSharding)}
    others = [s for s in leaves if not isinstance(s, NamedSharding)]
    if len(meshes) != 1 or others:
        raise ValueError(
            f"jit_sharded takes NamedShardings of one mesh; got {len(meshes)} meshes and "
            f"{len(others)} other shardings {others[:1]}")
    (mesh,) = meshes
    seq = sequence_axes(mesh, rules)

    @functools.wraps(fn)
    def traced(*args):
        with split_activations(mesh, seq):
            return fn(*args)

    return jax.jit(traced, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate_argnums)


# ----------------------------------------------------------------------------- multi-host


def maybe_initialize_distributed(settings: DistributedSettings) -> bool:
    """Start JAX's multi-process runtime when `settings` or the environment ask for it (see
    DistributedSettings); returns whether the process is part of a multi-process run.

    Call first, at program start, before anything touches a device.
    """
    if jax.distributed.is_initialized():
        return True
    arguments = settings.initialize_arguments()
    if arguments is None:
        return False
    jax.distributed.initialize(**arguments)
    _log.info("process %d of %d, %d local / %d global devices", jax.process_index(),
              jax.process_count(), jax.local_device_count(), jax.device_count())
    return True


def replicated_value(x: jax.Array) -> np.ndarray:
    """The host value of a replicated array (e.g. a step's reduced metrics), read from this
    process's own copy: an array that spans processes cannot be fetched whole."""
    if not x.is_fully_replicated:
        raise ValueError(f"replicated_value of an array sharded as {x.sharding}")
    return np.asarray(x.addressable_data(0))
