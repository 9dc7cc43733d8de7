"""Attention of a few new tokens per row over the rows of a KV cache, each row at its own fill: a
Pallas TPU kernel (the rollout engine's decode and prefill steps on a TPU, models.row_attention).

Shape letters as in qwen2.py (B rows, T new tokens, S slots, N = K x G heads, H head dim), plus
L layers and R rows of the cache. Row b's T queries sit at slots starts[b] + 0..T-1 and its valid
keys are the slots [0, ends[b]): the rollout engine holds a row's tokens contiguously from slot 0
(rlver_jax.sampling.kv_rows), so its fill is the one number that masks it. Query t attends slot s
when s < ends[b] and s <= starts[b] + t: the same maths as `attention.dense_attention` with
`attention.slot_bias`'s mask (fp32 scores, probabilities in the compute dtype for the PV matmul),
without [B, N, T, S] scores in HBM: an online softmax (running max, sum and accumulator in VMEM,
fp32) over key blocks.

The grid is (kv head, block of rows): one grid step serves several rows (`rows_per_step`: all of
a decode step's, one of a prefill chunk's 256 tokens), and inside it a loop walks its rows, each
row's query blocks and, for each, its key blocks up to the last one it needs (a row's fill, or its
query block's last slot), copying each key and value block from HBM itself, the next one's copy
started before the current one's maths (two buffers), as vLLM's TPU kernel loops over sequences
inside one call. So nothing past a row's fill is read, and a decode step of the 7B plan (8 rows,
one kv head per device) runs one grid step per layer where a grid over (row, kv head, query
block, key block) ran some 70 (`grid_steps`: the planner's count of them).

The cache is read where it lies: the whole stack [L, R, S, K, H] (16-bit values as their uint16
bits, qwen2.KVCache), the layer and each fed row's cache row prefetched as scalars, so no layer
slice, gather or dtype conversion is copied out of it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from rlver_jax.models.attention import NEG_INF, kernel_partition

# Key block lengths: long for a decode step's few query rows (each block's copy and loop step
# cost a fixed overhead), shorter for a prefill chunk's many, whose fp32 scores [query rows, block]
# live in VMEM. A row's last block reads up to a block past its fill (half a block on average).
DECODE_KEY_BLOCK, PREFILL_KEY_BLOCK = 2048, 512
QUERY_BLOCK = 256  # new tokens per query block when T is longer (a prefill chunk: one block each)
# Query rows (tokens x groups, over its rows) one grid step holds in VMEM: every row of a decode
# step (7B: 7 a row), one row of a 256-token prefill chunk (1,792).
STEP_QUERY_ROWS = 2048
NAME = "ragged_decode_attention"  # the kernel's custom call (the planner's cost model reads it)


def key_block(s: int, query_rows: int) -> int:
    """The key block length over S slots for a query block of `query_rows` rows (tokens x groups):
    S whole where it is shorter; else the last block starts early enough to end at S (its slots
    already read are masked in the kernel)."""
    block = DECODE_KEY_BLOCK if query_rows <= 128 else PREFILL_KEY_BLOCK
    return min(block, s)


def rows_per_step(b: int, query_rows: int) -> int:
    """Rows one grid step serves, of B rows of `query_rows` query rows each (q's operand [B, K, M,
    H]: M = tokens, padded to query blocks, x groups): the most that divide B and whose query rows
    fit STEP_QUERY_ROWS, at least one."""
    return max([d for d in range(1, b + 1) if b % d == 0 and d * query_rows <= STEP_QUERY_ROWS] or [1])


def grid_steps(rows: int, kv_heads: int, query_rows: int) -> int:
    """The kernel's grid steps per call on one device: kv heads x blocks of `rows_per_step` rows,
    for the kernel's operand q [rows, kv_heads, query_rows, H] (a device's share, in the custom
    call's operands). Each grid step then loops over its rows' key blocks up to their fills."""
    return kv_heads * (rows // rows_per_step(rows, query_rows))


def reads_in_place(mesh_sizes: dict[str, int], b: int, n: int, kh: int) -> bool:
    """Whether the kernel reads the cache where it lies on a mesh of axis `mesh_sizes` (B rows of N
    query and K kv heads): with one kv head per device (`kernel_partition`). A block's last two
    dims must be whole or (8, 128)-aligned, so the kernel reads keys [L, R, K, S, H] (a view with
    the slots second-minor); with one kv head per device that view is the TPU layout of the cache
    itself, with several the TPU compiler would copy the whole stack for it in every layer."""
    heads = kernel_partition(mesh_sizes, b, n, kh)[1]
    return kh // (mesh_sizes[heads] if heads else 1) == 1


def _kernel(layer_ref, rows_ref, starts_ref, ends_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems, m_ref, l_ref,
            acc_ref, *, rb: int, nq: int, tq: int, groups: int, bs: int, s: int, dt):
    """One grid step: rows [block x rb, + rb) of kv head `head`, walked as a sequence of (row,
    query block, key block) visits; the key and value blocks of the next visit are copied into the
    other buffer while this one's are used."""
    head, first_row = pl.program_id(0), pl.program_id(1) * rb
    layer, mq = layer_ref[0], tq * groups

    def last(r, i):  # the last key block query block i of row r reads
        b = first_row + r
        return _last_block(starts_ref[b], ends_ref[b], i, tq, bs)

    def copies(r, j, buf):  # the DMAs of row r's key block j into buffer `buf`
        src = (layer, rows_ref[first_row + r], head, pl.ds(jnp.minimum(j * bs, s - bs), bs))
        return [pltpu.make_async_copy(hbm.at[src], scratch.at[buf], sems.at[k, buf])
                for k, (hbm, scratch) in enumerate(((k_hbm, k_buf), (v_hbm, v_buf)))]

    def following(r, i, j):  # the visit after (r, i, j)
        more_keys, more_queries = j < last(r, i), i + 1 < nq
        next_i = jnp.where(more_keys, i, jnp.where(more_queries, i + 1, 0))
        return jnp.where(more_keys | more_queries, r, r + 1), next_i, jnp.where(more_keys, j + 1, 0)

    def visit(carry):
        r, i, j, buf = carry
        nr, ni, nj = following(r, i, j)

        @pl.when(nr < rb)
        def _():
            for c in copies(nr, nj, 1 - buf):
                c.start()

        for c in copies(r, j, buf):
            c.wait()

        @pl.when(j == 0)
        def _():
            m_ref[...] = jnp.full(m_ref.shape, NEG_INF, jnp.float32)
            l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        b = first_row + r
        start, end = starts_ref[b], ends_ref[b]
        q = q_ref[r] if nq == 1 else q_ref[r, pl.ds(pl.multiple_of(i * mq, 8), mq), :]
        k, v = (jax.lax.bitcast_convert_type(x, dt) if x.dtype == jnp.uint16 else x.astype(dt)
                for x in (k_buf[buf], v_buf[buf]))
        scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        scores = scores * (q.shape[-1] ** -0.5)
        rows = jax.lax.broadcasted_iota(jnp.int32, scores.shape, 0)
        slot = jnp.minimum(j * bs, s - bs) + jax.lax.broadcasted_iota(jnp.int32, scores.shape, 1)
        q_slot = start + i * tq + rows // groups  # query rows are (token, group) pairs, token-major
        # A last block that starts early to end at S holds slots an earlier block counted.
        scores = jnp.where((slot >= j * bs) & (slot < end) & (slot <= q_slot), scores, NEG_INF)
        # Slots past the fill hold unspecified values, maybe NaN bits: 0 x NaN is NaN.
        v_slot = jnp.minimum(j * bs, s - bs) + jax.lax.broadcasted_iota(jnp.int32, (bs, 1), 0)
        v = jnp.where((v_slot >= j * bs) & (v_slot < end), v, 0)
        m = m_ref[...]
        m_new = jnp.maximum(m, scores.max(axis=-1, keepdims=True))
        p = jnp.exp(scores - m_new)
        corr = jnp.exp(m - m_new)
        l_ref[...] = l_ref[...] * corr + p.sum(axis=-1, keepdims=True)
        pv = jax.lax.dot_general(p.astype(dt), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        acc_ref[...] = acc_ref[...] * corr + pv
        m_ref[...] = m_new

        @pl.when(j == last(r, i))
        def _():
            out = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)
            if nq == 1:
                o_ref[r] = out
            else:
                o_ref[r, pl.ds(pl.multiple_of(i * mq, 8), mq), :] = out

        return nr, ni, nj, 1 - buf

    for c in copies(0, 0, 0):
        c.start()
    zero = jnp.int32(0)
    jax.lax.while_loop(lambda c: c[0] < rb, visit, (zero, zero, zero, zero))


def _last_block(start, end, i, tq: int, bs: int):
    """The last key block query block i reads: its last query's slot or the row's last, if earlier."""
    return jnp.maximum(jnp.minimum(end, start + (i + 1) * tq) - 1, 0) // bs


def ragged_attention(q_BTNH: jax.Array, k_stack: jax.Array, v_stack: jax.Array, layer: jax.Array,
                     rows_B: jax.Array, starts_B: jax.Array, ends_B: jax.Array, interpret: bool = False) -> jax.Array:
    """Row b's T queries (slots starts[b] + 0..T-1) over cache row rows_B[b] of layer `layer` of the
    stacks k, v [L, R, S, K, H] (its slots [0, ends[b])): [B, T, N, H] in q's dtype. One device's
    kernel; `partitioned` runs it in a shard_map. `interpret=True` runs it on CPU (tests)."""
    b, t, n, h = q_BTNH.shape
    s, kh = k_stack.shape[2:4]
    g = n // kh
    dt = q_BTNH.dtype
    tq = t if t <= QUERY_BLOCK else QUERY_BLOCK
    nq = -(-t // tq)
    mq = tq * g
    bs = key_block(s, mq)
    rb = rows_per_step(b, nq * mq)
    q = jnp.pad(q_BTNH, ((0, 0), (0, nq * tq - t), (0, 0), (0, 0)))
    q = q.reshape(b, nq * tq, kh, g, h).transpose(0, 2, 1, 3, 4).reshape(b, kh, nq * mq, h)
    q_spec = pl.BlockSpec((rb, None, nq * mq, h), lambda head, block, *refs: (block, head, 0, 0))
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    cache_dtype = k_stack.dtype
    out = pl.pallas_call(
        functools.partial(_kernel, rb=rb, nq=nq, tq=tq, groups=g, bs=bs, s=s, dt=dt),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(kh, b // rb), in_specs=[q_spec, hbm, hbm], out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((2, bs, h), cache_dtype), pltpu.VMEM((2, bs, h), cache_dtype),
                            pltpu.SemaphoreType.DMA((2, 2)), pltpu.VMEM((mq, 1), jnp.float32),
                            pltpu.VMEM((mq, 1), jnp.float32), pltpu.VMEM((mq, h), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q.shape, dt),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=interpret, name=NAME,
    )(jnp.reshape(layer, (1,)).astype(jnp.int32), rows_B.astype(jnp.int32), starts_B.astype(jnp.int32),
      ends_B.astype(jnp.int32), q, jnp.swapaxes(k_stack, 2, 3), jnp.swapaxes(v_stack, 2, 3))
    out = out.reshape(b, kh, nq * tq, g, h).transpose(0, 2, 1, 3, 4).reshape(b, nq * tq, n, h)
    return out[:, :t]


def partitioned(q_BTNH: jax.Array, k_stack: jax.Array, v_stack: jax.Array, layer: jax.Array,
                rows_B: jax.Array | None, starts_B: jax.Array, ends_B: jax.Array, interpret: bool = False) -> jax.Array:
    """`ragged_attention` in a shard_map over the mesh in context, as attention.splash_attention runs
    its kernel (`kernel_partition`): rows over the batch axes, kv heads over 'tensor'. rows_B None:
    fed row b is cache row b (each device reads its own rows). Given rows_B (a fed row past the
    cache's rows reads its last, for an output nobody reads), the kernel reads them where they lie,
    unless the rows are split over devices: a fed row's cache row may lie on another device, so
    the layer's fed rows are gathered first."""
    b, n, kh = q_BTNH.shape[0], q_BTNH.shape[2], k_stack.shape[3]
    mesh = jax.sharding.get_abstract_mesh()
    rows, heads = kernel_partition({} if mesh.empty else dict(zip(mesh.axis_names, mesh.axis_sizes)), b, n, kh)
    if rows_B is not None and rows is not None:
        k_stack, v_stack = (x[layer][rows_B][None] for x in (k_stack, v_stack))
        layer, rows_B = jnp.zeros((), jnp.int32), None
    if rows_B is None:
        def run(q, k, v, layer, starts, ends):  # one device's rows are its cache rows in order
            return ragged_attention(q, k, v, layer, jnp.arange(q.shape[0]), starts, ends, interpret)
        args, row_spec = (), ()
    else:
        def run(q, k, v, layer, starts, ends, fed):
            return ragged_attention(q, k, v, layer, jnp.minimum(fed, k.shape[1] - 1), starts, ends, interpret)
        args, row_spec = (rows_B,), (P(),)
    if not mesh.empty:
        stack = P(None, rows, None, heads)
        run = jax.shard_map(run, in_specs=(P(rows, None, heads), stack, stack, P(), P(rows), P(rows)) + row_spec,
                            out_specs=P(rows, None, heads), check_vma=False)
    return run(q_BTNH, k_stack, v_stack, layer, starts_B, ends_B, *args)
