"""Attention implementations against a plain softmax attention written here: values and
gradients at odd lengths, left/right padding, packed rows (segment ids), grouped-query heads, fp32
and bf16; the choice of implementation; the memory growth of the blockwise backward; the whole
model with each path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlver_jax.models import attention, qwen2
from rlver_jax.models.config import Qwen2Config, get_preset


def reference(q, k, v, mask):
    """Causal-by-slot softmax attention over real slots, kv heads repeated: [B, T, N, H] (fp32).
    An integer mask is segment ids: a query sees only its own segment's slots (0 is padding)."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    t, n, h = q.shape[1:]
    g = n // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", q, k, precision="highest") / np.sqrt(h)
    seen = (mask[:, :, None] == mask[:, None, :]) & (mask[:, None, :] != 0)  # [B, query, key]
    ok = jnp.tril(jnp.ones((t, t), bool))[None, None] & seen[:, None]
    p = jax.nn.softmax(jnp.where(ok, s, -1e30), axis=-1)  # finite: an all-padding row gives no NaN
    return jnp.einsum("bnts,bsnh->btnh", p, v, precision="highest")


def padded_mask(t: int) -> np.ndarray:
    """Rows: no padding, left padding (3), right padding (6), all padding."""
    slots = np.arange(t)
    return np.stack([slots >= 0, slots >= 3, slots < t - 6, slots < 0])


def packed_segments(t: int) -> np.ndarray:
    """Rows of segments laid end to end (ids as rlver_jax.rl.packing gives them: row + 1): three
    segments and padding, one segment and padding, one token segments then a long one, all padding."""
    rows = np.zeros((4, t), np.int32)
    rows[0, :7], rows[0, 7:9], rows[0, 9:t - 5] = 3, 8, 1
    rows[1, :t - 9] = 5
    rows[2, 0], rows[2, 1], rows[2, 2:] = 2, 4, 6
    return rows


def make_inputs(t, n, k, h, dtype=jnp.float32, seed=0, segments=False):
    keys = jax.random.split(jax.random.key(seed), 4)
    mask = packed_segments(t) if segments else padded_mask(t)
    b = len(mask)
    q = jax.random.normal(keys[0], (b, t, n, h)).astype(dtype)
    kk = jax.random.normal(keys[1], (b, t, k, h)).astype(dtype)
    v = jax.random.normal(keys[2], (b, t, k, h)).astype(dtype)
    # Cotangent of the outputs: random at real query slots, zero at padding ones (as in the model).
    w = jax.random.normal(keys[3], (b, t, n, h)) * (mask != 0)[:, :, None, None]
    return q, kk, v, jnp.asarray(mask), w


def values_and_grads(fn, q, k, v, mask, w):
    @jax.jit
    def run(q, k, v, mask, w):
        def loss(q, k, v):
            out = fn(q, k, v, mask)
            return jnp.sum(out.astype(jnp.float32) * w), out
        return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)[::-1]
    return run(q, k, v, mask, w)


def max_errors(fn, q, k, v, mask, w):
    """Max |fn - reference| over real query slots, then over d/dq, d/dk, d/dv."""
    out, grads = values_and_grads(fn, q, k, v, mask, w)
    ref_out, ref_grads = values_and_grads(reference, q, k, v, mask, w)
    real = np.asarray(mask) != 0
    errs = [np.abs(np.asarray(out, np.float32) - np.asarray(ref_out))[real].max()]
    errs += [np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max() for a, b in zip(grads, ref_grads)]
    return errs


_PATHS = {
    "xla": lambda q, k, v, m: attention.attend(q, k, v, m, "xla"),
    # Block 8: T = 37 is 4 full blocks and a partial one, T = 48 six full blocks.
    "blockwise": lambda q, k, v, m: attention.blockwise_attention(q, k, v, m, block=8),
    "blockwise_one_block": lambda q, k, v, m: attention.blockwise_attention(q, k, v, m, block=64),
    # The cuDNN call's row rotation and length masks, through jax's XLA version of the same call.
    "cudnn_layout": lambda q, k, v, m: attention.cudnn_attention(q, k, v, m, implementation="xla"),
}


@pytest.mark.parametrize("path", sorted(_PATHS))
@pytest.mark.parametrize("t,n,k", [(37, 6, 2), (48, 4, 4)])
def test_fp32_values_and_grads_match_reference(path, t, n, k):
    errs = max_errors(_PATHS[path], *make_inputs(t, n, k, 8))
    assert max(errs) < 1e-5, errs


_PACKED_PATHS = {**_PATHS, "cudnn_layout": lambda q, k, v, m: attention.cudnn_attention(
    q, k, v, m, implementation="xla", max_segments=3)}


@pytest.mark.parametrize("path", ["xla", "blockwise", "cudnn_layout"])
def test_packed_rows_attend_within_their_segments(path):
    """Rows of several segments (packed_segments, T = 37): each query attends only its own
    segment's earlier slots, values and gradients as the reference's; cuDNN's packed call through
    the mask its runs (first slots and lengths) describe."""
    errs = max_errors(_PACKED_PATHS[path], *make_inputs(37, 6, 2, 8, segments=True))
    assert max(errs) < 1e-5, errs


def test_segment_runs_are_each_rows_first_slots_and_lengths():
    """What cuDNN's packed call takes: per row the first slot of each run of one id (-1 after the
    row's runs, M + 1 of them) and its length (-1 after, M of them), by hand."""
    first, lengths = attention.segment_runs(jnp.asarray(packed_segments(20)), 3)
    np.testing.assert_array_equal(first, [[0, 7, 9, -1], [0, -1, -1, -1], [0, 1, 2, -1], [-1, -1, -1, -1]])
    np.testing.assert_array_equal(lengths, [[7, 2, 6], [11, -1, -1], [1, 1, 18], [-1, -1, -1]])


@pytest.mark.slow
@pytest.mark.parametrize("path", ["blockwise", "cudnn_layout"])
def test_bf16_within_bf16_precision(path):
    """bf16 inputs: errors against the fp32 reference of the same (rounded) inputs are of the
    order of today's dense attention in bf16, and absolutely small."""
    inputs = make_inputs(37, 6, 2, 16, jnp.bfloat16)
    errs, dense_errs = max_errors(_PATHS[path], *inputs), max_errors(_PATHS["xla"], *inputs)
    assert max(errs) < 0.05, errs
    assert all(e <= 2 * d + 4e-3 for e, d in zip(errs, dense_errs)), (errs, dense_errs)


def test_cudnn_call_in_a_mesh_context_matches_reference_in_its_shard_map():
    """The cuDNN call's layout (through jax's XLA version of it) inside a mesh context, where it
    runs in a shard_map as splash does: 8 rows over data x fsdp, 4 query and 2 kv heads over
    tensor; values and gradients are the reference's."""
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh):
        errs = max_errors(_PATHS["cudnn_layout"], *make_inputs(37, 4, 2, 8))
    assert max(errs) < 1e-5, errs


@pytest.mark.slow
def test_splash_kernel_matches_reference_in_interpret_mode():
    """The Pallas kernel (interpreted on CPU) with its segment ids, padding to the 128 tile and,
    inside a mesh context, its shard_map over batch and heads."""
    inputs = make_inputs(150, 4, 2, 8)
    fn = lambda q, k, v, m: attention.splash_attention(q, k, v, m, interpret=True)  # noqa: E731
    assert max(max_errors(fn, *inputs)) < 1e-5
    assert max(max_errors(fn, *make_inputs(150, 4, 2, 8, segments=True))) < 1e-5  # packed rows
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh):
        errs = max_errors(fn, *inputs)
    assert max(errs) < 1e-5, errs


@pytest.mark.slow
def test_choice_of_implementation():
    f32, bf16 = jnp.float32, jnp.bfloat16
    assert attention.resolve("auto", 100, bf16, "tpu") == "splash"
    assert attention.resolve("auto", 100, bf16, "gpu") == "cudnn"
    assert attention.resolve("auto", 100, f32, "gpu") == "xla"  # cuDNN has no fp32 flash kernel
    assert attention.resolve("auto", attention.AUTO_BLOCKWISE_MIN_T - 1, f32, "cpu") == "xla"
    assert attention.resolve("auto", attention.AUTO_BLOCKWISE_MIN_T, f32, "cpu") == "blockwise"
    assert attention.resolve("blockwise", 10, f32, "tpu") == "blockwise"
    for impl, platform in [("cudnn", "cpu"), ("cudnn", "tpu"), ("splash", "cpu"), ("splash", "gpu")]:
        with pytest.raises(ValueError, match=f"config.model.attention='{impl}' runs on"):
            attention.resolve(impl, 10, bf16, platform)
    q, k, v, mask, _ = make_inputs(5, 2, 1, 8)
    with pytest.raises(ValueError, match="config.model.attention='cudnn'"):
        attention.attend(q, k, v, mask, "cudnn")  # the tests run on CPU
    with pytest.raises(ValueError, match="config.model.attention"):
        get_preset("tiny", attention="flash")


def _grad_temp_bytes(impl: str, t: int) -> int:
    """Temporaries of the compiled forward + backward of one attention call (1 row, 4 heads)."""
    q = jax.ShapeDtypeStruct((1, t, 4, 64), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, t, 2, 64), jnp.float32)
    mask = jax.ShapeDtypeStruct((1, t), bool)
    loss = lambda q, k, v, m: jnp.sum(attention.attend(q, k, v, m, impl))  # noqa: E731
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv, mask).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_blockwise_memory_grows_linearly_and_dense_quadratically():
    """4x the tokens: xla's temporaries grow ~16x (T^2 scores), blockwise's at most 4x."""
    xla = _grad_temp_bytes("xla", 4096) / _grad_temp_bytes("xla", 1024)
    blockwise = _grad_temp_bytes("blockwise", 4096) / _grad_temp_bytes("blockwise", 1024)
    assert xla > 12 and blockwise < 4.5, (xla, blockwise)


@pytest.mark.slow
def test_model_logits_and_gradients_equal_across_paths():
    """The tiny model (scanned, remat) at T = 1100 (three 512-token blocks, the last partial) on
    left- and right-padded rows: log-probs at real tokens and the gradient of a masked loss,
    blockwise against xla (fp32)."""
    base: Qwen2Config = get_preset("tiny", scan_layers=True, remat="full")
    params = qwen2.init_params(base, jax.random.key(0))
    t = 1100
    mask = jnp.asarray(padded_mask(t)[1:3])
    ids = jax.random.randint(jax.random.key(1), mask.shape, 0, base.vocab_size)

    def loss(p, cfg):
        logp = jax.nn.log_softmax(qwen2.forward(cfg, p, ids, mask))
        return jnp.sum(logp[..., 0] * mask) / mask.sum(), logp

    run = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (l0, logp0), g0 = run(params, base.replace(attention="xla"))
    (l1, logp1), g1 = run(params, base.replace(attention="blockwise"))
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(logp1)[real], np.asarray(logp0)[real], atol=1e-5)
    np.testing.assert_allclose(l1, l0, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g1, g0)


@pytest.mark.slow
@pytest.mark.parametrize("index,t,s", [(0, 37, 45), (5, 20, 33), (0, 16, 16)])
def test_cached_attention_in_blocks_matches_the_slot_reference(index, t, s):
    """Queries at cache slots [index, index + t) over s slots with holes in the mask (earlier
    turns' padding): the blocked prefill (block 8: full, partial and skipped key blocks) equals a
    plain softmax over the allowed slots, and the dense path below the block size too."""
    keys = jax.random.split(jax.random.key(3), 3)
    b, n, kh, h = 3, 6, 2, 8
    q = jax.random.normal(keys[0], (b, t, n, h))
    k, v = (jax.random.normal(x, (b, s, kh, h)) for x in keys[1:])
    mask = np.zeros((b, s), bool)
    mask[0, :index + t] = True  # every slot written
    mask[1, 3:index + t] = True  # left padding
    mask[2, :index + t] = np.arange(index + t) % 3 != 1  # holes
    q_slot, k_slot = index + np.arange(t), np.arange(s)
    ok = (k_slot[None, None, :] <= q_slot[None, :, None]) & mask[:, None, :]
    kr, vr = np.repeat(np.asarray(k), n // kh, axis=2), np.repeat(np.asarray(v), n // kh, axis=2)
    sc = np.einsum("btnh,bsnh->bnts", np.asarray(q, np.float64), kr) / np.sqrt(h)
    sc = np.where(ok[:, None], sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = np.einsum("bnts,bsnh->btnh", p / p.sum(-1, keepdims=True), vr)
    real = mask[:, index:index + t]  # the queries of real tokens
    for block in (8, 64):  # blocked; one block of more than t queries: dense
        out = attention.cached_attention(q, k, v, jnp.int32(index), jnp.asarray(mask), jnp.float32, block=block)
        np.testing.assert_allclose(np.asarray(out)[real], ref[real], atol=1e-5, rtol=0)
