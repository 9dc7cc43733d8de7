"""Checkpoints of the whole train state: exact round trips onto the mesh, the actor alone onto
another layout, the save interval and retention, and errors that say what is there."""

import asyncio
import logging

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.parallel import sharding
from rlver_jax.rl import train_state
from rlver_jax.train import checkpoint


def _state(mesh, seed):
    """A small TrainState on `mesh`: numbers drawn with numpy, the actor split over fsdp."""
    rng = np.random.default_rng(seed)
    split = NamedSharding(mesh, P("fsdp"))
    actor = {"w": jax.device_put(rng.normal(size=(8, 4)).astype(np.float32), split),
             "b": jax.device_put(rng.normal(size=(8,)).astype(np.float32), split)}
    tx = optax.adam(1e-3)
    shardings = train_state.state_shardings(tx, actor, jax.tree.map(lambda x: x.sharding, actor))
    return train_state.init_train_state(actor, tx, seed=seed, shardings=shardings)


def _manager(path, **kw):
    return checkpoint.make_manager(path, **{"save_every": 1, "keep": 5, "async_save": False, **kw})


def test_restore_is_exact_and_keeps_the_template_shardings(tmp_path):
    mesh = sharding.make_mesh((1, 8, 1))
    saved = _state(mesh, seed=1)
    expected = jax.device_get(saved)
    manager = _manager(tmp_path)
    checkpoint.save(manager, 3, saved, {"step": 3, "seed": 1}, force=True)
    template = _state(mesh, seed=2)  # other values, same structure and layout
    restored, meta = checkpoint.restore(manager, None, template)
    manager.close()
    assert meta == {"step": 3, "seed": 1}
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), expected)
    jax.tree.map(lambda r, t: r.sharding.is_equivalent_to(t.sharding, r.ndim) or pytest.fail(str(r.sharding)),
                 restored, template)


def test_restore_actor_reads_only_the_actor_onto_another_layout(tmp_path):
    saved = _state(sharding.make_mesh((1, 8, 1)), seed=1)
    expected = jax.device_get(saved.actor)
    manager = _manager(tmp_path)
    checkpoint.save(manager, 2, saved, {"step": 2}, force=True)
    manager.close()
    mesh = sharding.make_mesh((1, 2, 4))
    target = {"w": NamedSharding(mesh, P(None, "tensor")), "b": NamedSharding(mesh, P())}
    actor, step = checkpoint.restore_actor(tmp_path, None, sharding.with_shardings(expected, target))
    assert step == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(actor), expected)
    assert actor["w"].sharding == target["w"]


def test_save_interval_retention_and_errors(tmp_path):
    state = _state(sharding.make_mesh((1, 8, 1)), seed=0)
    manager = _manager(tmp_path, save_every=2, keep=2)
    saved = [step for step in range(1, 6) if checkpoint.save(manager, step, state, {"step": step})]
    assert saved == [1, 2, 4]  # the first step orbax sees, then every second
    checkpoint.save(manager, 5, state, {"step": 5}, force=True)
    assert checkpoint.latest_step(manager) == 5 and sorted(manager.all_steps()) == [4, 5]  # the newest two
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at step 2 .*available: \[4, 5\]"):
        checkpoint.restore(manager, 2, state)
    manager.close()
    with pytest.raises(ValueError, match="config.checkpoint.save_every=0"):
        checkpoint.make_manager(tmp_path / "other", save_every=0, keep=1)


def test_a_checkpoint_of_another_model_names_both_shapes(tmp_path):
    mesh = sharding.make_mesh((1, 8, 1))
    manager = _manager(tmp_path)
    checkpoint.save(manager, 4, _state(mesh, seed=0), {"step": 4}, force=True)
    split = NamedSharding(mesh, P("fsdp"))
    wider = {"w": jax.device_put(np.zeros((8, 6), np.float32), split),
             "b": jax.device_put(np.zeros(8, np.float32), split)}
    tx = optax.adam(1e-3)
    template = train_state.init_train_state(wider, tx, seed=0, shardings=train_state.state_shardings(
        tx, wider, jax.tree.map(lambda x: x.sharding, wider)))
    with pytest.raises(checkpoint.CheckpointMismatchError,
                       match=r"step 4 in .* is of another model: actor/w: \(8, 4\) in the checkpoint, \(8, 6\) in "
                             r"this config's model; .*config.model.preset"):
        checkpoint.restore(manager, None, template)
    manager.close()
    assert checkpoint.saved_steps(tmp_path) == [4] and checkpoint.saved_steps(tmp_path / "none") == []


def _damage(step_dir, kind):
    """What a disk fault or a copy cut short leaves: array files cut to half or gone, or metadata
    that is not JSON."""
    if kind == "truncated":
        for path in (step_dir / "state").rglob("*"):
            if path.is_file() and path.parent.name == "d":
                with open(path, "r+b") as f:
                    f.truncate(path.stat().st_size // 2)
    elif kind == "missing":
        for path in (step_dir / "state").rglob("*"):
            if path.is_file() and path.parent.name == "d":
                path.unlink()
    else:
        (step_dir / "state" / "_METADATA").write_text("{cut")


@pytest.mark.parametrize("kind", ["truncated", "missing", "metadata"])
def test_an_unreadable_newest_checkpoint_falls_back_to_the_newest_readable(tmp_path, kind, caplog):
    mesh = sharding.make_mesh((1, 8, 1))
    manager = _manager(tmp_path)
    for step in (1, 2, 3):
        checkpoint.save(manager, step, _state(mesh, seed=step), {"step": step}, force=True)
    manager.close()
    expected = jax.device_get(_state(mesh, seed=2))
    _damage(tmp_path / "3", kind)
    manager = _manager(tmp_path)
    with caplog.at_level(logging.WARNING):
        restored, meta = checkpoint.restore_newest_readable(manager, _state(mesh, seed=9), attempts=2,
                                                            retry_wait_s=0)
    assert meta == {"step": 2}
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), expected)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == checkpoint.log.name]
    assert len(warnings) == 2 and "checkpoint of step 3" in warnings[0] and "trying again" in warnings[0]
    assert "(step 3: " in warnings[1] and "resuming from step 2" in warnings[1]
    # Set aside, so the step run again saves there; the next restore is of the new save.
    assert checkpoint.saved_steps(tmp_path) == [1, 2] and (tmp_path / "unreadable_3").is_dir()
    checkpoint.save(manager, 3, _state(mesh, seed=5), {"step": 3}, force=True)
    restored, meta = checkpoint.restore_newest_readable(manager, _state(mesh, seed=9))
    manager.close()
    assert meta == {"step": 3}
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(_state(mesh, seed=5)))


def test_no_readable_checkpoint_stops_naming_the_directory(tmp_path):
    mesh = sharding.make_mesh((1, 8, 1))
    manager = _manager(tmp_path / "empty")
    assert checkpoint.restore_newest_readable(manager, _state(mesh, seed=0)) is None
    manager.close()
    manager = _manager(tmp_path)
    for step in (1, 2):
        checkpoint.save(manager, step, _state(mesh, seed=step), {"step": step}, force=True)
    manager.close()
    _damage(tmp_path / "1", "missing")
    _damage(tmp_path / "2", "metadata")
    manager = _manager(tmp_path)
    with pytest.raises(checkpoint.UnreadableCheckpointError) as error:
        checkpoint.restore_newest_readable(manager, _state(mesh, seed=0), attempts=1)
    manager.close()
    message = str(error.value)
    assert "\n" not in message and f"no checkpoint in {tmp_path} can be used (step 2: " in message
    assert "; step 1: " in message and checkpoint.saved_steps(tmp_path) == [1, 2]  # nothing moved
    assert "--config.checkpoint.start_over=True" in message and "resume=False" not in message


# ----------------------------------------------------------------------------- faults (issue 44)


def test_a_transient_read_error_is_retried_not_declared_unreadable(tmp_path, monkeypatch, caplog):
    mesh = sharding.make_mesh((1, 8, 1))
    manager = _manager(tmp_path)
    for step in (1, 2):
        checkpoint.save(manager, step, _state(mesh, seed=step), {"step": step}, force=True)
    restore, failures = manager.restore, []

    def flaky(step, *args, **kw):  # one read of the newest fails, as a network file system's might
        if not failures:
            failures.append(step)
            raise OSError(5, "Input/output error")
        return restore(step, *args, **kw)

    monkeypatch.setattr(manager, "restore", flaky)
    with caplog.at_level(logging.WARNING):
        _, meta = checkpoint.restore_newest_readable(manager, _state(mesh, seed=9), attempts=3, retry_wait_s=0)
    manager.close()
    assert failures == [2] and meta == {"step": 2}
    assert checkpoint.saved_steps(tmp_path) == [1, 2] and not list(tmp_path.glob("unreadable_*"))
    assert "trying again" in caplog.text and "cannot be used" not in caplog.text


def test_a_checkpoint_that_fails_verification_is_set_aside(tmp_path, caplog):
    """`verify` (the loop's: weights finite and equal to their record's norms) rejects step 2: the
    run goes on from step 1, step 2 kept as unusable_2."""
    mesh = sharding.make_mesh((1, 8, 1))
    manager = _manager(tmp_path)
    for step in (1, 2):
        checkpoint.save(manager, step, _state(mesh, seed=step), {"step": step}, force=True)
    with caplog.at_level(logging.WARNING):
        _, meta = checkpoint.restore_newest_readable(
            manager, _state(mesh, seed=9), verify=lambda state, meta: "its weights are not finite" if meta["step"] == 2
            else None)
    manager.close()
    assert meta == {"step": 1} and checkpoint.saved_steps(tmp_path) == [1] and (tmp_path / "unusable_2").is_dir()
    assert "step 2: its weights are not finite" in caplog.text


def test_records_are_read_without_a_manager(tmp_path):
    mesh = sharding.make_mesh((1, 8, 1))
    manager = _manager(tmp_path)
    for step in (1, 2):
        checkpoint.save(manager, step, _state(mesh, seed=step), {"step": step, "run": {"seed": step}}, force=True)
    manager.close()
    assert checkpoint.read_record(tmp_path, 1) == {"step": 1, "run": {"seed": 1}}
    (tmp_path / "2" / "meta" / "metadata").write_text("{cut")
    assert checkpoint.newest_record(tmp_path) == (1, {"step": 1, "run": {"seed": 1}})
    assert checkpoint.newest_record(tmp_path / "none") is None


# What orbax raises when tensorstore meets a full disk in a save's background thread.
_ORBAX_FULL = ('RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database at local file "{d}/4.orbax-checkpoint-tmp/'
               'state.orbax-checkpoint-tmp/ocdbt.process_0/": Failed to write 248120 bytes to file 4: No space left on '
               "device [os_error_code='28']")


def test_a_failed_save_is_one_line_naming_the_step_the_directory_and_the_cause(tmp_path, monkeypatch):
    mesh = sharding.make_mesh((1, 8, 1))
    manager = _manager(tmp_path)
    checkpoint.save(manager, 2, _state(mesh, seed=2), {"step": 2}, force=True)

    def full(*args, **kw):
        raise ValueError(_ORBAX_FULL.format(d=tmp_path))

    monkeypatch.setattr(manager, "save", full)
    with pytest.raises(checkpoint.CheckpointWriteError) as error:
        checkpoint.save(manager, 5, _state(mesh, seed=5), {"step": 5}, force=True)
    message = str(error.value)
    assert "\n" not in message and "RESOURCE_EXHAUSTED" not in message
    assert message.startswith(f"the checkpoint of step 4 could not be written to {tmp_path}: No space left on device "
                              "(errno 28). The run stopped there; kept: the checkpoint of step 2")
    monkeypatch.undo()

    # Asynchronous: `check` (before the next update) waits for that save and raises its failure.
    monkeypatch.setattr(manager, "wait_until_finished", full)
    setattr(manager, checkpoint._PENDING, 4)
    with pytest.raises(checkpoint.CheckpointWriteError, match="the checkpoint of step 4 could not be written"):
        checkpoint.check(manager)
    monkeypatch.undo()
    checkpoint.check(manager)  # nothing pending: nothing raised
    manager.close()


def test_orbax_failure_logs_are_kept_off_the_console(monkeypatch):
    """One full disk printed 1,497 stderr lines (a traceback per background write: absl's error logs,
    asyncio's "exception was never retrieved", tensorstore's closed-loop callbacks); the failure
    reaches the run as one CheckpointWriteError instead."""
    import sys
    import types

    for name in ("absl", "asyncio"):
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    checkpoint.quiet_orbax_errors()
    checkpoint.quiet_orbax_errors()  # once is enough: nothing stacks up
    record = logging.LogRecord("absl", logging.ERROR, "/venv/site-packages/orbax/checkpoint/future.py", 1,
                               "_SignalingThread.run() raised an exception", None, None)
    ours = logging.LogRecord("absl", logging.ERROR, "/repo/rlver_jax/train/loop.py", 1, "kept", None, None)
    assert [logging.getLogger("absl").filter(r) for r in (record, ours)] == [False, True]
    assert len(logging.getLogger("asyncio").filters) == 1
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(print)  # what tensorstore's callback does after a failed read
    except RuntimeError as e:
        callback = types.SimpleNamespace(exc_value=e, exc_traceback=e.__traceback__)
    elsewhere = types.SimpleNamespace(exc_value=RuntimeError("Event loop is closed"), exc_traceback=None)
    other = types.SimpleNamespace(exc_value=RuntimeError("something else"), exc_traceback=None)
    for unraisable in (callback, elsewhere, other):
        sys.unraisablehook(unraisable)
    assert seen == [elsewhere, other]  # only the callbacks into a closed loop are dropped


def test_a_save_whose_folder_never_appears_is_a_failure_with_the_disks_cause(tmp_path, monkeypatch):
    """A read-only disk: orbax's wait ends without an error (it would raise at the next save, one
    step later) but the step's folder is not there; the probe names the cause."""
    manager = _manager(tmp_path)
    monkeypatch.setattr(manager, "wait_until_finished", lambda: None)
    setattr(manager, checkpoint._PENDING, 7)

    def read_only(self, *args, **kw):
        raise OSError(30, "Read-only file system", str(self))

    monkeypatch.setattr(checkpoint.epath.Path, "write_text", read_only)
    with pytest.raises(checkpoint.CheckpointWriteError, match=r"^the checkpoint of step 7 could not be written to "
                                                              rf"{tmp_path}: Read-only file system \("):
        checkpoint.check(manager)
    monkeypatch.undo()
    manager.close()


def test_the_sampling_versions_item_reads_back_in_a_new_manager(tmp_path):
    """With rollout.max_staleness > 0 a checkpoint holds the actor versions the next batches are
    sampled with (the `sampling` item); a resumed run's new manager reads it, or None where absent."""
    mesh = sharding.make_mesh((1, 8, 1))
    manager = _manager(tmp_path)
    checkpoint.save(manager, 1, _state(mesh, seed=1), {"step": 1}, force=True)
    older = _state(mesh, seed=7).actor
    checkpoint.save(manager, 2, _state(mesh, seed=2), {"step": 2, "sampling_versions": [1]}, force=True,
                    sampling={"version_1": older})
    manager.close()
    manager = _manager(tmp_path)
    template = {"version_1": _state(mesh, seed=0).actor}
    item = checkpoint.restore_item(manager, 2, "sampling", template)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(item["version_1"]), jax.device_get(older))
    assert checkpoint.restore_item(manager, 1, "sampling", template) is None
    manager.close()
