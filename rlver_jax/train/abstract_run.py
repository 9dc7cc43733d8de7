"""A run before any weight exists: its mesh, architectures, optimizers, jitted update program and
the train state and frozen weights as abstract values carrying their shardings.

Built once from a `RunSpec` (`abstract_run`) and shared by the three that need it: `build_run`
loads weights into it (rlver_jax.train.run), the planner compiles its programs from shapes
(rlver_jax.train.planner), and evaluation restores a run's actor into its trainable shapes
(`trainable_shapes`, rlver_jax.eval.policy_loading). A new part of the state is added here once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import optax
from jax.sharding import Mesh

from rlver_jax.models import lora as lora_lib
from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.models.lora import LoraSettings
from rlver_jax.parallel import sharding
from rlver_jax.parallel.device_groups import split_devices
from rlver_jax.rl import optimizer, program, settings, train_state
from rlver_jax.train import model_loading
from rlver_jax.train.spec import RunSpec


def frozen_architecture(actor_cfg: Qwen2Config, lora: LoraSettings) -> Qwen2Config:
    """The frozen weights' architecture: the actor's; a LoRA run's base stores it in config.lora.base_dtype."""
    return actor_cfg.replace(param_dtype=lora.base_dtype) if lora.enabled else actor_cfg


def trainable_shapes(lora: LoraSettings, cfg: Qwen2Config, mesh: Mesh, rules: sharding.RulesLike
                     ) -> tuple[Any, Any]:
    """(ShapeDtypeStructs, NamedShardings) of what model `cfg` (the actor, or the critic with its value
    head) trains: every parameter in full fine-tuning; with LoRA its adapters (fp32, sharded by their
    logical axes) and a critic's value head."""
    full, full_sh = qwen2.abstract_params(cfg), sharding.param_shardings(cfg, mesh, rules)
    if not lora.enabled:
        return full, full_sh
    adapters = jax.eval_shape(lambda k: lora_lib.init_adapters(lora, full, k), jax.random.key(0))
    adapters_sh = sharding.tree_shardings(lora_lib.adapter_axes(lora, qwen2.logical_axes(cfg)), adapters, mesh, rules)
    head = [k for k in full if k.startswith("value_")]
    return {**adapters, **{k: full[k] for k in head}}, {**adapters_sh, **{k: full_sh[k] for k in head}}


def make_optimizers(spec: RunSpec) -> tuple[optimizer.Optimizer, optimizer.Optimizer | None]:
    """The actor's and (with a critic) the critic's optimizer; their schedules count the run's train
    steps. With LoRA the adapters' learning rates are config.optim's x config.lora.lr_multiplier, the
    other trainable leaves' (modules_to_save, a value head) config.optim's (lora.full_rank_rate)."""
    lora, steps = spec.lora, spec.loop.steps

    def make(opt: settings.OptimSettings) -> optimizer.Optimizer:
        if not lora.enabled:
            return optimizer.make_optimizer(opt, steps)
        made = optimizer.make_optimizer(dataclasses.replace(opt, lr=opt.lr * lora.lr_multiplier), steps)
        return dataclasses.replace(made, tx=optax.chain(made.tx, lora_lib.full_rank_rate(lora)))

    return make(spec.actor_optim), make(spec.critic_optim) if spec.rl.uses_critic else None


# Update programs built in this process, by everything they are built from (`_program_key`): a
# second run of the same settings in one process (a resume, evaluating checkpoint after checkpoint,
# a test's unbroken and resumed runs) gets the same jitted functions, whose compiled executables jax
# keeps, instead of tracing and compiling them again (a tiny run spends most of its time there).
_PROGRAMS: dict[tuple, program.UpdateProgram] = {}
_PROGRAMS_KEPT = 4  # programs hold executables, never arrays: a few cost little memory


def _program_key(spec: RunSpec, mesh: Mesh, actor_cfg: Qwen2Config) -> tuple:
    """What `_build_update_program` reads: the run's length only through the optimizers' warmups."""
    warmups = tuple(opt.warmup_steps(spec.loop.steps) for opt in (spec.actor_optim, spec.critic_optim))
    return (spec.rl, spec.lora, spec.mesh.rules, spec.offload, spec.actor_optim, spec.critic_optim, warmups, mesh,
            actor_cfg)


def update_program(spec: RunSpec, mesh: Mesh, actor_cfg: Qwen2Config) -> program.UpdateProgram:
    """Everything of the update that follows from the spec and the actor's architecture, before any
    weight exists; the same object for the same settings within a process (`_PROGRAMS`)."""
    key = _program_key(spec, mesh, actor_cfg)
    if key not in _PROGRAMS:
        if len(_PROGRAMS) >= _PROGRAMS_KEPT:
            del _PROGRAMS[next(iter(_PROGRAMS))]  # the oldest
        _PROGRAMS[key] = _build_update_program(spec, mesh, actor_cfg)
    return _PROGRAMS[key]


def _build_update_program(spec: RunSpec, mesh: Mesh, actor_cfg: Qwen2Config) -> program.UpdateProgram:
    """With LoRA the state's models are their trainable leaves (`trainable_shapes`) and the frozen
    weights are the base (rlver_jax.rl.update.Frozen)."""
    lora, rules, rl = spec.lora, spec.mesh.rules, spec.rl
    actor, actor_sh = trainable_shapes(lora, actor_cfg, mesh, rules)
    actor_opt, critic_opt = make_optimizers(spec)
    critic_cfg = critic_sh = critic = critic_tx = None
    if rl.uses_critic:
        critic_cfg = model_loading.critic_config(actor_cfg)
        critic, critic_sh = trainable_shapes(lora, critic_cfg, mesh, rules)
        critic_tx = critic_opt.tx
    state_sh = train_state.state_shardings(actor_opt.tx, actor, actor_sh, critic_tx, critic, critic_sh)
    ref_sh = sharding.param_shardings(actor_cfg, mesh, rules) if rl.uses_reference or lora.enabled else None
    return program.make_update_program(rl, actor_cfg, critic_cfg, actor_opt, critic_opt, mesh, state_sh, ref_sh,
                                       rules, offload=spec.offload, lora=lora)


def check_mesh(spec: RunSpec, mesh: Mesh) -> None:
    """Mini-batches split over the mesh's batch shards (and, in rows, over the processes)."""
    rl = spec.rl
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    unit = "dialogues" if rl.batch_size else "rows"
    if rl.mini_batch_size % shards:
        raise ValueError(
            f"mini-batches of {rl.mini_batch_size} {unit} must split over the {shards} data x fsdp shards of "
            f"config.mesh.shape={spec.mesh.shape}: change config.rollout.profiles_per_step or "
            "config.rl.mini_batch_size, or move devices to the tensor axis")
    if not rl.batch_size and rl.mini_batch_size % jax.process_count():
        raise ValueError(f"config.rl.mini_batch_size={rl.mini_batch_size} rows must split over the "
                         f"{jax.process_count()} processes (each pads its rows to a multiple of its share): "
                         "make it a multiple of the process count")


@dataclasses.dataclass(frozen=True)
class AbstractRun:
    """The run of a spec without weights."""

    spec: RunSpec
    mesh: Mesh
    update: program.UpdateProgram  # architectures, optimizers, the state's shardings, the jitted programs
    state: train_state.TrainState  # ShapeDtypeStructs with the state's shardings
    frozen: Any | None  # the frozen weights' (a KL term's reference, LoRA's base), with shardings

    @property
    def actor_cfg(self) -> Qwen2Config:
        return self.update.actor_cfg


def abstract_run(spec: RunSpec, *, any_preset: bool = False, actor_cfg: Qwen2Config | None = None,
                 devices: Sequence[jax.Device] | None = None) -> AbstractRun:
    """The mesh, update program and abstract state of `spec`. `actor_cfg`: the actor's architecture
    when the caller has read it already; else from spec.model (`any_preset`: a preset's architecture
    without weights, for the planner). `devices`: the mesh's devices (default: jax.devices()), e.g.
    a TPU topology's compile-only devices (rlver_jax.parallel.topology) for the planner; the mesh
    spans the trainer's group of them (config.mesh.sampler_devices: parallel.device_groups)."""
    trainer, _ = split_devices(jax.devices() if devices is None else devices, spec.mesh.sampler_devices)
    mesh = sharding.make_mesh(spec.mesh.shape, trainer)
    check_mesh(spec, mesh)
    actor_cfg = actor_cfg or model_loading.policy_architecture(spec.model, any_preset=any_preset)
    prog = update_program(spec, mesh, actor_cfg)
    actor, _ = trainable_shapes(spec.lora, actor_cfg, mesh, spec.mesh.rules)
    critic = None if prog.critic_cfg is None else trainable_shapes(spec.lora, prog.critic_cfg, mesh,
                                                                   spec.mesh.rules)[0]
    critic_tx = None if prog.critic_opt is None else prog.critic_opt.tx
    state = jax.eval_shape(
        lambda a, c: train_state.init_train_state(a, prog.actor_opt.tx, c, critic_tx, spec.loop.seed), actor, critic)
    state = sharding.with_shardings(state, prog.shardings)
    frozen = None if prog.ref_shardings is None else sharding.with_shardings(
        qwen2.abstract_params(frozen_architecture(actor_cfg, spec.lora)), prog.ref_shardings)
    return AbstractRun(spec, mesh, prog, state, frozen)
