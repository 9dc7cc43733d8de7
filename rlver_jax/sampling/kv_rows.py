"""The rollout engine's device programs (continuous batching): a fixed set of KV-cache rows, each
holding one dialogue's tokens at its own fill level, fed and decoded apart from the others.

A row holds its dialogue's tokens contiguously from slot 0, so a token's slot is its position id
and the row's fill is its next position. `prefill` writes a chunk of new tokens into the rows
entering a turn (a row whose prompt no longer extends what it holds starts writing at the first
slot that differs, the slots after it cleared) and draws each one's first token from the chunk's
last real position; `decode` runs up to `steps` decode steps, each row with a reply in progress
feeding its last token and drawing the next, until no row is live. Each runs over the rows it is
given (`rows`: indices, padded to a power of two; a padding index past the cache's rows writes
nothing), gathering their slots, so a row waiting for its simulator costs nothing; or, `rows`
None, over every row of the cache in order, gathering nothing (a row with nothing to do writes
only masked-out slots past what it holds). Between calls the host (rlver_jax.engines.continuous)
decides which rows enter and leave.

Tokens are drawn as `generation.generate` draws them (`generation.choose`): column c of a reply
from fold_in(its turn key, c), so a dialogue's tokens do not depend on the rows it shares the
cache with, on the chunking or on when it entered. Shapes: R rows and S slots of the cache (grown
by the host in buckets), C tokens a prefill chunk (bucketed), `steps` static: a mix of rows never
recompiles.

Shape letters as in rlver_jax.sampling.generation, plus R cache rows, B rows of a call, C chunk
tokens.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.sampling.generation import activations_split, choose, params_mesh
from rlver_jax.sampling.settings import SamplingSettings

Params = qwen2.Params


class Draw(NamedTuple):
    """One token per row: id, sampling log-prob, model log-prob (as generation.Generation)."""

    tokens: jax.Array
    logprobs: jax.Array
    model_logprobs: jax.Array


class Chunk(NamedTuple):
    """A decode chunk's output: row r's new tokens are columns [0, emitted[r]) of [R, steps]."""

    tokens: jax.Array
    logprobs: jax.Array
    model_logprobs: jax.Array
    emitted: jax.Array


_traces = 0


def trace_count() -> int:
    """How often an engine program has been traced; each trace is one compilation."""
    return _traces


def _count_trace() -> None:
    global _traces
    _traces += 1  # runs only while tracing


def _column_keys(keys: jax.Array, columns: jax.Array) -> jax.Array:
    """Each row's key of the column it draws: fold_in(turn key, column), as generation draws column c."""
    return jax.vmap(jax.random.fold_in)(keys, columns)


def _prefill_program(config: Qwen2Config, settings: SamplingSettings, mesh, params: Params, cache: qwen2.KVCache,
                     rows_B: jax.Array | None, starts_B: jax.Array, ids_BC: jax.Array, counts_B: jax.Array,
                     keys_B: jax.Array) -> tuple[qwen2.KVCache, Draw]:
    _count_trace()
    c, s = ids_BC.shape[1], cache.mask.shape[1]
    where = qwen2.RowSlots(starts_B, rows_B)
    with activations_split(mesh):
        # Slots from the chunk's start on hold nothing of the row any more (a rewound history).
        kept_BS = where.fed(cache.mask) & (jnp.arange(s) < starts_B[:, None])
        cache = cache._replace(mask=kept_BS if rows_B is None else cache.mask.at[rows_B].set(kept_BS, mode="drop"))
        real_BC = jnp.arange(c) < counts_B[:, None]
        positions_BC = starts_B[:, None] + jnp.arange(c, dtype=jnp.int32)
        h_BCD, cache = qwen2.hidden_states(config, params, ids_BC, real_BC, positions_BC, cache, where)
        last_B = jnp.maximum(counts_B - 1, 0)
        h_B1D = jnp.take_along_axis(h_BCD, last_B[:, None, None], axis=1)
        logits_BV = qwen2.logits_from_hidden(config, params, h_B1D)[:, 0]
        draw = Draw(*choose(settings, logits_BV, _column_keys(keys_B, jnp.zeros_like(counts_B))))
    return cache, draw


class _Carry(NamedTuple):
    step: jax.Array
    cache: qwen2.KVCache
    out: Chunk
    last: jax.Array  # [B] the token each row feeds next
    lengths: jax.Array  # [B] its slot (and position id)
    columns: jax.Array  # [B] the reply column it draws next
    live: jax.Array  # [B] bool


def _decode_program(config: Qwen2Config, settings: SamplingSettings, mesh, steps: int, params: Params,
                    cache: qwen2.KVCache, rows_B: jax.Array | None, last_B: jax.Array, lengths_B: jax.Array,
                    columns_B: jax.Array, limits_B: jax.Array, keys_B: jax.Array
                    ) -> tuple[qwen2.KVCache, Chunk, jax.Array]:
    _count_trace()
    b = last_B.shape[0]
    stop_ids = jnp.asarray(settings.stop_ids, jnp.int32)

    def body(c: _Carry) -> _Carry:
        live = c.live
        h_B1D, cache = qwen2.hidden_states(config, params, c.last[:, None], live[:, None], c.lengths[:, None],
                                           c.cache, qwen2.RowSlots(c.lengths, rows_B))
        logits_BV = qwen2.logits_from_hidden(config, params, h_B1D)[:, 0]
        tokens, logp, model_logp = choose(settings, logits_BV, _column_keys(keys_B, c.columns))
        tokens = jnp.where(live, tokens, settings.pad_id).astype(jnp.int32)
        zero = jnp.zeros((), jnp.float32)

        def put(col_BN, val_B):
            return jax.lax.dynamic_update_slice(col_BN, val_B[:, None], (0, c.step))

        out = Chunk(put(c.out.tokens, tokens), put(c.out.logprobs, jnp.where(live, logp, zero)),
                    put(c.out.model_logprobs, jnp.where(live, model_logp, zero)),
                    c.out.emitted + live.astype(jnp.int32))
        columns = c.columns + live.astype(jnp.int32)
        stopped = jnp.any(tokens[:, None] == stop_ids, axis=-1) if settings.stop_ids else jnp.zeros_like(live)
        return _Carry(c.step + 1, cache, out, jnp.where(live, tokens, c.last), c.lengths + live.astype(jnp.int32),
                      columns, live & ~stopped & (columns < limits_B))

    empty = Chunk(jnp.full((b, steps), settings.pad_id, jnp.int32), jnp.zeros((b, steps), jnp.float32),
                  jnp.zeros((b, steps), jnp.float32), jnp.zeros((b,), jnp.int32))
    with activations_split(mesh):
        final = jax.lax.while_loop(lambda c: (c.step < steps) & jnp.any(c.live), body,
                                   _Carry(jnp.zeros((), jnp.int32), cache, empty, last_B, lengths_B, columns_B,
                                          columns_B < limits_B))
    return final.cache, final.out, final.step


_prefill_jit = jax.jit(_prefill_program, static_argnums=(0, 1, 2), donate_argnums=(4,))
_decode_jit = jax.jit(_decode_program, static_argnums=(0, 1, 2, 3), donate_argnums=(5,))


def _rows(rows):
    return None if rows is None else jnp.asarray(rows, jnp.int32)


def prefill(config: Qwen2Config, settings: SamplingSettings, params: Params, cache: qwen2.KVCache, *, rows, starts,
            ids, counts, keys) -> tuple[qwen2.KVCache, Draw]:
    """Feed a chunk of new tokens into rows of `cache` (donated) and draw each fed row's first
    reply token (column 0) from its last real position.

    rows [B] int32: the fed rows (the module docstring; None: every row, in order). starts, counts
    [B] int32: the slot of each one's first new token (its slots from there on are cleared first;
    a row with nothing to feed: its fill, clearing nothing) and how many of its C tokens are real;
    ids [B, C] int32: the tokens, real ones first; keys [B, 2] uint32: each one's turn key. The
    draw is meaningful for the rows whose prompt this chunk ends.
    """
    return _prefill_jit(config, settings, params_mesh(params), params, cache, _rows(rows),
                        jnp.asarray(starts, jnp.int32), jnp.asarray(ids, jnp.int32), jnp.asarray(counts, jnp.int32),
                        jnp.asarray(keys))


def decode(config: Qwen2Config, settings: SamplingSettings, params: Params, cache: qwen2.KVCache, *, rows, last,
           lengths, columns, limits, keys, steps: int) -> tuple[qwen2.KVCache, Chunk, jax.Array]:
    """Up to `steps` decode steps over rows of `cache` (donated; rows [B] as `prefill`'s): a row is
    live while columns < limits (one with no reply in progress: limits 0); it feeds its `last`
    token at slot `lengths` and draws reply column `columns` from fold_in(its key, column), and
    stops at a stop token or at `limits` columns; the loop ends early when no row is live. All [B]
    int32 (keys [B, 2] uint32). Returns the cache, the Chunk (row b's tokens) and the steps run."""
    return _decode_jit(config, settings, params_mesh(params), steps, params, cache, _rows(rows),
                       jnp.asarray(last, jnp.int32),
                       jnp.asarray(lengths, jnp.int32), jnp.asarray(columns, jnp.int32),
                       jnp.asarray(limits, jnp.int32), jnp.asarray(keys))


@functools.partial(jax.jit, static_argnums=(1, 2))  # a new shape: nothing to donate into
def resize(cache: qwen2.KVCache, rows: int, slots: int) -> qwen2.KVCache:
    """The same cache with `rows` rows and `slots` slots (the new ones empty)."""
    extra_r, extra_s = rows - cache.mask.shape[0], slots - cache.mask.shape[1]
    pad = lambda x: jnp.pad(x, ((0, 0), (0, extra_r), (0, extra_s), (0, 0), (0, 0)))  # noqa: E731
    return cache._replace(k=pad(cache.k), v=pad(cache.v), mask=jnp.pad(cache.mask, ((0, extra_r), (0, extra_s))))
