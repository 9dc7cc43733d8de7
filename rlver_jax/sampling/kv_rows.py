"""The rollout engine's device program (continuous batching): a fixed set of KV-cache rows, each
holding one dialogue's tokens at its own fill level, and each row's decoding state (`RowState`),
both kept on the device between calls.

A row holds its dialogue's tokens contiguously from slot 0, so a token's slot is its position id
and the row's fill is its next position; attention reads a row to its fill (models.row_attention).
`chunk` runs one call: up to `steps` decode steps over the rows it is given, each live row feeding
its last token and drawing the next, until no row is live. A call may carry a prefill piece
(`Feed`): new prompt tokens for rows entering a turn (a row whose prompt no longer extends what
it holds starts writing at the first slot that differs), fed in the call's first step beside the
decoding rows' tokens, in the same forward (the weights read once for both), so no decoding row
stalls while another enters; a row whose prompt ends in its piece draws its first reply token
(column 0) from the piece's last real position in that step and decodes in the call's next
steps. The rows' state stays on the device, so the host can dispatch a call before it has read
the previous one's tokens (rlver_jax.engines.continuous): the decoding rows go on from the device's
state, a row that stopped in the previous call is no longer live.

A call runs over the rows it is given (`rows`: indices, padded to a bucket; a padding index past
the cache's rows reads the last and writes nothing), gathering their state and slots, so a row
waiting for its simulator costs nothing; or, `rows` None, over every row of the cache in order,
gathering nothing. Between calls the host decides which rows enter and leave.

Tokens are drawn as `generation.generate` draws them (`generation.choose`): column c of a reply
from fold_in(its turn key, c), so a dialogue's tokens do not depend on the rows it shares the
cache with, on the chunking or on when it entered. Shapes: R rows and S slots of the cache (grown
by the host), B rows of a call, P rows and C tokens of a prefill piece (bucketed), `steps`
static: a mix of rows never recompiles.

Shape letters as in rlver_jax.sampling.generation, plus R cache rows, B rows of a call, P fed rows,
C tokens of a piece.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.models.row_attention import at_fill
from rlver_jax.sampling.generation import activations_split, choose, params_mesh
from rlver_jax.sampling.settings import SamplingSettings

Params = qwen2.Params


class RowState(NamedTuple):
    """Each cache row's decoding state, on the device between calls (all [R]; key [R, 2])."""

    last: jax.Array  # int32: the token it feeds next
    fill: jax.Array  # int32: its next slot (and position id)
    column: jax.Array  # int32: the reply column it draws next
    limit: jax.Array  # int32: its reply's budget
    key: jax.Array  # uint32 [R, 2]: its turn's key
    live: jax.Array  # bool: a reply in progress


def init_state(rows: int) -> RowState:
    """The state of `rows` empty rows (nothing live)."""
    ints = [jnp.zeros((rows,), jnp.int32) for _ in range(4)]  # a buffer each: the state is donated
    return RowState(*ints, jnp.zeros((rows, 2), jnp.uint32), jnp.zeros((rows,), bool))


class Feed(NamedTuple):
    """A prefill piece for P of a call's rows (all [P]; ids [P, C], keys [P, 2]). A padding entry
    has `place` past the call's rows and count 0."""

    place: jax.Array  # int32: the fed row's index among the call's rows
    starts: jax.Array  # int32: the slot of its first new token (what the row keeps before it stays)
    ids: jax.Array  # int32 [P, C]: the tokens, real ones first
    counts: jax.Array  # int32: how many are real
    keys: jax.Array  # uint32 [P, 2]: its turn's key
    limits: jax.Array  # int32: its reply's budget where the piece ends its prompt (column 0 is drawn), else 0


class Chunk(NamedTuple):
    """A call's output: row b's new tokens are columns [0, emitted[b]) of [B, steps]."""

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


class _Carry(NamedTuple):
    step: jax.Array
    cache: qwen2.KVCache
    out: Chunk
    last: jax.Array  # [B] the token each row feeds next
    fill: jax.Array  # [B] its slot (and position id)
    column: jax.Array  # [B] the reply column it draws next
    limit: jax.Array  # [B]
    key: jax.Array  # [B, 2]
    live: jax.Array  # [B] bool


def _draw(config: Qwen2Config, settings: SamplingSettings, params: Params, c: _Carry, h_BD: jax.Array,
          drawn: jax.Array, fill: jax.Array) -> _Carry:
    """Column c.column of each `drawn` row from its hidden state h_BD (the others: padding), into
    column c.step of the output; the rows' state after it (`fill`: each row's fill after the step)."""
    logits_BV = qwen2.logits_from_hidden(config, params, h_BD[:, None])[:, 0]
    tokens, logp, model_logp = choose(settings, logits_BV, jax.vmap(jax.random.fold_in)(c.key, c.column))
    tokens = jnp.where(drawn, tokens, settings.pad_id).astype(jnp.int32)
    zero = jnp.zeros((), jnp.float32)

    def put(col_BN, val_B):
        return jax.lax.dynamic_update_slice(col_BN, val_B[:, None], (0, c.step))

    out = Chunk(put(c.out.tokens, tokens), put(c.out.logprobs, jnp.where(drawn, logp, zero)),
                put(c.out.model_logprobs, jnp.where(drawn, model_logp, zero)), c.out.emitted + drawn.astype(jnp.int32))
    column = c.column + drawn.astype(jnp.int32)
    stopped = jnp.any(tokens[:, None] == jnp.asarray(settings.stop_ids, jnp.int32), axis=-1) if settings.stop_ids \
        else jnp.zeros_like(drawn)
    return c._replace(step=c.step + 1, out=out, last=jnp.where(drawn, tokens, c.last), fill=fill, column=column,
                      live=drawn & ~stopped & (column < c.limit))


def _decode_step(config: Qwen2Config, settings: SamplingSettings, params: Params, rows_B: jax.Array | None,
                 c: _Carry) -> _Carry:
    """Each live row feeds its last token at its fill and draws its next column."""
    h_B1D, cache = qwen2.hidden_states(config, params, c.last[:, None], None, c.fill[:, None], c.cache,
                                       at_fill(c.fill, c.live.astype(jnp.int32), 1, rows_B))
    return _draw(config, settings, params, c._replace(cache=cache), h_B1D[:, 0], c.live,
                 c.fill + c.live.astype(jnp.int32))


def _mixed_step(config: Qwen2Config, settings: SamplingSettings, params: Params, rows_B: jax.Array | None,
                c: _Carry, feed: Feed) -> _Carry:
    """The first step of a call with a prefill piece: the live rows' tokens and the piece's side by
    side in one forward; the live rows draw their next column, and each fed row whose piece ends
    its prompt draws column 0 from its last real position (its turn's key and budget from the feed)."""
    b, (p, w) = c.last.shape[0], feed.ids.shape
    cache_rows = c.cache.k.shape[1]
    fed_rows = feed.place if rows_B is None else rows_B.at[feed.place].get(mode="fill", fill_value=cache_rows)
    live = c.live & ~jnp.zeros((b,), bool).at[feed.place].set(True, mode="drop")
    feed_slots = feed.starts[:, None] + jnp.arange(w, dtype=jnp.int32)
    ids = jnp.concatenate([c.last, feed.ids.reshape(-1)])[None]
    positions = jnp.concatenate([c.fill, feed_slots.reshape(-1)])[None]
    groups = (at_fill(c.fill, live.astype(jnp.int32), 1, rows_B), at_fill(feed.starts, feed.counts, w, fed_rows))
    h_1MD, cache = qwen2.hidden_states(config, params, ids, None, positions, c.cache, groups)
    h_feed_PWD = h_1MD[0, b:].reshape(p, w, -1)
    h_last_PD = jnp.take_along_axis(h_feed_PWD, jnp.maximum(feed.counts - 1, 0)[:, None, None], axis=1)[:, 0]
    ending = jnp.where((feed.limits > 0) & (feed.counts > 0), feed.place, b)  # rows drawing column 0 (else dropped)
    fed = jnp.where(feed.counts > 0, feed.place, b)
    h_BD = h_1MD[0, :b].at[ending].set(h_last_PD, mode="drop")
    fill = (c.fill + live.astype(jnp.int32)).at[fed].set(feed.starts + feed.counts, mode="drop")
    c = c._replace(cache=cache, column=c.column.at[ending].set(0, mode="drop"),
                   limit=c.limit.at[ending].set(feed.limits, mode="drop"),
                   key=c.key.at[ending].set(feed.keys, mode="drop"))
    return _draw(config, settings, params, c, h_BD, live | jnp.zeros((b,), bool).at[ending].set(True, mode="drop"),
                 fill)


def _chunk_program(config: Qwen2Config, settings: SamplingSettings, mesh, steps: int, params: Params,
                   cache: qwen2.KVCache, state: RowState, rows_B: jax.Array | None, serving_B: jax.Array,
                   feed: Feed | None) -> tuple[qwen2.KVCache, RowState, Chunk, jax.Array]:
    _count_trace()
    b = serving_B.shape[0]
    own = state if rows_B is None else RowState(*(x[rows_B] for x in state))
    empty = Chunk(jnp.full((b, steps), settings.pad_id, jnp.int32), jnp.zeros((b, steps), jnp.float32),
                  jnp.zeros((b, steps), jnp.float32), jnp.zeros((b,), jnp.int32))
    c = _Carry(jnp.zeros((), jnp.int32), cache, empty, own.last, own.fill, own.column, own.limit, own.key,
               own.live & serving_B)
    with activations_split(mesh):
        if feed is not None:
            c = _mixed_step(config, settings, params, rows_B, c, feed)
        c = jax.lax.while_loop(lambda c: (c.step < steps) & jnp.any(c.live),
                               functools.partial(_decode_step, config, settings, params, rows_B), c)
    new = RowState(c.last, c.fill, c.column, c.limit, c.key, c.live)
    if rows_B is not None:  # padding rows (past the cache's rows) write nothing
        new = RowState(*(x.at[rows_B].set(y, mode="drop") for x, y in zip(state, new)))
    return c.cache, new, c.out, c.step


_chunk_jit = jax.jit(_chunk_program, static_argnums=(0, 1, 2, 3), donate_argnums=(5, 6))


def chunk(config: Qwen2Config, settings: SamplingSettings, params: Params, cache: qwen2.KVCache, state: RowState,
          *, rows, serving, feed: Feed | None, steps: int) -> tuple[qwen2.KVCache, RowState, Chunk, jax.Array]:
    """One call over rows of `cache` and `state` (both donated): up to `steps` decode steps, the
    first with `feed`'s prefill piece beside the live rows (the module docstring).

    rows [B] int32: the call's rows (None: every row, in order); serving [B] bool: the rows the
    host still serves (a row it let go is not live, whatever the device's state says); feed: a
    Feed whose `place` indexes the call's rows, or None. A row is live while its column < its
    limit; it feeds its last token at its fill and draws column c from fold_in(its key, c), and
    stops at a stop token or at its limit; the call ends early when no row is live. Returns the
    cache, the state, the Chunk (row b's tokens) and the steps run. Dispatched asynchronously:
    nothing waits for the device until the outputs are read."""
    feed = None if feed is None else Feed(*(jnp.asarray(x) for x in feed))
    return _chunk_jit(config, settings, params_mesh(params), steps, params, cache, state,
                      None if rows is None else jnp.asarray(rows, jnp.int32), jnp.asarray(serving, bool), feed)


@functools.partial(jax.jit, static_argnums=(2, 3))  # a new shape: nothing to donate into
def resize(cache: qwen2.KVCache, state: RowState, rows: int, slots: int) -> tuple[qwen2.KVCache, RowState]:
    """The same cache and state with `rows` rows and `slots` slots (the new ones empty)."""
    extra_r, extra_s = rows - cache.mask.shape[0], slots - cache.mask.shape[1]
    pad = lambda x: jnp.pad(x, ((0, 0), (0, extra_r), (0, extra_s), (0, 0), (0, 0)))  # noqa: E731
    cache = cache._replace(k=pad(cache.k), v=pad(cache.v), mask=jnp.pad(cache.mask, ((0, extra_r), (0, extra_s))))
    return cache, RowState(*(jnp.pad(x, ((0, extra_r),) + ((0, 0),) * (x.ndim - 1)) for x in state))
