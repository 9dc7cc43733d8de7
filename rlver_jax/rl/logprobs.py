"""Per-token model outputs the PPO/GRPO losses read: log-probs and entropy through the LM head
(only at the policy tokens), and the critic's values.

Alignment follows rlver_jax.rl.losses: logprobs[b, t] = log pi(token_t | tokens_<t) (0 at t = 0),
and values[b, t] is the critic's value of the state before token t.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config

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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _head_logprobs(cfg: Qwen2Config, params: Params, h_BTD: jax.Array, targets_BT: jax.Array):
    """log pi(target) and entropy [B, T] from hidden states through the LM head, in fp32.

    A custom VJP because autodiff of log_softmax + entropy keeps several fp32 [B, T, V] arrays
    alive and re-runs exp over them; here the backward pass needs only the logits and one exp.
    """
    return _head_logprobs_fwd(cfg, params, h_BTD, targets_BT)[0]


def _head_logprobs_fwd(cfg: Qwen2Config, params: Params, h_BTD: jax.Array, targets_BT: jax.Array):
    b, t = targets_BT.shape
    logits = qwen2.logits_from_hidden(cfg, params, h_BTD).reshape(b * t, -1)
    logprob, entropy, lse = _logit_stats(logits, targets_BT.reshape(-1))
    out = (logprob.reshape(b, t), entropy.reshape(b, t))
    return out, (params, h_BTD, targets_BT, logits, lse, entropy)


def _head_logprobs_bwd(cfg: Qwen2Config, residuals, cotangents):
    params, h_BTD, targets_BT, logits, lse, entropy = residuals
    g_lp, g_ent = (c.reshape(-1, 1) for c in cotangents)
    logp = logits - lse[:, None]
    p = jnp.exp(logp)
    onehot = jnp.arange(logits.shape[-1])[None, :] == targets_BT.reshape(-1, 1)
    # d logp_target / dz = onehot - p;  dH / dz = -p (log p + H).
    d_logits = g_lp * (onehot - p) - g_ent * p * (logp + entropy[:, None])
    _, head_vjp = jax.vjp(lambda pr, h: qwen2.logits_from_hidden(cfg, pr, h), params, h_BTD)
    d_params, d_h = head_vjp(d_logits.reshape(h_BTD.shape[:2] + logits.shape[-1:]))
    return d_params, d_h, None


_head_logprobs.defvjp(_head_logprobs_fwd, _head_logprobs_bwd)


def token_logprobs(cfg: Qwen2Config, params: Params, tokens, attention_mask, with_entropy: bool = False,
                   positions: jax.Array | None = None):
    """log pi(token_t | tokens_<t) aligned to t (0 at t = 0), and optionally the entropy at t.

    positions [B, C] (rlver_jax.rl.batch.policy_positions): run the LM head only at these token
    indices (0 pads a row) and return 0 elsewhere; None scores every token. The head is a quarter
    of a 0.5B model's FLOPs and its [tokens, vocab] logits the largest activation at 7B; the
    losses never read the user and template tokens, so scoring only policy tokens saves both.
    """
    h, _ = qwen2.hidden_states(cfg, params, tokens, attention_mask)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    # Token t is predicted from the hidden state at t - 1; the pad index 0 reads h[0] and its
    # result is dropped below (t = 0 has no log-prob).
    h_sel = jnp.take_along_axis(h, jnp.maximum(positions - 1, 0)[..., None], axis=1)
    lp_sel, ent_sel = _head_logprobs(cfg, params, h_sel, jnp.take_along_axis(tokens, positions, axis=1))
    rows = jnp.arange(tokens.shape[0])[:, None]
    keep = positions > 0
    lp, ent = (jnp.zeros(tokens.shape, jnp.float32).at[rows, positions].add(jnp.where(keep, x, 0.0))
               for x in (lp_sel, ent_sel))
    return (lp, ent) if with_entropy else lp


def token_values(cfg: Qwen2Config, params: Params, tokens, attention_mask) -> jax.Array:
    """V(state before token t), aligned to t."""
    h, _ = qwen2.hidden_states(cfg, params, tokens, attention_mask)
    return _shift_right(qwen2.values_from_hidden(cfg, params, h))
