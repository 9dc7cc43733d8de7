"""Batched generation on the trainer's own parameters: prefill and decode loop in one jitted program.

`generate` left-pads a batch of prompts to a shape bucket, prefills them into a static-shape KV
cache in one call, then decodes inside a `lax.while_loop` that ends when every row has produced a
stop token or `max_new_tokens` tokens. The cache lives inside the program, so XLA updates the loop
carry in place; nothing crosses the host boundary until the loop ends.

Sampling follows transformers' order: temperature, then top-k, then top-p. A draw is an inverse-CDF
lookup with one uniform per row (blocked, so the vocabulary is read a constant number of times),
which on CPU is an order of magnitude cheaper than Gumbel-max over the whole vocabulary; top-p
finds its threshold by bisection over float bit patterns instead of sorting the vocabulary.

Shape letters as in models/qwen2.py, plus P prompt slots (bucketed), N max new tokens,
C vocabulary blocks of W tokens.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.parallel import sharding
from rlver_jax.sampling.buckets import MIN_PROMPT_BUCKET, bucket
from rlver_jax.sampling.settings import SamplingSettings

Params = qwen2.Params
_BLOCK = 128  # W: vocabulary block of the inverse-CDF draw


class Generation(NamedTuple):
    """Output of `generate` (a pytree). Entries after a row's last token are padding.

    tokens [B, N] int32: new tokens; the stop token, when one ended the row, is its last token,
      followed by `pad_id`.
    logprobs [B, N] f32: log-probability of each token under the distribution it was drawn from
      (after temperature, top-k and top-p); 0 for greedy decoding and after the row's end.
    model_logprobs [B, N] f32: log-probability under the unmodified model (temperature 1, no
      truncation), as PPO's old-policy log-probs; 0 after the row's end.
    lengths [B] int32: number of new tokens per row, the stop token included.
    """

    tokens: jax.Array
    logprobs: jax.Array
    model_logprobs: jax.Array
    lengths: jax.Array


def pad_left(rows: Sequence[Sequence[int]], length: int, pad_id: int,
             batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token rows left-padded to int32 ids [batch, length] and a bool mask of the real tokens;
    rows past len(rows) (batch defaults to it) are all padding."""
    batch = len(rows) if batch is None else batch
    ids = np.full((batch, length), pad_id, np.int32)
    mask = np.zeros((batch, length), bool)
    for b, row in enumerate(rows):
        if len(row):
            ids[b, length - len(row):] = row
            mask[b, length - len(row):] = True
    return ids, mask


def kv_cache_bytes(config: Qwen2Config, prompt_length: int, max_new_tokens: int,
                   length_buckets: Sequence[int] | None = None) -> int:
    """KV-cache bytes per sequence that `generate` allocates for prompts of this length."""
    slots = bucket(prompt_length, length_buckets, MIN_PROMPT_BUCKET) + max_new_tokens
    per_slot = 2 * config.num_layers * config.num_kv_heads * config.head_dim * jnp.dtype(config.jnp_dtype).itemsize
    return slots * per_slot


_traces = 0


def trace_count() -> int:
    """How often the generation program has been traced; each trace is one compilation."""
    return _traces


def generate(
    config: Qwen2Config,
    params: Params,
    prompt_ids: np.ndarray | jax.Array,
    prompt_mask: np.ndarray | jax.Array,
    *,
    max_new_tokens: int,
    rng: jax.Array,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_ids: Sequence[int] = (),
    pad_id: int = 0,
    length_buckets: Sequence[int] | None = None,
    batch_buckets: Sequence[int] | None = None,
    vocab_limit: int = 0,
    limits: Sequence[int] | None = None,
) -> Generation:
    """Generate up to `max_new_tokens` tokens for each row of a LEFT-padded batch of prompts.

    prompt_ids, prompt_mask [B, T]: token ids and 1 for real tokens; each row's real tokens are
    contiguous and end at the last column. rng: a PRNG key, or one key per row (`row_keys`); the
    same keys and inputs give the same output. Rows and columns are padded to the buckets
    (`length_buckets`, `batch_buckets`: sorted sizes, default powers of two), so calls whose shapes
    share a bucket share one compiled program; the sampling settings are static (one program per
    setting). The KV cache holds bucketed prompt length + max_new_tokens slots. Params keep their
    placement: sharded params run sharded.
    limits [B]: each row's own budget, at most max_new_tokens (default: max_new_tokens), so a call
    ends once each row has stopped or reached its own budget.
    """
    settings = SamplingSettings(
        max_new_tokens=max_new_tokens, temperature=float(temperature), top_p=float(top_p),
        top_k=int(top_k), stop_ids=tuple(int(s) for s in stop_ids), pad_id=int(pad_id), vocab_limit=int(vocab_limit))
    ids = np.asarray(prompt_ids)
    mask = np.asarray(prompt_mask).astype(bool)
    if ids.ndim != 2 or ids.shape != mask.shape:
        raise ValueError(f"prompt_ids {ids.shape} and prompt_mask {mask.shape} must both be [batch, length]")
    if np.any(mask[:, :-1] & ~mask[:, 1:]):
        raise ValueError("prompt_mask must be left-padded: each row's real tokens end at the last column")
    b, t = ids.shape
    bb = bucket(b, batch_buckets)
    ids_BP, mask_BP = pad_left([row[m] for row, m in zip(ids, mask)], bucket(t, length_buckets, MIN_PROMPT_BUCKET),
                               settings.pad_id, bb)
    out = _generate_jit(config, settings, params_mesh(params), params, ids_BP, mask_BP, _pad_row_keys(rng, b, bb),
                        _row_limits(limits, settings.max_new_tokens, b, bb))
    return out if bb == b else jax.tree.map(lambda x: x[:b], out)


def _row_limits(limits: Sequence[int] | None, max_new_tokens: int, b: int, rows: int) -> np.ndarray:
    """Each of `rows` rows' budget: `limits` (default max_new_tokens) for the first b, 0 for padding."""
    out = np.zeros(rows, np.int32)
    out[:b] = max_new_tokens if limits is None else np.minimum(np.asarray(limits, np.int32), max_new_tokens)
    return out


def sample_logits(
    logits_BV: jax.Array, key: jax.Array, temperature: float, top_k: int = 0, top_p: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """One draw per row: tokens [B] int32 and their log-probs under the sampling distribution.

    key: one key for the batch, or one per row (`row_keys`).

    temperature 0 is greedy (log-prob 0: the choice is certain). Otherwise logits are divided by
    the temperature, then all but the top_k largest are removed (0: off), then all but the
    smallest set of most likely tokens whose probability reaches top_p (1: off).
    """
    if temperature == 0:
        return _argmax(logits_BV), jnp.zeros(logits_BV.shape[:1], jnp.float32)
    x_BV = logits_BV if temperature == 1 else logits_BV / temperature
    vocab = x_BV.shape[-1]
    if 0 < top_k < vocab:
        # min, not [:, -1]: XLA rewrites a slice of top_k into a full sort of the vocabulary.
        kth_B1 = jnp.min(jax.lax.top_k(x_BV, top_k)[0], axis=-1, keepdims=True)
        x_BV = jnp.where(x_BV >= kth_B1, x_BV, -jnp.inf)
    max_B1 = jnp.max(x_BV, axis=-1, keepdims=True)
    e_BV = jnp.exp(x_BV - max_B1)  # unnormalised probabilities, max 1; removed tokens 0
    if top_p < 1:
        e_BV = jnp.where(e_BV >= _nucleus_threshold(e_BV, top_p), e_BV, 0.0)
    u_B = _uniforms(key, logits_BV.shape[0])
    tokens_B, z_B = _inverse_cdf(e_BV, u_B)
    logp_B = _take(x_BV, tokens_B) - max_B1[:, 0] - jnp.log(z_B)
    return tokens_B, logp_B


def row_keys(rng: jax.Array) -> bool:
    """Whether `rng` holds one key per row ([B] typed keys or [B, 2] raw uint32 keys) rather than
    one key for the whole batch. With row keys a row's draws depend on its own key alone, not on
    the rows it is batched with: a dialogue samples the same tokens in any batch, on any device."""
    typed = jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
    return rng.ndim == (1 if typed else 2)


def _fold_in(rng: jax.Array, data) -> jax.Array:
    if row_keys(rng):
        return jax.vmap(jax.random.fold_in, in_axes=(0, None))(rng, data)
    return jax.random.fold_in(rng, data)


def _uniforms(key: jax.Array, b: int) -> jax.Array:
    """[B] uniforms: one draw from each row's key, or B from one key."""
    if row_keys(key):
        return jax.vmap(lambda k: jax.random.uniform(k, ()))(key)
    return jax.random.uniform(key, (b,))


def _pad_row_keys(rng: jax.Array, b: int, rows: int) -> jax.Array:
    """Row keys for a batch of `b` rows padded to `rows` (padding rows draw from zero keys)."""
    rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
    if not row_keys(rng):
        return rng
    if rng.shape[0] != b:
        raise ValueError(f"{rng.shape[0]} row keys for a batch of {b} rows")
    typed = jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
    data = jax.random.key_data(rng) if typed else rng
    data = jnp.concatenate([data, jnp.zeros((rows - b,) + data.shape[1:], data.dtype)])
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(rng)) if typed else data


def _argmax(x_BV: jax.Array) -> jax.Array:
    """First index of the maximum; two plain reductions, which XLA:CPU vectorises (argmax it does not)."""
    max_B1 = jnp.max(x_BV, axis=-1, keepdims=True)
    iota_V = jnp.arange(x_BV.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(x_BV == max_B1, iota_V, x_BV.shape[-1]), axis=-1)


def _take(x_BV: jax.Array, idx_B: jax.Array) -> jax.Array:
    return jnp.take_along_axis(x_BV, idx_B[:, None], axis=-1)[:, 0]


def _last_positive(x_BM: jax.Array) -> jax.Array:
    """Index of the last entry > 0 per row (0 when none)."""
    return jnp.max(jnp.where(x_BM > 0, jnp.arange(x_BM.shape[-1], dtype=jnp.int32), 0), axis=-1)


def _inverse_cdf(e_BV: jax.Array, u_B: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Draw index i with probability e_i / sum(e) by the uniform u; returns (index [B], sum(e) [B]).

    Two levels: block sums pick the block holding u * sum(e), then a cumulative sum inside that
    block alone picks the token. A zero-probability token is never returned, even when rounding
    puts u * sum(e) at or past the last cumulative sum.
    """
    b, v = e_BV.shape
    c = -(-v // _BLOCK)
    if c * _BLOCK != v:
        e_BV = jnp.pad(e_BV, ((0, 0), (0, c * _BLOCK - v)))
    e_BCW = e_BV.reshape(b, c, _BLOCK)
    sums_BC = jnp.sum(e_BCW, axis=-1)
    cum_BC = jnp.cumsum(sums_BC, axis=-1)
    z_B = cum_BC[:, -1]
    target_B = u_B * z_B
    blk_B = jnp.minimum(jnp.sum(cum_BC <= target_B[:, None], axis=-1, dtype=jnp.int32), _last_positive(sums_BC))
    rest_B = jnp.maximum(target_B - (_take(cum_BC, blk_B) - _take(sums_BC, blk_B)), 0.0)
    e_BW = jnp.take_along_axis(e_BCW, blk_B[:, None, None], axis=1)[:, 0]
    within_B = jnp.sum(jnp.cumsum(e_BW, axis=-1) <= rest_B[:, None], axis=-1, dtype=jnp.int32)
    within_B = jnp.minimum(within_B, _last_positive(e_BW))
    return blk_B * _BLOCK + within_B, z_B


def _nucleus_threshold(e_BV: jax.Array, top_p: float) -> jax.Array:
    """Per row [B, 1], the largest t with sum(e[e >= t]) >= top_p * sum(e): keep tokens with e >= t.

    This is transformers' top-p set (the most likely tokens until their mass reaches top_p, the one
    crossing it included). Bisection over the int32 bit patterns of non-negative floats, which sort
    like the floats, is exact after 31 steps and reads the vocabulary once per step, with no sort.
    """
    goal_B = top_p * jnp.sum(e_BV, axis=-1)
    lo_B = jnp.zeros(goal_B.shape, jnp.int32)  # t = 0 keeps everything: always enough mass
    hi_B = jax.lax.bitcast_convert_type(jnp.max(e_BV, axis=-1), jnp.int32) + 1  # keeps nothing

    def body(_, bounds):
        lo_B, hi_B = bounds
        mid_B = lo_B + (hi_B - lo_B) // 2
        t_B1 = jax.lax.bitcast_convert_type(mid_B, jnp.float32)[:, None]
        enough_B = jnp.sum(jnp.where(e_BV >= t_B1, e_BV, 0.0), axis=-1) >= goal_B
        return jnp.where(enough_B, mid_B, lo_B), jnp.where(enough_B, hi_B, mid_B)

    lo_B, _ = jax.lax.fori_loop(0, 31, body, (lo_B, hi_B))
    return jax.lax.bitcast_convert_type(lo_B, jnp.float32)[:, None]


def choose(settings: SamplingSettings, logits_BV: jax.Array, key: jax.Array):
    """Next tokens, their sampling log-probs and their log-probs under the unmodified model.

    Ids from settings.vocab_limit on are removed before sampling, like top-k's cut; the model's
    log-probs stay over the whole vocabulary, as the trainer recomputes them."""
    limited = 0 < settings.vocab_limit < logits_BV.shape[-1]
    x_BV = logits_BV
    if limited:
        x_BV = jnp.where(jnp.arange(logits_BV.shape[-1]) < settings.vocab_limit, logits_BV, -jnp.inf)
    tokens_B, logp_B = sample_logits(x_BV, key, settings.temperature, settings.top_k, settings.top_p)
    unmodified = settings.temperature == 1 and settings.top_k == 0 and settings.top_p == 1 and not limited
    if unmodified:  # the sampling distribution is the model's: reuse its normaliser
        return tokens_B, logp_B, logp_B
    model_logp_B = _take(logits_BV, tokens_B) - jax.nn.logsumexp(logits_BV, axis=-1)
    return tokens_B, logp_B, model_logp_B


class _Carry(NamedTuple):
    step: jax.Array  # next column to write
    out: Generation
    done_B: jax.Array
    cache: qwen2.KVCache


def _emit(settings: SamplingSettings, rng: jax.Array, step, logits_BV, out: Generation, done_B, limits_B):
    """Choose column `step` of every row still running; finished rows get padding. A row is done
    at a stop token or at its budget (`limits_B`)."""
    tokens_B, logp_B, model_logp_B = choose(settings, logits_BV, _fold_in(rng, step))
    live_B = ~done_B
    tokens_B = jnp.where(live_B, tokens_B, settings.pad_id).astype(jnp.int32)
    zero = jnp.zeros((), jnp.float32)

    def put(col_BN, val_B):
        return jax.lax.dynamic_update_slice(col_BN, val_B[:, None], (0, step))

    out = Generation(
        tokens=put(out.tokens, tokens_B),
        logprobs=put(out.logprobs, jnp.where(live_B, logp_B, zero)),
        model_logprobs=put(out.model_logprobs, jnp.where(live_B, model_logp_B, zero)),
        lengths=out.lengths + live_B.astype(jnp.int32))
    if settings.stop_ids:
        stopped_B = jnp.any(tokens_B[:, None] == jnp.asarray(settings.stop_ids, jnp.int32), axis=-1)
        done_B = done_B | (live_B & stopped_B)
    return out, done_B | (out.lengths >= limits_B)


def _extend_and_decode(config: Qwen2Config, settings: SamplingSettings, params: Params, cache: qwen2.KVCache,
                       ids_BE: jax.Array, mask_BE: jax.Array, start_pos_B: jax.Array, rng: jax.Array,
                       limits_B: jax.Array):
    """Feed each row's new (left-padded) tokens into `cache`, then decode.

    Returns the Generation, the cache, and per row how many of the generated tokens were fed
    back into the cache (every token but those emitted at the loop's last step). Slots of padding
    and of rows that have finished are masked out, so a row's cached tokens are exactly its own.
    """
    global _traces
    _traces += 1  # runs only while tracing: counts compilations
    b = ids_BE.shape[0]
    n = settings.max_new_tokens
    positions_BE = start_pos_B[:, None] + qwen2.positions_from_mask(mask_BE)
    h_BED, cache = qwen2.hidden_states(config, params, ids_BE, mask_BE, positions_BE, cache)
    logits_BV = qwen2.logits_from_hidden(config, params, h_BED[:, -1:])[:, 0]  # left padding: last slot
    new_len_B = jnp.sum(mask_BE, axis=-1, dtype=jnp.int32)
    gen_pos_B = start_pos_B + new_len_B  # position of the first generated token
    empty = Generation(
        tokens=jnp.full((b, n), settings.pad_id, jnp.int32), logprobs=jnp.zeros((b, n), jnp.float32),
        model_logprobs=jnp.zeros((b, n), jnp.float32), lengths=jnp.zeros((b,), jnp.int32))
    out, done_B = _emit(settings, rng, 0, logits_BV, empty, new_len_B == 0, limits_B)  # rows with no input: done

    def cond(c: _Carry):
        return (c.step < n) & ~jnp.all(c.done_B)

    def body(c: _Carry) -> _Carry:
        last_B1 = jax.lax.dynamic_slice_in_dim(c.out.tokens, c.step - 1, 1, axis=1)
        real_B1 = (c.step - 1 < c.out.lengths)[:, None]  # finished rows feed padding: mask it out
        pos_B1 = (gen_pos_B + c.step - 1)[:, None]
        h_B1D, cache = qwen2.hidden_states(config, params, last_B1, real_B1, pos_B1, c.cache)
        logits_BV = qwen2.logits_from_hidden(config, params, h_B1D)[:, 0]
        out, done_B = _emit(settings, rng, c.step, logits_BV, c.out, c.done_B, limits_B)
        return _Carry(c.step + 1, out, done_B, cache)

    final = jax.lax.while_loop(cond, body, _Carry(jnp.ones((), jnp.int32), out, done_B, cache))
    fed_B = jnp.minimum(final.out.lengths, final.step - 1)
    return final.out, final.cache, fed_B


def params_mesh(params: Params) -> jax.sharding.Mesh | None:
    """The mesh that `params` are split over (a sampling copy: SamplingLayout.local), or None."""
    placement = getattr(jax.tree.leaves(params)[0], "sharding", None)
    if isinstance(placement, jax.sharding.NamedSharding) and placement.mesh.size > 1:
        return placement.mesh
    return None


def activations_split(mesh: jax.sharding.Mesh | None):
    """Trace a sampler program with its activations' rows split over the batch axes of the
    parameters' mesh (sharding.split_activations), as the update's are; none on one device."""
    return contextlib.nullcontext() if mesh is None else sharding.split_activations(mesh)


def _generate_program(config: Qwen2Config, settings: SamplingSettings, mesh: jax.sharding.Mesh | None,
                      params: Params, ids_BP: jax.Array, mask_BP: jax.Array, rng: jax.Array,
                      limits_B: jax.Array) -> Generation:
    b, p = ids_BP.shape
    with activations_split(mesh):
        cache = qwen2.init_cache(config, b, p + settings.max_new_tokens)
        out, _, _ = _extend_and_decode(config, settings, params, cache, ids_BP, mask_BP,
                                       jnp.zeros((b,), jnp.int32), rng, limits_B)
    return out


def _continue_program(config: Qwen2Config, settings: SamplingSettings, mesh: jax.sharding.Mesh | None,
                      params: Params, cache: qwen2.KVCache, ids_BE: jax.Array, mask_BE: jax.Array,
                      start_pos_B: jax.Array, rng: jax.Array, limits_B: jax.Array):
    with activations_split(mesh):
        return _extend_and_decode(config, settings, params, cache, ids_BE, mask_BE, start_pos_B, rng, limits_B)


# The mesh is static: the split is fixed at trace time.
_generate_jit = jax.jit(_generate_program, static_argnums=(0, 1, 2))

_continue_jit = jax.jit(_continue_program, static_argnums=(0, 1, 2), donate_argnums=(4,))


def continue_generation(
    config: Qwen2Config,
    params: Params,
    cache: qwen2.KVCache,
    new_ids: np.ndarray,
    new_mask: np.ndarray,
    start_positions: np.ndarray,
    *,
    settings: SamplingSettings,
    rng: jax.Array,
    limits: Sequence[int] | None = None,
) -> tuple[Generation, qwen2.KVCache, jax.Array]:
    """Multi-turn generation that keeps each row's KV cache from call to call.

    new_ids, new_mask [B, E]: each row's tokens not yet in `cache` (left-padded; a row with none
    is skipped), e.g. the end of the previous turn, the user's reply and the next generation
    prompt; start_positions [B]: each row's position id of its first new token. The cache
    (donated) needs room for E + max_new_tokens more slots: see `compact_cache`. Returns the
    Generation, the cache, and per row the number of generated tokens now in the cache (the
    rest, at most the last one, start the next call's new tokens). rng: a key, or one per row of
    the cache (`row_keys`). limits [B]: each row's budget, as `generate`'s.
    """
    b = np.shape(new_ids)[0]
    return _continue_jit(config, settings, params_mesh(params), params, cache, jnp.asarray(new_ids, jnp.int32),
                         jnp.asarray(new_mask, bool), jnp.asarray(start_positions, jnp.int32), rng,
                         _row_limits(limits, settings.max_new_tokens, b, b))


@functools.partial(jax.jit, donate_argnums=(0,))
def compact_cache(cache: qwen2.KVCache) -> qwen2.KVCache:
    """Move each row's cached tokens to the front, in order, freeing the slots of padding and of
    finished rows (attention is by slot mask and slot order, so the results are unchanged)."""
    order_BS = jnp.argsort(~cache.mask, axis=-1, stable=True)
    take = lambda x: jnp.take_along_axis(x, order_BS[None, :, :, None, None], axis=2)  # noqa: E731
    mask = jnp.take_along_axis(cache.mask, order_BS, axis=-1)
    return qwen2.KVCache(k=take(cache.k), v=take(cache.v), mask=mask,
                         index=jnp.max(jnp.sum(mask, axis=-1, dtype=jnp.int32)))


@functools.partial(jax.jit, static_argnums=(1,))  # a new shape: nothing to donate into
def grow_cache(cache: qwen2.KVCache, slots: int) -> qwen2.KVCache:
    """The same cache with `slots` slots (new ones empty): decoding attends over every slot, so
    a multi-turn cache starts small and grows with its dialogues."""
    extra = slots - cache.mask.shape[1]
    pad = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0), (0, 0)))  # noqa: E731
    return qwen2.KVCache(k=pad(cache.k), v=pad(cache.v), mask=jnp.pad(cache.mask, ((0, 0), (0, extra))),
                         index=cache.index)
