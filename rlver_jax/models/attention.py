"""Grouped-query softmax attention: the dense form, and causal self-attention in four forms.

Shape letters as in qwen2.py: B batch, T queries, S key/value slots, N query heads, K kv heads,
G = N // K, H head dim. With a KV cache masking is by slot: a query at slot q attends slot s when
s <= q and slot s holds a real token. Without one (`attend`) each row is split in segments by its
segment ids [B, T] (int32): a query attends the slots at or before its own that carry its segment
id, so rows packed end to end in one row (rlver_jax.rl.packing) never see each other; id 0 is
padding, which attends only padding. A 0/1 mask is one segment a row. Outputs at padding query
slots are unspecified (no NaN); callers never read them and give them zero cotangents.

`attend` is the cache-free (training) self-attention, chosen by `config.model.attention`:
  xla        dense scores [B, N, T, T] in fp32, split into causal query blocks (memory ~ T^2).
  blockwise  flash-style online softmax over key blocks, in JAX, with its own backward that
             recomputes the block scores from the saved log-sum-exp (memory ~ T, any platform).
  cudnn      jax.nn.dot_product_attention(implementation="cudnn"): fused flash attention (GPU).
  splash     Pallas splash attention (TPU).
  auto       splash on TPU; cudnn on GPU for bf16/fp16 (cuDNN has no fp32 flash kernel); else
             blockwise from AUTO_BLOCKWISE_MIN_T tokens, xla below (faster there, see
             docs/attention.md).
With a KV cache, `cached_attention`: `dense_attention` with `slot_bias` for a few queries (a
decode step), and for a prefill of BLOCK tokens or more the same online softmax over query x key
blocks (forward only), so a 16,384-token prompt never holds [B, N, T, S] scores.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

IMPLEMENTATIONS = ("auto", "xla", "blockwise", "cudnn", "splash")
AUTO_BLOCKWISE_MIN_T = 4096  # "auto" off GPU/TPU: dense below this length (faster on CPU), blockwise from it
BLOCK = 512  # blockwise: query and key block length (scores [B, N, BLOCK, BLOCK] per step)
_CAUSAL_BLOCKS = 4  # xla: query blocks, so the fully masked upper triangle is skipped
_SPLASH_BLOCK = 128  # splash: its smallest tile; T is padded to a multiple
_SPLASH_LARGE_BLOCK = 512  # splash: its tile where T is a multiple (fewer, larger grid steps on a TPU)
_PLATFORM = {"cudnn": "gpu", "splash": "tpu"}
NEG_INF = -1e30  # finite, so a fully masked (padding) query row gives no NaN


def slot_bias(q_slots: jax.Array, kv_mask_BS: jax.Array) -> jax.Array:
    """Additive attention bias [B, T, S]: causal by slot, and only slots holding real tokens.
    q_slots: [T] the queries' slots, shared by the rows, or [B, T] each row's own."""
    s = kv_mask_BS.shape[-1]
    q_slots_BT = q_slots if q_slots.ndim == 2 else q_slots[None]
    allowed = (jnp.arange(s)[None, None, :] <= q_slots_BT[:, :, None]) & kv_mask_BS[:, None, :]
    return jnp.where(allowed, 0.0, NEG_INF).astype(jnp.float32)


def dense_attention(q_BTNH: jax.Array, keys_BSKH: jax.Array, values_BSKH: jax.Array,
                    bias_BTS: jax.Array, dt) -> jax.Array:
    """Grouped-query softmax attention of T queries over S slots (scores in fp32): [B, T, N, H].

    The G x T queries of each kv head form one [G*T, H] matrix (M rows), so both matmuls are
    plain batched matmuls over (B, K): on XLA's CPU backend this beats a [B, K, G, T, S] einsum
    (which transposes the probabilities), in training and in cached decoding.
    """
    b, t, n, h = q_BTNH.shape
    s, k = keys_BSKH.shape[1:3]
    g = n // k
    q_BKMH = q_BTNH.reshape(b, t, k, g, h).transpose(0, 2, 3, 1, 4).reshape(b, k, g * t, h)
    logits = jnp.einsum("BKMH,BSKH->BKMS", q_BKMH, keys_BSKH, preferred_element_type=jnp.float32)
    logits = logits.reshape(b, k, g, t, s) * (h ** -0.5) + bias_BTS[:, None, None, :, :]
    probs = jax.nn.softmax(logits, axis=-1).astype(dt).reshape(b, k, g * t, s)
    # fp32 accumulation, then the compute dtype: XLA:CPU's bf16-output matmuls take a slow path.
    out_BKMH = jnp.einsum("BKMS,BSKH->BKMH", probs, values_BSKH, preferred_element_type=jnp.float32).astype(dt)
    return out_BKMH.reshape(b, k, g, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def target_platform() -> str:
    """The platform the traced program is compiled for: the devices of the mesh in context (the
    trainer's and the sampler's programs trace under their mesh: rlver_jax.parallel.sharding), else
    the default backend. A TPU topology's compile-only devices on a CPU host make it "tpu"."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    if device is None:
        return jax.default_backend()
    return "gpu" if device.platform in ("cuda", "rocm") else device.platform


def resolve(implementation: str, t: int, dtype, platform: str | None = None) -> str:
    """The implementation `attend` runs for `implementation` at T = t on `platform` (default: the
    target of the program being traced, `target_platform`)."""
    platform = platform or target_platform()
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"config.model.attention={implementation!r}; use one of {IMPLEMENTATIONS}")
    if implementation == "auto":
        if platform == "tpu":
            return "splash"
        if platform == "gpu" and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            return "cudnn"
        return "blockwise" if t >= AUTO_BLOCKWISE_MIN_T else "xla"
    needed = _PLATFORM.get(implementation)
    if needed and platform != needed:
        raise ValueError(f"config.model.attention={implementation!r} runs on {needed} only, and this run "
                         f"is on {platform}: use 'auto', 'blockwise' or 'xla'")
    return implementation


def attend(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, segments_BT: jax.Array,
           implementation: str = "auto", max_segments: int = 1) -> jax.Array:
    """Causal self-attention of T tokens (slot = index) within their segments (`segments_BT`: ids,
    0 padding, or a 0/1 mask): [B, T, N, H]. `max_segments` (static): the most segments a row holds,
    which cuDNN's packed call sizes its arrays by (1: each row's real tokens are contiguous).

    One token attends only itself, which every implementation computes alike: the dense form, on any
    platform (the parameters' shape-only init traces one token, wherever the run is compiled for)."""
    segments_BT = segments_BT.astype(jnp.int32)
    if q_BTNH.shape[1] == 1:
        return _causal_dense(q_BTNH, k_BTKH, v_BTKH, segments_BT)
    impl = resolve(implementation, q_BTNH.shape[1], q_BTNH.dtype)
    if impl == "xla":
        return _causal_dense(q_BTNH, k_BTKH, v_BTKH, segments_BT)
    if impl == "blockwise":
        return blockwise_attention(q_BTNH, k_BTKH, v_BTKH, segments_BT)
    if impl == "cudnn":
        return cudnn_attention(q_BTNH, k_BTKH, v_BTKH, segments_BT, max_segments=max_segments)
    return splash_attention(q_BTNH, k_BTKH, v_BTKH, segments_BT)


def segment_bias(q_slots: jax.Array, q_segments_BT: jax.Array, k_segments_BS: jax.Array) -> jax.Array:
    """Additive attention bias [B, T, S] without a cache: query t (at slot q_slots[t]) attends key
    slot s <= its slot of its own segment id."""
    s = k_segments_BS.shape[-1]
    allowed = ((jnp.arange(s)[None, None, :] <= q_slots[None, :, None])
               & (k_segments_BS[:, None, :] == q_segments_BT[:, :, None]))
    return jnp.where(allowed, 0.0, NEG_INF).astype(jnp.float32)


def _causal_dense(q, k, v, segments_BT):
    # Query block i attends to the keys of blocks 0..i only: the fully masked upper triangle is
    # skipped (10/16 of the scores with 4 blocks). Valid queries never see the skipped slots, so
    # their outputs are unchanged; only padding rows differ.
    t = q.shape[1]
    blocks = _CAUSAL_BLOCKS if t % _CAUSAL_BLOCKS == 0 else 1
    size = t // blocks
    return jnp.concatenate([
        dense_attention(q[:, i * size:(i + 1) * size], k[:, :(i + 1) * size], v[:, :(i + 1) * size],
                        segment_bias(jnp.arange(i * size, (i + 1) * size), segments_BT[:, i * size:(i + 1) * size],
                                     segments_BT[:, :(i + 1) * size]),
                        q.dtype)
        for i in range(blocks)], axis=1)


# ----------------------------------------------------------------------------- blockwise


def blockwise_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, segments_BT: jax.Array,
                        block: int = BLOCK) -> jax.Array:
    """Causal self-attention within segments (`attend`) in query x key blocks of `block` tokens (T
    padded up to a multiple).

    Query block i visits key blocks 0..i with an online softmax (running max m, sum l, output
    accumulator, all fp32); the backward recomputes each block's probabilities from the saved
    log-sum-exp. Live memory: q, k, v, the output and the log-sum-exp (all ~ T) plus one block
    of scores; nothing [T, T].
    """
    b, t, n, h = q_BTNH.shape
    kh = k_BTKH.shape[2]
    size = min(block, t)
    nb = -(-t // size)
    pad = nb * size - t

    def blocks(x, heads):  # [B, T, K(, G), H] -> [nb, B, K(, G), size, H]
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2)).reshape((b, nb, size) + heads + (h,))
        return jnp.moveaxis(x, (1, 2), (0, -2))

    qb = blocks(q_BTNH.reshape(b, t, kh, n // kh, h), (kh, n // kh))
    kb, vb = blocks(k_BTKH, (kh,)), blocks(v_BTKH, (kh,))
    sb = jnp.pad(segments_BT.astype(jnp.int32), ((0, 0), (0, pad))).reshape(b, nb, size).transpose(1, 0, 2)
    ob = _flash(qb, kb, vb, sb)  # [nb, B, K, G, size, H]
    return jnp.moveaxis(ob, (0, -2), (1, 2)).reshape(b, nb * size, n, h)[:, :t]


def _scores(q_i, kb, kseg, q_start, j, q_seg):
    """Scores [B, K, G, q, s] (fp32, scaled, masked) of query block q_i, at slots q_start + 0..q-1 of
    segments q_seg [B, q], against key block j (slots j * s + 0..s-1 of segments kseg[j]; a cache's
    slot mask: True where real, against True)."""
    q_slot = q_start + jnp.arange(q_i.shape[-2])
    size = kb.shape[-2]
    k_slot = j * size + jnp.arange(size)
    k_seg = jax.lax.dynamic_index_in_dim(kseg, j, keepdims=False)
    ok = (k_slot[None, :] <= q_slot[:, None])[None] & (k_seg[:, None, :] == q_seg[:, :, None])
    k_j = jax.lax.dynamic_index_in_dim(kb, j, keepdims=False)
    s = jnp.einsum("BKGqH,BKsH->BKGqs", q_i, k_j, preferred_element_type=jnp.float32)
    return s * (q_i.shape[-1] ** -0.5) + jnp.where(ok, 0.0, NEG_INF)[:, None, None]


def _online_softmax(q_i, kb, vb, kseg, q_start, key_blocks, dt, q_seg):
    """Query block q_i (slots q_start + 0..q-1, segments q_seg) over key blocks 0..key_blocks-1 with
    an online softmax: the running max m, sum row_sum and output accumulator (all fp32), rescaled by
    exp(m - m_new) at each block. The output is acc / row_sum, its log-sum-exp m + log(row_sum)."""
    f32 = jnp.float32

    def key_block(j, carry):
        m, row_sum, acc = carry
        s = _scores(q_i, kb, kseg, q_start, j, q_seg)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        v_j = jax.lax.dynamic_index_in_dim(vb, j, keepdims=False)
        pv = jnp.einsum("BKGqs,BKsH->BKGqH", p.astype(dt), v_j, preferred_element_type=f32)
        return m_new, row_sum * corr + p.sum(-1), acc * corr[..., None] + pv

    init = (jnp.full(q_i.shape[:-1], NEG_INF, f32), jnp.zeros(q_i.shape[:-1], f32), jnp.zeros(q_i.shape, f32))
    return jax.lax.fori_loop(0, key_blocks, key_block, init)


def _flash_forward(qb, kb, vb, sb):
    dt, size = qb.dtype, qb.shape[-2]

    def query_block(_, xs):
        i, q_i, seg_i = xs
        m, row_sum, acc = _online_softmax(q_i, kb, vb, sb, i * size, i + 1, dt, seg_i)  # causal: key blocks 0..i
        return None, ((acc / row_sum[..., None]).astype(dt), m + jnp.log(row_sum))

    _, (ob, lse) = jax.lax.scan(query_block, None, (jnp.arange(qb.shape[0]), qb, sb))
    return ob, lse


@jax.custom_vjp
def _flash(qb, kb, vb, sb):
    return _flash_forward(qb, kb, vb, sb)[0]


def _flash_fwd(qb, kb, vb, sb):
    ob, lse = _flash_forward(qb, kb, vb, sb)
    return ob, (qb, kb, vb, sb, ob, lse)


def _flash_bwd(res, dob):
    """FlashAttention-2's backward: p = exp(s - lse), ds = p * (dp - rowsum(do * o))."""
    qb, kb, vb, sb, ob, lse = res
    f32, dt = jnp.float32, qb.dtype
    scale = qb.shape[-1] ** -0.5
    delta = jnp.sum(dob.astype(f32) * ob.astype(f32), axis=-1)

    def query_block(carry, xs):
        i, q_i, seg_i, do_i, lse_i, delta_i = xs

        def key_block(j, c):
            dq_i, dk, dv = c
            p = jnp.exp(_scores(q_i, kb, sb, i * q_i.shape[-2], j, seg_i) - lse_i[..., None])
            k_j = jax.lax.dynamic_index_in_dim(kb, j, keepdims=False)
            v_j = jax.lax.dynamic_index_in_dim(vb, j, keepdims=False)
            dv_j = jnp.einsum("BKGqs,BKGqH->BKsH", p.astype(dt), do_i, preferred_element_type=f32)
            dp = jnp.einsum("BKGqH,BKsH->BKGqs", do_i, v_j, preferred_element_type=f32)
            ds = (p * (dp - delta_i[..., None])).astype(dt)
            dq_i = dq_i + scale * jnp.einsum("BKGqs,BKsH->BKGqH", ds, k_j, preferred_element_type=f32)
            dk_j = scale * jnp.einsum("BKGqs,BKGqH->BKsH", ds, q_i, preferred_element_type=f32)
            return dq_i, _add_block(dk, j, dk_j), _add_block(dv, j, dv_j)

        dq_i, dk, dv = jax.lax.fori_loop(0, i + 1, key_block, (jnp.zeros(q_i.shape, f32),) + carry)
        return (dk, dv), dq_i.astype(dt)

    zeros = jnp.zeros(kb.shape, f32)
    (dk, dv), dqb = jax.lax.scan(query_block, (zeros, zeros), (jnp.arange(qb.shape[0]), qb, sb, dob, lse, delta))
    return dqb, dk.astype(kb.dtype), dv.astype(vb.dtype), None


def _add_block(x, j, dx):
    return jax.lax.dynamic_update_index_in_dim(x, jax.lax.dynamic_index_in_dim(x, j, keepdims=False) + dx, j, 0)


_flash.defvjp(_flash_fwd, _flash_bwd)


# ----------------------------------------------------------------------------- with a KV cache


def cached_attention(q_BTNH: jax.Array, keys_BSKH: jax.Array, values_BSKH: jax.Array, index: jax.Array,
                     kv_mask_BS: jax.Array, dt, block: int | None = None) -> jax.Array:
    """T queries at cache slots [index, index + T) over S cache slots (causal by slot, only slots
    that hold real tokens): [B, T, N, H]. Below `block` (default BLOCK) queries, `dense_attention`;
    from it, query blocks of `block` visit the key blocks up to their last slot with an online
    softmax (fp32), so memory is one block of scores, not [B, N, T, S]. No backward: sampling."""
    block = BLOCK if block is None else block
    b, t, n, h = q_BTNH.shape
    s, kh = keys_BSKH.shape[1:3]
    if t < block:
        return dense_attention(q_BTNH, keys_BSKH, values_BSKH, slot_bias(index + jnp.arange(t), kv_mask_BS), dt)
    g = n // kh
    nq, ns = -(-t // block), -(-s // block)

    def blocks(x, count):  # [B, X, ...] -> [count, B, ..., block, H] (heads before the block's slots)
        x = jnp.pad(x, ((0, 0), (0, count * block - x.shape[1])) + ((0, 0),) * (x.ndim - 2))
        x = x.reshape((b, count, block) + x.shape[2:])
        return jnp.moveaxis(x, (1, 2), (0, -2))

    qb = blocks(q_BTNH.reshape(b, t, kh, g, h), nq)  # [nq, B, K, G, block, H]
    kb, vb = blocks(keys_BSKH, ns), blocks(values_BSKH, ns)  # [ns, B, K, block, H]
    mb = jnp.pad(kv_mask_BS, ((0, 0), (0, ns * block - s))).reshape(b, ns, block).transpose(1, 0, 2)

    def query_block(_, xs):
        i, q_i = xs
        last = jnp.minimum((index + (i + 1) * block - 1) // block + 1, ns)  # key blocks at or before its slots
        m, row_sum, acc = _online_softmax(q_i, kb, vb, mb, index + i * block, last, dt, jnp.ones((b, block), bool))
        return None, (acc / row_sum[..., None]).astype(dt)

    _, ob = jax.lax.scan(query_block, None, (jnp.arange(nq), qb))  # [nq, B, K, G, block, H]
    return jnp.moveaxis(ob, (0, -2), (1, 2)).reshape(b, nq * block, n, h)[:, :t]


# ----------------------------------------------------------------------------- platform kernels


def cudnn_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, segments_BT: jax.Array,
                    implementation: str = "cudnn", max_segments: int = 1) -> jax.Array:
    """cuDNN flash attention (`implementation="xla"`: jax's reference of the same call, for tests).

    cuDNN masks by sequence length (real tokens first), not by an arbitrary slot mask (a mask
    argument would become a [B, N, T, T] bias). One segment a row (`max_segments` 1): its real
    tokens must be contiguous, left or right padding, as the trainer and sampler build them. Rows
    are rotated so their real tokens come first, attended with a causal padding mask, and rotated
    back; rotary positions were applied before, so the rotation changes no score. Packed rows
    (`max_segments` > 1, rlver_jax.rl.packing): cuDNN's ragged layout, each row's segments given by
    their first slots and lengths (`segment_runs`), each attended causally on its own; jax's public
    call has no such arguments, so this calls its cuDNN module's (`_cudnn_packed`).

    Inside a mesh context (the trainer's and the sampler's programs) it runs in a `shard_map`, as
    splash does (`kernel_partition`): jax's partitioning rule of the cuDNN call fails on shardings
    that XLA gives its per-row lengths and that no mesh axis expresses (the tiny preset in bf16 on
    8 GPUs, `launch/plan.py --gpu=h100:8`), and each row and head attends on its own anyway.
    """
    def run(q, k, v, segments):  # one shard: [b, T, n, H], [b, T, kh, H], [b, T]
        if max_segments > 1:
            return _cudnn_packed(q, k, v, segments, max_segments, implementation)
        t = q.shape[1]
        mask = segments != 0
        start_B = jnp.argmax(mask, axis=1)  # first real slot (0 for an all-padding row)
        length_B = jnp.maximum(mask.sum(axis=1), 1).astype(jnp.int32)  # >= 1: no empty softmax
        front = (jnp.arange(t)[None, :] + start_B[:, None]) % t  # rotated slot -> original slot
        back = (jnp.arange(t)[None, :] - start_B[:, None]) % t

        def rotate(x, index):
            return jnp.take_along_axis(x, index[:, :, None, None], axis=1)

        out = jax.nn.dot_product_attention(
            rotate(q, front), rotate(k, front), rotate(v, front), is_causal=True,
            query_seq_lengths=length_B, key_value_seq_lengths=length_B, implementation=implementation)
        # Padding rows are zeroed: a NaN there would reach later layers' keys through 0 * NaN.
        return jnp.where(mask[:, :, None, None], rotate(out, back), 0).astype(q.dtype)

    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        rows, heads = kernel_partition(dict(zip(mesh.axis_names, mesh.axis_sizes)), q_BTNH.shape[0],
                                       q_BTNH.shape[2], k_BTKH.shape[2])
        spec = P(rows, None, heads)
        run = jax.shard_map(run, in_specs=(spec, spec, spec, P(rows)), out_specs=spec, check_vma=False)
    return run(q_BTNH, k_BTKH, v_BTKH, segments_BT.astype(jnp.int32))


def segment_runs(segments_BT: jax.Array, max_segments: int) -> tuple[jax.Array, jax.Array]:
    """Each row's runs of one nonzero segment id as cuDNN's packed call takes them: (their first
    slots [B, M + 1], their lengths [B, M]), M = max_segments, -1 past a row's runs. A row of more
    runs than M loses the last ones: the packing caps a row's segments (rlver_jax.rl.packing)."""
    before = jnp.pad(segments_BT[:, :-1], ((0, 0), (1, 0)))
    after = jnp.pad(segments_BT[:, 1:], ((0, 0), (0, 1)))
    real = segments_BT != 0
    first = jax.vmap(lambda r: jnp.nonzero(r, size=max_segments + 1, fill_value=-1)[0])(real & (segments_BT != before))
    last = jax.vmap(lambda r: jnp.nonzero(r, size=max_segments, fill_value=-1)[0])(real & (segments_BT != after))
    return first.astype(jnp.int32), jnp.where(last >= 0, last - first[:, :-1] + 1, -1).astype(jnp.int32)


def _cudnn_packed(q, k, v, segments_BT, max_segments: int, implementation: str):
    """cuDNN's attention over packed rows (its ragged layout: compute capability 9.0, an H100 or
    later); `implementation="xla"`: jax's XLA attention under the mask the same runs describe (a
    padding slot attends itself). Padding slots come out 0."""
    first, lengths = segment_runs(segments_BT, max_segments)
    if implementation == "cudnn":
        from jax._src.cudnn.fused_attention_stablehlo import MaskType
        from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention as packed_call
        out = packed_call(q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=first, kv_offsets=first,
                          scale=q.shape[-1] ** -0.5, mask_type=MaskType.PADDING_CAUSAL)
    else:
        slot = jnp.arange(q.shape[1])
        start, length = first[:, :-1, None], lengths[:, :, None]
        inside = (start >= 0) & (slot >= start) & (slot < start + length)  # [B, M, T]
        run = jnp.where(inside.any(1), jnp.argmax(inside, axis=1), -1)
        same = (run[:, :, None] == run[:, None, :]) & (slot[None, None, :] <= slot[None, :, None])
        mask = jnp.where((run < 0)[:, :, None], slot[None, None, :] == slot[None, :, None], same)
        out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation=implementation)
    return jnp.where((segments_BT != 0)[:, :, None, None], out, 0).astype(q.dtype)


def splash_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, segments_BT: jax.Array,
                     interpret: bool = False) -> jax.Array:
    """Pallas splash attention (TPU; `interpret=True` runs the kernel on CPU, for tests).

    The segment ids (`attend`; a 0/1 mask: 1 real, 0 padding) go to the kernel as its own, and-ed
    with a causal mask, so packed rows are exact, and every query attends at least itself
    (padding attends padding); grouped-query heads go to the kernel as
    they are (N query heads on K kv heads). The kernel takes one sequence; it is vmapped over the
    batch. A Pallas kernel is not partitioned by XLA ("Mosaic kernels cannot be automatically
    partitioned"), so inside a mesh context (the trainer's programs: sharding.jit_sharded) it runs
    in a `shard_map` (`kernel_partition`): rows over the batch axes ('data', 'fsdp'), as many of
    them as divide B, and heads over 'tensor' where it divides both N and K (else each tensor device
    runs every head).
    T is padded to the kernel's tile: 512 where that adds nothing, else 128.
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    b, t, n, h = q_BTNH.shape
    kh = k_BTKH.shape[2]
    tp = -(-t // _SPLASH_BLOCK) * _SPLASH_BLOCK
    block = _SPLASH_LARGE_BLOCK if tp % _SPLASH_LARGE_BLOCK == 0 else _SPLASH_BLOCK
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)

    def heads_first(x):  # [B, T, heads, H] -> [B, heads, Tp, H]
        return jnp.pad(x, ((0, 0), (0, tp - t), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    def run(q, k, v, seg):  # one shard: [b, n, Tp, H], [b, kh, Tp, H], [b, Tp]
        mask = sm.MultiHeadMask([sm.CausalMask((tp, tp))] * q.shape[1])
        kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret)
        return jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=sk.SegmentIds(s, s)))(q, k, v, seg)

    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        rows, heads = kernel_partition(dict(zip(mesh.axis_names, mesh.axis_sizes)), b, n, kh)
        spec = P(rows, heads)  # [B, heads, Tp, H]
        run = jax.shard_map(run, in_specs=(spec, spec, spec, P(rows)), out_specs=spec, check_vma=False)
    seg = jnp.pad(segments_BT.astype(jnp.int32), ((0, 0), (0, tp - t)))
    out = run(heads_first(q_BTNH * (h ** -0.5)), heads_first(k_BTKH), heads_first(v_BTKH), seg)
    return out.transpose(0, 2, 1, 3)[:, :t].astype(q_BTNH.dtype)


def kernel_partition(sizes: dict[str, int], b: int, n: int, kh: int) -> tuple[tuple[str, ...] | None, str | None]:
    """How an attention kernel's shard_map (splash's, cuDNN's) splits B rows of N query and K kv
    heads on a mesh of axis `sizes`: (the rows' axes, the heads' axis), rows over the longest
    prefix of ('data', 'fsdp') whose product divides B, heads over 'tensor' when it divides N and
    K; None where not split (replicated)."""
    batch: tuple[str, ...] = ()
    for axis in ("data", "fsdp"):
        if axis in sizes and b % (math.prod(sizes[a] for a in batch) * sizes[axis]) == 0:
            batch += (axis,)
        else:
            break
    tensor = sizes.get("tensor", 1)
    heads = "tensor" if tensor > 1 and n % tensor == 0 and kh % tensor == 0 else None
    return batch or None, heads
