"""Tests for rlver_jax.rl.off_policy against numpy transcriptions of verl's rollout correction,
IcePop and AReaL's decoupled loss (tests/verl_reference.py), a hand-computed case, the settings'
refusals (a train step whose policy loss carries the correction: tests/trainer_test.py)."""

import jax
import numpy as np
import pytest

from rlver_jax.rl import losses, off_policy
from rlver_jax.rl.settings import RLSettings
from tests import verl_reference as ref
from tests.rl_helpers import random_policy_mask, strict_ranks  # noqa: F401 (autouse fixture)


def _inputs(seed: int, batch: int = 6, length: int = 30, spread: float = 0.8):
    """Ragged multi-turn masks plus one padding row; sampling log-probs off by a per-row amount (so
    sequence ratios land on both sides of a band); huge log-probs on the non-policy positions,
    which must never reach a ratio."""
    rng = np.random.default_rng(seed)
    mask = np.concatenate([random_policy_mask(rng, batch - 1, length), np.zeros((1, length), np.float32)])
    old = -rng.uniform(0.1, 4.0, mask.shape)
    scale = rng.uniform(0.02, spread, (batch, 1))
    sample = old + rng.normal(size=mask.shape) * scale
    old = np.where(mask > 0, old, 40.0).astype(np.float32)
    sample = np.where(mask > 0, sample, -40.0).astype(np.float32)
    return old, sample, mask


def _correct(old, sample, mask, mode, level="token"):
    rl = RLSettings(off_policy_correction=mode, off_policy_level=level)
    weights, keep, metrics = jax.jit(off_policy.correction, static_argnames=("mode", "level", "low", "high"))(
        old, sample, mask, mode=mode, level=level, low=rl.off_policy_low, high=rl.off_policy_high)
    return rl, np.asarray(weights), np.asarray(keep), {k: float(v) for k, v in metrics.items()}


def _check_shared_metrics(metrics, old, sample, mask, level):
    sel = mask > 0
    ratio = ref.rollout_ratios(old, sample, mask, level)[sel]
    np.testing.assert_allclose(metrics["offpolicy_weight_mean"], ratio.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["offpolicy_weight_max"], ratio.max(), rtol=1e-5)
    np.testing.assert_allclose(metrics["logprob_diff_sampler"], np.abs(old - sample.astype(np.float64))[sel].mean(),
                               rtol=1e-5)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tis_is_verls_truncated_weights(level):
    old, sample, mask = _inputs(0)
    rl, weights, keep, metrics = _correct(old, sample, mask, "tis", level)
    want, verl = ref.rollout_is_weights(old, sample, mask, level, rl.off_policy_high)
    sel = mask > 0
    assert 0 < verl["clipped"] < 1 and rl.off_policy_high == 2.0  # some truncated, some not
    np.testing.assert_allclose(weights[sel], want[sel], rtol=1e-5)
    assert keep.all()
    np.testing.assert_allclose(metrics["offpolicy_clipped_frac"], verl["clipped"], atol=1e-6)
    assert metrics["offpolicy_masked_frac"] == 0.0
    _check_shared_metrics(metrics, old, sample, mask, level)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_mis_is_verls_rejection_mask(level):
    old, sample, mask = _inputs(1)
    rl, weights, keep, metrics = _correct(old, sample, mask, "mis", level)
    want = ref.rollout_rs_mask(old, sample, mask, level, rl.off_policy_low, rl.off_policy_high)
    sel = mask > 0
    rejected = (want == 0)[sel]
    assert 0 < rejected.mean() < 1 and (rl.off_policy_low, rl.off_policy_high) == (0.5, 2.0)
    np.testing.assert_array_equal(mask * keep, want)
    assert (weights == 1).all()
    np.testing.assert_allclose(metrics["offpolicy_masked_frac"], rejected.mean(), atol=1e-6)
    if level == "sequence":  # a row is kept or rejected whole
        assert all(len(set(keep[b][mask[b] > 0])) <= 1 for b in range(mask.shape[0]))
    _check_shared_metrics(metrics, old, sample, mask, level)


def test_icepop_is_the_two_sided_token_mask():
    old, sample, mask = _inputs(2)
    rl, weights, keep, metrics = _correct(old, sample, mask, "icepop")
    want = ref.icepop_weights(old, sample, mask, rl.off_policy_low, rl.off_policy_high)
    sel = mask > 0
    dropped = (want == 0)[sel]
    assert 0 < dropped.mean() < 1 and (rl.off_policy_low, rl.off_policy_high) == (0.5, 5.0)
    np.testing.assert_allclose(weights[sel], want[sel], rtol=1e-5)
    assert keep.all()  # the masked tokens stay in the aggregation's denominators
    np.testing.assert_allclose(metrics["offpolicy_masked_frac"], dropped.mean(), atol=1e-6)
    _check_shared_metrics(metrics, old, sample, mask, "token")


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_decoupled_ppo_is_areals_loss(agg):
    """The PPO loss around the proximal policy times the behaviour weight, aggregated as the update
    does (rlver_jax.rl.update._actor_loss), against AReaL's decoupled loss (token mean) and verl's
    aggregation of the weighted loss."""
    prox, behaviour, mask = _inputs(3, spread=2.0)
    rng = np.random.default_rng(4)
    logprobs = (prox + rng.normal(size=mask.shape) * 0.3).astype(np.float32)
    advantages = rng.normal(size=mask.shape).astype(np.float32)
    rl, weights, _, metrics = _correct(prox, behaviour, mask, "decoupled")
    assert 0 < metrics["offpolicy_masked_frac"] < 1 and rl.off_policy_high == 5.0
    pg, _ = losses.ppo_policy_loss(logprobs, prox, advantages, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    got = float(losses.aggregate_loss(pg * weights, mask, agg))
    if agg == "token_mean":
        want = ref.areal_decoupled_loss(logprobs, prox, behaviour, advantages, mask, 0.2, 0.28, rl.off_policy_high)
    else:
        ratio = np.exp(logprobs.astype(np.float64) - prox)
        per_token = np.maximum(-advantages * ratio, -advantages * np.clip(ratio, 0.8, 1.28))
        behav = ref.rollout_ratios(prox, behaviour, mask, "token")
        want = ref.verl_agg_loss(per_token * np.where(behav <= 5.0, behav, 0.0), mask, "seq_mean_token_mean")
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_hand_computed_case():
    """One row: log rho = 0.5, -1, (a template token), 0 -> rho = 1.6487, 0.3679, 1."""
    old = np.array([[-1.0, -2.0, 9.0, -0.5]], np.float32)
    sample = np.array([[-1.5, -1.0, -9.0, -0.5]], np.float32)
    mask = np.array([[1, 1, 0, 1]], np.float32)
    e5, em1 = np.exp(0.5), np.exp(-1.0)

    def run(mode, level="token", low=None, high=None):
        w, keep, m = off_policy.correction(old, sample, mask, mode=mode, level=level, low=low, high=high)
        return np.asarray(w)[0, [0, 1, 3]], np.asarray(keep)[0, [0, 1, 3]], m

    w, keep, m = run("tis", high=1.5)
    np.testing.assert_allclose(w, [1.5, em1, 1.0], rtol=1e-6)
    np.testing.assert_allclose([m["offpolicy_weight_mean"], m["offpolicy_weight_max"], m["offpolicy_clipped_frac"],
                                m["offpolicy_masked_frac"], m["logprob_diff_sampler"]],
                               [(e5 + em1 + 1) / 3, e5, 1 / 3, 0.0, 0.5], rtol=1e-6)
    w, _, m = run("tis", "sequence", high=1.5)  # the row's product: exp(-0.5), under the cap
    np.testing.assert_allclose(w, [np.exp(-0.5)] * 3, rtol=1e-6)
    assert float(m["offpolicy_clipped_frac"]) == 0.0
    _, keep, m = run("mis", low=0.5, high=2.0)
    np.testing.assert_array_equal(keep, [True, False, True])
    np.testing.assert_allclose(m["offpolicy_masked_frac"], 1 / 3, rtol=1e-6)
    _, keep, _ = run("mis", "sequence", low=0.5, high=2.0)  # exp(-0.5) = 0.61 is inside
    np.testing.assert_array_equal(keep, [True, True, True])
    w, _, m = run("icepop", low=0.5, high=1.5)
    np.testing.assert_allclose(w, [0.0, 0.0, 1.0])
    np.testing.assert_allclose(m["offpolicy_masked_frac"], 2 / 3, rtol=1e-6)
    w, _, _ = run("decoupled", high=1.5)
    np.testing.assert_allclose(w, [0.0, em1, 1.0], rtol=1e-6)
    w, keep, m = run("none")
    assert (w == 1).all() and keep.all() and float(m["offpolicy_masked_frac"]) == 0.0
    # A row's log-ratio of 30 is clamped at 20 (verl's SAFETY_BOUND) before exp: finite in fp32.
    w, _, m = off_policy.correction(np.zeros((1, 2), np.float32), np.full((1, 2), -15.0, np.float32),
                                    np.ones((1, 2), np.float32), mode="tis", level="sequence", high=2.0)
    np.testing.assert_allclose([float(m["offpolicy_weight_max"]), *np.asarray(w)[0]], [np.exp(20.0), 2.0, 2.0],
                               rtol=1e-6)


def test_settings_resolve_each_modes_band_and_refuse_bad_combinations():
    assert (RLSettings().off_policy_low, RLSettings().off_policy_high) == (None, None)
    tis = RLSettings(off_policy_correction="tis", off_policy_level="sequence", off_policy_high=3.0)
    assert (tis.off_policy_low, tis.off_policy_high, tis.off_policy_kind.weighs) == (None, 3.0, True)
    assert RLSettings(off_policy_correction="decoupled", off_policy_high=float("inf")).off_policy_high == np.inf
    refused = [
        (dict(off_policy_correction="is"),
         r"config.rl.off_policy_correction='is': use one of none \| tis \| mis \| icepop \| decoupled$"),
        (dict(off_policy_level="row"), r"config.rl.off_policy_level='row': use one of token \| sequence$"),
        (dict(off_policy_correction="icepop", off_policy_level="sequence"),
         r"config.rl.off_policy_level='sequence' with config.rl.off_policy_correction='icepop'"),
        (dict(off_policy_correction="tis", off_policy_low=0.5), r"config.rl.off_policy_low=0.5 with .*'tis'"),
        (dict(off_policy_high=2.0), r"config.rl.off_policy_high=2.0 with config.rl.off_policy_correction='none'"),
        (dict(off_policy_correction="mis", off_policy_low=2.0, off_policy_high=1.5),
         r"config.rl.off_policy_low=2.0 and config.rl.off_policy_high=1.5"),
        (dict(off_policy_correction="icepop", off_policy_high=0.9), r"config.rl.off_policy_low=0.5 and .*high=0.9"),
        (dict(off_policy_correction="mis", off_policy_low=-0.1), r"config.rl.off_policy_low=-0.1"),
    ]
    for fields, message in refused:
        with pytest.raises(ValueError, match=message) as e:
            RLSettings(**fields)
        assert "\n" not in str(e.value)
