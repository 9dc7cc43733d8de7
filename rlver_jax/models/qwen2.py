"""Qwen2 / Qwen2.5 (and Llama-family) decoder in Flax linen, used functionally.

Parameters are a plain nested-dict pytree; every function here is pure. Each parameter carries
logical axis names (see `logical_axes`) so sharding is a table of rules elsewhere, never code here.

Shape letters: B batch, T new tokens, S key/value slots (cache length or T), D model width,
N query heads, K kv heads, G = N // K query heads per kv head, H head dim, F mlp width,
V vocab, L layers.

Attention masking is by slot: a query at slot q attends to slot s when s <= q and slot s holds a
real token (`kv_mask`). Left-padded batches therefore need no special casing, and the same code
serves a full forward (slots = the T tokens) and incremental decoding with a KV cache. Without a
cache the mask may be segment ids instead (rows packed end to end: rlver_jax.models.attention.attend).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlver_jax.models import attention, row_attention
from rlver_jax.models.config import Qwen2Config

Params = Any  # nested dict of arrays


class KVCache(NamedTuple):
    """Static-shape cache of keys and values for incremental decoding.

    k, v: [L, B, S, K, H] in the compute dtype; a 16-bit one (bf16) is held as its raw bits
    (uint16), because XLA:CPU runs a bf16 dynamic_update_slice in fp32, converting the whole cache
    to fp32 and back in every layer of every decode step, where on the bits it updates in place.
    mask: [B, S] bool, slots that hold real tokens;
    index: int32 scalar, the next slot to write (shared by all rows: batches are left-padded).
    A caller that fills each row on its own (row_attention.RowSlots: the rollout engine) tracks
    the rows' fills itself: `mask` and `index` are then left as they are.
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    index: jax.Array


def init_cache(config: Qwen2Config, batch: int, max_len: int) -> KVCache:
    """An empty cache of `max_len` slots per row."""
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    k, v = (_to_cache(jnp.zeros(shape, config.jnp_dtype)) for _ in "kv")  # two buffers: a cache is donated
    return KVCache(k=k, v=v, mask=jnp.zeros((batch, max_len), bool), index=jnp.zeros((), jnp.int32))


def _to_cache(x: jax.Array) -> jax.Array:
    """Values of the compute dtype as the cache holds them (see KVCache)."""
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if x.dtype.itemsize == 2 else x


def _from_cache(x: jax.Array, dtype) -> jax.Array:
    return jax.lax.bitcast_convert_type(x, dtype) if x.dtype == jnp.uint16 else x.astype(dtype)


class _StackCache(NamedTuple):
    """The whole stack's cache as it passes through the layers: `layer` is the index of the layer
    it enters next; k, v [L, B, S, K, H]. Each layer writes its new slots in place (one
    dynamic_update_slice into the stack), so a decode step never copies the cache."""

    layer: jax.Array
    k: jax.Array
    v: jax.Array


def _param(module: nn.Module, name: str, shape, names, init):
    cfg = module.config
    return module.param(name, nn.with_logical_partitioning(init, names), shape, cfg.jnp_param_dtype)


def _normal(config: Qwen2Config):
    return nn.initializers.normal(config.initializer_range)


def _dense(x: jax.Array, w: jax.Array, in_dims: int = 1, out_dtype=None) -> jax.Array:
    """x [M, *in] @ w [*in, *out] -> [M, *out] over a flat token axis M.

    Accumulates in fp32 and casts to `out_dtype` (default: x's dtype): XLA:CPU runs a matmul
    with bf16 outputs on a slow path (several times slower than fp32 out plus a cast; see
    docs/benchmarks.md, Generation). Not an einsum over [B, T, ...]: XLA's CPU backend lays out
    the backward pass of a matmul with two token axes with extra transposes (flat is faster; see
    benchmarks/train_step.py). On CPU one 2-D matmul of `w` reshaped; on TPU and GPU a
    dot_general on `w` as it is: a head axis of 7 (Qwen2.5-7B's 28 heads over 4 devices) does not
    fill the TPU's (8, 128) tiles, so reshaping [D, 7, H] to [D, 7H] is a relayout, which the TPU
    compiler does once per decode call for the stacked layers and then copies each layer's slice
    every step (0.7 GB per decode step of the 7B plan; docs/sharding.md).
    """
    m, out_shape = x.shape[0], w.shape[in_dims:]
    if attention.target_platform() != "cpu":
        contract = (tuple(range(1, in_dims + 1)), tuple(range(in_dims)))
        y = jax.lax.dot_general(x.reshape((m,) + w.shape[:in_dims]), w, (contract, ((), ())),
                                preferred_element_type=jnp.float32)
        return y.astype(out_dtype or x.dtype)
    w_2d = w.reshape(math.prod(w.shape[:in_dims]), math.prod(out_shape))
    y = jnp.dot(x.reshape(m, -1), w_2d, preferred_element_type=jnp.float32)
    return y.astype(out_dtype or x.dtype).reshape((m,) + out_shape)


class RMSNorm(nn.Module):
    config: Qwen2Config

    @nn.compact
    def __call__(self, x):
        scale = _param(self, "scale", (x.shape[-1],), ("norm",), nn.initializers.ones)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.config.rms_norm_eps)
        return (y * scale.astype(jnp.float32)).astype(self.config.jnp_dtype)


def rope_frequencies(config: Qwen2Config) -> jax.Array:
    """RoPE's inverse frequencies [H/2] in fp32: plain, or rescaled by `config.rope_scaling` (llama3) in
    transformers' own order of fp32 operations (modeling_rope_utils._compute_llama3_parameters)."""
    h = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
    s = config.rope_scaling
    if s is None:
        return inv_freq
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = ((s.original_max_position_embeddings / wavelen - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor))
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return jnp.where(medium, smoothed, scaled)


def rotary(x_BTNH: jax.Array, positions_BT: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding, half-split layout (as in Hugging Face Qwen2 and Llama), computed in fp32."""
    h = x_BTNH.shape[-1]
    angles_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq
    cos = jnp.cos(angles_BTh)[:, :, None, :]
    sin = jnp.sin(angles_BTh)[:, :, None, :]
    x = x_BTNH.astype(jnp.float32)
    x1, x2 = x[..., : h // 2], x[..., h // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTNH.dtype)


def _bias(module: nn.Module, name: str, shape, names, enabled: bool) -> jax.Array | None:
    """A zero-initialised bias parameter, or None where the architecture has none (no leaf at all)."""
    return _param(module, name, shape, names, nn.initializers.zeros) if enabled else None


def _add(y: jax.Array, bias: jax.Array | None) -> jax.Array:
    return y if bias is None else y + bias.astype(y.dtype)


class Attention(nn.Module):
    config: Qwen2Config
    max_segments: int = 1  # without a cache: the most segments a row holds (attention.attend)

    @nn.compact
    def __call__(self, x_BTD, positions_BT, kv_mask_BS, cache: _StackCache | None, index):
        cfg = self.config
        d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        dt = cfg.jnp_dtype
        init = _normal(cfg)
        wq = _param(self, "q_kernel", (d, n, h), ("embed", "heads", "head_dim"), init)
        bq = _bias(self, "q_bias", (n, h), ("heads", "head_dim"), cfg.attention_bias)
        wk = _param(self, "k_kernel", (d, k, h), ("embed", "kv_heads", "head_dim"), init)
        bk = _bias(self, "k_bias", (k, h), ("kv_heads", "head_dim"), cfg.attention_bias)
        wv = _param(self, "v_kernel", (d, k, h), ("embed", "kv_heads", "head_dim"), init)
        bv = _bias(self, "v_bias", (k, h), ("kv_heads", "head_dim"), cfg.attention_bias)
        wo = _param(self, "o_kernel", (n, h, d), ("heads", "head_dim", "embed"), init)
        bo = _bias(self, "o_bias", (d,), ("embed",), cfg.o_bias)

        b, t = x_BTD.shape[:2]
        x_MD = x_BTD.reshape(b * t, d)
        q = _add(_dense(x_MD, wq.astype(dt)).reshape(b, t, n, h), bq)
        kk = _add(_dense(x_MD, wk.astype(dt)).reshape(b, t, k, h), bk)
        vv = _add(_dense(x_MD, wv.astype(dt)).reshape(b, t, k, h), bv)
        inv_freq = rope_frequencies(cfg)
        q = rotary(q, positions_BT, inv_freq)
        kk = rotary(kk, positions_BT, inv_freq)

        if cache is None:  # no cache: the keys are exactly the new tokens, slot = index
            out = attention.attend(q, kk, vv, kv_mask_BS, cfg.attention, self.max_segments)
        elif isinstance(index, tuple):  # rows at their own fills: a RowSlots, or groups of them side by side
            groups = (index,) if isinstance(index, row_attention.RowSlots) else index
            out, k_stack, v_stack = row_attention.attend(
                q.reshape(b * t, n, h), kk.reshape(b * t, k, h), vv.reshape(b * t, k, h), cache.k, cache.v,
                cache.layer, groups, attention_impl=cfg.attention, to_cache=_to_cache, from_cache=_from_cache)
            cache = cache._replace(k=k_stack, v=v_stack)
            out = out.reshape(b, t, n, h)
        else:
            def write(stack, new_BTKH):  # in place, in the whole stack's cache
                return jax.lax.dynamic_update_slice(stack, _to_cache(new_BTKH[None]), (cache.layer, 0, index, 0, 0))

            cache = cache._replace(k=write(cache.k, kk), v=write(cache.v, vv))
            keys, values = _from_cache(cache.k[cache.layer], dt), _from_cache(cache.v[cache.layer], dt)
            out = attention.cached_attention(q, keys, values, index, kv_mask_BS, dt)
        return _add(_dense(out.reshape(b * t, n, h), wo.astype(dt), in_dims=2), bo).reshape(b, t, d), cache


class MLP(nn.Module):
    config: Qwen2Config

    @nn.compact
    def __call__(self, x_BTD):
        cfg = self.config
        d, f, dt = cfg.hidden_size, cfg.intermediate_size, cfg.jnp_dtype
        init = _normal(cfg)
        wg = _param(self, "gate_kernel", (d, f), ("embed", "mlp"), init)
        wu = _param(self, "up_kernel", (d, f), ("embed", "mlp"), init)
        wd = _param(self, "down_kernel", (f, d), ("mlp", "embed"), init)
        bg, bu = (_bias(self, name, (f,), ("mlp",), cfg.mlp_bias) for name in ("gate_bias", "up_bias"))
        bd = _bias(self, "down_bias", (d,), ("embed",), cfg.mlp_bias)
        wg, wu, wd = wg.astype(dt), wu.astype(dt), wd.astype(dt)

        def mlp(x_BCD):
            x_MD = x_BCD.reshape(-1, d)
            gated = nn.silu(_add(_dense(x_MD, wg), bg)) * _add(_dense(x_MD, wu), bu)
            return _add(_dense(gated, wd), bd).reshape(x_BCD.shape)

        b, t = x_BTD.shape[:2]
        chunk = _chunk_length(t, cfg.mlp_chunk)
        if chunk == t:
            return mlp(x_BTD)
        # Chunks of each row's tokens (the batch axis stays whole, so its split is kept); each
        # chunk is rematerialised, so the backward holds one chunk's [B, C, F] at a time.
        x_NBCD = x_BTD.reshape(b, t // chunk, chunk, d).swapaxes(0, 1)
        y_NBCD = jax.lax.map(jax.checkpoint(mlp), x_NBCD)
        return y_NBCD.swapaxes(0, 1).reshape(b, t, d)


def _chunk_length(t: int, limit: int) -> int:
    """The largest divisor of t that is at most `limit` (t itself when limit is 0 or >= t)."""
    if not limit or limit >= t:
        return t
    return max(c for c in range(1, limit + 1) if t % c == 0)


class DecoderLayer(nn.Module):
    """One layer on the carry (x [B, T, D], the stack's cache or None); the same carry form in the
    scanned and the unrolled stack, so both update the cache in place."""

    config: Qwen2Config
    max_segments: int = 1

    @nn.compact
    def __call__(self, carry, positions_BT, kv_mask_BS, index):
        x_BTD, cache = carry
        attn_out, cache = Attention(self.config, self.max_segments, name="attn")(
            RMSNorm(self.config, name="input_norm")(x_BTD), positions_BT, kv_mask_BS, cache, index)
        x_BTD = x_BTD + attn_out
        x_BTD = x_BTD + MLP(self.config, name="mlp")(RMSNorm(self.config, name="post_attn_norm")(x_BTD))
        if cache is not None:
            cache = cache._replace(layer=cache.layer + 1)
        return (x_BTD, cache), None


def _layer_class(config: Qwen2Config):
    if config.remat == "none":
        return DecoderLayer
    policy = None if config.remat == "full" else jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims
    # index is a traced scalar and the carry's cache may be None: mark nothing static.
    return nn.remat(DecoderLayer, policy=policy, prevent_cse=not config.scan_layers)


class Qwen2(nn.Module):
    """The decoder stack; `__call__` returns final-normed hidden states and the updated cache."""

    config: Qwen2Config
    max_segments: int = 1  # without a cache: the most segments a row holds (attention.attend)

    def setup(self):
        cfg = self.config
        self.embed = nn.Embed(
            cfg.vocab_size, cfg.hidden_size, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_param_dtype,
            embedding_init=nn.with_logical_partitioning(_normal(cfg), ("vocab", "embed")))
        layer = _layer_class(cfg)
        if cfg.scan_layers:
            self.layers = nn.scan(
                layer, variable_axes={"params": 0}, split_rngs={"params": True},
                in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"})(cfg, self.max_segments, name="layers")
        else:
            self.layers = [layer(cfg, self.max_segments, name=f"layer_{i}") for i in range(cfg.num_layers)]
        self.final_norm = RMSNorm(cfg)
        if cfg.untied_lm_head:
            self.lm_head = self.param(
                "lm_head", nn.with_logical_partitioning(_normal(cfg), ("embed", "vocab")),
                (cfg.hidden_size, cfg.vocab_size), cfg.jnp_param_dtype)
        if cfg.value_head:
            self.value_kernel = self.param(
                "value_kernel", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                (cfg.hidden_size,), jnp.float32)
            self.value_bias = self.param(
                "value_bias", nn.with_logical_partitioning(nn.initializers.zeros, ()), (), jnp.float32)

    def __call__(self, input_ids_BT, positions_BT, kv_mask_BS, cache_kv, index):
        cache = None if cache_kv is None else _StackCache(jnp.zeros((), jnp.int32), *cache_kv)
        carry = (self.embed(input_ids_BT), cache)
        if self.config.scan_layers:
            carry, _ = self.layers(carry, positions_BT, kv_mask_BS, index)
        else:
            for layer in self.layers:
                carry, _ = layer(carry, positions_BT, kv_mask_BS, index)
        x, cache = carry
        return self.final_norm(x), None if cache is None else (cache.k, cache.v)

    def logits(self, h_BTD):
        """LM-head logits in fp32 (matmul in the compute dtype, fp32 accumulation)."""
        dt = self.config.jnp_dtype
        b, t, d = h_BTD.shape
        h_MD = h_BTD.astype(dt).reshape(b * t, d)
        if self.config.tie_word_embeddings:
            # Contract the table's D axis where it lies: a dot with `embedding.T` makes XLA:CPU
            # convert the whole bf16 table to fp32 on every call (docs/benchmarks.md, Generation).
            logits = jax.lax.dot_general(h_MD, self.embed.embedding.astype(dt), (((1,), (1,)), ((), ())),
                                         preferred_element_type=jnp.float32)
        else:
            logits = _dense(h_MD, self.lm_head.astype(dt), out_dtype=jnp.float32)
        return logits.reshape(b, t, -1)

    def values(self, h_BTD):
        """Scalar value per position in fp32 (PPO critic)."""
        return jnp.einsum("BTD,D->BT", h_BTD.astype(jnp.float32), self.value_kernel) + self.value_bias


# ----------------------------------------------------------------------------- functional API


def _boxed_init(config: Qwen2Config, rng: jax.Array):
    ids = jnp.zeros((1, 1), jnp.int32)
    return Qwen2(config).init(rng, ids, ids, jnp.ones((1, 1), bool), None, 0)["params"]


def init_params(config: Qwen2Config, rng: jax.Array) -> Params:
    """Random parameters (normal(initializer_range) kernels, zero biases, unit norms) as a plain pytree."""
    return nn.meta.unbox(_boxed_init(config, rng))


def abstract_params(config: Qwen2Config) -> Params:
    """Shapes and dtypes of the parameters, without allocating them."""
    return nn.meta.unbox(jax.eval_shape(lambda: _boxed_init(config, jax.random.key(0))))


def logical_axes(config: Qwen2Config) -> Params:
    """A PartitionSpec of logical axis names for every parameter (same tree as the params)."""
    boxed = jax.eval_shape(lambda: _boxed_init(config, jax.random.key(0)))
    return nn.get_partition_spec(boxed)


def positions_from_mask(attention_mask_BT: jax.Array) -> jax.Array:
    """Position ids that skip left padding: 0 at each row's first real token."""
    return jnp.maximum(jnp.cumsum(attention_mask_BT.astype(jnp.int32), axis=-1) - 1, 0)


def hidden_states(
    config: Qwen2Config,
    params: Params,
    input_ids: jax.Array,
    attention_mask: jax.Array | None = None,
    position_ids: jax.Array | None = None,
    cache: KVCache | None = None,
    row_slots: row_attention.RowSlots | tuple[row_attention.RowSlots, ...] | None = None,
    max_segments: int = 1,
) -> tuple[jax.Array, KVCache | None]:
    """Final-normed hidden states [B, T, D] (compute dtype) and the updated cache.

    attention_mask [B, T]: 1 for real tokens, 0 for padding (default all ones); without a cache it
    may hold segment ids instead (rows packed end to end, at most `max_segments` a row: each
    attends only its own tokens; attention.attend), with position_ids restarting at each. position_ids
    default to `positions_from_mask(attention_mask)` without a cache; with a cache the caller
    passes them (they continue each row's own count). With a cache the T new tokens are written
    at slots [cache.index, cache.index + T), or, given `row_slots`, each fed row's at its own
    slots and read to its own fill (row_attention; the cache's mask and index unchanged): one
    RowSlots of B rows x T tokens, or groups of them whose tokens lie side by side on one flat
    axis, input_ids [1, sum of B x T] (a decode step's rows beside a prefill chunk's).
    """
    b, t = input_ids.shape
    if attention_mask is None:
        attention_mask = jnp.ones((b, t), bool)
    segments = attention_mask.astype(jnp.int32)
    attention_mask = attention_mask.astype(bool)
    if position_ids is None:
        if cache is not None:
            raise ValueError("position_ids are required when decoding with a cache")
        position_ids = positions_from_mask(attention_mask)
    model = Qwen2(config, max_segments)
    if cache is None:
        h, _ = model.apply({"params": params}, input_ids, position_ids, segments, None, 0)
        return h, None
    if row_slots is not None:
        h, (k, v) = model.apply({"params": params}, input_ids, position_ids, None, (cache.k, cache.v), row_slots)
        return h, cache._replace(k=k, v=v)
    kv_mask = jax.lax.dynamic_update_slice(cache.mask, attention_mask, (0, cache.index))
    h, (k, v) = model.apply({"params": params}, input_ids, position_ids, kv_mask, (cache.k, cache.v), cache.index)
    return h, KVCache(k=k, v=v, mask=kv_mask, index=cache.index + t)


def logits_from_hidden(config: Qwen2Config, params: Params, h_BTD: jax.Array) -> jax.Array:
    """fp32 logits [B, T, V] from hidden states; a critic (config.value_head) has no LM head."""
    if config.value_head:
        raise ValueError("a critic (value_head=True) has no LM head; compute logits with the actor's config")
    return Qwen2(config).apply({"params": params}, h_BTD, method=Qwen2.logits)


def values_from_hidden(config: Qwen2Config, params: Params, h_BTD: jax.Array) -> jax.Array:
    """fp32 scalar values [B, T] from hidden states; needs config.value_head."""
    if not config.value_head:
        raise ValueError("this model has no value head; build the critic with value_head=True")
    return Qwen2(config).apply({"params": params}, h_BTD, method=Qwen2.values)


def forward(
    config: Qwen2Config,
    params: Params,
    input_ids: jax.Array,
    attention_mask: jax.Array | None = None,
    position_ids: jax.Array | None = None,
) -> jax.Array:
    """Logits [B, T, V] in fp32 for a (possibly left-padded) batch, as transformers' Qwen2ForCausalLM."""
    h, _ = hidden_states(config, params, input_ids, attention_mask, position_ids)
    return logits_from_hidden(config, params, h)
