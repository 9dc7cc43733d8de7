"""Programs compiled for a TPU slice on this CPU host: libtpu's compile-only devices of a v5e:2x2
(rlver_jax/parallel/topology.py), the TPU compiler's own memory figures, no TPU and no XLA_FLAGS;
the roofline's cost model of the compiled programs (rlver_jax/train/planner/hlo_cost.py).

Splash attention (the kernel a TPU target gets) compiles inside its shard_map over a 2x2 mesh for
head_dim 64 and 128, forward and backward; the tiny preset's update and sampler programs compile
with it, each below the chip's HBM. Two pytest workers may load libtpu at once
(ALLOW_MULTIPLE_LIBTPU_LOAD, set by topology.tpu_target). Without libtpu every test skips.
"""

import math
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import grpo_think
from rlver_jax.cli import program
from rlver_jax.models import attention
from rlver_jax.parallel import sharding, topology
from rlver_jax.rl import update
from rlver_jax.train.planner import hlo_cost, plan, report
from rlver_jax.train.planner.lengths import Lengths
from rlver_jax.train.planner.setup import abstract_setup
from rlver_jax.train.spec import RunSpec

REPO = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not topology.libtpu_available(),
                                reason="libtpu is not installed (pip install -e '.[tpu]'): no TPU compiler here")


@pytest.fixture(scope="module")
def v5e():
    return topology.tpu_target("v5e:2x2")


def test_a_topology_is_its_compile_only_tpu_devices(v5e):
    assert len(v5e.devices) == 4 and v5e.device_kind == "TPU v5 lite" and v5e.chip.name == "v5e"
    assert (v5e.hosts, v5e.devices_per_host, v5e.chip.hbm_gb) == (1, 4, 16.0)
    mesh = sharding.make_mesh((1, -1, 2), v5e.devices)
    assert sharding.mesh_platform(mesh) == "tpu" and dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    with sharding.split_activations(mesh):  # what the trainer's and the sampler's programs trace under
        assert attention.target_platform() == "tpu"
        assert attention.resolve("auto", 2048, jnp.bfloat16) == "splash"
    assert attention.target_platform() == "cpu"  # the host's, outside


@pytest.mark.parametrize("name", ["v5e:2", "v5e:2x2x2", "v9:2x2", "tpu", "v5e:3x3"])
def test_a_bad_topology_name_is_one_line_naming_the_valid_forms(name):
    with pytest.raises(ValueError) as e:
        topology.tpu_target(name)
    assert "\n" not in str(e.value) and "v5e:4x4" in str(e.value) and "v5p:2x2x2" in str(e.value)


@pytest.mark.parametrize("head_dim,mask", [(64, jnp.bool_), (128, jnp.bool_), (128, jnp.int32)])
def test_splash_attention_compiles_in_its_shard_map_on_a_2x2_mesh(v5e, head_dim, mask):
    """Forward and backward of `attend` ("auto") in a jit_sharded program on mesh (1, 2, 2): the
    TPU target chooses splash; its kernels (forward, dq, dkv) get one row and one of the two
    tensor shards' heads each (rows over fsdp, 4 query heads on 2 kv heads over tensor). An int32
    mask is packed rows' segment ids, which splash takes as its own."""
    mesh = sharding.make_mesh((1, 2, 2), v5e.devices)
    b, t, n, k = 2, 512, 4, 2
    rows = NamedSharding(mesh, P(sharding.BATCH_AXES))

    def loss(q, kk, v, mask):
        return jnp.sum(attention.attend(q, kk, v, mask, "auto").astype(jnp.float32) ** 2)

    grad = sharding.jit_sharded(jax.grad(loss, argnums=(0, 1, 2)), (rows,) * 4, (rows,) * 3)
    q = jax.ShapeDtypeStruct((b, t, n, head_dim), jnp.bfloat16, sharding=rows)
    kv = jax.ShapeDtypeStruct((b, t, k, head_dim), jnp.bfloat16, sharding=rows)
    mask = jax.ShapeDtypeStruct((b, t), mask, sharding=rows)
    compiled = grad.lower(q, kv, kv, mask).compile()
    comps, _ = hlo_cost._computations(compiled.as_text())
    calls = [i for ins in comps.values() for i in ins if i.op == "custom-call" and i.name.startswith("splash_mha")]
    assert {re.match(r"splash_mha_(fwd|dq|dkv)", i.name).group(1) for i in calls} == {"fwd", "dq", "dkv"}
    # Each device's kernels: its one row (a vmap over one row leaves no row axis) and its tensor
    # shard's query heads (n / 2) at full T and head_dim.
    assert {hlo_cost.kernel_q_shape(i)[-3:] for i in calls} == {(n // 2, t, head_dim)}
    assert {math.prod(hlo_cost.kernel_q_shape(i)[:-3]) for i in calls} == {1}
    mem = compiled.memory_analysis()
    total = mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes
    assert 0 < total < v5e.chip.hbm_gb * 1e9
    cost = hlo_cost.program_cost(compiled)
    # Splash's matmuls by formula: forward 2, dq 3, dkv 4 per head and causal half of T x T.
    assert cost.kernel_flops == pytest.approx(2 * 1 * (n // 2) * t * t / 2 * head_dim * (2 + 3 + 4), rel=0.01)


@pytest.mark.slow
def test_tiny_presets_update_and_sampler_compile_for_v5e(v5e):
    """The planner on the tiny GRPO preset for v5e:2x2: the update's programs and the sampler's,
    each compiled by the TPU compiler with splash attention, each positive and below the chip's
    HBM; the plan names the device kind and chip count, and estimates a roofline."""
    config = grpo_think.get_config("tiny")
    config.workdir = "/tmp/unused"
    config.rollout.max_total_tokens, config.train.length_multiple = 128, 128
    config.rollout.profiles_per_step, config.rollout.max_new_tokens, config.rollout.cache_slots = 4, 16, 0
    # Lengths that fit 128 tokens (the default first prompt, 512, would leave no turn to estimate).
    result = plan.plan(RunSpec.from_config(config), None, ("prepare", "actor update", "rollout"),
                       Lengths(prompt=32, feed=8), search=False,
                       target=v5e)
    assert result.memory_gb == 16.0  # the chip's HBM
    # The rollout engine (the default): its decode chunk and its prefill chunk.
    assert [p.name for p in result.phases] == ["prepare", "actor update", "rollout", "rollout prefill"]
    for p in result.phases:  # the update's programs need temporaries; a tiny prefill chunk may not
        assert 0 < p.total < 16e9 and (p.temporaries > 0 or p.name.startswith("rollout")), p
        assert p.cost is not None and p.cost.flops > 0 and p.cost.bytes > 0
    text = report.format_plan(result, "tiny")
    assert "attention=auto (splash on TPU v5 lite)" in text
    assert "target     v5e:2x2: 4 x TPU v5 lite (v5e), 1 host of 4" in text and "= 4 tpu devices" in text
    assert "estimate   an ESTIMATE" in text and "step       every reply at max_new_tokens" in text
    est = result.estimate
    assert est is not None and est.step > 0 and 0 < est.mfu <= 1
    assert np.isfinite([p.cost.seconds(v5e.chip) for p in result.phases]).all()


@pytest.mark.slow
def test_the_packed_update_compiles_for_v5e(v5e):
    """The tiny GRPO preset's prepare and actor programs on packed rows (config.rl.pack_rows: the batch
    with its packed layout, the order with each micro-batch's), compiled by the TPU compiler for
    v5e:2x2 with splash attention over the packed rows' segment ids."""
    config = grpo_think.get_config("tiny")
    config.workdir = "/tmp/unused"
    config.rollout.max_total_tokens, config.train.length_multiple = 128, 128
    config.rollout.profiles_per_step, config.rollout.max_new_tokens, config.rollout.cache_slots = 4, 16, 0
    config.rl.pack_rows, config.rl.micro_batch_size = True, 4
    s = abstract_setup(RunSpec.from_config(config), target=v5e)
    rows_sh = NamedSharding(s.mesh, P(sharding.BATCH_AXES))
    replicated = NamedSharding(s.mesh, P())
    b, t = s.batch["tokens"].shape
    packed = {"pack_source": jax.ShapeDtypeStruct((b // 2, t), jnp.int32, sharding=rows_sh),
              "pack_positions": jax.ShapeDtypeStruct((b // 2, t // 4), jnp.int32, sharding=rows_sh)}
    prepare = s.update.prepare.lower(s.models, s.frozen, {**s.batch, **packed}).compile()
    assert "splash_mha" in prepare.as_text()
    minis, micro = s.rows.shape[0], s.rl.micro_batch_size
    order = update.PackedOrder(s.rows, *(jax.ShapeDtypeStruct((minis, s.rows.shape[1] // micro, 2, w), jnp.int32,
                                                              sharding=replicated) for w in (t, t // 4)))
    actor = s.update.actor.lower(s.state.step, *s.state.model("actor"), s.base, s.inputs, order).compile()
    assert {"splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"} <= set(re.findall(r"splash_mha_(?:fwd|dq|dkv)",
                                                                                   actor.as_text()))


def test_roofline_counts_loops_by_their_trip_counts(v5e):
    """A scan of 10 matmuls over 4 devices: each device's 10 x 2 x 256 x 1024 x 1024 FLOPs, where
    XLA's own cost_analysis() counts the loop body once; the estimate is the larger of the compute
    time at v5e's peak and the HBM time."""
    mesh = jax.make_mesh((4,), ("x",), devices=v5e.devices, axis_types=(jax.sharding.AxisType.Auto,))

    def layers(a, w):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), a, w)[0]

    a = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))
    w = jax.ShapeDtypeStruct((10, 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    cost = hlo_cost.program_cost(jax.jit(layers).lower(a, w).compile())
    flops = 10 * 2 * 256 * 1024 * 1024
    assert cost.flops == flops and cost.xla_flops == pytest.approx(flops / 10, rel=0.01) and not cost.unknown_loops
    # Each step reads its 2 MB layer, not the whole 20 MB stack.
    assert 10 * 2 * 2**20 < cost.bytes < 10 * 8 * 2**20
    assert cost.seconds(v5e.chip) == max(flops / 197e12, cost.bytes / 819e9)


@pytest.mark.slow
def test_launch_plan_names_a_bad_topology_in_one_line(tmp_path):
    """launch/plan.py --topology with a name libtpu does not know: exit 1, one line listing the valid
    forms, no traceback, before the config's programs are built. Without JAX_PLATFORMS (as a user
    runs it) that line is all of stderr: no libtpu warning about TPU_ACCELERATOR_TYPE or worker
    hostnames (off a TPU, program.skip_tpu_probe and topology.tpu_target)."""
    off_tpu = not program.tpu_may_be_attached()
    env = {**{k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" or not off_tpu}, "XLA_FLAGS": "",
           "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(REPO / "launch" / "plan.py"), "--config=configs/grpo_think.py:tiny",
                          "--topology=v5e:3x3", f"--config.workdir={tmp_path}"],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    lines = [x for x in out.stderr.splitlines() if "error:" in x]
    assert out.returncode == 1 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "--topology='v5e:3x3'" in lines[0] and "v5e:4x4" in lines[0] and "v5p:2x2x2" in lines[0]
    assert out.stderr.strip().splitlines() == lines or not off_tpu, out.stderr[-2000:]
