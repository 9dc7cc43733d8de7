"""Tests for rlver_jax.rl.advantages against plain numpy loops and hand-computed values."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlver_jax.rl import advantages as adv_lib
from tests import verl_reference as ref
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


def _ragged_turn_batch(seed: int, dialogues_per_group=(4, 3, 1, 2, 4), padding_rows: int = 2):
    """A train batch as the trainer builds it with one row per dialogue turn: each dialogue's 1-3
    rows are consecutive, dialogues of different groups interleave, groups differ in size (one
    has a single dialogue), each row has its own score (the return from its turn on), some
    dialogues tie, and padding rows carry fresh group and dialogue ids. Returns scores, group
    ids, members (each dialogue's first row), dialogue ids and the id bound."""
    rng = np.random.default_rng(seed)
    groups = rng.permutation(np.repeat(np.arange(len(dialogues_per_group)), dialogues_per_group))
    scores, group_ids, members, dialogue_ids = [], [], [], []
    for d, g in enumerate(groups):
        rows = int(rng.integers(1, 4))
        # Ties: a few dialogues score exactly like one another.
        first = float(np.float32(rng.choice([0.25, 0.5]) if rng.uniform() < 0.3 else rng.uniform()))
        for r in range(rows):
            scores.append(first if r == 0 else float(rng.uniform()))
            group_ids.append(g)
            members.append(r == 0)
            dialogue_ids.append(d)
    bound = 2 * (len(scores) + padding_rows)
    for p in range(padding_rows):
        scores.append(0.0)
        group_ids.append(bound // 2 + p)
        members.append(True)
        dialogue_ids.append(bound // 2 + p)
    return (np.array(scores, np.float32), np.array(group_ids), np.array(members),
            np.array(dialogue_ids), bound)


def test_rloo_golden():
    # [1, 2, 3]: 1 - 2.5, 2 - 2, 3 - 1.5. [5, 5]: 0. A group of one: 0 (no other dialogue).
    scores = np.array([1.0, 2.0, 3.0, 5.0, 5.0, 7.0], np.float32)
    got = adv_lib.rloo_advantages(scores, np.array([0, 0, 0, 1, 1, 2]), 3)
    np.testing.assert_allclose(got, [-1.5, 0, 1.5, 0, 0, 0], atol=1e-6)


def test_rloo_one_row_per_dialogue_matches_verl_and_scaled_grpo():
    rng = np.random.default_rng(11)
    group_ids = rng.permutation(np.repeat(np.arange(5), [4, 4, 3, 1, 6]))
    scores = rng.uniform(size=len(group_ids)).astype(np.float32)
    got = np.asarray(adv_lib.rloo_advantages(scores, group_ids, 5))
    sizes = np.bincount(group_ids)[group_ids]
    np.testing.assert_allclose(got[sizes > 1], ref.verl_rloo(scores, group_ids)[sizes > 1],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, ref.rloo(scores, group_ids, np.ones(len(scores), bool),
                                             np.arange(len(scores))), rtol=1e-5, atol=1e-6)
    assert np.all(got[sizes == 1] == 0)  # verl's loop would keep the raw score
    # A_i = n / (n - 1) (s_i - mean_g).
    centered = adv_lib.grpo_advantages(scores, group_ids, 5, normalize_std=False)
    np.testing.assert_allclose(got, np.where(sizes > 1, sizes / np.maximum(sizes - 1, 1), 0)
                               * centered, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_matches_reference_on_turn_rows(seed):
    scores, groups, members, dialogues, bound = _ragged_turn_batch(seed)
    got = adv_lib.rloo_advantages(scores, groups, bound, members=members, dialogue_ids=dialogues)
    np.testing.assert_allclose(got, ref.rloo(scores, groups, members, dialogues),
                               rtol=1e-5, atol=1e-6)


def test_rloo_turn_rows_leave_out_their_own_dialogue():
    """Group 0: dialogue 0 (rows 0.2 then 0.9) and dialogue 1 (0.6). Row 1, a later turn of
    dialogue 0, is compared with dialogue 1 only: 0.9 - 0.6; without dialogue ids it would be
    compared with both members: 0.9 - 0.4. A lone dialogue (group 1, two rows) gets 0."""
    scores = np.array([0.2, 0.9, 0.6, 0.3, 0.8], np.float32)
    groups = np.array([0, 0, 0, 1, 1])
    members = np.array([1, 0, 1, 1, 0], bool)
    dialogues = np.array([0, 0, 1, 2, 2])
    got = adv_lib.rloo_advantages(scores, groups, 2, members=members, dialogue_ids=dialogues)
    np.testing.assert_allclose(got, [-0.4, 0.3, 0.4, 0, 0], atol=1e-6)
    plain = adv_lib.rloo_advantages(scores, groups, 2, members=members)
    np.testing.assert_allclose(plain[:2], [-0.4, 0.5], atol=1e-6)


def test_rloo_identical_scores_give_exact_zero_and_jit():
    scores = np.repeat(np.array([0.37, 0.93, 0.1], np.float32), [7, 7, 4])
    group_ids = np.repeat(np.arange(3), [7, 7, 4])
    np.testing.assert_array_equal(adv_lib.rloo_advantages(scores, group_ids, 3), 0.0)
    s, g, m, d, bound = _ragged_turn_batch(3)
    fn = jax.jit(functools.partial(adv_lib.rloo_advantages, num_groups=bound))
    np.testing.assert_allclose(fn(s, g, members=m, dialogue_ids=d),
                               ref.rloo(s, g, m, d), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gamma", [1.0, 0.97, 0.5])
def test_reinforce_pp_returns_match_reference_on_multi_turn_rows(gamma):
    rng = np.random.default_rng(12)
    mask = random_policy_mask(rng, 6, 40)
    mask[4] = 0.0  # a padding row
    rewards = (rng.normal(size=mask.shape) * mask).astype(np.float32)
    advantages, returns = adv_lib.reinforce_pp_returns(rewards, mask, gamma)
    want_returns = ref.returns_to_go(rewards, mask, gamma)
    np.testing.assert_allclose(returns, want_returns, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(advantages, ref.whiten(want_returns, mask), rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(advantages)[mask == 0] == 0)


def test_reinforce_pp_returns_match_verl_on_single_responses():
    """One contiguous response per row, right padded (verl's setting): verl's loop, which resets
    the running return after every token with mask 0, gives the same advantages and returns."""
    rng = np.random.default_rng(13)
    mask = np.zeros((5, 30), np.float32)
    for b in range(5):
        start = int(rng.integers(0, 8))
        mask[b, start : start + int(rng.integers(5, 22))] = 1.0
    rewards = (rng.normal(size=mask.shape) * mask).astype(np.float32)
    advantages, returns = adv_lib.reinforce_pp_returns(rewards, mask, 0.9)
    want_adv, want_ret = ref.verl_reinforce_pp(rewards, mask, 0.9)
    np.testing.assert_allclose(advantages, want_adv, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(returns)[mask > 0], want_ret[mask > 0], rtol=1e-5,
                               atol=1e-6)


def test_reinforce_pp_credit_crosses_user_turns():
    """Turns at tokens {0, 1} and {3}, the final reward 1 on token 3, gamma 0.5: the returns are
    0.25, 0.5, -, 1 over the policy tokens. verl's loop would stop at the user token 2 and give
    the first turn 0."""
    mask = np.array([[1, 1, 0, 1]], np.float32)
    rewards = np.array([[0, 0, 0, 1.0]], np.float32)
    _, returns = adv_lib.reinforce_pp_returns(rewards, mask, 0.5)
    np.testing.assert_allclose(returns, [[0.25, 0.5, 0, 1.0]], atol=1e-7)
    _, verl_returns = ref.verl_reinforce_pp(rewards, mask, 0.5)
    np.testing.assert_allclose(verl_returns[mask > 0], [0, 0, 1.0])


@pytest.mark.parametrize("seed", [0, 4])
def test_reinforce_pp_baseline_matches_reference(seed):
    scores, groups, members, dialogues, bound = _ragged_turn_batch(seed)
    rng = np.random.default_rng(seed + 100)
    mask = random_policy_mask(rng, len(scores), 24)
    mask[-2:] = 0.0  # the padding rows have no policy token
    got = adv_lib.reinforce_pp_baseline_advantages(scores, groups, bound, mask, members=members)
    want = ref.reinforce_pp_baseline(scores, groups, members, mask)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    sel = np.asarray(got)[mask > 0]
    np.testing.assert_allclose([sel.mean(), sel.std(ddof=1)], [0, 1], atol=1e-4)


def test_grpo_lone_dialogue_with_turn_rows_gets_zero():
    # One dialogue of three turn rows with different scores (per-turn returns): no baseline.
    scores = np.array([0.5, 0.9, 0.1], np.float32)
    members = np.array([1, 0, 0], bool)
    for normalize_std in (True, False):
        got = adv_lib.grpo_advantages(scores, np.zeros(3, int), 1, normalize_std=normalize_std,
                                      members=members)
        np.testing.assert_array_equal(got, np.zeros(3))


def test_overlong_penalty_golden_and_reference():
    # max 100, buffer 20: free up to 80, linear to -factor at 100, -factor beyond.
    lengths = np.array([0, 80, 85, 90, 100, 101, 500])
    got = adv_lib.overlong_penalty(lengths, 100, 20, 0.5)
    np.testing.assert_allclose(got, [0, 0, -0.125, -0.25, -0.5, -0.5, -0.5], atol=1e-7)
    assert got.dtype == jnp.float32
    many = np.arange(0, 130)
    np.testing.assert_allclose(adv_lib.overlong_penalty(many, 100, 30, 1.0),
                               [ref.overlong_penalty(n, 100, 30, 1.0) for n in many], atol=1e-6)
    for buffer_len in (0, 101):
        with pytest.raises(ValueError, match="buffer_len"):
            adv_lib.overlong_penalty(lengths, 100, buffer_len, 1.0)


def test_degenerate_groups():
    # Group 0 all 1.0; group 1 mixed; group 2 a single member; group 3 mixed only through a
    # non-member row (which does not count); id 4 unused.
    scores = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.3, 0.7], np.float32)
    groups = np.array([0, 0, 0, 1, 1, 2, 3, 3])
    members = np.array([1, 1, 1, 1, 1, 1, 1, 0], bool)
    got = adv_lib.degenerate_groups(scores, groups, 5, members=members)
    np.testing.assert_array_equal(got, [True, False, True, True, True])
    assert not adv_lib.degenerate_groups(scores, groups, 5)[3]
    s, g, m, _, bound = _ragged_turn_batch(5)
    np.testing.assert_array_equal(adv_lib.degenerate_groups(s, g, bound, members=m),
                                  ref.degenerate_groups(s, g, m, bound))
    # A degenerate group is exactly where GRPO and RLOO give their members 0.
    for fn in (adv_lib.grpo_advantages, adv_lib.rloo_advantages):
        adv = np.asarray(fn(scores, groups, 5, members=members))
        assert np.all(adv[np.asarray(got)[groups] & members] == 0)


def _random_turns(seed: int, rows: int = 14, turns: int = 5):
    rng = np.random.default_rng(seed)
    groups = rng.permutation(np.repeat(np.arange(4), [5, 4, 1, 4]))[:rows]
    lengths = rng.integers(1, turns + 1, size=rows)  # dialogues end at different turns
    valid = np.arange(turns)[None, :] < lengths[:, None]
    rewards = rng.normal(size=(rows, turns)).astype(np.float32)
    rewards[rng.uniform(size=rewards.shape) < 0.2] = 0.5  # ties
    rewards[~valid] = np.nan  # garbage past a dialogue's end must not matter
    members = rng.uniform(size=rows) < 0.85
    return rewards, valid, groups, members


@pytest.mark.parametrize("normalize_std", [True, False])
def test_turn_group_advantages_match_reference(normalize_std):
    rewards, valid, groups, members = _random_turns(14)
    got = adv_lib.turn_group_advantages(rewards, valid, groups, 4, members=members,
                                        normalize_std=normalize_std)
    want = ref.turn_group(rewards, valid, groups, members, normalize_std, 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(got)) and np.all(np.asarray(got)[~valid] == 0)


def test_turn_group_advantages_golden():
    # Three dialogues of one group. Turn 0: [1, 2, 3] -> mean 2, std 1 -> [-1, 0, 1]. Turn 1:
    # dialogues 0 and 1 reach it with [0.5, 0.5] -> 0. Turn 2: only dialogue 0 -> 0.
    rewards = np.array([[1.0, 0.5, 9.0], [2.0, 0.5, 0.0], [3.0, 0.0, 0.0]], np.float32)
    valid = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)
    got = adv_lib.turn_group_advantages(rewards, valid, np.zeros(3, int), 1, eps=0.0)
    np.testing.assert_allclose(got, [[-1, 0, 0], [0, 0, 0], [1, 0, 0]], atol=1e-6)


def test_turn_group_advantages_one_row_per_turn_layout():
    """The same dialogues laid out one row per turn (row = turn k of a dialogue, only its column k
    valid, every row a member) give each turn the same advantage as one row per dialogue."""
    rewards, valid, groups, _ = _random_turns(15)
    by_dialogue = np.asarray(adv_lib.turn_group_advantages(rewards, valid, groups, 4))
    d_idx, k_idx = np.nonzero(valid)
    turn_rows = np.zeros((len(d_idx), rewards.shape[1]), np.float32)
    turn_rows[np.arange(len(d_idx)), k_idx] = rewards[d_idx, k_idx]
    turn_valid = np.zeros(turn_rows.shape, bool)
    turn_valid[np.arange(len(d_idx)), k_idx] = True
    by_turn = adv_lib.turn_group_advantages(turn_rows, turn_valid, groups[d_idx], 4)
    np.testing.assert_allclose(np.asarray(by_turn)[np.arange(len(d_idx)), k_idx],
                               by_dialogue[d_idx, k_idx], rtol=1e-5, atol=1e-6)


def test_mix_turn_advantages():
    rng = np.random.default_rng(16)
    mask = random_policy_mask(rng, 4, 30)
    # Number the assistant segments of each row: the turn index of its policy tokens.
    turn_index = np.where(mask > 0, np.cumsum(np.diff(mask, axis=1, prepend=0) == 1, axis=1) - 1,
                          -1)
    turns = int(turn_index.max()) + 1
    turn_adv = rng.normal(size=(4, turns)).astype(np.float32)
    dialogue_adv = rng.normal(size=4).astype(np.float32)
    base = adv_lib.broadcast_to_tokens(dialogue_adv, mask)
    got = adv_lib.mix_turn_advantages(base, turn_adv, turn_index, 0.3)
    np.testing.assert_allclose(got, ref.mix_turns(base, turn_adv, turn_index, 0.3), rtol=1e-6,
                               atol=1e-7)
    assert np.all(np.asarray(got)[mask == 0] == 0)
    # By hand: turn 0 on tokens 0-1, turn 1 on token 3.
    got = adv_lib.mix_turn_advantages(np.array([[1.0, 1.0, 0.0, 1.0]]), np.array([[0.5, -2.0]]),
                                      np.array([[0, 0, -1, 1]]), 0.5)
    np.testing.assert_allclose(got, [[1.25, 1.25, 0.0, 0.0]])


def test_new_estimators_jit():
    scores, groups, members, dialogues, bound = _ragged_turn_batch(6)
    mask = random_policy_mask(np.random.default_rng(17), len(scores), 20)
    rewards = np.zeros(mask.shape, np.float32)
    rewards[:, -1] = scores

    @jax.jit
    def run(scores, groups, members, mask, rewards, gamma):
        return (adv_lib.reinforce_pp_returns(rewards, mask, gamma),
                adv_lib.reinforce_pp_baseline_advantages(scores, groups, bound, mask,
                                                         members=members),
                adv_lib.degenerate_groups(scores, groups, bound, members=members),
                adv_lib.overlong_penalty(jnp.sum(mask, axis=-1), 16, 4, 1.0))

    got = run(scores, groups, members, mask, rewards, jnp.float32(0.9))
    want = (adv_lib.reinforce_pp_returns(rewards, mask, 0.9),
            adv_lib.reinforce_pp_baseline_advantages(scores, groups, bound, mask, members=members),
            adv_lib.degenerate_groups(scores, groups, bound, members=members),
            adv_lib.overlong_penalty(mask.sum(axis=-1), 16, 4, 1.0))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
