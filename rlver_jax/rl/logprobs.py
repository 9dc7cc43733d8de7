"""Per-token model outputs the PPO/GRPO losses read: log-probs and entropy through the LM head
(only at the policy tokens), and the critic's values.

Alignment follows rlver_jax.rl.losses: logprobs[b, t] = log pi(token_t | tokens_<t) (0 at t = 0),
and values[b, t] is the critic's value of the state before token t. Rows packed end to end
(rlver_jax.rl.packing) run as `PackedRows` and come back in the rows' layout.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.rl.packing import SEGMENTS

Params = Any


def _shift_right(x_BT: jax.Array) -> jax.Array:
    return jnp.pad(x_BT[:, :-1], ((0, 0), (1, 0)))


def _logit_stats(logits_NV: jax.Array, targets_N: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """log-softmax at the targets, entropy and log-sum-exp per row, without a [N, V] log-softmax.

    Rows are flattened to 2-D: XLA's CPU backend reduces a product over the last axis of a 3-D
    array several times slower than over a 2-D one. The two sums are one variadic reduction so
    exp runs once per logit without materialising it.
    """
    row_max = jnp.max(logits_NV, axis=-1, keepdims=True)
    shifted = logits_NV - row_max  # exp cannot overflow
    e = jnp.exp(shifted)
    zero = np.float32(0)
    sum_e, sum_e_shifted = jax.lax.reduce(
        (e, e * shifted), (zero, zero), lambda a, b: (a[0] + b[0], a[1] + b[1]), (1,))
    log_sum_e = jnp.log(sum_e)
    # H = log sum e - E_p[shifted], since log p = shifted - log sum e and sum p = 1.
    entropy = log_sum_e - sum_e_shifted / sum_e
    logprob = jnp.take_along_axis(shifted, targets_N[:, None], axis=-1)[:, 0] - log_sum_e
    return logprob, entropy, row_max[:, 0] + log_sum_e


def _head_weights(cfg: Qwen2Config, params: Params) -> Params:
    """The parameters the LM head reads: its own matrix, or the tied embedding."""
    return {"lm_head": params["lm_head"]} if cfg.untied_lm_head else {"embed": params["embed"]}


def _chunk_logits(cfg: Qwen2Config, head: Params, h_BKD: jax.Array) -> jax.Array:
    """fp32 logits [B * K, V] of one chunk, 2-D for the reductions."""
    return qwen2.logits_from_hidden(cfg, head, h_BKD).reshape(h_BKD.shape[0] * h_BKD.shape[1], -1)


def _chunks_first(x):  # [B, N, K, ...] -> [N, B, K, ...]: the map runs over chunks, rows stay split
    return jnp.moveaxis(x, 1, 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _head_logprobs(cfg: Qwen2Config, head: Params, h_BNKD: jax.Array, targets_BNK: jax.Array):
    """log pi(target) and entropy [B, N, K] from hidden states through the LM head, in fp32,
    chunk by chunk: N chunks of K tokens per row, so only one chunk's [B, K, V] logits exist.

    A custom VJP because autodiff of log_softmax + entropy keeps several fp32 logit arrays alive
    and re-runs exp over them. The backward recomputes each chunk's logits from its hidden states
    and the saved log-sum-exp (one more head matmul), accumulating the head's gradient in fp32.
    """
    return _head_logprobs_fwd(cfg, head, h_BNKD, targets_BNK)[0]


def _head_logprobs_fwd(cfg: Qwen2Config, head: Params, h_BNKD: jax.Array, targets_BNK: jax.Array):
    def chunk(xs):
        h_BKD, t_BK = xs
        logprob, entropy, lse = _logit_stats(_chunk_logits(cfg, head, h_BKD), t_BK.reshape(-1))
        return tuple(x.reshape(t_BK.shape) for x in (logprob, entropy, lse))

    logprob, entropy, lse = (_chunks_first(x) for x in jax.lax.map(chunk, (_chunks_first(h_BNKD),
                                                                           _chunks_first(targets_BNK))))
    return (logprob, entropy), (head, h_BNKD, targets_BNK, lse, entropy)


def _head_logprobs_bwd(cfg: Qwen2Config, residuals, cotangents):
    head, h_BNKD, targets_BNK, lse_BNK, entropy_BNK = residuals

    def chunk(d_head, xs):
        h_BKD, t_BK, lse_BK, ent_BK, g_lp_BK, g_ent_BK = xs
        logits, head_vjp = jax.vjp(lambda w, h: _chunk_logits(cfg, w, h), head, h_BKD)
        logp = logits - lse_BK.reshape(-1, 1)
        p = jnp.exp(logp)
        onehot = jnp.arange(logits.shape[-1])[None, :] == t_BK.reshape(-1, 1)
        # d logp_target / dz = onehot - p;  dH / dz = -p (log p + H).
        d_logits = (g_lp_BK.reshape(-1, 1) * (onehot - p)
                    - g_ent_BK.reshape(-1, 1) * p * (logp + ent_BK.reshape(-1, 1)))
        d_w, d_h = head_vjp(d_logits)
        return jax.tree.map(lambda acc, g: acc + g.astype(jnp.float32), d_head, d_w), d_h

    zeros = jax.tree.map(lambda w: jnp.zeros(w.shape, jnp.float32), head)
    xs = (h_BNKD, targets_BNK, lse_BNK, entropy_BNK) + tuple(cotangents)
    d_head, d_h = jax.lax.scan(chunk, zeros, tuple(_chunks_first(x) for x in xs))
    return jax.tree.map(lambda g, w: g.astype(w.dtype), d_head, head), _chunks_first(d_h), None


_head_logprobs.defvjp(_head_logprobs_fwd, _head_logprobs_bwd)


def _chunking(c: int, chunk: int) -> tuple[int, int]:
    """(chunks N, tokens per chunk K) covering C scored tokens in chunks of at most `chunk`,
    as even as possible (N x K - C < N tokens of padding)."""
    n = max(-(-c // chunk), 1)
    return n, -(-c // n)


def token_logprobs(cfg: Qwen2Config, params: Params, tokens, attention_mask, with_entropy: bool = False,
                   positions: jax.Array | None = None, chunk: int = 1024, position_ids: jax.Array | None = None,
                   max_segments: int = 1):
    """log pi(token_t | tokens_<t) aligned to t (0 at t = 0), and optionally the entropy at t.

    positions [B, C] (rlver_jax.rl.batch.policy_positions): run the LM head only at these token
    indices (0 pads a row) and return 0 elsewhere; None scores every token. The head is a quarter
    of a 0.5B model's FLOPs and its [tokens, vocab] logits the largest activation at 7B; the
    losses never read the user and template tokens, so scoring only policy tokens saves both.
    chunk (config.rl.logprob_chunk): the head runs over at most this many tokens of each row at
    a time, forward and backward, so no [tokens, vocab] array is ever whole.
    position_ids, max_segments: packed rows (`PackedRows`; qwen2.hidden_states).
    """
    h, _ = qwen2.hidden_states(cfg, params, tokens, attention_mask, position_ids, max_segments=max_segments)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    b, c = positions.shape
    n, k = _chunking(c, chunk)
    positions = jnp.pad(positions, ((0, 0), (0, n * k - c)))  # index 0: dropped below
    # Token t is predicted from the hidden state at t - 1; the pad index 0 reads h[0] and its
    # result is dropped below (t = 0 has no log-prob).
    h_sel = jnp.take_along_axis(h, jnp.maximum(positions - 1, 0)[..., None], axis=1)
    targets = jnp.take_along_axis(tokens, positions, axis=1)
    lp_sel, ent_sel = (x.reshape(b, n * k) for x in _head_logprobs(
        cfg, _head_weights(cfg, params), h_sel.reshape(b, n, k, -1), targets.reshape(b, n, k)))
    rows = jnp.arange(b)[:, None]
    keep = positions > 0
    lp, ent = (jnp.zeros(tokens.shape, jnp.float32).at[rows, positions].add(jnp.where(keep, x, 0.0))
               for x in (lp_sel, ent_sel))
    return (lp, ent) if with_entropy else lp


def token_values(cfg: Qwen2Config, params: Params, tokens, attention_mask, position_ids: jax.Array | None = None,
                 max_segments: int = 1) -> jax.Array:
    """V(state before token t), aligned to t; 0 at t = 0 (with position_ids, packed rows: at each
    segment's first token, which no state of its own precedes)."""
    h, _ = qwen2.hidden_states(cfg, params, tokens, attention_mask, position_ids, max_segments=max_segments)
    values = _shift_right(qwen2.values_from_hidden(cfg, params, h))
    return values if position_ids is None else jnp.where(position_ids > 0, values, 0.0)


class PackedRows(NamedTuple):
    """Rows [R, T] laid end to end in P rows of T slots (rlver_jax.rl.packing): `source` [P, T] the
    flat index (row x T + slot) of each packed slot's token, -1 empty; `positions` [P, C] the slots
    the LM head scores (0 pads). The packed rows' segment ids are row + 1 (0 empty) and their
    positions each row's own slots, so the model computes per row what it does unpacked; a packed row
    holds at most SEGMENTS rows."""

    source: jax.Array
    positions: jax.Array

    def inputs(self, tokens_RT: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(tokens, segment ids, position ids) [P, T] of the rows `tokens_RT` packed."""
        t = tokens_RT.shape[1]
        real = self.source >= 0
        tokens = jnp.where(real, tokens_RT.reshape(-1)[jnp.maximum(self.source, 0)], 0)
        return tokens, jnp.where(real, self.source // t + 1, 0), jnp.where(real, self.source % t, 0)

    def unpack(self, x_PT: jax.Array, rows: int) -> jax.Array:
        """`x_PT` (per packed slot) in the rows' layout [rows, T], 0 where no packed slot lands (a
        scatter; its gradient is the gather back)."""
        t = x_PT.shape[1]
        index = jnp.where(self.source >= 0, self.source, rows * t).reshape(-1)
        return jnp.zeros((rows * t + 1,), x_PT.dtype).at[index].add(x_PT.reshape(-1))[:-1].reshape(rows, t)

    def logprobs(self, cfg: Qwen2Config, params: Params, tokens_RT: jax.Array, with_entropy: bool = False,
                 chunk: int = 1024):
        """`token_logprobs` of the rows `tokens_RT` at the scored slots, run packed, in the rows' layout."""
        tokens, segments, ids = self.inputs(tokens_RT)
        out = token_logprobs(cfg, params, tokens, segments, with_entropy, self.positions, chunk, ids, SEGMENTS)
        return jax.tree.map(lambda x: self.unpack(x, tokens_RT.shape[0]), out)

    def values(self, cfg: Qwen2Config, params: Params, tokens_RT: jax.Array) -> jax.Array:
        """`token_values` of the rows `tokens_RT`, run packed, in the rows' layout."""
        tokens, segments, ids = self.inputs(tokens_RT)
        return self.unpack(token_values(cfg, params, tokens, segments, ids, SEGMENTS), tokens_RT.shape[0])
