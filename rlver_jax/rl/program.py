"""The update side of a run as jitted programs (`UpdateProgram`), and the host driver of a train step.

A program per stage (`train_step` runs them in this order): `prepare`, the actor's epochs, the
critic's (when the algorithm has one), step + 1; the maths is rlver_jax.rl.update's. A program per
model lets what a program does not read wait in host memory (config.train.offload,
rlver_jax.rl.offload). With config.rl.pack_rows the host lays the rows out packed
(rlver_jax.rl.packing): `prepare`'s with the batch, the update's micro-batches once `prepare` has
drawn the step's mini-batch order.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.models import lora as lora_lib
from rlver_jax.models.config import Qwen2Config
from rlver_jax.parallel import sharding
from rlver_jax.parallel.sampling_copy import on_device
from rlver_jax.rl import offload as offload_lib
from rlver_jax.rl import packing
from rlver_jax.rl.batch import RowTable, TrainBatch
from rlver_jax.rl.optimizer import Optimizer
from rlver_jax.rl.settings import RLSettings
from rlver_jax.rl.train_state import ModelState, TrainState
from rlver_jax.rl.update import NO_LORA, Frozen, PackedOrder, actor_update, critic_update, model_epochs, prepare_step

Params = Any
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class UpdateProgram:
    """The update side of one run, built once (shardings fixed at build time): the models'
    architectures and optimizers, the state's shardings and the train step's jitted programs:
    `prepare` (models, frozen, batch) -> (inputs, rows, metrics, dialogue advantages); `actor` and
    (with a critic) `critic` (step, params, opt_state, frozen base, inputs, rows) -> (params,
    opt_state, metrics), their model donated (`update.Frozen.base`); `next_step` (step) -> step + 1.
    `train_step` runs them in that order. With LoRA (`lora.rank` > 0) the state's models are their
    trainable leaves and the frozen weights are the base, which every program reads."""

    rl: RLSettings
    actor_cfg: Qwen2Config
    critic_cfg: Qwen2Config | None  # None: no critic (GRPO)
    actor_opt: Optimizer
    critic_opt: Optimizer | None
    prepare: Callable
    actor: Callable
    critic: Callable | None
    next_step: Callable
    mesh: Any = None  # batches are split over its batch axes; None: the default device
    offload: str = "none"  # a mode of rlver_jax.rl.offload_modes.OFFLOAD
    shardings: TrainState | None = None  # the state's, in device memory (with a mesh)
    ref_shardings: Any | None = None  # the frozen weights' (a KL term's reference, or LoRA's base)
    lora: lora_lib.LoraSettings = NO_LORA
    merge: Callable | None = None  # LoRA: (actor adapters, base) -> the merged actor, in the base's layout

    def frozen(self, params: Params | None) -> Frozen:
        """The frozen weights `params` (a KL term's reference, LoRA's base, or None) as the programs
        take them."""
        return Frozen(params, self.lora)

    def actor_params(self, state: TrainState, frozen: Params | None) -> Params:
        """The actor's whole parameter tree, for sampling: with LoRA its adapters merged into the
        base `frozen` (one jitted merge into the base's layout; adapters waiting in host memory,
        config.train.offload "state", come to the devices for it), else the state's actor itself."""
        if self.merge is None:
            return state.actor
        return self.merge(on_device(state.actor), self.frozen(frozen))

    def model_programs(self) -> list[tuple[str, Callable]]:
        """(model, its update program) in the order a train step runs them."""
        return [(name, fn) for name, fn in (("actor", self.actor), ("critic", self.critic)) if fn is not None]

    def _shards(self) -> int:
        """The batch shards of the mesh (1 without one)."""
        return 1 if self.mesh is None else math.prod(self.mesh.shape[a] for a in sharding.BATCH_AXES)

    def _owners(self, table: RowTable) -> np.ndarray | None:
        """[B] the process holding each row of the global batch (None: one process)."""
        processes, rows = table.lengths.shape
        return None if processes == 1 else sharding.row_processes(self.mesh, processes * rows)

    def prepare_layout(self, table: RowTable) -> dict[str, np.ndarray]:
        """This process's packed rows for `prepare` (packing.prepare_layout), their slots numbered in
        the global batch, their count a multiple of its batch shards and of its share of a micro-batch;
        none where they would be as many as the rows (prepare then runs on the rows)."""
        processes = len(table.lengths)
        owners, micro = self._owners(table), self.rl.micro_batch_size
        local = self._shards() // processes
        unit = math.lcm(local, micro // math.gcd(micro, processes))
        ids = None if owners is None else np.flatnonzero(owners == jax.process_index())
        layout = packing.prepare_layout(table, jax.process_index(), unit, ids)
        log.debug("packed rows: prepare's %d x %d rows (%d tokens) in %d", *table.policy.shape[1:],
                  int(table.lengths.sum()), len(layout["pack_source"]))
        return layout if len(layout["pack_source"]) < table.lengths.shape[1] else {}

    def packed_order(self, rows: jax.Array, table: RowTable) -> PackedOrder | jax.Array:
        """The update's order `rows` (prepare's, replicated) with each micro-batch's packed rows
        (packing.micro_layouts of every process's rows), placed replicated; `rows` itself where a
        micro-batch would take as many packed rows as rows (the update then runs on the rows)."""
        owners = self._owners(table)
        lengths, policy = table.lengths.reshape(-1), table.policy.reshape((-1,) + table.policy.shape[2:])
        if owners is not None:  # the processes' rows in global order: each one's ascending
            where = np.argsort(owners, kind="stable")
            lengths, policy = lengths[np.argsort(where)], policy[np.argsort(where)]
        order = np.asarray(rows) if self.mesh is None else sharding.replicated_value(rows)
        source, positions = packing.micro_layouts(lengths, policy, order, self.rl.micro_batch_size, self._shards())
        log.debug("packed rows: the update's micro-batches of %d rows in %d, scored slots %d", self.rl.micro_batch_size,
                  source.shape[2], positions.shape[-1])
        if source.shape[2] == self.rl.micro_batch_size:
            return rows
        if self.mesh is None:
            return PackedOrder(rows, jax.device_put(source), jax.device_put(positions))
        replicated = NamedSharding(self.mesh, P())
        place = lambda x: jax.make_array_from_process_local_data(replicated, x, x.shape)  # noqa: E731
        return PackedOrder(rows, place(source), place(positions))


def make_update_program(rl: RLSettings, actor_cfg: Qwen2Config, critic_cfg: Qwen2Config | None,
                        actor_opt: Optimizer, critic_opt: Optimizer | None, mesh=None, state_shardings=None,
                        ref_shardings=None, rules=None, offload: str = "none",
                        lora: lora_lib.LoraSettings = NO_LORA) -> UpdateProgram:
    """Jit the train step's programs; each model's program donates its parameters and optimizer state.

    With a mesh and the state's shardings (`state_shardings`), parameters and optimizer states
    keep their layout across steps, and every batch array is split over the batch axes; `rules`
    (config.mesh.rules) may split the residual stream's tokens (sharding.jit_sharded).
    `offload` (a mode of rlver_jax.rl.offload_modes.OFFLOAD, with a mesh): what waits in host memory
    when (config.train.offload). `lora` (config.lora): the state's models are their trainable
    leaves on the frozen base passed as the frozen weights (`update.Frozen`).
    """
    offload_lib.check_mode(offload, mesh)
    prepare_fn = functools.partial(prepare_step, rl, actor_cfg, critic_cfg)
    actor_fn = functools.partial(model_epochs, "actor", rl,
                                 functools.partial(actor_update, rl, actor_cfg, actor_opt.tx), actor_opt)
    critic_fn = None if critic_opt is None else functools.partial(
        model_epochs, "critic", rl, functools.partial(critic_update, rl, critic_cfg, critic_opt.tx), critic_opt)
    merge = None
    if lora.enabled:  # the sampler's actor: the base's layout on a mesh
        merge = jax.jit(lambda trainable, frozen: frozen.model(actor_cfg, trainable),
                        out_shardings=None if mesh is None else ref_shardings)
    common = dict(rl=rl, actor_cfg=actor_cfg, critic_cfg=critic_cfg, actor_opt=actor_opt, critic_opt=critic_opt,
                  lora=lora, merge=merge)
    if mesh is None:
        jit = functools.partial(jax.jit, donate_argnums=(1, 2))
        return UpdateProgram(**common, prepare=jax.jit(prepare_fn), actor=jit(actor_fn),
                             critic=critic_fn and jit(critic_fn), next_step=jax.jit(lambda s: s + 1, donate_argnums=0),
                             ref_shardings=ref_shardings)
    batch = NamedSharding(mesh, P(sharding.BATCH_AXES))  # a prefix: every leaf of a batch dict
    replicated = NamedSharding(mesh, P())
    sh = state_shardings
    jit = functools.partial(sharding.jit_sharded, rules=rules)
    frozen_sh = Frozen(ref_shardings, lora)
    base_sh = frozen_sh.base()

    def model_jit(fn, params_sh, opt_sh):
        return jit(fn, (replicated, params_sh, opt_sh, base_sh, batch, replicated), (params_sh, opt_sh, replicated),
                   donate_argnums=(1, 2))

    return UpdateProgram(
        **common,
        prepare=jit(prepare_fn, (sh.models(), frozen_sh, batch), (batch, replicated, replicated, replicated)),
        actor=model_jit(actor_fn, sh.actor, sh.actor_opt),
        critic=critic_fn and model_jit(critic_fn, sh.critic, sh.critic_opt),
        next_step=jit(lambda s: s + 1, (replicated,), replicated, donate_argnums=(0,)),
        mesh=mesh, offload=offload, shardings=sh, ref_shardings=ref_shardings)


def train_step(program: UpdateProgram, state: TrainState, frozen: Frozen, batch: dict,
               table: RowTable | None = None) -> tuple[TrainState, dict, jax.Array]:
    """One train step on placed arrays: prepare, then `ppo_epochs` passes over mini-batches of
    the actor's updates, then the critic's (PPO), then step + 1; the state is consumed. Metrics
    are replicated device scalars, as is each dialogue's advantage (`dialogue_advantages`).
    Before each program the state's parts go where `program.offload` has them (rlver_jax.rl.offload.place),
    and after the last to where they rest between steps. `table` (every process's rows): the update
    runs on packed rows, laid out once prepare's mini-batch order is on the host."""

    def place(state: TrainState, stage: str) -> TrainState:
        return offload_lib.place(state, stage, program.offload, program.shardings)

    state = place(state, "prepare")
    inputs, rows, metrics, advantages = program.prepare(state.models(), frozen, batch)
    if table is not None:
        rows = program.packed_order(rows, table)
    for name, fn in program.model_programs():
        state = place(state, name)
        params, opt_state, m = fn(state.step, *state.model(name), frozen.base(), inputs, rows)
        state = state.with_model(name, ModelState(params, opt_state))
        metrics.update(m)
    state = place(state, "rest")
    return state.replace(step=program.next_step(state.step)), metrics, advantages


def train_on_batch(program: UpdateProgram, state: TrainState, batch: TrainBatch, frozen: Params | None = None,
                   policy_tokens: int | None = None) -> tuple[TrainState, dict[str, float], np.ndarray]:
    """One train step on the device: the batch is placed explicitly (this process's rows on the
    mesh: rlver_jax.parallel.sharding.shard_host_batch), the step's jitted programs run, and its
    metrics (reduced on device, replicated) come back as floats from this process's copy, with each
    dialogue's advantage (`dialogue_advantages`, indexed by the batch's global dialogue ids: every
    process has all of them); nothing else crosses between host and device.
    `frozen`: the frozen weights (a KL term's reference, LoRA's base; None: neither); `policy_tokens`:
    see rl.batch.policy_positions. With config.rl.pack_rows the model passes run on packed rows
    (rlver_jax.rl.packing): the batch goes with prepare's layout, and the step's mini-batch order
    comes to the host between prepare and the updates, which get their micro-batches' layouts.
    Returns the new state (step + 1)."""
    arrays = batch.arrays(policy_tokens)
    table = batch.rows() if program.rl.pack_rows else None
    if table is not None:
        arrays.update(program.prepare_layout(table))
    mesh = program.mesh
    device_batch = jax.device_put(arrays) if mesh is None else sharding.shard_host_batch(mesh, arrays)
    bsz, rl = device_batch["tokens"].shape[0], program.rl  # the global batch: every process's rows
    if bsz % (rl.batch_size or rl.mini_batch_size):
        raise ValueError(f"batch of {bsz} rows is not a multiple of config.rl.mini_batch_size={rl.mini_batch_size}"
                         + (f" and of the {rl.batch_size} dialogues per step" if rl.batch_size else ""))
    state, metrics, advantages = train_step(program, state, program.frozen(frozen), device_batch, table)
    return (state, {k: float(sharding.replicated_value(v)) for k, v in metrics.items()},
            sharding.replicated_value(advantages))
