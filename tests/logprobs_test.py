"""The log-prob / entropy head (custom VJP, policy positions) against the textbook log-softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlver_jax.models import qwen2
from rlver_jax.models.config import get_preset
from rlver_jax.rl.batch import policy_positions
from rlver_jax.rl.logprobs import token_logprobs
from tests.rl_helpers import training_batch


@pytest.mark.slow
def test_token_logprobs_value_and_gradient_match_plain_log_softmax():
    """The custom-VJP head (no [B, T, V] log-softmax kept) against autodiff of the textbook form."""
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(3))
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (3, 12)), jnp.int32)
    mask = jnp.asarray(np.arange(12)[None, :] >= np.array([[0], [4], [1]]), jnp.int32)  # left padding
    w_lp, w_ent = (jnp.asarray(rng.normal(size=(3, 12)), jnp.float32) for _ in range(2))

    def ours(p):
        lp, ent = token_logprobs(cfg, p, tokens, mask, with_entropy=True)
        return jnp.sum(w_lp * lp + w_ent * ent)

    def reference(p):
        logp = jax.nn.log_softmax(qwen2.forward(cfg, p, tokens, mask)[:, :-1], axis=-1)
        lp = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
        return jnp.sum(w_lp[:, 1:] * lp + w_ent[:, 1:] * ent)

    (v1, g1), (v2, g2) = jax.jit(jax.value_and_grad(ours))(params), jax.jit(jax.value_and_grad(reference))(params)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4), g1, g2)


@pytest.mark.slow
def test_token_logprobs_at_policy_positions_match_the_full_head():
    cfg = get_preset("tiny")
    params = qwen2.init_params(cfg, jax.random.key(4))
    batch = training_batch()
    tokens, attn = jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask)
    mask = batch.policy_mask
    positions = jnp.asarray(policy_positions(mask))
    assert positions.shape[1] < tokens.shape[1]

    def masked_sum(p, pos):
        lp, ent = token_logprobs(cfg, p, tokens, attn, with_entropy=True, positions=pos)
        return jnp.sum((lp + 0.3 * ent) * mask), (lp, ent)

    value_and_grad = jax.jit(jax.value_and_grad(masked_sum, has_aux=True))
    (v_full, (lp_full, ent_full)), g_full = value_and_grad(params, None)
    (v_sel, (lp_sel, ent_sel)), g_sel = value_and_grad(params, positions)
    np.testing.assert_allclose(v_sel, v_full, rtol=1e-6)
    np.testing.assert_allclose(lp_sel, np.asarray(lp_full) * mask, atol=1e-6)
    np.testing.assert_allclose(ent_sel, np.asarray(ent_full) * mask, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), g_sel, g_full)


def _textbook(cfg, params, tokens, mask, w_lp, w_ent):
    logp = jax.nn.log_softmax(qwen2.forward(cfg, params, tokens, mask)[:, :-1], axis=-1)
    lp = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return jnp.sum(w_lp[:, 1:] * lp + w_ent[:, 1:] * ent)


@pytest.mark.parametrize("tied", [pytest.param(True, marks=pytest.mark.slow), False])
def test_chunked_head_matches_plain_log_softmax(tied):
    """Chunks of 1, 5 (12 tokens -> 3 chunks of 4) and 12 tokens (one chunk), tied and untied
    head: values and every gradient equal autodiff of the textbook form (compiled once for the
    three chunk sizes)."""
    cfg = get_preset("tiny", tie_word_embeddings=tied)
    params = qwen2.init_params(cfg, jax.random.key(5))
    rng = np.random.default_rng(5)
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (3, 12)), jnp.int32)
    mask = jnp.asarray(np.arange(12)[None, :] >= np.array([[0], [4], [1]]), jnp.int32)
    w_lp, w_ent = (jnp.asarray(rng.normal(size=(3, 12)), jnp.float32) for _ in range(2))
    (v2, g2) = jax.jit(jax.value_and_grad(lambda p: _textbook(cfg, p, tokens, mask, w_lp, w_ent)))(params)

    for chunk in (1, 5, 12):
        def ours(p, chunk=chunk):
            lp, ent = token_logprobs(cfg, p, tokens, mask, with_entropy=True, chunk=chunk)
            return jnp.sum(w_lp * lp + w_ent * ent)

        (v1, g1) = jax.jit(jax.value_and_grad(ours))(params)
        np.testing.assert_allclose(v1, v2, rtol=1e-5, err_msg=f"chunk {chunk}")
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4, err_msg=f"chunk {chunk}"),
                     g1, g2)


def _largest_intermediate(fn, *args) -> int:
    """Elements of the largest array that `fn`'s jaxpr (and every jaxpr nested in it) creates."""
    def walk(jaxpr):
        sizes = [int(np.prod(v.aval.shape)) for e in jaxpr.eqns for v in e.outvars if hasattr(v.aval, "shape")]
        for e in jaxpr.eqns:
            for p in e.params.values():
                for sub in p if isinstance(p, (list, tuple)) else [p]:
                    inner = getattr(sub, "jaxpr", sub)
                    if isinstance(inner, jax.extend.core.Jaxpr):
                        sizes.append(walk(inner))
        return max(sizes, default=0)

    return walk(jax.make_jaxpr(fn)(*args).jaxpr)


def test_no_tokens_by_vocab_array_is_ever_whole():
    """Forward and backward of the loss at 3 rows x 48 tokens, chunks of 8: the largest array
    is one chunk's [3, 8, V] logits, not the [3, 48, V] a whole head would make."""
    cfg = get_preset("tiny", tie_word_embeddings=False)
    params = qwen2.init_params(cfg, jax.random.key(6))
    tokens = jnp.asarray(np.random.default_rng(6).integers(1, cfg.vocab_size, (3, 48)), jnp.int32)
    mask = jnp.ones((3, 48), jnp.int32)

    def grad(chunk):
        return jax.grad(lambda p: jnp.sum(token_logprobs(cfg, p, tokens, mask, with_entropy=True, chunk=chunk)[1]))

    whole, chunked = 3 * 48 * cfg.vocab_size, 3 * 8 * cfg.vocab_size
    assert _largest_intermediate(grad(48), params) >= whole  # the check sees a whole head
    assert _largest_intermediate(grad(8), params) <= max(chunked, cfg.vocab_size * cfg.hidden_size) < whole
