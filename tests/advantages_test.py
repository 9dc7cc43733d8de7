"""Tests for rlver_jax.rl.advantages against plain numpy loops and hand-computed values."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlver_jax.rl import advantages as adv_lib
from tests.rl_helpers import random_policy_mask, strict_ranks  # noqa: F401 (autouse fixture)




def numpy_gae(rewards, values, mask, gamma, lam):
    """Reference: gather each row's policy tokens, run textbook GAE on them, scatter back."""
    advantages = np.zeros_like(rewards, dtype=np.float64)
    returns = np.zeros_like(rewards, dtype=np.float64)
    for b in range(rewards.shape[0]):
        idx = np.flatnonzero(mask[b])
        r, v = rewards[b, idx].astype(np.float64), values[b, idx].astype(np.float64)
        v_next = np.append(v[1:], 0.0)
        running = 0.0
        for k in reversed(range(len(idx))):
            running = r[k] + gamma * v_next[k] - v[k] + gamma * lam * running
            advantages[b, idx[k]] = running
            returns[b, idx[k]] = running + v[k]
    return advantages, returns


def _random_gae_inputs(seed: int, batch: int = 6, length: int = 48):
    rng = np.random.default_rng(seed)
    mask = random_policy_mask(rng, batch, length)
    values = rng.normal(size=(batch, length)).astype(np.float32)
    rewards = (rng.normal(size=(batch, length)) * mask).astype(np.float32)
    return rewards, values, mask


def test_random_masks_have_several_turns_and_different_lengths():
    _, _, mask = _random_gae_inputs(0)
    turns = (np.diff(mask, axis=1, prepend=0) == 1).sum(axis=1)
    last = [np.flatnonzero(row).max() for row in mask]
    assert turns.min() >= 2
    assert len(set(last)) > 1


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_numpy(gamma, lam):
    rewards, values, mask = _random_gae_inputs(1)
    got_adv, got_ret = adv_lib.gae_advantages(rewards, values, mask, gamma, lam)
    want_adv, want_ret = numpy_gae(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(got_adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_ret, want_ret, rtol=1e-5, atol=1e-5)


def test_gae_golden():
    # Row 0: turns at tokens {1, 2} and {4}, final reward 1 on token 4. gamma 0.9, lam 0.5:
    #   t4: delta = 1 - 0.4 = 0.6;             A = 0.6
    #   t2: delta = 0.9*0.4 - 0.6 = -0.24;    A = -0.24 + 0.45*0.6 = 0.03
    #   t1: delta = 0.9*0.6 - 0.5 = 0.04;     A = 0.04 + 0.45*0.03 = 0.0535
    # Row 1: per-turn rewards 0.1 on token 0 and -0.2 on token 3:
    #   t3: delta = -0.2 - 0.3 = -0.5;        A = -0.5
    #   t0: delta = 0.1 + 0.9*0.3 - 0.2 = 0.17; A = 0.17 + 0.45*(-0.5) = -0.055
    # Values on non-policy tokens (9.0) must not matter.
    mask = np.array([[0, 1, 1, 0, 1, 0], [1, 0, 0, 1, 0, 0]], np.float32)
    values = np.array([[9, 0.5, 0.6, 9, 0.4, 9], [0.2, 9, 9, 0.3, 9, 9]], np.float32)
    rewards = np.array([[0, 0, 0, 0, 1.0, 0], [0.1, 0, 0, -0.2, 0, 0]], np.float32)
    advantages, returns = adv_lib.gae_advantages(rewards, values, mask, 0.9, 0.5)
    np.testing.assert_allclose(
        advantages, [[0, 0.0535, 0.03, 0, 0.6, 0], [-0.055, 0, 0, -0.5, 0, 0]], atol=1e-6
    )
    np.testing.assert_allclose(
        returns, [[0, 0.5535, 0.63, 0, 1.0, 0], [0.145, 0, 0, -0.2, 0, 0]], atol=1e-6
    )


def test_gae_undiscounted_is_reward_to_go_minus_value():
    rewards, values, mask = _random_gae_inputs(2)
    advantages, returns = adv_lib.gae_advantages(rewards, values, mask, 1.0, 1.0)
    reward_to_go = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1]
    np.testing.assert_allclose(advantages, (reward_to_go - values) * mask, atol=1e-5)
    np.testing.assert_allclose(returns, reward_to_go * mask, atol=1e-5)


def test_gae_ignores_non_policy_positions_and_accepts_bool_mask():
    rewards, values, mask = _random_gae_inputs(3)
    base = adv_lib.gae_advantages(rewards, values, mask, 0.95, 0.9)
    noise = np.random.default_rng(4).normal(size=rewards.shape).astype(np.float32) * (1 - mask)
    perturbed = adv_lib.gae_advantages(rewards + noise, values + noise, mask > 0, 0.95, 0.9)
    for a, b in zip(base, perturbed):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert np.all(np.asarray(base[0])[mask == 0] == 0)


def test_gae_jit_with_traced_hyperparameters_and_bf16():
    rewards, values, mask = _random_gae_inputs(5)
    eager = adv_lib.gae_advantages(rewards, values, mask, 0.99, 0.95)
    jitted = jax.jit(adv_lib.gae_advantages)(
        jnp.asarray(rewards, jnp.bfloat16), values, mask, jnp.float32(0.99), jnp.float32(0.95)
    )
    assert jitted[0].dtype == jnp.float32
    np.testing.assert_allclose(jitted[0], eager[0], atol=0.05)


def numpy_grpo(scores, group_ids, normalize_std, eps):
    out = np.zeros(len(scores), np.float64)
    for g in np.unique(group_ids):
        members = np.flatnonzero(group_ids == g)
        s = scores[members].astype(np.float64)
        centered = s - s.mean()
        if normalize_std and len(s) > 1:
            centered = centered / (s.std(ddof=1) + eps)
        out[members] = centered
    return out


@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_matches_numpy_with_shuffled_ragged_groups(normalize_std):
    rng = np.random.default_rng(6)
    # Groups of sizes 4, 4, 3, 1, 4 (two dropped dialogues), interleaved.
    group_ids = rng.permutation(np.repeat(np.arange(5), [4, 4, 3, 1, 4]))
    scores = rng.uniform(0, 1, size=len(group_ids)).astype(np.float32)
    got = adv_lib.grpo_advantages(scores, group_ids, 5, normalize_std=normalize_std, eps=1e-6)
    want = numpy_grpo(scores, group_ids, normalize_std, 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_grpo_golden_and_singleton_group():
    # Group 0 = {1, 2, 3}: mean 2, sample std 1. Group 1 = {10, 10}. Group 2 = {7}.
    scores = np.array([1.0, 2.0, 3.0, 10.0, 10.0, 7.0], np.float32)
    got = adv_lib.grpo_advantages(scores, np.array([0, 0, 0, 1, 1, 2]), 3, eps=0.0)
    np.testing.assert_allclose(got, [-1, 0, 1, 0, 0, 0], atol=1e-6)
    assert np.all(np.isfinite(got))


def test_grpo_identical_scores_give_zero():
    # 0.37 and 0.93 in groups of 7: a plain fp32 group sum / 7 is off by one ulp, which the std
    # normalisation would turn into advantages of order 0.05.
    scores = np.repeat(np.array([0.37, 0.93, 0.1, 1.0], np.float32), [7, 7, 4, 4])
    group_ids = np.repeat(np.arange(4), [7, 7, 4, 4])
    for normalize_std in (True, False):
        got = adv_lib.grpo_advantages(scores, group_ids, 4, normalize_std=normalize_std)
        np.testing.assert_array_equal(got, np.zeros(len(scores)))


def test_grpo_jit():
    rng = np.random.default_rng(7)
    scores = rng.uniform(size=12).astype(np.float32)
    group_ids = np.repeat(np.arange(3), 4)
    fn = jax.jit(functools.partial(adv_lib.grpo_advantages, num_groups=3, normalize_std=True))
    np.testing.assert_allclose(
        fn(scores, group_ids), adv_lib.grpo_advantages(scores, group_ids, 3), atol=1e-6
    )


def test_broadcast_to_tokens():
    mask = random_policy_mask(np.random.default_rng(8), 3, 10)
    seq_adv = np.array([0.5, -1.0, 2.0], np.float32)
    np.testing.assert_array_equal(
        adv_lib.broadcast_to_tokens(seq_adv, mask > 0), seq_adv[:, None] * mask
    )


def test_masked_mean_and_var_match_numpy():
    rng = np.random.default_rng(9)
    mask = random_policy_mask(rng, 4, 20)
    x = rng.normal(size=mask.shape).astype(np.float32)
    sel = x[mask > 0]
    np.testing.assert_allclose(adv_lib.masked_mean(x, mask), sel.mean(), rtol=1e-5)
    np.testing.assert_allclose(adv_lib.masked_var(x, mask), sel.var(), rtol=1e-5)
    np.testing.assert_allclose(adv_lib.masked_var(x, mask, ddof=1), sel.var(ddof=1), rtol=1e-5)
    rows = [x[b][mask[b] > 0] for b in range(4)]
    np.testing.assert_allclose(adv_lib.masked_mean(x, mask, axis=1), [r.mean() for r in rows],
                               rtol=1e-5)
    np.testing.assert_allclose(adv_lib.masked_var(x, mask, axis=1), [r.var() for r in rows],
                               rtol=1e-4)
    assert float(adv_lib.masked_mean(x, np.zeros_like(mask))) == 0.0


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten(shift_mean):
    rng = np.random.default_rng(10)
    mask = random_policy_mask(rng, 4, 30)
    x = (rng.normal(size=mask.shape) * 3 + 2).astype(np.float32)
    got = np.asarray(adv_lib.masked_whiten(x, mask, shift_mean=shift_mean))
    sel = x[mask > 0]
    want = (sel - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8)  # unbiased, as verl
    if not shift_mean:
        want = want + sel.mean()
    np.testing.assert_allclose(got[mask > 0], want, rtol=1e-5, atol=1e-5)
    assert np.all(got[mask == 0] == 0)


def test_grpo_members_group_dialogues_not_turn_rows():
    """Turn rows of dialogues (think_history "drop"): the baseline runs over dialogues (their
    first rows), each dialogue counted once whatever its number of turns. By hand: group 0 has
    dialogues of reward 0.2 (3 turn rows) and 0.6 (1 row): mean 0.4, sample std 0.2828, so every
    row of the first gets -0.7071 and the second +0.7071 (over the 4 rows the mean would be 0.3).
    Group 1 holds one dialogue of 2 rows (a lone member): 0. A padding row of its own group: 0."""
    scores = np.array([0.2, 0.2, 0.2, 0.6, 0.9, 0.9, 0.0], np.float32)
    groups = np.array([0, 0, 0, 0, 1, 1, 14])
    members = np.array([1, 0, 0, 1, 1, 0, 1], bool)
    got = adv_lib.grpo_advantages(scores, groups, 16, eps=0.0, members=members)
    a = 0.2 / np.sqrt(0.08)
    np.testing.assert_allclose(got, [-a, -a, -a, a, 0, 0, 0], rtol=1e-5, atol=1e-7)
    # Without members every row counts: group 0's mean is 0.3.
    plain = adv_lib.grpo_advantages(scores, groups, 16, normalize_std=False)
    np.testing.assert_allclose(plain[:4], [-0.1, -0.1, -0.1, 0.3], atol=1e-6)
