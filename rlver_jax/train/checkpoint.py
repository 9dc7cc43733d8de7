"""Checkpoints of the whole train state with orbax: save every N steps, keep K, resume exactly.

A checkpoint holds the TrainState pytree (actor, critic, optimizer states, step, RNG), a small
JSON record (`meta`: the step, the seed, the config fields the run was trained with, the parameter
norms) and, with rollout.max_staleness > 0, the actor versions the next batches are sampled with
(`sampling`). Nothing else is needed to continue exactly where the run stopped: the profiles of a
step and every random key are pure functions of (seed, step), so there is no data cursor to save.
Orbax writes each step into a temporary directory and renames it when complete, so a crash (or a
full disk) never leaves a half-written checkpoint that looks finished: the last complete one stays
the newest.

A save that fails (a full or read-only disk, in the save itself or, asynchronous, in the
background) raises CheckpointWriteError, one line naming the checkpoint, the directory and the
cause; `check` waits for an asynchronous save before the next update (it overlaps the next batch's
rollout) and raises its failure, so no step trains after a failed save.
A read is tried `attempts` times before a checkpoint is declared unreadable.

Every process of a multi-host run calls `save` and `restore` at the same step: each writes and
reads its own shards of the sharded state (process 0 the metadata), so the directory must be one
that every host reaches: a shared file system or a bucket URL (gs://...), which orbax writes
directly.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from rlver_jax.checks import InputError
from rlver_jax.parallel import sharding
from rlver_jax.train.checkpoint_files import newest_record, read_record, saved_steps, steps_in  # noqa: F401 (here too)
from rlver_jax.train.workdir import is_url

log = logging.getLogger(__name__)


def _location(directory: str | os.PathLike) -> str:
    """An absolute path, or a URL (gs://...) as it is."""
    return os.fspath(directory) if is_url(directory) else os.path.abspath(directory)


class _NotOrbax(logging.Filter):
    """Drops log records written by orbax's code, or carrying an exception raised through it."""

    def filter(self, record: logging.LogRecord) -> bool:
        paths = [record.pathname]
        tb = record.exc_info[2] if record.exc_info else None
        while tb is not None:
            paths.append(tb.tb_frame.f_code.co_filename)
            tb = tb.tb_next
        return not any("/orbax/" in p.replace(os.sep, "/") for p in paths)


def quiet_orbax_errors() -> None:
    """Keep orbax's error logs off the console: through absl a traceback per background thread and
    retry of a failed save, and asyncio's "exception was never retrieved" for each of its writes
    (hundreds of lines for one full disk); the failure reaches the run as one CheckpointWriteError.
    The launch scripts call it unless tracebacks are asked for."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NotOrbax) for f in logger.filters):
            logger.addFilter(_NotOrbax())
    _expect_closed_loop_callbacks()


def _expect_closed_loop_callbacks() -> None:
    """A checkpoint read or write that failed leaves tensorstore's other operations of it running:
    orbax closes its event loop as soon as the first one fails (asyncio_utils.run_sync), and each
    of the others, when it ends, calls back into that closed loop (loop.call_soon_threadsafe), which
    Python reports as an unraisable "Event loop is closed" with a traceback. Their results are
    discarded and nothing waits for them: drop exactly those reports (`_quiet_closed_loops`), once
    a failure made them expected, in the library and in the launch scripts alike."""
    if not getattr(sys.unraisablehook, "_rlver_quiet", False):
        sys.unraisablehook = _quiet_closed_loops(sys.unraisablehook)


def _quiet_closed_loops(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """`hook` but for "Event loop is closed" raised by a callback into a closed event loop
    (call_soon_threadsafe: tensorstore's, after a checkpoint write or read that already failed)."""
    def quiet(unraisable: Any) -> None:
        error, tb = unraisable.exc_value, unraisable.exc_traceback
        frames = []
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        if (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
                and "call_soon_threadsafe" in frames):
            return
        hook(unraisable)

    quiet._rlver_quiet = True  # type: ignore[attr-defined]
    return quiet


def make_manager(directory: str | os.PathLike, *, save_every: int, keep: int,
                 async_save: bool = True) -> ocp.CheckpointManager:
    """A manager for `directory` (a path or a gs:// URL; created if missing) that saves every
    `save_every` steps."""
    if save_every < 1 or keep < 1:
        raise ValueError(f"config.checkpoint.save_every={save_every} and keep={keep} must both be >= 1")
    # cleanup_tmp_directories: a save cut short (a kill, a full disk) leaves a temporary folder; removed here
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=save_every, max_to_keep=keep, enable_async_checkpointing=async_save,
        create=True, cleanup_tmp_directories=True)
    return ocp.CheckpointManager(_location(directory), options=options)


class CheckpointMismatchError(InputError):
    """A checkpoint holds arrays of other shapes than the state it is restored into."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the message names it, the directory, the cause and what is kept."""


# Phrases of the OS errors a save meets on a full or read-only disk, as orbax and tensorstore word them.
_DISK_ERRORS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied",
                "File too large")
_PENDING = "_rlver_pending_step"  # the step of an asynchronous save not yet known to be written


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict[str, Any],
         *, force: bool = False, sampling: Any = None) -> bool:
    """Save `state`, `meta` (and `sampling`: the actor versions the next batches are sampled with)
    at `step` when the interval says so (or `force`). Async: returns once the arrays are copied off
    the device; `wait(manager)` blocks until written. CheckpointWriteError when this save, or an
    earlier asynchronous one, failed."""
    items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
    if sampling is not None:
        items["sampling"] = ocp.args.StandardSave(sampling)
    try:
        saved = manager.save(step, args=ocp.args.Composite(**items), force=force)
    except Exception as e:  # noqa: BLE001 - whatever orbax and tensorstore raise for the disk
        raise _write_error(manager, getattr(manager, _PENDING, None) or step, e) from e
    if saved:  # checked by the next `check` or `wait` (an asynchronous write may fail after this returned)
        setattr(manager, _PENDING, step)
    return saved


def check(manager: ocp.CheckpointManager) -> None:
    """Wait for an asynchronous save still being written (the loop calls this once the next batch
    has arrived: the write overlaps that batch's rollout, never the next update) and raise
    CheckpointWriteError if it failed, so that no step trains after a failed save."""
    if getattr(manager, _PENDING, None) is not None:
        wait(manager)


def wait(manager: ocp.CheckpointManager) -> None:
    """Block until pending saves are written; CheckpointWriteError when one failed. A failure orbax
    keeps to itself until the next save (its step folder could not even be created: a read-only
    disk) is found by the folder's absence; the cause, by writing a probe file beside it."""
    pending = getattr(manager, _PENDING, None)
    try:
        manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 - see save
        raise _write_error(manager, pending, e) from e
    setattr(manager, _PENDING, None)
    if pending is not None and pending not in steps_in(manager.directory):
        raise _write_error(manager, pending, _probe(manager.directory))


def _probe(directory: Any) -> Exception:
    """Why `directory` cannot be written (the OSError of writing a small file there), or an error
    saying that the save failed in the background for no cause seen here."""
    path = epath.Path(os.fspath(directory)) / ".write_probe"
    try:
        path.write_text("probe")
        path.unlink()
    except OSError as e:
        return e
    return RuntimeError("its folder is missing once the write ended (it failed in the background)")


def _write_error(manager: ocp.CheckpointManager, step: int | None, error: Exception) -> CheckpointWriteError:
    """The one-line error of a failed save of `step` (None: unknown): the cause (the OS error, not
    tensorstore's kilobytes) and the newest complete checkpoint, which is what is kept."""
    setattr(manager, _PENDING, None)
    text = str(error)
    if m := re.search(r"/(\d+)\.orbax-checkpoint-tmp", text):  # the failed step's temporary folder
        step = int(m.group(1))
    directory = str(getattr(manager, "directory", "the checkpoint directory"))
    if isinstance(error, OSError) and error.strerror:
        cause = error.strerror + (f" ({error.filename})" if error.filename else "")
    else:
        found = [p for p in _DISK_ERRORS if p in text]
        code = re.search(r"os_error_code='(\d+)'", text)
        cause = (found[0] + (f" (errno {code.group(1)})" if code else "")) if found else _reason(error)
    try:
        kept = [s for s in steps_in(directory) if s != step]
    except Exception:  # noqa: BLE001 - a directory that cannot even be listed
        kept = []
    what = f"the checkpoint of step {step}" if step is not None else "a checkpoint"
    keeps = f"the checkpoint of step {kept[-1]}" if kept else "no checkpoint"
    return CheckpointWriteError(
        f"{what} could not be written to {directory}: {cause}. The run stopped there; kept: {keeps} and the "
        "metrics and transcripts of the steps before it. Free space on (or make writable) that disk, then rerun the "
        "same command to resume")


def latest_step(manager: ocp.CheckpointManager) -> int | None:
    return manager.latest_step()


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
            "model.path), or start this config in a new config.workdir")
    out = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(sharding.with_shardings(template)), meta=ocp.args.JsonRestore()))
    return out.state, dict(out.meta)


def restore_item(manager: ocp.CheckpointManager, step: int, name: str, template: Any) -> Any | None:
    """The item `name` of checkpoint `step` (e.g. "sampling", see `save`) read into `template`'s
    structure and shardings; None when the checkpoint holds no such item."""
    if name not in manager.item_metadata(step).keys():  # listed by its folder (its metadata needs a handler)
        return None
    out = manager.restore(step, args=ocp.args.Composite(
        **{name: ocp.args.StandardRestore(sharding.with_shardings(template))}))
    return out[name]


class UnreadableCheckpointError(RuntimeError):
    """A directory holds checkpoints, and none of them can be read (or none is usable)."""


def restore_newest_readable(manager: ocp.CheckpointManager, template: Any, *, attempts: int = 3,
                            retry_wait_s: float = 1.0,
                            verify: Callable[[Any, dict[str, Any]], str | None] | None = None
                            ) -> tuple[Any, dict[str, Any]] | None:
    """(state, meta) of the newest checkpoint that can be read and is usable, as `restore`; None
    when there is none.

    A read that fails is tried again (`attempts` reads in all, `retry_wait_s` doubling between them:
    a network file system's or a bucket's transient error) before the checkpoint is declared
    unreadable (array files truncated or missing, bad metadata: a disk fault, a copy cut short).
    `verify(state, meta)` returns why a checkpoint that reads is not usable (weights that are not
    finite, or differ from its record), else None. Newer ones that cannot be read or used are named,
    with why, in one warning and set aside as `unreadable_STEP` / `unusable_STEP` in the same
    directory (deleted on a bucket), so the steps run again can save there; a run then goes on from
    the restored step, rewriting the metrics and transcripts of later steps. None readable:
    UnreadableCheckpointError, one line naming the directory. A checkpoint of another model
    (CheckpointMismatchError) is not a fault of the files: it stops at once. Every process tries
    the same steps in order; a fault that only some processes see is not reconciled.
    """
    failed: list[tuple[int, str, str]] = []  # (step, why, "unreadable" | "unusable")
    for step in sorted(manager.all_steps(), reverse=True):
        for attempt in range(attempts):
            try:
                restored = restore(manager, step, template)
                break
            except CheckpointMismatchError:
                raise
            except Exception as e:  # noqa: BLE001 - what damaged files raise varies (tensorstore, JSON, OS)
                _expect_closed_loop_callbacks()  # the read's other operations end into orbax's closed loop
                if attempt + 1 < attempts:
                    log.warning("reading the checkpoint of step %d in %s failed (%s); trying again", step,
                                manager.directory, _reason(e))
                    time.sleep(retry_wait_s * 2 ** attempt)
                    continue
                restored = None
                failed.append((step, _reason(e), "unreadable"))
        if restored is None:
            continue
        why = verify(restored[0], restored[1]) if verify is not None else None
        if why is not None:
            failed.append((step, why, "unusable"))
            continue
        if failed:
            aside = _set_aside(manager, [(s, kind) for s, _, kind in failed])
            log.warning("the newest checkpoint(s) in %s cannot be used (%s); resuming from step %d, the newest that "
                        "can, and running the later steps again (the others are kept as %s)",
                        manager.directory, "; ".join(f"step {s}: {why}" for s, why, _ in failed), step, aside)
        return restored
    if failed:
        raise UnreadableCheckpointError(
            f"no checkpoint in {manager.directory} can be used ({'; '.join(f'step {s}: {w}' for s, w, _ in failed)}): "
            "restore the directory from a copy, or start again from step 0 with --config.checkpoint.start_over=True "
            "(which moves this run aside)")
    return None


def _reason(error: Exception, limit: int = 160) -> str:
    """The first line of an error, shortened (tensorstore's messages run to kilobytes)."""
    text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return text if len(text) <= limit else text[:limit] + "..."


def _set_aside(manager: ocp.CheckpointManager, steps: list[tuple[int, str]]) -> str:
    """Rename the folders of `steps` ((step, "unreadable" | "unusable")) to KIND_STEP (a URL: delete
    them); what became of them."""
    directory = str(manager.directory)
    if is_url(directory):
        for step, _ in steps:
            manager.delete(step)
        manager.reload()
        return "nothing: deleted from the bucket"
    names = []
    for step, kind in steps:
        name, n = f"{kind}_{step}", 1
        while os.path.exists(os.path.join(directory, name)):
            name, n = f"{kind}_{step}.{n}", n + 1
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
