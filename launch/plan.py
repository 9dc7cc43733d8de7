"""Per-device memory of a training step, from XLA's own analysis, without allocating weights.

  python launch/plan.py --config=configs/plan.py:7b
  python launch/plan.py --config=configs/plan.py:tiny      # fits one CPU device
  python launch/plan.py --config=configs/plan.py:tiny --config.mesh.shape='(1,2,4)' --config.mesh.rules=fsdp_tensor

Builds the mesh of `config.mesh`, gives every parameter and optimizer-state leaf its sharding as
a `jax.ShapeDtypeStruct`, compiles the step ahead of time (`jit(...).lower(...).compile()`) and
prints per-device parameters, AdamW state, batch and XLA temporaries. The step is next-token
cross-entropy with an AdamW update for the actor and, with `config.with_critic` (PPO), value
regression with an AdamW update for a critic of the same size. On a CPU, fake the target's
device count with XLA_FLAGS=--xla_force_host_platform_device_count=N.
"""

import functools
import math
import pathlib
import sys
import time
from typing import Any

# Config files import the shared `configs.mesh` section from the repository root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from rlver_jax import cli, sharding  # noqa: E402
from rlver_jax.distributed import DistributedSettings  # noqa: E402
from rlver_jax.models import qwen2  # noqa: E402
from rlver_jax.models.config import Qwen2Config, get_preset  # noqa: E402

_CONFIG = cli.config_flag("config", None, "configs/plan.py:PRESET")


def lm_loss(config: Qwen2Config, params: Any, batch: dict) -> jax.Array:
    """Mean next-token cross-entropy over `loss_mask` tokens."""
    logits = qwen2.forward(config, params, batch["input_ids"])[:, :-1]
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, batch["input_ids"][:, 1:, None], axis=-1)[..., 0]
    mask = batch["loss_mask"][:, 1:]
    return (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def value_loss(config: Qwen2Config, params: Any, batch: dict) -> jax.Array:
    """Mean squared error of the critic's values against `returns` over `loss_mask` tokens."""
    h, _ = qwen2.hidden_states(config, params, batch["input_ids"])
    err = qwen2.values_from_hidden(config, params, h) - batch["returns"]
    return (err * err * batch["loss_mask"]).sum() / jnp.maximum(batch["loss_mask"].sum(), 1.0)


def _adamw_update(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def make_step(models: dict[str, tuple[Qwen2Config, Any]], optimizer: optax.GradientTransformation):
    """step(state, batch) -> (state, losses) for state {name: (params, opt_state)}."""

    def step(state, batch):
        new_state, losses = {}, {}
        for name, (config, loss_fn) in models.items():
            params, opt_state, loss = _adamw_update(
                functools.partial(loss_fn, config), optimizer, *state[name], batch)
            new_state[name], losses[name] = (params, opt_state), loss
        return new_state, losses

    return step


def _device_bytes(tree: Any) -> int:
    """Bytes of one device's shards of an abstract tree."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def plan(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """Compile the step for `cfg` ahead of time and return per-device sizes (bytes) and timings."""
    m = cfg.model
    actor = get_preset(m.preset, param_dtype=m.param_dtype, dtype=m.dtype, scan_layers=m.scan_layers, remat=m.remat)
    models = {"actor": (actor, lm_loss)}
    if cfg.with_critic:
        models["critic"] = (actor.replace(value_head=True), value_loss)
    mesh = sharding.make_mesh(cfg.mesh.shape)
    optimizer = optax.adamw(1e-6, weight_decay=0.01)  # the values do not change the memory

    state, state_shardings, report = {}, {}, {}
    for name, (config, _) in models.items():
        p_sh = sharding.param_shardings(config, mesh, cfg.mesh.rules)
        params = sharding.with_shardings(qwen2.abstract_params(config), p_sh)
        o_sh = sharding.opt_state_shardings(optimizer, params, p_sh)
        opt_state = sharding.with_shardings(jax.eval_shape(optimizer.init, params), o_sh)
        state[name], state_shardings[name] = (params, opt_state), (p_sh, o_sh)
        report[f"{name} params"] = _device_bytes(params)
        report[f"{name} AdamW state"] = _device_bytes(opt_state)
    b, t = cfg.batch_size, cfg.seq_len
    batch_shapes = {"input_ids": jax.ShapeDtypeStruct((b, t), jnp.int32),
                    "loss_mask": jax.ShapeDtypeStruct((b, t), jnp.float32),
                    "returns": jax.ShapeDtypeStruct((b, t), jnp.float32)}
    batch_sh = sharding.batch_shardings(mesh, batch_shapes)
    batch = sharding.with_shardings(batch_shapes, batch_sh)
    report["batch"] = _device_bytes(batch)

    replicated = NamedSharding(mesh, P())
    step = sharding.jit_sharded(
        make_step(models, optimizer), in_shardings=(state_shardings, batch_sh),
        out_shardings=(state_shardings, {name: replicated for name in models}), donate_argnums=(0,))
    t0 = time.perf_counter()
    lowered = step.lower(state, batch)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()  # per device: the compiled program is one SPMD partition
    return dict(
        models=models, mesh=mesh, sizes=report, lower_s=t1 - t0, compile_s=t2 - t1,
        xla_arguments=mem.argument_size_in_bytes, xla_outputs=mem.output_size_in_bytes,
        xla_aliased=mem.alias_size_in_bytes, xla_temporaries=mem.temp_size_in_bytes)


def format_report(cfg: ml_collections.ConfigDict, r: dict[str, Any]) -> str:
    """The plan as a table; total = arguments + temporaries + outputs not aliased to donated inputs."""
    actor = r["models"]["actor"][0]
    mesh = r["mesh"]
    total = r["xla_arguments"] + r["xla_outputs"] - r["xla_aliased"] + r["xla_temporaries"]
    unit, scale = ("GB", 1e9) if total >= 1e9 else ("MB", 1e6)
    lines = [
        f"model      {cfg.model.preset}: {actor.num_params() / 1e6:,.1f}M parameters x {len(r['models'])} "
        f"({', '.join(r['models'])}); param_dtype={actor.param_dtype} dtype={actor.dtype} "
        f"scan_layers={actor.scan_layers} remat={actor.remat}",
        f"mesh       {dict(mesh.shape)} = {mesh.size} {mesh.devices.flat[0].platform} devices; rules={cfg.mesh.rules}",
        f"batch      {cfg.batch_size} x {cfg.seq_len} tokens "
        f"({cfg.batch_size // math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)} per batch shard)",
        f"per device ({unit}):",
    ]
    lines += [f"  {name:<26}{size / scale:9.3f}" for name, size in r["sizes"].items()]
    lines += [
        f"  {'= arguments (XLA)':<26}{r['xla_arguments'] / scale:9.3f}",
        f"  {'temporaries (XLA)':<26}{r['xla_temporaries'] / scale:9.3f}",
        f"  {'outputs not aliased (XLA)':<26}{(r['xla_outputs'] - r['xla_aliased']) / scale:9.3f}",
        f"  {'total':<26}{total / scale:9.3f}  "
        f"({'fits' if total <= cfg.memory_budget_gb * 1e9 else 'does NOT fit'} in {cfg.memory_budget_gb:g} GB)",
        f"compile    lower {r['lower_s']:.1f} s, compile {r['compile_s']:.1f} s",
    ]
    return "\n".join(lines)


def main(argv):
    del argv
    cfg = _CONFIG.value
    jax.config.update("jax_threefry_partitionable", True)
    sharding.maybe_initialize_distributed(DistributedSettings.from_config(cfg.mesh.distributed))
    print(format_report(cfg, plan(cfg)), flush=True)


if __name__ == "__main__":
    cli.run(main, required=["config"])
