"""Checkpoints of the whole train state: exact round trips onto the mesh, the actor alone onto
another layout, the save interval and retention, and errors that say what is there."""

import logging

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rlver_jax.train import checkpoint
from rlver_jax.parallel import sharding
from rlver_jax.rl import train_state


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
        restored, meta = checkpoint.restore_newest_readable(manager, _state(mesh, seed=9))
    assert meta == {"step": 2}
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), expected)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == checkpoint.log.name]
    assert len(warnings) == 1 and "(step 3: " in warnings[0] and "resuming from step 2" in warnings[0]
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
        checkpoint.restore_newest_readable(manager, _state(mesh, seed=0))
    manager.close()
    message = str(error.value)
    assert "\n" not in message and f"no checkpoint in {tmp_path} can be read (step 2: " in message
    assert "; step 1: " in message and checkpoint.saved_steps(tmp_path) == [1, 2]  # nothing moved
