"""Checkpoints of the whole train state with orbax: save every N steps, keep K, resume exactly.

A checkpoint holds the TrainState pytree (actor, critic, optimizer states, step, RNG) and a small
JSON record (`meta`: the step and the seed). Nothing else is needed to continue exactly where the
run stopped: the profiles of a step and every random key are pure functions of (seed, step), so
there is no data cursor or sampler state to save. Orbax writes each step into a temporary
directory and renames it when complete, so a crash (or a full disk) never leaves a half-written
checkpoint that looks finished: the last complete one stays the newest.

Every process of a multi-host run calls `save` and `restore` at the same step: each writes and
reads its own shards of the sharded state (process 0 the metadata), so the directory must be one
that every host reaches: a shared file system or a bucket URL (gs://...), which orbax writes
directly.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from rlver_jax.parallel import sharding
from rlver_jax.train.workdir import is_url

log = logging.getLogger(__name__)


def _location(directory: str | os.PathLike) -> str:
    """An absolute path, or a URL (gs://...) as it is."""
    return os.fspath(directory) if is_url(directory) else os.path.abspath(directory)


def make_manager(directory: str | os.PathLike, *, save_every: int, keep: int,
                 async_save: bool = True) -> ocp.CheckpointManager:
    """A manager for `directory` (a path or a gs:// URL; created if missing) that saves every
    `save_every` steps."""
    if save_every < 1 or keep < 1:
        raise ValueError(f"config.checkpoint.save_every={save_every} and keep={keep} must both be >= 1")
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=save_every, max_to_keep=keep, enable_async_checkpointing=async_save,
        create=True)
    return ocp.CheckpointManager(_location(directory), options=options)


class CheckpointMismatchError(ValueError):
    """A checkpoint holds arrays of other shapes than the state it is restored into."""


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


def saved_steps(directory: str | os.PathLike) -> list[int]:
    """The complete checkpoints' steps in `directory` (a run's WORKDIR/checkpoints), read from the
    folder names without opening a manager: orbax renames a step's folder to its number only when
    the step is fully written."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def restore(manager: ocp.CheckpointManager, step: int | None, template: Any) -> tuple[Any, dict[str, Any]]:
    """Restore (state, meta) at `step` (default: the latest) into `template`'s structure,
    dtypes and shardings (each array is read straight into its shards)."""
    step = manager.latest_step() if step is None else step
    if step is None or step not in manager.all_steps():
        raise FileNotFoundError(
            f"no checkpoint at step {step} in {manager.directory}; available: {sorted(manager.all_steps())}")
    # Shapes first: a restore into the wrong shapes fails inside orbax with its own message (and
    # leaves its reader coroutines to complain at exit).
    mismatches = _shape_mismatches(manager.item_metadata(step)["state"], template)
    if mismatches:
        shown = "; ".join(f"{name}: {saved} in the checkpoint, {wanted} in this config's model"
                          for name, saved, wanted in mismatches[:3])
        more = f" (and {len(mismatches) - 3} more)" if len(mismatches) > 3 else ""
        raise CheckpointMismatchError(
            f"the checkpoint of step {step} in {manager.directory} is of another model: {shown}{more}. Resume "
            "it with the config it was trained with (its config.json: the same config.model.preset and "
            "model.path), or start this config in a new config.workdir (or with config.checkpoint.resume=False)")
    out = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(sharding.with_shardings(template)), meta=ocp.args.JsonRestore()))
    return out.state, dict(out.meta)


class UnreadableCheckpointError(RuntimeError):
    """A directory holds checkpoints, and none of them can be read."""


def restore_newest_readable(manager: ocp.CheckpointManager, template: Any) -> tuple[Any, dict[str, Any]] | None:
    """(state, meta) of the newest checkpoint that can be read, as `restore`; None when there is none.

    Newer ones that cannot be read (array files truncated or missing, bad metadata: a disk fault,
    a copy cut short) are named, with why, in one warning and set aside as `unreadable_STEP` in
    the same directory (deleted on a bucket), so the steps run again can save there; a run then
    goes on from the restored step, rewriting the metrics and transcripts of later steps. None
    readable: UnreadableCheckpointError, one line naming the directory. A checkpoint of another
    model (CheckpointMismatchError) is not a fault of the files: it stops at once. Every process
    tries the same steps in order; a fault that only some processes see is not reconciled.
    """
    failed: list[tuple[int, str]] = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            restored = restore(manager, step, template)
        except CheckpointMismatchError:
            raise
        except Exception as e:  # noqa: BLE001 - what damaged files raise varies (tensorstore, JSON, OS)
            failed.append((step, _reason(e)))
            continue
        if failed:
            aside = _set_aside(manager, [s for s, _ in failed])
            log.warning("the newest checkpoint(s) in %s cannot be read (%s); resuming from step %d, the newest that "
                        "can, and running the later steps again (the unreadable ones are kept as %s)",
                        manager.directory, "; ".join(f"step {s}: {why}" for s, why in failed), step, aside)
        return restored
    if failed:
        raise UnreadableCheckpointError(
            f"no checkpoint in {manager.directory} can be read ({'; '.join(f'step {s}: {w}' for s, w in failed)}): "
            "restore the directory from a copy, or move it away (or set config.checkpoint.resume=False) to start "
            "from step 0")
    return None


def _reason(error: Exception, limit: int = 160) -> str:
    """The first line of an error, shortened (tensorstore's messages run to kilobytes)."""
    text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return text if len(text) <= limit else text[:limit] + "..."


def _set_aside(manager: ocp.CheckpointManager, steps: list[int]) -> str:
    """Rename the folders of `steps` to unreadable_STEP (a URL: delete them); what became of them."""
    directory = str(manager.directory)
    if is_url(directory):
        for step in steps:
            manager.delete(step)
        manager.reload()
        return "nothing: deleted from the bucket"
    names = []
    for step in steps:
        name, n = f"unreadable_{step}", 1
        while os.path.exists(os.path.join(directory, name)):
            name, n = f"unreadable_{step}.{n}", n + 1
        os.rename(os.path.join(directory, str(step)), os.path.join(directory, name))
        names.append(name)
    manager.reload()
    return ", ".join(names)


def _path_name(path: tuple) -> str:
    return "/".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)


def _shape_mismatches(saved: Any, template: Any) -> list[tuple[str, tuple, tuple]]:
    """(leaf path, saved shape, template shape) of every array whose shapes differ."""
    saved_tree = getattr(saved, "tree", saved)
    saved_shapes = {_path_name(p): tuple(getattr(leaf, "shape", ()))
                    for p, leaf in jax.tree_util.tree_flatten_with_path(saved_tree)[0]}
    out = []
    for p, leaf in jax.tree_util.tree_flatten_with_path(template)[0]:
        name, wanted = _path_name(p), tuple(getattr(leaf, "shape", ()))
        if name in saved_shapes and saved_shapes[name] != wanted:
            out.append((name, saved_shapes[name], wanted))
    return out


def restore_actor(directory: str | os.PathLike, step: int | None, abstract_actor: Any) -> tuple[Any, int]:
    """Only the actor parameters of the TrainState saved at `step` (default: the latest) in
    `directory` (a run's WORKDIR/checkpoints), for sampling or export.

    The directory is opened read-only and the restore is partial: the critic and the optimizer
    states are never read, so a policy needs the memory of its own parameters only.
    `abstract_actor`: ShapeDtypeStructs (with shardings) of the actor, as saved. Returns
    (params, step).
    """
    manager = ocp.CheckpointManager(_location(directory), options=ocp.CheckpointManagerOptions(read_only=True))
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
