"""Programs compiled for GPUs on this CPU host: the CUDA compiler of jax's CUDA plugin for a card's
target description (rlver_jax/parallel/gpu_topology.py), no GPU and no driver, its own memory
figures and the roofline's cost model of its programs (rlver_jax/train/planner/hlo_cost.py).

The plugin lives in a venv of its own (`pip install -e '.[gpu-plan]'`), never the project's: here
the tests that need it skip with the one line that says what to install, and launch/plan.py --gpu
says that line (exit 2). In the GPU-planning venv:
  PYTHONPATH=$PWD ../gpu-venv/bin/python -m pytest -q -n 0 tests/gpu_plan_test.py
"""

import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import grpo_think
from rlver_jax.checks import InputError
from rlver_jax.models import attention
from rlver_jax.parallel import gpu_topology, sharding
from rlver_jax.train.planner import hlo_cost, plan, report
from rlver_jax.train.planner.lengths import Lengths
from rlver_jax.train.spec import RunSpec

REPO = pathlib.Path(__file__).resolve().parents[1]
needs_plugin = pytest.mark.skipif(not gpu_topology.plugin_available(), reason=gpu_topology.INSTALL)
# XLA's own descriptions of the cards (gpu_targets/, from openxla/xla's specs): bytes of memory.
H100_BYTES = 84942979072


@pytest.mark.parametrize("name", ["h100:0", "h100:9", "b200:8", "h100:8x0", "h100:x2", "h100:8x2x2", "gpu"])
def test_a_bad_gpu_name_is_one_line_naming_the_valid_forms(name):
    with pytest.raises(InputError) as e:
        gpu_topology.gpu_target(name)
    assert "\n" not in str(e.value) and "h100:8" in str(e.value) and "h100:8x2" in str(e.value)


def test_a_peak_above_jaxs_default_share_of_the_card_names_the_fraction_to_set():
    """A JAX process holds 75% of an H100's 84.94e9 bytes by default (63.7 GB): a 55 GB peak needs
    nothing, a 70 GB one XLA_PYTHON_CLIENT_MEM_FRACTION of 70 / 84.94 = 0.82, 0.84 with the margin."""
    h100 = gpu_topology.GpuTarget("h100:1", 1, (), card="h100", memory_bytes=H100_BYTES)
    assert h100.runtime_notes(55e9) == []
    [note] = h100.runtime_notes(70e9)
    assert "(63.7 GB)" in note and "XLA_PYTHON_CLIENT_MEM_FRACTION=0.84 " in note


@pytest.mark.slow
@pytest.mark.skipif(gpu_topology.plugin_available(), reason="jax's CUDA plugin is installed here")
def test_launch_plan_says_what_to_install_without_the_cuda_plugin(tmp_path):
    """In a venv without the plugin (the project's): exit 2 and one line, the install line."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(REPO / "launch" / "plan.py"), "--config=configs/grpo_think.py:tiny",
                          "--gpu=h100:8", f"--config.workdir={tmp_path}"],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    lines = [x for x in out.stderr.splitlines() if "error:" in x]
    assert out.returncode == 2 and lines == [f"plan.py: error: {gpu_topology.INSTALL}"], out.stderr[-2000:]
    assert "pip install -e '.[gpu-plan]'" in lines[0]


@needs_plugin
def test_a_target_is_its_cards_compile_only_devices():
    """h100:8 is one node of 8 H100s (XLA's description: 84,942,979,072 bytes), h100:8x2 two
    nodes of 8 whose programs of one node compile for one; attention `auto` is cuDNN's under a
    mesh of them, the host's outside."""
    node = gpu_topology.gpu_target("h100:8")
    assert len(node.devices) == 8 and node.device_kind == "NVIDIA H100 80GB HBM3" and node.chip.name == "h100"
    assert (node.hosts, node.devices_per_host, node.chip.hbm_gb, node.memory_bytes) == (1, 8, 80.0, H100_BYTES)
    assert (node.chip.bf16_tflops, node.chip.hbm_gb_s) == (989.0, 3350.0)
    two = gpu_topology.gpu_target("h100:8x2")
    assert (len(two.devices), two.hosts, two.devices_per_host) == (16, 2, 8)
    assert len(two.host_target().devices) == 8 and two.host_target().hosts == 1
    assert gpu_topology.gpu_target("h200:1").device_kind == "NVIDIA H200 141GB HBM3e"
    assert gpu_topology.gpu_target("a100:8").chip.name == "a100"
    assert re.fullmatch(
        r"the CUDA compiler \(jax-cuda12-plugin [\d.]+, target gpu_targets/h100_sxm.txtpb\)", node.compiler)
    mesh = sharding.make_mesh((1, -1, 2), node.devices)
    assert sharding.mesh_platform(mesh) == "gpu" and dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    with sharding.split_activations(mesh):
        assert attention.target_platform() == "gpu"
        assert attention.resolve("auto", 2048, jnp.bfloat16) == "cudnn"
    assert attention.target_platform() == "cpu"
    # Two nodes compile as one program: each device's shard of a [16 x 1024, 1024] f32 array.
    sh = NamedSharding(sharding.make_mesh((2, -1, 1), two.devices), P(sharding.BATCH_AXES))
    x = jax.ShapeDtypeStruct((16 * 1024, 1024), jnp.float32, sharding=sh)
    mem = jax.jit(lambda a: a * 2).lower(x).compile().memory_analysis()
    assert mem.argument_size_in_bytes == mem.output_size_in_bytes == 1024 * 1024 * 4


@needs_plugin
def test_cudnn_attention_compiles_with_its_matmuls_counted():
    """Forward and backward of `attend("auto")` on an H100 mesh (1, 2, 2), rows over fsdp and heads
    over tensor as the model splits them: cuDNN's fused-attention custom calls on each device's
    query shard [rows / 2, T, heads / 2, head_dim], and their matmuls by formula: causal half of
    T x T, forward 2 and backward 5 per head."""
    mesh = sharding.make_mesh((1, 2, 2), gpu_topology.gpu_target("h100:4").devices)
    b, t, n, k, h = 2, 1024, 4, 2, 128
    rows = NamedSharding(mesh, P(sharding.BATCH_AXES))
    heads = NamedSharding(mesh, P(sharding.BATCH_AXES, None, "tensor"))

    def loss(q, kk, v, mask):
        return jnp.sum(attention.attend(q, kk, v, mask, "auto").astype(jnp.float32) ** 2)

    grad = sharding.jit_sharded(jax.grad(loss, argnums=(0, 1, 2)), (heads,) * 3 + (rows,), (heads,) * 3)
    q = jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16, sharding=heads)
    kv = jax.ShapeDtypeStruct((b, t, k, h), jnp.bfloat16, sharding=heads)
    mask = jax.ShapeDtypeStruct((b, t), jnp.bool_, sharding=rows)
    compiled = grad.lower(q, kv, kv, mask).compile()
    comps, _ = hlo_cost._computations(compiled.as_text())
    calls = [i for ins in comps.values() for i in ins if i.op == "custom-call" and "__cudnn$fmha" in i.rest]
    targets = {re.search(r'custom_call_target="([^"]+)"', i.rest).group(1) for i in calls}
    assert targets == {"__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"}
    assert {hlo_cost.kernel_q_shape(i) for i in calls} == {(b // 2, t, n // 2, h)}
    cost = hlo_cost.program_cost(compiled)
    assert cost.kernel_flops == 2 * (b // 2) * (n // 2) * t * (t / 2) * h * (2 + 5)


class _Compiled:
    """A compiled program's HLO text, as program_cost reads it."""

    def __init__(self, text: str):
        self.text = text

    def as_text(self) -> str:
        return self.text

    def cost_analysis(self) -> None:
        return None


# The CUDA compiler's decode step, cut down: 10 steps each write one 1,024-wide row into a stacked
# bf16 KV cache [10, 4096, 1024] (80 MB) through a bitcast to u16, in place, then read one layer's
# 8 MB slice of it (dynamic-update-slice, then dynamic-slice, as its fusions do).
_DECODE_HLO = """HloModule decode

%fused_write (param_0: bf16[10,4096,1024], param_1: bf16[1,1,1024], param_2: s32[]) -> u16[10,4096,1024] {
  %param_0 = bf16[10,4096,1024]{2,1,0} parameter(0)
  %bitcast.1 = u16[10,4096,1024]{2,1,0} bitcast(%param_0)
  %param_1 = bf16[1,1,1024]{2,1,0} parameter(1)
  %bitcast.2 = u16[1,1,1024]{2,1,0} bitcast(%param_1)
  %param_2 = s32[] parameter(2)
  %constant.0 = s32[] constant(0)
  ROOT %dus = u16[10,4096,1024]{2,1,0} dynamic-update-slice(%bitcast.1, %bitcast.2, %param_2, %constant.0, %constant.0)
}

%fused_read (param_0: u16[10,4096,1024], param_1: bf16[1,1,1024], param_2: s32[]) -> bf16[1,4096,1024] {
  %param_0 = u16[10,4096,1024]{2,1,0} parameter(0)
  %bitcast.3 = u16[10,4096,1024]{2,1,0} bitcast(%param_0)
  %param_1 = bf16[1,1,1024]{2,1,0} parameter(1)
  %bitcast.4 = u16[1,1,1024]{2,1,0} bitcast(%param_1)
  %param_2 = s32[] parameter(2)
  %constant.1 = s32[] constant(0)
  %dus.1 = u16[10,4096,1024]{2,1,0} dynamic-update-slice(%bitcast.3, %bitcast.4, %param_2, %constant.1, %constant.1)
  %ds = u16[1,4096,1024]{2,1,0} dynamic-slice(%dus.1, %param_2, %constant.1, %constant.1), \
dynamic_slice_sizes={1,4096,1024}
  ROOT %bitcast.5 = bf16[1,4096,1024]{2,1,0} bitcast(%ds)
}

%body (p: (s32[], bf16[10,4096,1024], bf16[1,1,1024])) -> (s32[], bf16[10,4096,1024], bf16[1,1,1024]) {
  %p = (s32[], bf16[10,4096,1024]{2,1,0}, bf16[1,1,1024]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %cache = bf16[10,4096,1024]{2,1,0} get-tuple-element(%p), index=1
  %row = bf16[1,1,1024]{2,1,0} get-tuple-element(%p), index=2
  %write = u16[10,4096,1024]{2,1,0} fusion(%cache, %row, %i), kind=kLoop, calls=%fused_write
  %read = bf16[1,4096,1024]{2,1,0} fusion(%write, %row, %i), kind=kLoop, calls=%fused_read
  ROOT %t = (s32[], bf16[10,4096,1024]{2,1,0}, bf16[1,1,1024]{2,1,0}) tuple(%i, %write, %row)
}

%cond (p.1: (s32[], bf16[10,4096,1024], bf16[1,1,1024])) -> pred[] {
  %p.1 = (s32[], bf16[10,4096,1024]{2,1,0}, bf16[1,1,1024]{2,1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(10)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (a: (s32[], bf16[10,4096,1024], bf16[1,1,1024])) -> (s32[], bf16[10,4096,1024], bf16[1,1,1024]) {
  %a = (s32[], bf16[10,4096,1024]{2,1,0}, bf16[1,1,1024]{2,1,0}) parameter(0)
  ROOT %w = (s32[], bf16[10,4096,1024]{2,1,0}, bf16[1,1,1024]{2,1,0}) while(%a), condition=%cond, body=%body
}
"""


def test_roofline_reads_a_decode_steps_cache_row_and_layer_not_the_stack():
    """Each of the 10 steps: the write fusion writes its 2 KB row in place and reads the row and
    the index; the read fusion reads its layer's 8 MB slice and writes it; the loop's condition
    compares the counter 11 times. Not 80 MB of cache a step (the value the CUDA compiler bitcasts
    is the cache: its uses are the cache's)."""
    row, layer, index = 1024 * 2, 4096 * 1024 * 2, 4
    write = row + (row + index)  # writes the row; reads the row and the index
    read = layer + (layer + row + index)  # writes the slice; reads the slice, the row and the index
    condition = 1 + 2 * index  # a pred from two s32
    cost = hlo_cost.program_cost(_Compiled(_DECODE_HLO))
    assert cost.bytes == 10 * (write + read) + 11 * condition and not cost.unknown_loops


_HEAD_HLO = """HloModule m

%fused_lookup (t: bf16[1000,64], ids: s32[8]) -> bf16[8,64] {
  %t = bf16[1000,64]{1,0} parameter(0)
  %ids = s32[8]{0} parameter(1)
  ROOT %g = bf16[8,64]{1,0} gather(%t, %ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, \
index_vector_dim=1, slice_sizes={1,64}
}

%fused_view (v: bf16[64,1000]) -> bf16[64,1000] {
  %v = bf16[64,1000]{1,0} parameter(0)
  ROOT %b = bf16[64,1000]{1,0} bitcast(%v)
}

%fused_head (w: bf16[64,1000], h: bf16[8,64]) -> f32[8,1000] {
  %w = bf16[64,1000]{1,0} parameter(0)
  %view = bf16[64,1000]{1,0} fusion(%w), kind=kLoop, calls=%fused_view
  %h = bf16[8,64]{1,0} parameter(1)
  ROOT %d = f32[8,1000]{1,0} dot(%h, %view), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (table: bf16[1000,64], ids: s32[8], head: bf16[64,1000]) -> f32[8,1000] {
  %table = bf16[1000,64]{1,0} parameter(0)
  %ids = s32[8]{0} parameter(1)
  %head = bf16[64,1000]{1,0} parameter(2)
  %rows = bf16[8,64]{1,0} fusion(%table, %ids), kind=kLoop, calls=%fused_lookup
  ROOT %logits = f32[8,1000]{1,0} fusion(%head, %rows), kind=kOutput, calls=%fused_head
}
"""


def test_roofline_reads_the_embedding_rows_a_step_takes_and_the_whole_lm_head():
    """A decode step's embedding lookup gathers 8 rows of the table (1 KB), not the table (128 KB);
    the LM head is read whole even when the compiler reaches it through a nested fusion whose root
    is a bitcast (the view's readers are outside that fusion)."""
    rows, ids, table = 8 * 64 * 2, 8 * 4, 1000 * 64 * 2
    lookup = rows + (rows + ids)  # writes the rows; reads them and the ids
    head = 8 * 1000 * 4 + (table + rows)  # writes the logits; reads the head and the rows
    cost = hlo_cost.program_cost(_Compiled(_HEAD_HLO))
    assert cost.bytes == lookup + head
    assert cost.flops == 2 * 8 * 1000 * 64


_SCORES_HLO = """HloModule m

ENTRY %main (q: bf16[4,7,128], k: bf16[4,64,128], x: bf16[16,64,1], w: bf16[64,4,32]) -> (f32[4,7,64], f32[16,4,32]) {
  %q = bf16[4,7,128]{2,1,0} parameter(0)
  %k = bf16[4,64,128]{2,1,0} parameter(1)
  %s = f32[4,7,64]{2,1,0} convolution(%q, %k), window={size=4 stride=3 lhs_dilate=4}, dim_labels=0bf_0oi->0bf
  %x = bf16[16,64,1]{2,1,0} parameter(2)
  %w = bf16[64,4,32]{2,1,0} parameter(3)
  %p = f32[16,4,32]{2,1,0} convolution(%x, %w), window={size=4 pad=3_3 rhs_reversal=1}, dim_labels=bf0_i0o->b0f
  ROOT %t = (f32[4,7,64]{2,1,0}, f32[16,4,32]{2,1,0}) tuple(%s, %p)
}
"""


def test_roofline_counts_the_products_of_convolutions_that_are_matmuls():
    """The TPU compiler writes some matmuls as convolutions whose window mostly misses the input:
    a decode step's attention scores (per row: [7, 128] @ [128, 64]) over the rows dilated by the
    window's size (one tap in 4 meets a row), and a projection onto 4 heads of 32 ([16, 64] @
    [64, 4 x 32]) as an input of 1 padded by 3 each side under a window of 4 (one tap meets it).
    Each output element is one row's dot product: 2 x 4 x 7 x 64 x 128 and 2 x 16 x 4 x 32 x 64
    FLOPs, not 4 times those."""
    cost = hlo_cost.program_cost(_Compiled(_SCORES_HLO))
    assert cost.flops == 2 * 4 * 7 * 64 * 128 + 2 * 16 * 4 * 32 * 64


def test_roofline_counts_a_conditional_by_its_most_expensive_branch():
    """The update's mini-batch loop skips a mini-batch of padding rows in a conditional (lax.cond):
    the roofline, of the worst case, counts the branch that runs the 10 matmuls, not half of it
    (XLA:CPU's program; the rule is the compiler's, any target)."""

    def step(real, a, w):
        heavy = lambda a: jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), a, w)[0]
        return jax.lax.cond(real, heavy, lambda a: a, a)

    a = jax.ShapeDtypeStruct((256, 1024), jnp.float32)
    w = jax.ShapeDtypeStruct((10, 1024, 1024), jnp.float32)
    cost = hlo_cost.program_cost(jax.jit(step).lower(jax.ShapeDtypeStruct((), jnp.bool_), a, w).compile())
    assert cost.flops == 10 * 2 * 256 * 1024 * 1024


@needs_plugin
def test_roofline_counts_the_cuda_compilers_loops_and_slices():
    """A scan of 10 matmuls over 4 H100s: each device's 10 x 2 x 256 x 1024 x 1024 FLOPs (the CUDA
    compiler's matmuls are Triton fusions), each step reading its 2 MB layer of the stack, not the
    20 MB."""
    h100 = gpu_topology.gpu_target("h100:4")
    mesh = jax.make_mesh((4,), ("x",), devices=h100.devices, axis_types=(jax.sharding.AxisType.Auto,))

    def layers(a, w):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), a, w)[0]

    a = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))
    w = jax.ShapeDtypeStruct((10, 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    cost = hlo_cost.program_cost(jax.jit(layers).lower(a, w).compile())
    flops = 10 * 2 * 256 * 1024 * 1024
    assert cost.flops == flops and not cost.unknown_loops
    # Per step: its layer copied out of the stack (2 MB read, 2 written), the split-K matmul's fp32
    # partial sums, the activations; never the 20 MB stack.
    assert 10 * 2 * 2**20 < cost.bytes < 10 * 20 * 2**20
    assert cost.seconds(h100.chip) == max(flops / 989e12, cost.bytes / 3350e9)


@needs_plugin
@pytest.mark.slow
@pytest.mark.parametrize("gpus", [1, 8])
def test_tiny_presets_programs_compile_for_h100(gpus):
    """The planner on the tiny GRPO preset in bf16 for h100:1 and h100:8: the update's programs and
    the sampler's, compiled by the CUDA compiler with cuDNN attention, each positive and below the
    card's memory; the plan names the card, the compiler and estimates a roofline."""
    config = grpo_think.get_config("tiny")
    config.workdir = "/tmp/unused"
    config.model.dtype = "bfloat16"  # cuDNN's attention takes bf16 (the tiny preset computes in fp32)
    config.rollout.max_total_tokens, config.train.length_multiple = 128, 128
    config.rollout.profiles_per_step, config.rollout.max_new_tokens, config.rollout.cache_slots = 4, 16, 0
    # Lengths that fit 128 tokens (the default first prompt, 512, would leave no turn to estimate).
    result = plan.plan(RunSpec.from_config(config), None, ("prepare", "actor update", "rollout"),
                       Lengths(prompt=32, feed=8), search=False,
                       target=gpu_topology.gpu_target(f"h100:{gpus}"))
    assert result.memory_gb == 80.0  # the card's
    # The rollout engine (the default): its decode chunk and its prefill chunk.
    assert [p.name for p in result.phases] == ["prepare", "actor update", "rollout", "rollout prefill"]
    for p in result.phases:  # the update's programs need temporaries; a tiny prefill chunk may not
        assert 0 < p.total < 80e9 and (p.temporaries > 0 or p.name.startswith("rollout")), p
        assert p.cost is not None and p.cost.flops > 0 and p.cost.bytes > 0
    assert result.phases[1].cost.kernel_flops > 0  # cuDNN's attention, by formula
    text = report.format_plan(result, "tiny")
    assert "attention=auto (cudnn on NVIDIA H100 80GB HBM3)" in text and f"= {gpus} gpu devices" in text
    assert f"target     h100:{gpus}: {gpus} x NVIDIA H100 80GB HBM3 (h100), 1 node of {gpus}" in text
    assert "compiled by the CUDA compiler (jax-cuda12-plugin" in text
    assert "estimate   an ESTIMATE" in text and "989 TFLOP/s" in text
    assert "step       every reply at max_new_tokens" in text
    est = result.estimate
    assert est is not None and est.step > 0 and 0 < est.mfu <= 1


@needs_plugin
@pytest.mark.slow
@pytest.mark.parametrize("config", ["ppo_think", "grpo_think"])
def test_the_7b_lora_preset_fits_one_h100_as_shipped(config):
    """configs/*:7b_lora promises one 80 GB GPU: every phase of its shipped plan (prepare, the
    updates at its turn rows, the rollout engine's 8 KV rows) fits an H100, within the 75% of the
    card a JAX process takes by default (no environment to set)."""
    module = __import__(f"configs.{config}", fromlist=["get_config"])
    cfg = module.get_config("7b_lora")
    cfg.workdir = "/tmp/unused"
    target = gpu_topology.gpu_target("h100:1")
    result = plan.plan(RunSpec.from_config(cfg), None, ("prepare", "actor update", "critic update", "rollout"),
                       search=False, target=target, estimate=False)
    assert result.fits, report.format_plan(result)
    assert not target.runtime_notes(result.peak.total), report.format_plan(result)
