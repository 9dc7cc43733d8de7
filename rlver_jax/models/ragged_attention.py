"""Attention of a few new tokens per row over the rows of a KV cache, each row at its own fill: a
Pallas TPU kernel (the rollout engine's decode and prefill steps on a TPU, qwen2.Attention).

Shape letters as in qwen2.py (B rows, T new tokens, S slots, N = K x G heads, H head dim), plus
L layers and R rows of the cache. Row b's T queries sit at slots starts[b] + 0..T-1 and its valid
keys are the slots [0, ends[b]): the rollout engine holds a row's tokens contiguously from slot 0
(rlver_jax.sampling.kv_rows), so its fill is the one number that masks it. Query t attends slot s
when s < ends[b] and s <= starts[b] + t: the same maths as `attention.dense_attention` with
`attention.slot_bias`'s mask (fp32 scores, probabilities in the compute dtype for the PV matmul),
without [B, N, T, S] scores in HBM: an online softmax (running max, sum and accumulator in VMEM,
fp32) over key blocks, grid (row, kv head, query block, key block). A key block past the last one
a query block needs maps to that last block, so the pipeline fetches nothing past a row's fill.

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

# Key block lengths: long for a decode step's few query rows (each grid step costs a fixed
# overhead, ~0.35 us on a TPU, as much as a 512-slot block's DMA), shorter for a prefill chunk's
# many, whose fp32 scores [query rows, block] live in VMEM. A row's last block reads up to a block
# past its fill (half a block on average).
DECODE_KEY_BLOCK, PREFILL_KEY_BLOCK = 2048, 512
QUERY_BLOCK = 256  # new tokens per query block when T is longer (a prefill chunk: one block each)
NAME = "ragged_decode_attention"  # the kernel's custom call (the planner's cost model reads it)


def key_block(s: int, query_rows: int) -> int:
    """The key block length over S slots for a query block of `query_rows` rows (tokens x groups):
    S whole where it is shorter; else the last block may run past S (masked in the kernel)."""
    block = DECODE_KEY_BLOCK if query_rows <= 128 else PREFILL_KEY_BLOCK
    return min(block, s)


def reads_in_place(mesh_sizes: dict[str, int], b: int, n: int, kh: int) -> bool:
    """Whether the kernel reads the cache where it lies on a mesh of axis `mesh_sizes` (B rows of N
    query and K kv heads): with one kv head per device (`kernel_partition`). A block's last two
    dims must be whole or (8, 128)-aligned, so the kernel reads keys [L, R, K, S, H] (a view with
    the slots second-minor); with one kv head per device that view is the TPU layout of the cache
    itself, with several the TPU compiler would copy the whole stack for it in every layer."""
    heads = kernel_partition(mesh_sizes, b, n, kh)[1]
    return kh // (mesh_sizes[heads] if heads else 1) == 1


def _kernel(layer_ref, rows_ref, starts_ref, ends_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
            groups: int, tq: int, bs: int, dt):
    del layer_ref, rows_ref  # used by the index maps only
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    start, end = starts_ref[b], ends_ref[b]

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, NEG_INF, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(j <= _last_block(start, end, i, tq, bs))
    def _():
        q = q_ref[...]
        k, v = (jax.lax.bitcast_convert_type(x, dt) if x.dtype == jnp.uint16 else x.astype(dt)
                for x in (k_ref[...], v_ref[...]))
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        s = s * (q.shape[-1] ** -0.5)
        rows, slots = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0), jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        slot = j * bs + slots
        q_slot = start + i * tq + rows // groups  # query rows are (token, group) pairs, token-major
        s = jnp.where((slot < end) & (slot <= q_slot), s, NEG_INF)
        # A block running past S holds unspecified values there, maybe NaN bits: 0 x NaN is NaN.
        v = jnp.where(j * bs + jax.lax.broadcasted_iota(jnp.int32, (bs, 1), 0) < end, v, 0)
        m = m_ref[...]
        m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        corr = jnp.exp(m - m_new)
        l_ref[...] = l_ref[...] * corr + p.sum(axis=-1, keepdims=True)
        pv = jax.lax.dot_general(p.astype(dt), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        acc_ref[...] = acc_ref[...] * corr + pv
        m_ref[...] = m_new

    @pl.when(j == pl.num_programs(3) - 1)
    def _():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


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
    mb = tq * g
    bs = key_block(s, mb)
    ns = -(-s // bs)
    q = jnp.pad(q_BTNH, ((0, 0), (0, nq * tq - t), (0, 0), (0, 0)))
    q = q.reshape(b, nq * tq, kh, g, h).transpose(0, 2, 1, 3, 4).reshape(b, kh, nq * tq * g, h)

    def q_map(bi, ki, i, j, layer_ref, rows_ref, starts_ref, ends_ref):
        return bi, ki, i, 0

    def kv_map(bi, ki, i, j, layer_ref, rows_ref, starts_ref, ends_ref):
        last = _last_block(starts_ref[bi], ends_ref[bi], i, tq, bs)
        return layer_ref[0], rows_ref[bi], ki, jnp.minimum(j, last), 0

    q_spec = pl.BlockSpec((None, None, mb, h), q_map)
    kv_spec = pl.BlockSpec((None, None, None, bs, h), kv_map)
    out = pl.pallas_call(
        functools.partial(_kernel, groups=g, tq=tq, bs=bs, dt=dt),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(b, kh, nq, ns), in_specs=[q_spec, kv_spec, kv_spec], out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((mb, 1), jnp.float32), pltpu.VMEM((mb, 1), jnp.float32),
                            pltpu.VMEM((mb, h), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q.shape, dt),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
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
