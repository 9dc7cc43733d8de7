"""Tests for rlver_jax.rl.losses against plain numpy loops and hand-computed values."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlver_jax.rl import loss_modes, losses
from tests import verl_reference as ref
from tests.rl_helpers import random_policy_mask, strict_ranks  # noqa: F401 (autouse fixture)


def _random_policy_inputs(seed: int, batch: int = 5, length: int = 40):
    rng = np.random.default_rng(seed)
    mask = random_policy_mask(rng, batch, length)
    old = -rng.uniform(0.1, 4.0, size=mask.shape).astype(np.float32)
    new = (old + rng.normal(size=mask.shape) * 0.8).astype(np.float32)
    advantages = rng.normal(size=mask.shape).astype(np.float32)
    return new, old, advantages, mask


def numpy_ppo(new, old, advantages, lo, hi, dual):
    """Reference, written per sign of A: pessimistic clip, then the dual bound for A < 0."""
    loss = np.zeros(new.shape, np.float64)
    clipped = np.zeros(new.shape, bool)
    dual_hit = np.zeros(new.shape, bool)
    for idx in np.ndindex(new.shape):
        a = float(advantages[idx])
        r = np.exp(float(new[idx]) - float(old[idx]))
        if a >= 0:
            loss[idx] = -a * min(r, 1 + hi)
            clipped[idx] = a > 0 and r > 1 + hi
        else:
            loss[idx] = -a * max(r, 1 - lo)
            clipped[idx] = r < 1 - lo
            if dual is not None and loss[idx] > -a * dual:
                loss[idx] = -a * dual
                dual_hit[idx] = True
    return loss, clipped, dual_hit


@pytest.mark.parametrize("lo,hi,dual", [(0.2, 0.2, None), (0.2, 0.28, 3.0), (0.1, 0.3, 1.5)])
def test_ppo_policy_loss_matches_numpy(lo, hi, dual):
    new, old, advantages, mask = _random_policy_inputs(0)
    loss, metrics = losses.ppo_policy_loss(
        new, old, advantages, mask, clip_eps_low=lo, clip_eps_high=hi, dual_clip=dual
    )
    want, clipped, dual_hit = numpy_ppo(new, old, advantages, lo, hi, dual)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-5)
    sel = mask > 0
    assert 0 < clipped[sel].mean() < 1
    np.testing.assert_allclose(metrics["clip_frac"], clipped[sel].mean(), atol=1e-6)
    log_ratio = (new - old).astype(np.float64)[sel]
    np.testing.assert_allclose(
        metrics["approx_kl"], np.mean(np.exp(log_ratio) - 1 - log_ratio), rtol=1e-5
    )
    if dual is None:
        assert "dual_clip_frac" not in metrics
    else:
        assert dual_hit[sel].any()
        np.testing.assert_allclose(metrics["dual_clip_frac"], dual_hit[sel].mean(), atol=1e-6)


def test_ppo_golden():
    # eps 0.2, dual clip 3:
    #   A=2,  rho=1.5: max(-3, -2.4) = -2.4        A=-1, rho=4:   max(4, 1.2) = 4 -> dual 3
    #   A=1,  rho=4:   max(-4, -1.2) = -1.2        A=-1, rho=0.5: max(0.5, 0.8) = 0.8
    #   A=-1, rho=2:   max(2, 1.2) = 2 (< 3, dual bound not reached)
    ratio = np.array([[1.5, 4.0, 4.0, 0.5, 2.0]], np.float32)
    advantages = np.array([[2.0, -1.0, 1.0, -1.0, -1.0]], np.float32)
    old = np.full_like(ratio, -1.0)
    loss, metrics = losses.ppo_policy_loss(
        old + np.log(ratio), old, advantages, np.ones_like(ratio), dual_clip=3.0
    )
    np.testing.assert_allclose(loss, [[-2.4, 3.0, -1.2, 0.8, 2.0]], rtol=1e-5)
    # Clipped branch taken for tokens 0, 2, 3 (token 1 is bounded by the dual clip instead).
    np.testing.assert_allclose(metrics["clip_frac"], 3 / 5, atol=1e-6)
    np.testing.assert_allclose(metrics["dual_clip_frac"], 1 / 5, atol=1e-6)


def test_dual_clip_only_for_negative_advantages():
    # Huge ratio: the plain clip bounds a positive-advantage token but not a negative one.
    ratio = np.array([[20.0, 20.0]], np.float32)
    advantages = np.array([[1.0, -1.0]], np.float32)
    old = np.full_like(ratio, -2.0)
    args = (old + np.log(ratio), old, advantages, np.ones_like(ratio))
    plain, _ = losses.ppo_policy_loss(*args)
    dual, _ = losses.ppo_policy_loss(*args, dual_clip=3.0)
    np.testing.assert_allclose(plain, [[-1.2, 20.0]], rtol=1e-5)
    np.testing.assert_allclose(dual, [[-1.2, 3.0]], rtol=1e-5)
    with pytest.raises(ValueError, match="dual_clip"):
        losses.ppo_policy_loss(*args, dual_clip=1.0)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_ppo_gradient_at_ratio_one(mode):
    _, old, advantages, mask = _random_policy_inputs(1)

    def objective(logprobs):
        per_token, _ = losses.ppo_policy_loss(logprobs, old, advantages, mask, dual_clip=3.0)
        return losses.aggregate_loss(per_token, mask, mode)

    grad = np.asarray(jax.grad(objective)(jnp.asarray(old)))
    if mode == "token_mean":
        weight = mask / mask.sum()
    else:
        weight = mask / mask.sum(axis=1, keepdims=True) / mask.shape[0]
    # Descending the loss raises log-probs of positive-advantage tokens.
    np.testing.assert_allclose(grad, -advantages * weight, rtol=1e-5, atol=1e-7)


def numpy_value_loss(values, old_values, returns, clip_range):
    loss = np.zeros(values.shape, np.float64)
    for idx in np.ndindex(values.shape):
        v, v_old, ret = float(values[idx]), float(old_values[idx]), float(returns[idx])
        v_clip = v_old + min(max(v - v_old, -clip_range), clip_range)
        loss[idx] = 0.5 * max((v - ret) ** 2, (v_clip - ret) ** 2)
    return loss


def test_value_loss_matches_numpy_and_golden():
    rng = np.random.default_rng(2)
    mask = random_policy_mask(rng, 4, 30)
    old_values = rng.normal(size=mask.shape).astype(np.float32)
    values = (old_values + rng.normal(size=mask.shape) * 0.5).astype(np.float32)
    returns = rng.normal(size=mask.shape).astype(np.float32)
    loss, metrics = losses.value_loss(values, old_values, returns, mask, clip_range=0.2)
    np.testing.assert_allclose(loss, numpy_value_loss(values, old_values, returns, 0.2),
                               rtol=1e-5, atol=1e-6)
    assert 0 < float(metrics["vf_clip_frac"]) < 1

    # old 0, new 1, return 2, clip 0.2: unclipped (1-2)^2 = 1, clipped (0.2-2)^2 = 3.24 -> 1.62.
    # old 0, new 1, return 0: unclipped 1, clipped 0.04 -> 0.5.
    loss, metrics = losses.value_loss(
        np.array([[1.0, 1.0]]), np.zeros((1, 2)), np.array([[2.0, 0.0]]), np.ones((1, 2)),
        clip_range=0.2,
    )
    np.testing.assert_allclose(loss, [[1.62, 0.5]], rtol=1e-5)
    np.testing.assert_allclose(metrics["vf_clip_frac"], 0.5)


def test_entropy_from_logits():
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=(2, 3, 11)) * 4).astype(np.float32)
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    got = losses.entropy_from_logits(jnp.asarray(logits, jnp.bfloat16))
    assert got.dtype == jnp.float32 and got.shape == (2, 3)
    np.testing.assert_allclose(losses.entropy_from_logits(logits), -(p * np.log(p)).sum(-1),
                               rtol=1e-5)
    # Uniform over V gives log V, even for huge logits.
    np.testing.assert_allclose(losses.entropy_from_logits(np.full((4,), 1e4)), np.log(4), rtol=1e-6)


def test_entropy_with_masked_vocabulary_is_finite():
    logits = jnp.array([0.0, 0.0, -jnp.inf, -jnp.inf])
    np.testing.assert_allclose(losses.entropy_from_logits(logits), np.log(2), rtol=1e-6)
    grad = jax.grad(losses.entropy_from_logits)(jnp.array([0.3, -0.2, -jnp.inf]))
    assert np.all(np.isfinite(grad))


def test_kl_estimators_formulas():
    logp = np.array([-1.0, -2.0, -0.5], np.float32)
    ref = np.array([-1.5, -2.0, -0.1], np.float32)
    np.testing.assert_allclose(losses.kl_divergence(logp, ref, "k1"), logp - ref, rtol=1e-6)
    d = (ref - logp).astype(np.float64)
    np.testing.assert_allclose(losses.kl_divergence(logp, ref, "k3"), np.exp(d) - d - 1,
                               rtol=1e-5, atol=1e-7)
    assert set(loss_modes.KL_ESTIMATORS) == {"k1", "k3"}
    with pytest.raises(ValueError, match="k1"):
        losses.kl_divergence(logp, ref, "k2")


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_estimators_are_unbiased(estimator):
    # E_{x ~ pi}[k(x)] = KL(pi || ref), computed exactly by enumerating a small vocabulary. The
    # distributions are moderate enough that k3 stays below its clamp at 10 (tested apart).
    rng = np.random.default_rng(4)
    logp = np.log(rng.dirichlet(np.full(6, 4.0)))
    ref = np.log(rng.dirichlet(np.full(6, 4.0)))
    per_token = np.asarray(losses.kl_divergence(logp, ref, estimator), np.float64)
    assert per_token.max() < losses.K3_CLAMP
    exact = np.sum(np.exp(logp) * (logp - ref))
    np.testing.assert_allclose(np.sum(np.exp(logp) * per_token), exact, rtol=1e-5)


def test_apply_kl_penalty():
    rng = np.random.default_rng(5)
    mask = random_policy_mask(rng, 3, 20)
    rewards = (rng.normal(size=mask.shape) * mask).astype(np.float32)
    logp = -rng.uniform(0.1, 3, size=mask.shape).astype(np.float32)
    ref = -rng.uniform(0.1, 3, size=mask.shape).astype(np.float32)
    got = losses.apply_kl_penalty(rewards, logp, ref, mask, coef=0.1, estimator="k3")
    d = (ref - logp).astype(np.float64)
    np.testing.assert_allclose(got, rewards - 0.1 * (np.exp(d) - d - 1) * mask, rtol=1e-5,
                               atol=1e-6)
    grad = jax.grad(lambda lp: losses.apply_kl_penalty(rewards, lp, ref, mask, coef=0.1).sum())(
        jnp.asarray(logp)
    )
    np.testing.assert_array_equal(grad, np.zeros_like(logp))


def test_aggregate_loss_modes():
    rng = np.random.default_rng(6)
    mask = random_policy_mask(rng, 4, 25)
    mask[2] = 0.0  # a padding row without policy tokens
    x = rng.normal(size=mask.shape).astype(np.float32)
    total, count = 0.0, 0
    seq_means = []
    for b in range(4):
        for t in range(25):
            if mask[b, t]:
                total, count = total + float(x[b, t]), count + 1
        if mask[b].any():
            seq_means.append(np.mean(x[b][mask[b] > 0]))
    np.testing.assert_allclose(losses.aggregate_loss(x, mask, "token_mean"), total / count,
                               rtol=1e-5)
    np.testing.assert_allclose(losses.aggregate_loss(x, mask > 0, "seq_mean_token_mean"),
                               np.mean(seq_means), rtol=1e-5)
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        losses.aggregate_loss(x, mask, "seq_sum")


def test_losses_jit():
    new, old, advantages, mask = _random_policy_inputs(7)

    @functools.partial(jax.jit, static_argnames="mode")
    def total_loss(new, old, advantages, mask, mode):
        pg, metrics = losses.ppo_policy_loss(new, old, advantages, mask, dual_clip=3.0)
        vf, _ = losses.value_loss(new, old, advantages, mask, clip_range=0.2)
        kl = losses.kl_divergence(new, old, "k3")
        per_token = pg + 0.5 * vf + 0.01 * kl
        return losses.aggregate_loss(per_token, mask, mode), metrics

    for mode in loss_modes.AGG_MODES:
        got, metrics = total_loss(new, old, advantages, mask, mode)
        pg, want_metrics = losses.ppo_policy_loss(new, old, advantages, mask, dual_clip=3.0)
        vf, _ = losses.value_loss(new, old, advantages, mask, clip_range=0.2)
        want = losses.aggregate_loss(pg + 0.5 * vf + 0.01 * (np.exp(old - new) - (old - new) - 1),
                                     mask, mode)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        np.testing.assert_allclose(metrics["clip_frac"], want_metrics["clip_frac"])


def test_log_ratio_and_k3_clamps_on_crafted_inputs():
    """verl's guards by hand: a log-ratio of +-50 counts as +-20 (exp(50) would be 5e21); k3 is
    at most 10, and inside the range it is the plain formula."""
    old = np.zeros((1, 4), np.float32)
    new = np.array([[50.0, -50.0, 20.0, 0.5]], np.float32)
    adv = np.array([[-1.0, 1.0, -1.0, -1.0]], np.float32)
    loss, _ = losses.ppo_policy_loss(new, old, adv, np.ones_like(old), clip_eps_low=0.2, clip_eps_high=0.2)
    # A < 0: loss = -A * max(rho, 0.8) = rho; A > 0 and rho = exp(-20): loss = -min(rho, 1.2) = -exp(-20).
    np.testing.assert_allclose(loss, [[np.exp(20.0), -np.exp(-20.0), np.exp(20.0), np.exp(0.5)]], rtol=1e-5)
    assert np.all(np.isfinite(loss))
    logp = np.zeros(5, np.float32)
    ref = np.array([30.0, 3.0, 0.5, -0.5, -30.0], np.float32)
    d = ref.astype(np.float64)
    want = np.minimum(np.exp(d) - d - 1, 10.0)
    want[-1] = min(np.exp(-20.0) + 20.0 - 1.0, 10.0)  # d clamped to -20 first: 19 -> 10
    np.testing.assert_allclose(losses.kl_k3(logp, ref), want, rtol=1e-6)
    np.testing.assert_allclose(losses.kl_k3(logp, ref)[2:4], np.exp(d[2:4]) - d[2:4] - 1, rtol=1e-6)


def test_value_clip_fraction_counts_only_clipped_tokens():
    """Values inside old +- c are never clipped: vf_clip_frac is exactly 0 and the loss is the
    plain squared error. The formulation old + clip(V - old) rounds in float32 and would count
    some of these tokens as clipped (checked in numpy on the same inputs)."""
    rng = np.random.default_rng(11)
    old = rng.normal(size=(64, 64)).astype(np.float32)
    values = (old + rng.uniform(-0.19, 0.19, size=old.shape)).astype(np.float32)
    returns = rng.normal(size=old.shape).astype(np.float32)
    mask = np.ones_like(old)
    loss, metrics = losses.value_loss(values, old, returns, mask, clip_range=0.2)
    assert float(metrics["vf_clip_frac"]) == 0.0
    np.testing.assert_array_equal(loss, 0.5 * (values - returns) ** 2)
    rounded = old + np.clip(values - old, np.float32(-0.2), np.float32(0.2))
    assert np.mean((rounded - returns) ** 2 > (values - returns) ** 2) > 0.001
    # Outside the range: V = old + 1 with c = 0.2 is clipped to old + 0.2 (return old + 2: the
    # clipped error 3.24 > 1 counts), and V = old - 1 toward a return of old - 2 likewise.
    v = np.array([[1.0, -1.0, 0.1]], np.float32)
    r = np.array([[2.0, -2.0, 5.0]], np.float32)
    loss, metrics = losses.value_loss(v, np.zeros_like(v), r, np.ones_like(v), clip_range=0.2)
    np.testing.assert_allclose(loss, [[1.62, 1.62, 0.5 * 4.9 ** 2]], rtol=1e-6)
    np.testing.assert_allclose(metrics["vf_clip_frac"], 2 / 3, rtol=1e-6)


def _gspo_inputs(seed: int, noise: float, batch: int = 6, length: int = 40):
    new, old, advantages, mask = _random_policy_inputs(seed, batch, length)
    new = (old + (new - old) / 0.8 * noise).astype(np.float32)
    mask[3] = 0.0  # a padding row
    return new, old, advantages, mask


@pytest.mark.parametrize("noise,lo,hi", [(3e-3, 3e-4, 4e-4), (1.0, 0.2, 0.28)])
def test_gspo_matches_reference(noise, lo, hi):
    new, old, advantages, mask = _gspo_inputs(20, noise)
    loss, metrics = losses.gspo_policy_loss(new, old, advantages, mask, clip_eps_low=lo,
                                            clip_eps_high=hi)
    want, clipped, want_grad = ref.gspo(new, old, advantages, mask, lo, hi)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
    sel = mask > 0
    assert 0 < clipped[sel].mean() < 1
    np.testing.assert_allclose(metrics["clip_frac"], clipped[sel].mean(), atol=1e-6)
    log_ratio = (new - old).astype(np.float64)[sel]
    # k3 = exp(d) - d - 1, clamped at 10; fp32 cancels for tiny d: an absolute tolerance.
    np.testing.assert_allclose(metrics["approx_kl"],
                               np.mean(np.minimum(np.exp(log_ratio) - 1 - log_ratio, 10.0)),
                               rtol=1e-4, atol=1e-7)
    # Gradient: each token's own -A s_b (the sequence ratio is a stop-gradient), times its weight.
    weights = np.asarray(losses.loss_weights(mask, loss_modes.GSPO_AGG_MODES[0]))

    def objective(logprobs):
        per_token, _ = losses.gspo_policy_loss(logprobs, old, advantages, mask, clip_eps_low=lo,
                                               clip_eps_high=hi)
        return losses.aggregate_loss(per_token, mask, loss_modes.GSPO_AGG_MODES[0])

    grad = jax.grad(objective)(jnp.asarray(new))
    np.testing.assert_allclose(grad, want_grad * weights, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("lo,hi", [(0.2, 0.28), (3e-4, 4e-4)])
def test_gspo_is_the_sequence_objective_with_sequence_advantages(lo, hi):
    """With one advantage per sequence, GSPO-token aggregated by seq_mean_token_mean is GSPO's
    sequence objective mean_b max(-A_b s_b, -A_b clip(s_b)) in value and in gradient; that
    objective has no stop-gradient, so central finite differences of its numpy transcription
    give the gradient."""
    _, old, _, mask = _gspo_inputs(21, 0.0)
    # Sequence log-ratios well inside and well outside the clip range (per-token noise around a
    # shift per row), so rows of both kinds, and none near a clip boundary.
    rng = np.random.default_rng(27)
    shift = np.array([-3.0, -0.5, 0.0, 0.3, 2.5, -2.0])[:, None] * hi
    new = (old + shift + rng.normal(size=old.shape) * 0.2 * hi).astype(np.float32)
    seq_adv = np.random.default_rng(22).normal(size=mask.shape[0]).astype(np.float32)
    advantages = seq_adv[:, None] * mask

    def objective(logprobs):
        per_token, _ = losses.gspo_policy_loss(logprobs, old, advantages, mask, clip_eps_low=lo,
                                               clip_eps_high=hi)
        return losses.aggregate_loss(per_token, mask, "seq_mean_token_mean")

    value, grad = jax.value_and_grad(objective)(jnp.asarray(new))
    x = new.astype(np.float64)
    np.testing.assert_allclose(value, ref.gspo_sequence_objective(x, old, seq_adv, mask, lo, hi),
                               rtol=1e-5)
    fd = np.zeros_like(x)
    h = 1e-6
    for idx in zip(*np.nonzero(mask)):
        plus, minus = x.copy(), x.copy()
        plus[idx] += h
        minus[idx] -= h
        fd[idx] = (ref.gspo_sequence_objective(plus, old, seq_adv, mask, lo, hi)
                   - ref.gspo_sequence_objective(minus, old, seq_adv, mask, lo, hi)) / (2 * h)
    assert np.abs(fd).max() > 0 and np.any((fd == 0) & (mask > 0))  # clipped rows too
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-7)


def test_gspo_golden():
    # Two policy tokens with log-ratios 0.1 and 0.3 (a user token between, log-ratio 5, is not
    # part of the sequence): s = exp(0.2) = 1.2214 for both. eps 0.2:
    #   A = 1:  max(-1.2214, -1.2) = -1.2 (clipped, no gradient)
    #   A = -1: max(1.2214, 1.2) = 1.2214 (gradient -A s = 1.2214 per token)
    old = np.full((2, 3), -1.0, np.float32)
    new = old + np.array([[0.1, 5.0, 0.3]] * 2, np.float32)
    mask = np.array([[1, 0, 1]] * 2, np.float32)
    adv = np.array([[1.0, 0.0, 1.0], [-1.0, 0.0, -1.0]], np.float32)
    loss, metrics = losses.gspo_policy_loss(new, old, adv, mask, clip_eps_low=0.2,
                                            clip_eps_high=0.2)
    s = np.exp(0.2)
    np.testing.assert_allclose(np.asarray(loss)[mask > 0], [-1.2, -1.2, s, s], rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_frac"], 0.5)
    grad = jax.grad(lambda lp: jnp.sum(losses.gspo_policy_loss(
        lp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2)[0] * mask))(jnp.asarray(new))
    np.testing.assert_allclose(grad, [[0, 0, 0], [s, 0, s]], rtol=1e-5)
    assert set(loss_modes.GSPO_AGG_MODES) <= set(loss_modes.AGG_MODES)


@pytest.mark.parametrize("lo,hi", [(None, 0.28), (0.2, 0.2), (None, 1.0)])
def test_cispo_matches_reference_values_and_gradients(lo, hi):
    new, old, advantages, mask = _random_policy_inputs(23)
    loss, metrics = losses.cispo_policy_loss(new, old, advantages, mask, clip_eps_high=hi,
                                             clip_eps_low=lo)
    want, truncated, want_grad = ref.cispo(new, old, advantages, hi, lo)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-5)
    sel = mask > 0
    assert 0 < truncated[sel].mean() < 1
    np.testing.assert_allclose(metrics["clip_frac"], truncated[sel].mean(), atol=1e-6)
    for mode in ("token_mean", "seq_mean_token_mean"):
        weights = np.asarray(losses.loss_weights(mask, mode))

        def objective(logprobs):
            per_token, _ = losses.cispo_policy_loss(logprobs, old, advantages, mask,
                                                    clip_eps_high=hi, clip_eps_low=lo)
            return losses.aggregate_loss(per_token, mask, mode)

        # dL/dlogp_t = -sg(w_t) A_t: the truncated weight is a constant.
        np.testing.assert_allclose(jax.grad(objective)(jnp.asarray(new)), want_grad * weights,
                                   rtol=1e-5, atol=1e-8)


def test_cispo_golden_keeps_the_gradient_ppo_drops():
    # ratio 2, A = 1, logp = log 0.5: PPO clips (loss -1.28, gradient 0); CISPO weighs the token
    # by 1 + 0.28: loss -1.28 * 1 * log 0.5 = 0.8873, gradient -1.28. ratio 0.5, A = -1: PPO
    # clips at 0.8 (gradient 0); CISPO without a lower bound: w = 0.5, loss -0.5 * -1 * log 0.25
    # = -0.6931, gradient 0.5.
    new = np.log(np.array([[0.5, 0.25]], np.float32))
    old = np.log(np.array([[0.25, 0.5]], np.float32))
    adv = np.array([[1.0, -1.0]], np.float32)
    mask = np.ones_like(adv)
    loss, metrics = losses.cispo_policy_loss(new, old, adv, mask, clip_eps_high=0.28)
    np.testing.assert_allclose(loss, [[-1.28 * np.log(0.5), 0.5 * np.log(0.25)]], rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_frac"], 0.5)
    cispo_grad = jax.grad(lambda lp: jnp.sum(losses.cispo_policy_loss(
        lp, old, adv, mask, clip_eps_high=0.28)[0]))(jnp.asarray(new))
    np.testing.assert_allclose(cispo_grad, [[-1.28, 0.5]], rtol=1e-5)
    ppo_grad = jax.grad(lambda lp: jnp.sum(losses.ppo_policy_loss(
        lp, old, adv, mask, clip_eps_high=0.28)[0]))(jnp.asarray(new))
    np.testing.assert_array_equal(ppo_grad, [[0.0, 0.0]])


@pytest.mark.parametrize("norm_len", [None, 512.0])
def test_aggregation_modes_match_verl_agg_loss(norm_len):
    rng = np.random.default_rng(24)
    mask = random_policy_mask(rng, 6, 30)
    mask[2] = 0.0  # a padding row
    x = rng.normal(size=mask.shape).astype(np.float32)
    for mode in loss_modes.AGG_MODES:
        got = losses.aggregate_loss(x, mask, mode, norm_len=norm_len)
        np.testing.assert_allclose(got, ref.verl_agg_loss(x, mask, mode, norm_len), rtol=1e-5)
    # By hand: rows of token-loss sums 3 and 5 and a padding row, T = 4: (3 + 5) / 2 / 4 = 1.
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    x = np.array([[1, 1, 1, 9], [5, 9, 9, 9], [9, 9, 9, 9]], np.float32)
    np.testing.assert_allclose(losses.aggregate_loss(x, mask, "seq_mean_token_sum_norm"), 1.0)
    np.testing.assert_allclose(
        losses.aggregate_loss(x, mask, "seq_mean_token_sum_norm", norm_len=8.0), 0.5)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_loss_weights_make_micro_batch_accumulation_exact(mode):
    """Weights from the whole mini-batch, split into micro-batches: the summed micro-batch
    losses and gradients are the mini-batch's."""
    new, old, advantages, mask = _random_policy_inputs(25, batch=8)
    mask[5] = 0.0
    weights = losses.loss_weights(mask, mode)

    def micro_loss(logprobs, rows):
        per_token, _ = losses.cispo_policy_loss(logprobs, old[rows], advantages[rows], mask[rows],
                                                clip_eps_high=0.28)
        return jnp.sum(per_token * weights[rows])

    def whole(logprobs):
        per_token, _ = losses.cispo_policy_loss(logprobs, old, advantages, mask,
                                                clip_eps_high=0.28)
        return losses.aggregate_loss(per_token, mask, mode)

    halves = (np.arange(4), np.arange(4, 8))
    total = sum(micro_loss(new[r], r) for r in halves)
    np.testing.assert_allclose(total, whole(new), rtol=1e-5)
    grad = np.concatenate([jax.grad(micro_loss)(jnp.asarray(new[r]), r) for r in halves])
    np.testing.assert_allclose(grad, jax.grad(whole)(jnp.asarray(new)), rtol=1e-5, atol=1e-9)


def test_gspo_and_cispo_jit():
    new, old, advantages, mask = _gspo_inputs(26, 0.3)

    def both(new, old, advantages, mask):
        return (losses.gspo_policy_loss(new, old, advantages, mask, clip_eps_low=0.2,
                                        clip_eps_high=0.28),
                losses.cispo_policy_loss(new, old, advantages, mask, clip_eps_high=0.28))

    got = jax.jit(both)(new, old, advantages, mask)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(both(new, old, advantages, mask))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
