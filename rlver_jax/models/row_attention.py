"""Attention of new tokens over the rows of a KV cache, each row at its own fill (the rollout
engine's programs, rlver_jax.sampling.kv_rows; qwen2.Attention with a `RowSlots` index).

A row holds its dialogue's tokens contiguously from slot 0, so its fill is the one number that
masks it: row b's new tokens are written at their slots, then each attends the row's slots
[0, ends[b]) at or before its own. On a TPU the Pallas kernel (models.ragged_attention) reads
each row to its fill; elsewhere (GPU, CPU) `blockwise` runs an online softmax over key blocks up
to the longest fill among the call's rows (a loop with a trip count decided at run time), so a
call reads the slots its rows hold, not every slot of the cache.

Several groups of rows can share one forward (`attend`'s `groups`: a decode step's rows, one new
token each, beside a prefill chunk's, many each): their tokens lie side by side on one flat token
axis, so the projections and the MLP read the weights once for all of them, and each group's
attention runs over its own rows.

Shape letters as in qwen2.py, plus L layers and R rows of the cache.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlver_jax.models import attention, ragged_attention
from rlver_jax.models.attention import NEG_INF


class RowSlots(NamedTuple):
    """Where a group's new tokens go when every row has its own fill: fed row b is cache row
    rows[b] (None: row b, every row of the cache fed, nothing gathered), its T tokens take the
    slots slots[b] (consecutive), and its keys are then the slots [0, ends[b]) (its real new tokens
    end there; padding tokens after them are written past the fill and never read). A write past
    the cache's end, or to a row index past its rows (padding of a bucketed call), is dropped."""

    slots: jax.Array  # int32 [B, T]: the shape carries the group's B and T
    ends: jax.Array  # int32 [B]
    rows: jax.Array | None = None  # int32 [B]

    @property
    def shape(self) -> tuple[int, int]:
        return self.slots.shape

    def cache_rows(self) -> jax.Array:
        """[B, 1] the cache row of each fed row."""
        b = self.slots.shape[0]
        return (jnp.arange(b, dtype=jnp.int32) if self.rows is None else self.rows)[:, None]


def at_fill(starts_B: jax.Array, counts_B: jax.Array, t: int, rows_B: jax.Array | None = None) -> RowSlots:
    """RowSlots of T tokens per row from slot starts[b], the first counts[b] of them real."""
    return RowSlots(starts_B[:, None] + jnp.arange(t, dtype=jnp.int32), starts_B + counts_B, rows_B)


def ragged_kernel(attention_impl: str, dtype, b: int, n: int, kh: int) -> bool:
    """Whether a group of B rows (N query and K kv heads) runs the Pallas kernel: where the model's
    attention resolves to a TPU kernel ("auto" or "splash" on a TPU target) and the kernel reads
    the cache where it lies (one kv head per device: ragged_attention.reads_in_place)."""
    if attention.resolve(attention_impl, 1, dtype) != "splash":
        return False
    mesh = jax.sharding.get_abstract_mesh()
    sizes = {} if mesh.empty else dict(zip(mesh.axis_names, mesh.axis_sizes))
    return ragged_attention.reads_in_place(sizes, b, n, kh)


def attend(q_MNH: jax.Array, k_MKH: jax.Array, v_MKH: jax.Array, k_stack: jax.Array, v_stack: jax.Array,
           layer: jax.Array, groups: tuple[RowSlots, ...], *, attention_impl: str, to_cache, from_cache
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The groups' new tokens (side by side on the flat axis M = sum of B x T, group after group)
    written into layer `layer` of the stacks [L, R, S, K, H], then each group's attention over its
    rows: ([M, N, H] in q's dtype, the stacks). `to_cache` / `from_cache`: the compute dtype as the
    cache holds it and back (qwen2.KVCache)."""
    n, h = q_MNH.shape[1:]
    dt = q_MNH.dtype
    pieces, offset = [], 0
    for g in groups:
        b, t = g.shape
        pieces.append((g, slice(offset, offset + b * t)))
        offset += b * t
    for g, part in pieces:  # every group's keys are in place before any group attends
        b, t = g.shape
        where = (layer, g.cache_rows(), g.slots)
        k_stack = k_stack.at[where].set(to_cache(k_MKH[part].reshape(b, t, *k_MKH.shape[1:])), mode="drop")
        v_stack = v_stack.at[where].set(to_cache(v_MKH[part].reshape(b, t, *v_MKH.shape[1:])), mode="drop")
    outs = []
    for g, part in pieces:
        b, t = g.shape
        q = q_MNH[part].reshape(b, t, n, h)
        if ragged_kernel(attention_impl, dt, b, n, k_stack.shape[3]):
            out = ragged_attention.partitioned(q, k_stack, v_stack, layer, g.rows, g.slots[:, 0], g.ends)
        else:
            out = blockwise(q, k_stack, v_stack, layer, g, dt, from_cache)
        outs.append(out.reshape(b * t, n, h))
    return jnp.concatenate(outs) if len(outs) > 1 else outs[0], k_stack, v_stack


def blockwise(q_BTNH: jax.Array, k_stack: jax.Array, v_stack: jax.Array, layer: jax.Array, where: RowSlots, dt,
              from_cache) -> jax.Array:
    """Row b's T queries (slots where.slots[b]) over its cache row's slots [0, where.ends[b]) of layer
    `layer`: [B, T, N, H]. An online softmax (running max, sum and accumulator in fp32) over key
    blocks of ragged_attention.key_block slots, as many as the longest fill among the rows needs;
    a block past a row's own fill adds exactly nothing to it (its scores are masked: a factor of
    exactly 1 and a sum of exact zeros), so a row's numbers do not depend on the rows beside it."""
    b, t, n, h = q_BTNH.shape
    s, kh = k_stack.shape[2:4]
    g = n // kh
    bs = ragged_attention.key_block(s, t * g)
    q_BKMH = q_BTNH.reshape(b, t, kh, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, h)
    q_slot_BM = jnp.tile(where.slots, (1, g))  # query row m = (group, token): token m % T
    f32 = jnp.float32

    def keys(stack: jax.Array, first: jax.Array) -> jax.Array:  # [B, bs, K, H] of the block from slot `first`
        if where.rows is None:
            block = jax.lax.dynamic_slice(stack, (layer, 0, first, 0, 0), (1, b, bs, kh, h))[0]
        else:  # a padding row past the cache's rows reads the last (clamped), for an output nobody reads
            block = stack[layer, where.rows[:, None], first + jnp.arange(bs)]
        return from_cache(block, dt)

    def key_block(j, carry):
        m, row_sum, acc = carry
        first = jnp.minimum(j * bs, s - bs)  # a last block running past S starts earlier: its earlier slots are counted
        slot = first + jnp.arange(bs)
        held_BS = (slot >= j * bs) & (slot < where.ends[:, None])
        scores = jnp.einsum("BKMH,BSKH->BKMS", q_BKMH, keys(k_stack, first), preferred_element_type=f32)
        allowed = held_BS[:, None, None, :] & (slot <= q_slot_BM[:, None, :, None])
        scores = jnp.where(allowed, scores * (h ** -0.5), NEG_INF)
        # Slots past a row's fill hold unspecified values, maybe NaN bits: 0 x NaN is NaN.
        values = jnp.where(held_BS[:, :, None, None], keys(v_stack, first), 0)
        m_new = jnp.maximum(m, scores.max(-1))
        p = jnp.exp(scores - m_new[..., None])
        corr = jnp.exp(m - m_new)
        pv = jnp.einsum("BKMS,BSKH->BKMH", p.astype(dt), values, preferred_element_type=f32)
        return m_new, row_sum * corr + p.sum(-1), acc * corr[..., None] + pv

    blocks = (jnp.max(where.ends) + bs - 1) // bs
    init = (jnp.full((b, kh, g * t), NEG_INF, f32), jnp.zeros((b, kh, g * t), f32), jnp.zeros((b, kh, g * t, h), f32))
    _, row_sum, acc = jax.lax.fori_loop(0, blocks, key_block, init)
    out = (acc / jnp.where(row_sum > 0, row_sum, 1)[..., None]).astype(dt)  # no block read (every row empty): 0
    return out.reshape(b, kh, g, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)
