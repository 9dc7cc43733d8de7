"""The rows' cached attention: the ragged TPU kernel (rlver_jax/models/ragged_attention.py) in Pallas
interpret mode on CPU and the blockwise form of other platforms (rlver_jax/models/row_attention.py)
against a numpy transcription of masked softmax attention; a row's numbers in the blockwise form
whatever the fills of the rows beside it; the rollout engine's program with the kernel against its
blockwise form; the kernel's grid steps; its compiled form for a v5e inside the engine's programs
(skipped without libtpu), and the cost model's figure of it."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlver_jax.models import qwen2, ragged_attention, row_attention
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
    (keys, values), stack = _stacks(rng, layers, r, s, k, h)
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


def _stacks(rng, layers, r, s, k, h):
    keys, values = (rng.standard_normal((layers, r, s, k, h)) for _ in "kv")
    bits = [jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.bfloat16), jnp.uint16) for x in (keys, values)]
    return (keys, values), bits


@pytest.mark.parametrize("t, s, gathered", [(1, 2100, True), (3, 2100, False), (260, 600, True)])
def test_blockwise_matches_masked_softmax_attention(t, s, gathered):
    """The form off a TPU: the same cases as the kernel's, the rows gathered (a padding row past the
    cache's rows) or every row in order."""
    rng = np.random.default_rng(t)
    layers, r, k, g, h = 2, 4, 2, 3, 32
    (keys, values), stack = _stacks(rng, layers, r, s, k, h)
    q = jnp.asarray(rng.standard_normal((r, t, k * g, h)), jnp.bfloat16)
    rows = np.array([2, 0, 3, 1]) if gathered else np.arange(r)
    ends = np.array([1, s, 300, s - 60])
    starts = np.maximum(ends - t, 0)
    starts[2] -= 5
    where = row_attention.RowSlots(jnp.asarray(starts[:, None] + np.arange(t)), jnp.asarray(ends),
                                   jnp.asarray(rows) if gathered else None)
    out = row_attention.blockwise(q, *stack, jnp.int32(1), where, jnp.bfloat16, qwen2._from_cache)
    want = _numpy_attention(_bf16(q), _bf16(keys)[1][rows], _bf16(values)[1][rows], starts, ends)
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), want, atol=2e-2, rtol=2e-2)


def test_a_rows_blockwise_numbers_do_not_depend_on_the_rows_beside_it():
    """Key blocks past a row's fill (read for a longer row beside it) add exactly nothing: the
    row's output is bit for bit the one it gets alone, in fp32."""
    rng = np.random.default_rng(0)
    (keys, _), stack = _stacks(rng, 1, 2, 3000, 2, 16)
    stack = [jnp.asarray(x, jnp.float32) for x in (keys, keys * 0.5)]
    q = jnp.asarray(rng.standard_normal((2, 1, 4, 16)), jnp.float32)
    attend = functools.partial(row_attention.blockwise, layer=jnp.int32(0), dt=jnp.float32,
                               from_cache=qwen2._from_cache)
    both = attend(q, *stack, where=row_attention.RowSlots(jnp.array([[99], [2999]]), jnp.array([100, 3000])))
    alone = attend(q[:1], *stack, where=row_attention.RowSlots(jnp.array([[99]]), jnp.array([100]), jnp.array([0])))
    np.testing.assert_array_equal(np.asarray(both[0]), np.asarray(alone[0]))


def test_grid_steps():
    """One grid step per kv head for every row of a decode step (7B per device: 8 rows of 7 query
    rows, one kv head: 1, where a grid over (row, kv head, query block, key block) ran 8 x 9 over
    15,104 slots), one per row of a 256-token prefill chunk (1,792 query rows)."""
    assert ragged_attention.grid_steps(8, 1, 7) == 1
    assert ragged_attention.grid_steps(8, 1, 256 * 7) == 8
    assert ragged_attention.grid_steps(6, 2, 700) == 2 * 3  # 2 rows of 700 a step (3 x 700 > 2048)
    assert ragged_attention.rows_per_step(5, 1000) == 1


def _engine_run(cfg, params):
    """Three rows of one cache at different fills: a call over every row feeding rows 0 and 2 (row
    0's piece not its whole prompt, row 2's whole: it draws and decodes), a gathered call feeding
    row 1 (a padding row past the cache's rows beside it), then a call feeding row 0's last piece
    beside rows 1 and 2 decoding."""
    settings = SamplingSettings(max_new_tokens=6, stop_ids=(), pad_id=0)
    cache, state = qwen2.init_cache(cfg, 4, 32), kv_rows.init_state(4)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, cfg.vocab_size, (4, 8)).astype(np.int32)
    keys = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(3), 4)))

    def feed(place, starts, pieces, limits, rows_keys):
        width = max(len(x) for x in pieces)
        padded = np.zeros((len(pieces), width), np.int32)
        for i, x in enumerate(pieces):
            padded[i, :len(x)] = x
        return kv_rows.Feed(np.array(place, np.int32), np.array(starts, np.int32), padded,
                            np.array([len(x) for x in pieces], np.int32), rows_keys, np.array(limits, np.int32))

    outs = []
    for rows, serving, f, steps in [
            (None, [True, False, True, False], feed([0, 2], [0, 0], [ids[0, :5], ids[2, :5]], [0, 6], keys[[0, 2]]), 3),
            ([1, 9], [True, False], feed([0, 2], [0, 0], [ids[1, :7], []], [6, 0], keys[[1, 3]]), 2),
            (None, [True, True, True, False], feed([0], [5], [ids[0, 5:]], [6], keys[:1]), 6)]:
        cache, state, out, _ = kv_rows.chunk(cfg, settings, params, cache, state, rows=rows, serving=serving,
                                             feed=f, steps=steps)
        outs.append(out)
    return state, [(o.tokens, o.model_logprobs, o.emitted) for o in outs]


@pytest.mark.slow  # six engine programs, three of them with the kernel in interpret mode
def test_engine_programs_with_the_kernel_match_their_blockwise_form(monkeypatch):
    """The engine's calls (every row, gathered rows, a prefill piece beside decoding rows) with the
    kernel (interpret mode) give the blockwise form's tokens and log-probs, and each row's fill."""
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(0))
    blockwise_state, blockwise = _engine_run(cfg, params)
    # Row 0: 8 prompt tokens then 6 drawn (5 fed); row 1: 7 + 6 (5 fed); row 2: 5 + 6 (5 fed).
    assert np.asarray(blockwise_state.fill).tolist() == [13, 12, 10, 0]
    assert [np.asarray(e).tolist() for _, _, e in blockwise] == [[0, 0, 3, 0], [2, 0], [6, 4, 3, 0]]
    monkeypatch.setattr(row_attention, "ragged_kernel", lambda *args: True)
    monkeypatch.setattr(ragged_attention, "partitioned",
                        functools.partial(ragged_attention.partitioned, interpret=True))
    jax.clear_caches()
    try:
        kernel_state, kernel = _engine_run(cfg, params)
    finally:
        jax.clear_caches()  # the engine's jitted programs traced with the kernel
    for (tokens, logprobs, emitted), (want_tokens, want_logprobs, want_emitted) in zip(kernel, blockwise):
        np.testing.assert_array_equal(np.asarray(tokens), np.asarray(want_tokens))
        np.testing.assert_array_equal(np.asarray(emitted), np.asarray(want_emitted))
        np.testing.assert_allclose(np.asarray(logprobs), np.asarray(want_logprobs), atol=1e-4)
    np.testing.assert_array_equal(np.asarray(kernel_state.fill), np.asarray(blockwise_state.fill))


def test_the_kernel_runs_on_tpu_targets_only():
    """On this CPU the rows' attention is the blockwise form (the CPU runs' numbers do not move)."""
    assert not row_attention.ragged_kernel("auto", jnp.float32, 4, 4, 2)
    # One kv head per device: the 7B plan's 4 over 'tensor' of 4 (rows unsplit); not 2 over 1.
    assert ragged_attention.reads_in_place({"data": 1, "fsdp": 1, "tensor": 4}, 8, 28, 4)
    assert not ragged_attention.reads_in_place({"data": 1, "fsdp": 2, "tensor": 1}, 8, 4, 2)
    assert ragged_attention.key_block(20096, 7) == 2048 and ragged_attention.key_block(20096, 256 * 7) == 512
    assert ragged_attention.key_block(40, 7) == 40


@pytest.mark.slow
@pytest.mark.skipif(not topology.libtpu_available(), reason="libtpu is not installed: no TPU compiler here")
def test_the_engine_program_compiles_for_v5e_with_the_kernel_and_no_scores():
    """The engine's call on a v5e:2x2 (rows over fsdp, 2 kv heads over tensor: one per device),
    decoding only and with a prefill piece beside the decoding rows: the kernel's custom calls (the
    decode loop's; the first step's two, one per group) read the cache stacks where they lie (no
    copy of them, no fp32 array of S slots: no scores), and the cost model counts one layer of each
    stack per call, every row whole, then scales it to a fill."""
    v5e = topology.tpu_target("v5e:2x2")
    mesh = sharding.make_mesh((1, 2, 2), v5e.devices)
    cfg = Qwen2Config(vocab_size=256, hidden_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=1024, tie_word_embeddings=True, head_size=128, dtype="bfloat16",
                      param_dtype="bfloat16", scan_layers=True)
    r, s, steps, width = 8, 2048, 8, 256
    rep = NamedSharding(mesh, P())
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
        mesh, P(*[None] * (x.ndim - 1), "tensor") if x.shape[-1] % 2 == 0 else P())), qwen2.abstract_params(cfg))
    shape = jax.eval_shape(lambda: qwen2.init_cache(cfg, r, s))
    split = NamedSharding(mesh, P(None, sharding.BATCH_AXES, None, "tensor"))
    cache = qwen2.KVCache(*(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=split) for x in (shape.k, shape.v)),
                          jax.ShapeDtypeStruct((r, s), jnp.bool_, sharding=NamedSharding(mesh, P(sharding.BATCH_AXES))),
                          jax.ShapeDtypeStruct((), jnp.int32, sharding=rep))
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep),
                         jax.eval_shape(lambda: kv_rows.init_state(r)))
    serving = jax.ShapeDtypeStruct((r,), jnp.bool_, sharding=rep)
    per_row = jax.ShapeDtypeStruct((r,), jnp.int32, sharding=rep)
    feed = kv_rows.Feed(per_row, per_row, jax.ShapeDtypeStruct((r, width), jnp.int32, sharding=rep), per_row,
                        jax.ShapeDtypeStruct((r, 2), jnp.uint32, sharding=rep), per_row)
    settings = SamplingSettings(max_new_tokens=64, stop_ids=(0, 1), pad_id=0)
    costs = []
    for fed, kernels in ((None, 1), (feed, 3)):
        compiled = kv_rows._chunk_jit.lower(cfg, settings, mesh, steps, params, cache, state, None, serving,
                                            fed).compile()
        text = compiled.as_text()
        comps, _ = hlo_cost._computations(text)
        ops = [i for ins in comps.values() for i in ins]
        assert [i.op for i in ops if i.name.startswith(ragged_attention.NAME)] == ["custom-call"] * kernels
        assert not re.search(rf"f32\[[\d,]*{s}\]", text)  # no scores (nor anything else fp32) over the slots
        assert not [i for i in ops if i.op in ("copy", "transpose") and re.match(rf"u16\[2,4,(1,)?{s}", i.shape)]
        costs.append(hlo_cost.program_cost(compiled))
    cost = costs[0]  # decoding only: the loop's call, `steps` times
    # Per device: 4 rows x 1 kv head x S x H uint16, keys and values, each layer of each step.
    assert cost.ragged_bytes == 2 * cfg.num_layers * steps * (4 * 1 * s * 128 * 2)
    # Two matmuls of 2 x q's rows (1 token x 2 groups) x S x H per row, kv head, layer and step.
    assert cost.ragged_flops == 2 * 2 * (4 * 1 * 2 * s * 128) * cfg.num_layers * steps
    quarter = cost.at_fill(0.25)
    assert quarter.bytes == pytest.approx(cost.bytes - 0.75 * cost.ragged_bytes)
    assert quarter.flops == pytest.approx(cost.flops - 0.75 * cost.ragged_flops)
    assert cost.at_fill(1.0) == cost
    # With the piece: the first step's two calls more (and the piece's 256 x 2 query rows a row).
    assert costs[1].ragged_bytes >= cost.ragged_bytes + 2 * cfg.num_layers * (4 * 1 * s * 128 * 2)
