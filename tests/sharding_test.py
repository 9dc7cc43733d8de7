"""Meshes, logical-axis rules, sharded parameters / optimizer state / batches, and the launch tools.

Runs on the eight virtual CPU devices of tests/conftest.py.
"""

import logging
import os
import pathlib
import shlex
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from configs import mesh as mesh_config
from rlver_jax.checks import InputError
from rlver_jax.models import hf_io, qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.parallel import device_groups, sharding
from rlver_jax.parallel.distributed import DistributedSettings
from rlver_jax.parallel.sampling_copy import SamplingLayout

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = get_preset("tiny")  # vocab 512, width 64, 4 heads / 2 kv heads of 16, mlp 128, 2 layers
RULES = "fsdp_tensor"
MESHES = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]

# Per-device shard shapes under fsdp_tensor: width over fsdp; heads, kv heads, mlp, vocab over
# tensor, except tiny's 2 kv heads on tensor=4, which stay whole (indivisible: replicated).
EXPECTED_SHARDS = {
    (8, 1, 1): {"embed": (512, 64), "q": (64, 4, 16), "k": (64, 2, 16), "gate": (64, 128), "down": (128, 64)},
    (1, 8, 1): {"embed": (512, 8), "q": (8, 4, 16), "k": (8, 2, 16), "gate": (8, 128), "down": (128, 8)},
    (2, 2, 2): {"embed": (256, 32), "q": (32, 2, 16), "k": (32, 1, 16), "gate": (32, 64), "down": (64, 32)},
    (1, 2, 4): {"embed": (128, 32), "q": (32, 1, 16), "k": (32, 2, 16), "gate": (32, 32), "down": (32, 32)},
}


def _batch(rows: int = 8, length: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids with left padding of different lengths per row."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, CONFIG.vocab_size, (rows, length)).astype(np.int32)
    mask = np.ones((rows, length), np.int32)
    for r in range(rows):
        mask[r, : r % 4] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


def _loss(params, batch):
    logits = qwen2.forward(CONFIG, params, batch["input_ids"], batch["attention_mask"])
    logp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.take_along_axis(logp, batch["input_ids"][:, 1:, None], axis=-1)[..., 0]
    mask = batch["attention_mask"][:, 1:].astype(jnp.float32)
    return (nll * mask).sum() / mask.sum(), logits


@pytest.fixture(scope="module")
def reference():
    """Parameters, loss, logits and gradients on one device, unsharded."""
    params = jax.jit(lambda key: qwen2.init_params(CONFIG, key))(jax.random.key(0))
    (loss, logits), grads = jax.jit(jax.value_and_grad(_loss, has_aux=True))(params, _batch())
    return params, loss, logits, grads


# ----------------------------------------------------------------------------- meshes


def test_mesh_shape_fills_one_axis_and_names_the_field_on_errors():
    assert sharding.resolve_mesh_shape((1, -1, 2), 8) == (1, 4, 2)
    assert sharding.resolve_mesh_shape([2, 2, 2], 8) == (2, 2, 2)
    with pytest.raises(ValueError, match=r"mesh.shape=\(2, 2, 3\) multiplies to 12 devices but this run has 8 "
                                         r"\(jax.device_count\(\)\)"):
        sharding.resolve_mesh_shape((2, 2, 3), 8)
    with pytest.raises(ValueError, match=r"mesh.shape.*does not divide"):
        sharding.resolve_mesh_shape((3, -1, 1), 8)
    with pytest.raises(ValueError, match="at most one -1"):
        sharding.resolve_mesh_shape((-1, -1, 1), 8)
    with pytest.raises(InputError, match=r"config.mesh.shape=\(8, 1\) must be 3 integers"):  # exit 2
        sharding.resolve_mesh_shape((8, 1), 8)
    with pytest.raises(InputError, match=r"must be 3 integers"):  # --config.mesh.shape=abc reads as ('abc',)
        sharding.resolve_mesh_shape(("abc",), 8)
    with pytest.raises(ValueError, match="mesh.shape"):
        sharding.make_mesh((4, 1, 1))


def test_make_mesh_uses_all_devices_with_fixed_auto_axes():
    mesh = sharding.make_mesh((1, -1, 2))
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert set(mesh.devices.flat) == set(jax.devices())
    assert mesh.axis_types == (AxisType.Auto,) * 3


def test_data_axis_spans_tpu_slices():
    assert sharding._dcn_split((4, 8, 2), 2) == ((2, 8, 2), (2, 1, 1))
    with pytest.raises(ValueError, match=r"mesh.shape\[0\] must be a multiple of 4"):
        sharding._dcn_split((2, 8, 1), 4)


def test_mesh_config_section_feeds_the_library():
    cfg = mesh_config.get_mesh_config()
    assert dict(sharding.make_mesh(cfg.shape).shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert sharding.resolve_rules(cfg.rules) == sharding.resolve_rules(RULES)
    explicit = mesh_config.get_mesh_config((2, 2, 2), [("embed", "fsdp"), ("vocab", ("tensor", "data"))])
    assert sharding.resolve_rules(explicit.rules) == {"embed": ("fsdp",), "vocab": ("tensor", "data")}


# ----------------------------------------------------------------------------- rules


def test_rule_errors_name_the_config_field():
    with pytest.raises(ValueError, match="mesh.rules='zero3' is not a preset"):
        sharding.resolve_rules("zero3")
    with pytest.raises(ValueError, match="mesh.rules maps 'embed' to \\('model',\\)"):
        sharding.resolve_rules([("embed", "model")])
    with pytest.raises(ValueError, match="names logical axis 'embed' twice"):
        sharding.resolve_rules([("embed", "fsdp"), ("embed", None)])
    mesh = sharding.make_mesh((1, 2, 4))
    no_mlp = [r for r in sharding.RULE_PRESETS[RULES] if r[0] != "mlp"]
    with pytest.raises(ValueError, match="logical axis 'mlp' of layer_0/mlp/\\w+_kernel has no rule in mesh.rules"):
        sharding.param_shardings(CONFIG, mesh, no_mlp)
    clash = [("mlp", "fsdp") if r[0] == "mlp" else r for r in sharding.RULE_PRESETS[RULES]]
    with pytest.raises(ValueError, match="both '(embed|mlp)' and '(embed|mlp)' .* to mesh axis 'fsdp'"):
        sharding.param_shardings(CONFIG, mesh, clash)


def test_indivisible_dimension_keeps_the_dividing_prefix_and_warns(caplog):
    mesh = sharding.make_mesh((1, 2, 4))
    rules = [("x", ("fsdp", "tensor"))]
    with caplog.at_level(logging.WARNING, logger="rlver_jax.parallel.sharding"):
        assert sharding.logical_to_mesh(P("x"), (16,), mesh, rules) == P(("fsdp", "tensor"))
        assert sharding.logical_to_mesh(P("x"), (6,), mesh, rules, "w6") == P("fsdp")
        assert sharding.logical_to_mesh(P("x"), (3,), mesh, rules, "w3") == P(None)
    assert "w6" in caplog.text and "w3" in caplog.text and "replicated" in caplog.text


# ----------------------------------------------------------------------------- parity


@pytest.mark.slow
@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_sharded_forward_and_gradient_match_one_device(reference, shape):
    ref_params, ref_loss, ref_logits, ref_grads = reference
    mesh = sharding.make_mesh(shape)
    p_sh = sharding.param_shardings(CONFIG, mesh, RULES)
    params = jax.device_put(ref_params, p_sh)

    shards = EXPECTED_SHARDS[shape]
    layer = params["layer_0"]
    for leaf, key in [(params["embed"]["embedding"], "embed"), (layer["attn"]["q_kernel"], "q"),
                      (layer["attn"]["k_kernel"], "k"), (layer["mlp"]["gate_kernel"], "gate"),
                      (layer["mlp"]["down_kernel"], "down")]:
        assert {s.data.shape for s in leaf.addressable_shards} == {shards[key]}
    for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(p_sh)):
        assert x.sharding == s

    batch = sharding.shard_host_batch(mesh, _batch())
    b_sh = sharding.batch_shardings(mesh, _batch())
    replicated = NamedSharding(mesh, P())
    step = sharding.jit_sharded(
        jax.value_and_grad(_loss, has_aux=True), in_shardings=(p_sh, b_sh),
        out_shardings=((replicated, b_sh["input_ids"]), p_sh))
    (loss, logits), grads = step(params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=1e-5)
    np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-5)
    jax.tree.map(lambda g, r: np.testing.assert_allclose(g, r, rtol=0, atol=1e-5), grads, ref_grads)
    assert grads["layer_0"]["mlp"]["gate_kernel"].addressable_shards[0].data.shape == shards["gate"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(1, 2, 4), (2, 2, 2)])
def test_sequence_rule_splits_the_residual_stream_and_changes_no_number(reference, shape):
    """With the rules, the residual stream between layers has its 16 tokens split over `tensor`
    (a constraint in the lowered program; none under the `fsdp` preset, whose `sequence` rule is
    None); loss, logits and every gradient still equal the single-device ones."""
    ref_params, ref_loss, ref_logits, ref_grads = reference
    mesh = sharding.make_mesh(shape)
    p_sh = sharding.param_shardings(CONFIG, mesh, RULES)
    b_sh = sharding.batch_shardings(mesh, _batch())
    out = ((NamedSharding(mesh, P()), b_sh["input_ids"]), p_sh)
    args = jax.device_put(ref_params, p_sh), sharding.shard_host_batch(mesh, _batch())
    split = '[{"data", "fsdp"}, {"tensor"}, {}]'
    for rules, constrained in [(RULES, True), ("fsdp", False)]:
        step = sharding.jit_sharded(jax.value_and_grad(_loss, has_aux=True), (p_sh, b_sh), out, rules=rules)
        assert (split in step.lower(*args).as_text()) == constrained
        (loss, logits), grads = step(*args)
        np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=1e-5)
        np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-5)
        jax.tree.map(lambda g, r: np.testing.assert_allclose(g, r, rtol=0, atol=1e-5), grads, ref_grads)


def test_load_pretrained_places_each_tensor_on_the_mesh(reference, tmp_path):
    hf_io.save_pretrained(CONFIG, reference[0], tmp_path / "hf")
    mesh = sharding.make_mesh((1, 2, 4))
    config, loaded = hf_io.load_pretrained(
        tmp_path / "hf", value_head=True, shardings=lambda c: sharding.param_shardings(c, mesh, RULES))
    expected = sharding.param_shardings(config, mesh, RULES)
    for x, s in zip(jax.tree.leaves(loaded), jax.tree.leaves(expected)):
        assert x.sharding == s
    assert loaded["layer_1"]["mlp"]["gate_kernel"].addressable_shards[0].data.shape == (32, 32)
    assert loaded["value_kernel"].addressable_shards[0].data.shape == (32,)
    del loaded["value_kernel"], loaded["value_bias"]
    _, plain = hf_io.load_pretrained(tmp_path / "hf")
    jax.tree.map(np.testing.assert_array_equal, loaded, plain)


# ----------------------------------------------------------------------------- optimizer


def test_adamw_step_keeps_parameter_and_optimizer_shardings(reference):
    mesh = sharding.make_mesh((2, 2, 2))
    optimizer = optax.adamw(1e-2, weight_decay=0.01)
    p_sh = sharding.param_shardings(CONFIG, mesh, RULES)
    o_sh = sharding.opt_state_shardings(optimizer, qwen2.abstract_params(CONFIG), p_sh)
    adam = o_sh[0]
    assert adam.mu == p_sh and adam.nu == p_sh and adam.count == NamedSharding(mesh, P())

    params = sharding.init_sharded_params(CONFIG, jax.random.key(0), mesh, RULES)
    jax.tree.map(np.testing.assert_array_equal, params, reference[0])  # same values, born sharded
    opt_state = sharding.init_opt_state(optimizer, params, p_sh)
    b_sh = sharding.batch_shardings(mesh, _batch())

    def update(params, opt_state, batch):
        (loss, _), grads = jax.value_and_grad(_loss, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step = sharding.jit_sharded(update, (p_sh, o_sh, b_sh), (p_sh, o_sh, NamedSharding(mesh, P())),
                                donate_argnums=(0, 1))
    losses = []
    for i in range(3):
        old = params
        params, opt_state, loss = step(params, opt_state, sharding.shard_host_batch(mesh, _batch(seed=i)))
        losses.append(float(loss))
        assert old["embed"]["embedding"].is_deleted()  # donated: updated in place
        for x, s in zip(jax.tree.leaves((params, opt_state)), jax.tree.leaves((p_sh, o_sh))):
            assert x.sharding == s
        assert opt_state[0].mu["layer_1"]["mlp"]["down_kernel"].addressable_shards[0].data.shape == (64, 32)
    assert int(opt_state[0].count) == 3 and np.all(np.isfinite(losses))


def test_state_that_does_not_mirror_the_params_is_replicated(caplog):
    mesh = sharding.make_mesh((1, 8, 1))
    abstract = qwen2.abstract_params(CONFIG)
    p_sh = sharding.param_shardings(CONFIG, mesh, "fsdp")
    odd = optax.GradientTransformation(
        init=lambda p: {"acc": jax.tree.map(jnp.zeros_like, p), "step": jnp.zeros([], jnp.int32),
                        "table": jnp.zeros((3, 5))},
        update=None)
    with caplog.at_level(logging.WARNING, logger="rlver_jax.parallel.sharding"):
        o_sh = sharding.opt_state_shardings(odd, abstract, p_sh)
    assert o_sh["acc"] == p_sh
    assert o_sh["step"] == o_sh["table"] == NamedSharding(mesh, P())
    assert "shape (3, 5) does not mirror a parameter" in caplog.text


# ----------------------------------------------------------------------------- batches and jit


def test_host_batch_goes_to_the_batch_axes():
    mesh = sharding.make_mesh((2, 2, 2))
    np.testing.assert_array_equal(sharding.host_batch_rows(mesh, 8), np.arange(8))
    batch = dict(_batch(), step=np.int32(3))
    placed = sharding.shard_host_batch(mesh, batch)
    assert placed["input_ids"].sharding.spec == P(("data", "fsdp"))
    assert placed["input_ids"].addressable_shards[0].data.shape == (2, 16)
    assert placed["step"].sharding.spec == P()
    np.testing.assert_array_equal(placed["input_ids"], batch["input_ids"])
    with pytest.raises(ValueError, match="batch of 6 rows .* multiple of 4"):
        sharding.batch_shardings(mesh, _batch(rows=6))
    with pytest.raises(ValueError, match="multiple of the 4 batch shards"):
        sharding.shard_host_batch(mesh, _batch(rows=6))
    with pytest.raises(ValueError, match="global batch size 6 .* multiple of 4"):
        sharding.host_batch_rows(mesh, 6)


def test_jit_sharded_takes_named_shardings_of_one_mesh():
    a, b = sharding.make_mesh((8, 1, 1)), sharding.make_mesh((1, 8, 1))
    with pytest.raises(ValueError, match="one mesh; got 2 meshes"):
        sharding.jit_sharded(lambda x: x, NamedSharding(a, P()), NamedSharding(b, P()))
    with pytest.raises(ValueError, match="other shardings"):
        sharding.jit_sharded(lambda x: x, NamedSharding(a, P()), jax.sharding.SingleDeviceSharding(jax.devices()[0]))


# ----------------------------------------------------------------------------- multi-host start-up


def _dist(initialize="auto", **fields):
    cfg = mesh_config.get_mesh_config().distributed
    cfg.initialize = initialize
    for k, v in fields.items():
        setattr(cfg, k, v)
    return DistributedSettings.from_config(cfg)


@pytest.fixture
def fake_initialize(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "RLVER_MULTIHOST"):
        monkeypatch.delenv(var, raising=False)
    return calls


def test_distributed_starts_only_when_asked(fake_initialize, monkeypatch):
    assert not sharding.maybe_initialize_distributed(_dist())
    assert not sharding.maybe_initialize_distributed(_dist("never", coordinator_address="h:1"))
    assert fake_initialize == []
    assert sharding.maybe_initialize_distributed(_dist("always"))
    assert fake_initialize.pop() == dict(coordinator_address=None, num_processes=None, process_id=None,
                                         heartbeat_timeout_seconds=120)
    assert sharding.maybe_initialize_distributed(_dist(coordinator_address="h:1", num_processes=4, process_id=2))
    assert fake_initialize.pop() == dict(coordinator_address="h:1", num_processes=4, process_id=2,
                                         heartbeat_timeout_seconds=120)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    assert sharding.maybe_initialize_distributed(_dist())
    assert fake_initialize.pop() == dict(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1,
                                         heartbeat_timeout_seconds=120)
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS")
    monkeypatch.delenv("JAX_NUM_PROCESSES")
    monkeypatch.setenv("RLVER_MULTIHOST", "1")  # a Cloud TPU pod worker under launch/tpu_pod.sh
    assert sharding.maybe_initialize_distributed(_dist())
    assert fake_initialize.pop() == dict(coordinator_address=None, num_processes=None, process_id=1,
                                         heartbeat_timeout_seconds=120)


def test_distributed_config_errors(fake_initialize, monkeypatch):
    with pytest.raises(ValueError, match="mesh.distributed.initialize='yes'"):
        sharding.maybe_initialize_distributed(_dist("yes"))
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not an integer"):
        sharding.maybe_initialize_distributed(_dist())


# ----------------------------------------------------------------------------- launch tools


@pytest.mark.slow
def test_tpu_pod_script_runs_the_command_in_the_repo_with_the_venv(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("export ACTIVATED=yes\n")
    out = subprocess.run(
        [REPO / "launch" / "tpu_pod.sh", "--name", "pod", "--zone", "zone-a", "--repo", str(tmp_path),
         "--venv", str(venv), "--env", "GREETING=hello world", "--dry-run", "--",
         "sh", "-c", 'echo "$PWD|$ACTIVATED|$RLVER_MULTIHOST|$GREETING|$0"', "two words"],
        capture_output=True, text=True, check=True).stdout
    argv = shlex.split(out)
    assert argv[:8] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod", "--zone", "zone-a"]
    assert "--worker=all" in argv
    remote = argv[argv.index("--command") + 1]
    ran = subprocess.run(["bash", "-c", remote], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"]}).stdout
    assert ran.strip() == f"{tmp_path}|yes|1|hello world|two words"
    usage = subprocess.run([REPO / "launch" / "tpu_pod.sh", "--zone", "z", "--", "ls"], capture_output=True, text=True)
    assert usage.returncode == 2 and "--name and --zone" in usage.stderr


# ----------------------------------------------------------------------------- sampling copy


def test_rows_of_one_process_are_all_its_own():
    assert sharding.row_processes(sharding.make_mesh((2, 2, 2)), 8).tolist() == [0] * 8
    with pytest.raises(ValueError, match="multiple of 4"):
        sharding.row_processes(sharding.make_mesh((2, 2, 2)), 6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampling_copy_is_cast_split_over_the_local_devices_and_its_own(reference, dtype):
    params = reference[0]
    mesh = sharding.make_mesh((1, 4, 2))
    placed = jax.device_put(params, sharding.param_shardings(CONFIG, mesh, RULES))
    model = CONFIG.replace(dtype=dtype)
    layout = SamplingLayout.create(model, mesh, RULES)
    copy = layout.copy(placed)
    gate = copy["layer_0"]["mlp"]["gate_kernel"]
    assert gate.dtype == jnp.dtype(dtype) and dict(gate.sharding.mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert gate.addressable_shards[0].data.shape == (16, 64)  # width 64 over fsdp 4, mlp 128 over tensor 2
    jax.tree.map(lambda c, p: np.testing.assert_array_equal(np.asarray(c), np.asarray(p).astype(jnp.dtype(dtype))),
                 copy, params)
    per_device: dict = {}
    for leaf in jax.tree.leaves(copy):
        for shard in leaf.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    assert layout.device_bytes(model) == max(per_device.values())
    jax.tree.map(lambda x: x.delete(), copy)  # the copy owns its buffers: an update may donate the params
    np.testing.assert_array_equal(np.asarray(placed["layer_0"]["mlp"]["gate_kernel"]),
                                  np.asarray(params["layer_0"]["mlp"]["gate_kernel"]))


def test_a_sampler_group_holds_the_sampling_copy_apart_from_the_training_mesh(reference):
    """config.mesh.sampler_devices=2 of this process's 8: the training mesh spans the first 6, the
    sampling copy (the same numbers) lives on the last 2 only; 8 leave nothing to train on."""
    trainer, sampler = device_groups.split_devices(jax.devices(), 2)
    assert [d.id for d in trainer] == list(range(6)) and [d.id for d in sampler] == [6, 7]
    assert device_groups.split_devices(jax.devices(), 0) == (jax.devices(), [])
    with pytest.raises(InputError, match=r"config.mesh.sampler_devices=8 leaves no device to train on: each "
                                         r"process has 8; set it below 8"):
        device_groups.split_devices(jax.devices(), 8)
    params = reference[0]
    mesh = sharding.make_mesh((1, 3, 2), trainer)
    placed = jax.device_put(params, sharding.param_shardings(CONFIG, mesh, RULES))
    copy = SamplingLayout.create(CONFIG, mesh, RULES, sampler).copy(placed)
    assert {d.id for leaf in jax.tree.leaves(copy) for d in leaf.sharding.device_set} == {6, 7}
    jax.tree.map(lambda c, p: np.testing.assert_array_equal(np.asarray(c), np.asarray(p)), copy, params)
