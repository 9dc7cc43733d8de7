"""The ragged cached-attention kernel (rlver_jax/models/ragged_attention.py): its numbers in Pallas
interpret mode on CPU against a numpy transcription of masked softmax attention; the rollout
engine's programs with it against their dense form (and the rows' masks it relies on: each a prefix
of its slots); its compiled form for a v5e inside the engine's decode program (skipped without
libtpu), and the cost model's figure of it."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.models import qwen2, ragged_attention
from rlver_jax.models.config import Qwen2Config, get_preset
from rlver_jax.parallel import sharding, topology
from rlver_jax.sampling import kv_rows
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.train.planner import hlo_cost


def _bf16(x):
    return np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32), np.float64)


def _numpy_attention(q, keys, values, starts, ends):
    """q [B, T, N, H], keys/values [B, S, K, H]: query t of row b attends the slots s < ends[b] with
    s <= starts[b] + t, softmax in float64."""
    b, t, n, h = q.shape
    s, k = keys.shape[1:3]
    out = np.zeros(q.shape)
    for r in range(b):
        for i in range(t):
            allowed = (np.arange(s) < ends[r]) & (np.arange(s) <= starts[r] + i)
            for head in range(n):
                kv = head // (n // k)
                scores = np.where(allowed, keys[r, :, kv] @ q[r, i, head] / np.sqrt(h), -np.inf)
                p = np.exp(scores - scores.max())
                out[r, i, head] = (p / p.sum()) @ values[r, :, kv]
    return out


@pytest.mark.parametrize("t, s", [(1, 2100), (3, 2100), (260, 600)])
def test_kernel_matches_masked_softmax_attention(t, s):
    """bf16 stacks held as uint16 bits, a permutation of the cache's rows, layer 1 of 2, 3 query
    heads per kv head; rows of 1 key, of every slot (S), and in between; T=260 spans two query
    blocks; both S span two key blocks, the last running past S."""
    rng = np.random.default_rng(t)
    layers, r, k, g, h = 2, 4, 2, 3, 32
    keys, values = (rng.standard_normal((layers, r, s, k, h)) for _ in "kv")
    stack = [jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.bfloat16), jnp.uint16) for x in (keys, values)]
    q = jnp.asarray(rng.standard_normal((r, t, k * g, h)), jnp.bfloat16)
    rows = np.array([2, 0, 3, 1])
    ends = np.array([1, s, 300, s - 60])  # row 0: one key; row 1: every slot
    starts = np.maximum(ends - t, 0)  # the last query at the row's last key, T=1 as a decode step does
    starts[2] -= 5  # queries past the fill (a prefill chunk's padding) attend only the fill
    out = ragged_attention.ragged_attention(q, *stack, jnp.int32(1), jnp.asarray(rows), jnp.asarray(starts),
                                            jnp.asarray(ends), interpret=True)
    assert out.shape == q.shape and out.dtype == jnp.bfloat16
    want = _numpy_attention(_bf16(q), _bf16(keys)[1][rows], _bf16(values)[1][rows], starts, ends)
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), want, atol=2e-2, rtol=2e-2)


def _engine_run(cfg, params):
    """Three rows of one cache at different fills: a prefill chunk into rows 0 and 2 (row 1
    waits), then a gathered prefill into row 1, then decode steps over every row."""
    settings = SamplingSettings(max_new_tokens=6, stop_ids=(), pad_id=0)
    cache = qwen2.init_cache(cfg, 4, 32)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, cfg.vocab_size, (4, 8)), jnp.int32)
    keys = jax.random.key_data(jax.random.split(jax.random.key(3), 4))
    cache, first = kv_rows.prefill(cfg, settings, params, cache, rows=None, starts=[0, 0, 0, 0], ids=ids,
                                  counts=[8, 0, 5, 1], keys=keys)
    cache, second = kv_rows.prefill(cfg, settings, params, cache, rows=[1, 9], starts=[0, 0], ids=ids[:2],
                                   counts=[7, 0], keys=keys[:2])
    cache, chunk, steps = kv_rows.decode(cfg, settings, params, cache, rows=None, last=[5, 6, 7, 8],
                                        lengths=[8, 7, 5, 1], columns=[1, 1, 1, 1], limits=[6, 6, 6, 0],
                                        keys=keys, steps=6)
    # A row fed no real token (row 1 at first, the padding row 9) draws from no key: unspecified.
    return cache, (first.model_logprobs[np.array([0, 2, 3])], second.model_logprobs[:1], chunk.model_logprobs,
                   chunk.tokens)


@pytest.mark.slow  # six engine programs, three of them with the kernel in interpret mode: 15-45 s
def test_engine_programs_with_the_kernel_match_their_dense_form(monkeypatch):
    """The engine's prefill (every row, and gathered rows) and decode with the kernel (interpret
    mode) give the dense form's tokens and log-probs; every row's mask is a prefix of its slots,
    so its fill is the one number the kernel masks by."""
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(0))
    dense_cache, dense = _engine_run(cfg, params)
    mask = np.asarray(dense_cache.mask)
    fill = mask.sum(axis=1)
    np.testing.assert_array_equal(mask, np.arange(mask.shape[1])[None] < fill[:, None])
    assert fill.tolist() == [13, 12, 10, 1]  # five columns (1..5) decoded by each live row
    monkeypatch.setattr(qwen2, "_ragged_kernel", lambda config, b: True)
    monkeypatch.setattr(ragged_attention, "partitioned",
                        functools.partial(ragged_attention.partitioned, interpret=True))
    jax.clear_caches()
    try:
        kernel_cache, kernel = _engine_run(cfg, params)
    finally:
        jax.clear_caches()  # the engine's jitted programs traced with the kernel
    for got, want in zip(kernel[:3], dense[:3]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4)
    np.testing.assert_array_equal(np.asarray(kernel[3]), np.asarray(dense[3]))
    held = mask[None, :, :, None, None]  # slots past a row's fill hold padding tokens' keys: unspecified
    np.testing.assert_allclose(np.where(held, kernel_cache.k, 0), np.where(held, dense_cache.k, 0), atol=1e-5)


def test_the_kernel_runs_on_tpu_targets_only():
    """On this CPU the rows' attention stays dense (the CPU runs' numbers do not move)."""
    assert not qwen2._ragged_kernel(get_preset("tiny"), 4)
    # One kv head per device: the 7B plan's 4 over 'tensor' of 4 (rows unsplit); not 2 over 1.
    assert ragged_attention.reads_in_place({"data": 1, "fsdp": 1, "tensor": 4}, 8, 28, 4)
    assert not ragged_attention.reads_in_place({"data": 1, "fsdp": 2, "tensor": 1}, 8, 4, 2)
    assert ragged_attention.key_block(20096, 7) == 2048 and ragged_attention.key_block(20096, 256 * 7) == 512
    assert ragged_attention.key_block(40, 7) == 40


@pytest.mark.skipif(not topology.libtpu_available(), reason="libtpu is not installed: no TPU compiler here")
def test_the_decode_program_compiles_for_v5e_with_the_kernel_and_no_scores():
    """The engine's decode chunk on a v5e:2x2 (rows over fsdp, 2 kv heads over tensor: one per
    device): the kernel's custom call reads the cache stacks where they lie (no copy of them, no
    fp32 array of S slots: no scores), and the cost model counts one layer of each stack per call,
    every row whole, then scales it to a fill."""
    v5e = topology.tpu_target("v5e:2x2")
    mesh = sharding.make_mesh((1, 2, 2), v5e.devices)
    cfg = Qwen2Config(vocab_size=256, hidden_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=1024, tie_word_embeddings=True, head_size=128, dtype="bfloat16",
                      param_dtype="bfloat16", scan_layers=True)
    r, s, steps = 8, 2048, 8
    rep = NamedSharding(mesh, P())
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
        mesh, P(*[None] * (x.ndim - 1), "tensor") if x.shape[-1] % 2 == 0 else P())), qwen2.abstract_params(cfg))
    shape = jax.eval_shape(lambda: qwen2.init_cache(cfg, r, s))
    split = NamedSharding(mesh, P(None, sharding.BATCH_AXES, None, "tensor"))
    cache = qwen2.KVCache(*(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=split) for x in (shape.k, shape.v)),
                          jax.ShapeDtypeStruct((r, s), jnp.bool_, sharding=NamedSharding(mesh, P(sharding.BATCH_AXES))),
                          jax.ShapeDtypeStruct((), jnp.int32, sharding=rep))
    per_row = jax.ShapeDtypeStruct((r,), jnp.int32, sharding=rep)
    keys = jax.ShapeDtypeStruct((r, 2), jnp.uint32, sharding=rep)
    settings = SamplingSettings(max_new_tokens=64, stop_ids=(0, 1), pad_id=0)
    compiled = kv_rows._decode_jit.lower(cfg, settings, mesh, steps, params, cache, None, per_row, per_row, per_row,
                                        per_row, keys).compile()
    text = compiled.as_text()
    comps, _ = hlo_cost._computations(text)
    ops = [i for ins in comps.values() for i in ins]
    assert [i.op for i in ops if i.name.startswith(ragged_attention.NAME)] == ["custom-call"]
    assert not re.search(rf"f32\[[\d,]*{s}\]", text)  # no scores (nor anything else fp32) over the slots
    assert not [i for i in ops if i.op in ("copy", "transpose") and re.match(rf"u16\[2,4,(1,)?{s}", i.shape)]
    cost = hlo_cost.program_cost(compiled)
    # Per device: 4 rows x 1 kv head x S x H uint16, keys and values, each layer of each step.
    assert cost.ragged_bytes == 2 * cfg.num_layers * steps * (4 * 1 * s * 128 * 2)
    # Two matmuls of 2 x q's rows (1 token x 2 groups) x S x H per row, kv head, layer and step.
    assert cost.ragged_flops == 2 * 2 * (4 * 1 * 2 * s * 128) * cfg.num_layers * steps
    quarter = cost.at_fill(0.25)
    assert quarter.bytes == pytest.approx(cost.bytes - 0.75 * cost.ragged_bytes)
    assert quarter.flops == pytest.approx(cost.flops - 0.75 * cost.ragged_flops)
    assert cost.at_fill(1.0) == cost
