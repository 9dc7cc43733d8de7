"""Checkpoints of the whole train state with orbax: save every N steps, keep K, resume exactly.

A checkpoint holds the TrainState pytree (actor, critic, optimizer states, step, RNG) and a JSON
record of host-side progress (the data cursor, the profile sampler's RNG state, anything else the
loop needs to continue exactly where it stopped). Orbax writes each step into a temporary
directory and renames it when complete, so a crash never leaves a half-written checkpoint that
looks finished.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp

from rlver_jax import sharding


def make_manager(directory: str | os.PathLike, *, save_every: int, keep: int,
                 async_save: bool = True) -> ocp.CheckpointManager:
    """A manager for `directory` (created if missing) that saves every `save_every` steps."""
    if save_every < 1 or keep < 1:
        raise ValueError(f"config.checkpoint.save_every={save_every} and keep={keep} must both be >= 1")
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=save_every, max_to_keep=keep, enable_async_checkpointing=async_save,
        create=True)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict[str, Any],
         *, force: bool = False) -> bool:
    """Save `state` and `meta` at `step` when the interval says so (or `force`). Async: returns
    once the arrays are copied off the device; `wait(manager)` blocks until written."""
    return manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      meta=ocp.args.JsonSave(meta)), force=force)


def wait(manager: ocp.CheckpointManager) -> None:
    manager.wait_until_finished()


def latest_step(manager: ocp.CheckpointManager) -> int | None:
    return manager.latest_step()


def restore(manager: ocp.CheckpointManager, step: int | None, template: Any) -> tuple[Any, dict[str, Any]]:
    """Restore (state, meta) at `step` (default: the latest) into `template`'s structure,
    dtypes and shardings (each array is read straight into its shards)."""
    step = manager.latest_step() if step is None else step
    if step is None or step not in manager.all_steps():
        raise FileNotFoundError(
            f"no checkpoint at step {step} in {manager.directory}; available: {sorted(manager.all_steps())}")
    out = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(sharding.with_shardings(template)), meta=ocp.args.JsonRestore()))
    return out.state, dict(out.meta)


def restore_actor(directory: str | os.PathLike, step: int | None, abstract_actor: Any) -> tuple[Any, int]:
    """Only the actor parameters of the TrainState saved at `step` (default: the latest) in
    `directory` (a run's WORKDIR/checkpoints), for sampling or export.

    The directory is opened read-only and the restore is partial: the critic and the optimizer
    states are never read, so a policy needs the memory of its own parameters only.
    `abstract_actor`: ShapeDtypeStructs (with shardings) of the actor, as saved. Returns
    (params, step).
    """
    manager = ocp.CheckpointManager(os.path.abspath(directory),
                                    options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        steps = sorted(manager.all_steps())
        step = manager.latest_step() if step is None else step
        if step is None or step not in steps:
            raise FileNotFoundError(f"no checkpoint at step {step} in {manager.directory}; available: {steps}")
        item = {"actor": abstract_actor}  # the TrainState field; everything else stays on disk
        out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True)))
        return out.state["actor"], step
    finally:
        manager.close()
