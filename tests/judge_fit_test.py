"""The judge's fit (rlver_jax.simulator.judge_fit) on synthetic rows: faults one-sided, what SAGE's
models never varied beyond their average capped at it, the ridge weights against a numpy solution
written here, and adversarial rows that refit only the reply's text features."""

import numpy as np
import pytest

from rlver_jax.simulator import judge_fit

NAMES = ("log_words", "lex_hedge", "exclamations", "skeleton_reuse")


def _rows(n=400, seed=0, adversarial=0):
    rng = np.random.default_rng(seed)
    x = np.column_stack([rng.normal(5, 0.6, n), rng.poisson(1.0, n), rng.poisson(0.7, n), rng.random(n)])
    y = 0.5 * x[:, 0] - 1.5 * x[:, 1] + 0.4 * x[:, 2] - 2.0 * x[:, 3] + rng.normal(0, 1, n)
    rows = judge_fit.Rows(tuple(["sage"] * n), NAMES, x, tuple(frozenset() for _ in range(n)), y)
    if adversarial:
        xa = np.column_stack([rng.normal(4, 0.3, adversarial), np.zeros(adversarial), np.full(adversarial, 4.0),
                              rng.uniform(0.6, 1.0, adversarial)])
        rows = rows.joined(judge_fit.Rows(tuple(["adv"] * adversarial), NAMES, xa,
                                          tuple(frozenset() for _ in range(adversarial)), np.full(adversarial, -10.0)))
    return rows


def _ridge_by_hand(x, y, w, low, high, penalty, free):
    """Weighted ridge on SAGE-standardised, clipped columns `free` (the others' weights 0)."""
    sage = w == 1.0
    xc = np.clip(x, low, high)
    mean, scale = xc[sage].mean(0), xc[sage].std(0)
    z = ((xc - mean) / scale)[:, free]
    a = (z * w[:, None]).T @ z + penalty * np.eye(z.shape[1])
    return np.linalg.solve(a, (z * w[:, None]).T @ (y - y[sage].mean()))


def test_faults_are_one_sided_and_the_unvaried_capped_at_the_average():
    data = _rows()
    model = judge_fit._dense(data, 0.0)
    low, high = np.percentile(data.x, judge_fit.CLIP_PERCENTILES, axis=0)
    first_mean = np.clip(data.x, low, high).mean(0)
    # lex_hedge is weighed negatively: clipped from below at its mean; skeleton_reuse too; log_words is
    # length (two-sided); exclamations is at most the average
    assert model.low[1] == pytest.approx(first_mean[1]) and model.low[3] == pytest.approx(first_mean[3])
    assert model.low[0] == pytest.approx(low[0]) and model.high[2] == pytest.approx(first_mean[2])
    w = np.ones(len(data.y))
    expected = _ridge_by_hand(data.x, data.y, w, np.array(model.low), np.array(model.high), judge_fit.DENSE_PENALTY,
                              np.ones(4, bool))
    np.testing.assert_allclose(model.weight, expected, rtol=1e-9)
    assert model.intercept == pytest.approx(data.y.mean())
    # a reply without the fault is paid as one with the average reply's: nothing for fewer faults
    none = model.contributions(dict(zip(NAMES, (5.0, 0.0, 0.0, 0.0))))
    average = model.contributions(dict(zip(NAMES, (5.0, first_mean[1], 0.0, 0.0))))
    more = model.contributions(dict(zip(NAMES, (5.0, first_mean[1] + 2, 0.0, 0.0))))
    assert model.weight[1] < 0 and none["lex_hedge"] == pytest.approx(average["lex_hedge"])
    assert more["lex_hedge"] < average["lex_hedge"]


def test_adversarial_rows_refit_only_the_replys_text_features():
    data = _rows(adversarial=100)
    share = 0.1
    sage_only = judge_fit._dense(data.subset(data.sage), 0.0)
    model = judge_fit._dense(data, share)
    assert model.weight[0] == sage_only.weight[0]  # log_words: KEPT
    assert model.intercept == sage_only.intercept and model.mean == sage_only.mean and model.low == sage_only.low
    w = np.where(data.sage, 1.0, share * data.sage.sum() / (~data.sage).sum())
    kept = np.array([n.startswith(judge_fit.KEPT) for n in NAMES])
    x = np.clip(data.x, model.low, model.high)
    z = (x - np.array(model.mean)) / np.array(model.scale)
    target = data.y - model.intercept - z[:, kept] @ np.array(model.weight)[kept]
    zf = z[:, ~kept]
    free = np.linalg.solve((zf * w[:, None]).T @ zf + judge_fit.DENSE_PENALTY * np.eye(zf.shape[1]),
                           (zf * w[:, None]).T @ target)
    np.testing.assert_allclose(np.array(model.weight)[~kept], free, rtol=1e-9)
    assert model.weight[3] < sage_only.weight[3]  # the templates' skeleton reuse weighs more against them


def test_a_refit_to_try_is_named_by_the_environment(tmp_path, monkeypatch):
    from rlver_jax.simulator import judge_weights

    shipped = judge_weights.load()
    refit = tmp_path / "weights.json"
    refit.write_text(shipped.to_json().replace('"intercept": ' + f"{shipped.dense.intercept:.6g}",
                                               '"intercept": 7.5', 1))
    monkeypatch.setenv(judge_weights.WEIGHTS_ENV, str(refit))
    judge_weights.load.cache_clear()
    try:
        assert judge_weights.load().dense.intercept == 7.5
    finally:
        judge_weights.load.cache_clear()
    monkeypatch.delenv(judge_weights.WEIGHTS_ENV)
    assert judge_weights.load() == shipped
