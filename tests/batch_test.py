"""Collation of finished dialogues into the update's fixed-shape batch: rewards, padding, buckets."""

import numpy as np
import pytest

from rlver_jax.rl.batch import TrainBatch, collate, policy_positions, token_rewards
from rlver_jax.rollout.sequence import DialogueSequence
from tests.rl_helpers import dialogue, score


def test_token_rewards_final_and_per_turn():
    seq = dialogue(np.random.default_rng(0), 0, [30.0, 45.0, 38.0])
    assert token_rewards(score(seq, "final")) == {seq.turn_ends[-1]: 0.38}
    per_turn = token_rewards(score(seq, "per_turn"))
    assert per_turn == pytest.approx({seq.turn_ends[0]: 0.15, seq.turn_ends[1]: -0.07})
    failed = dialogue(np.random.default_rng(0), 0, [30.0, 45.0], format_failure=True)
    assert token_rewards(score(failed, "final")) == {failed.turn_ends[-1]: 0.0}
    # The failed turn loses everything gained: the return is (0 - 30) / 100.
    assert sum(token_rewards(score(failed, "per_turn")).values()) == pytest.approx(-0.30)
    with pytest.raises(ValueError, match=r"config.rl.reward_mode='sparse': use one of final \| per_turn"):
        score(seq, "sparse")
    unscored = _hand_made([1, 2, 3], [0, 1, 1], [2], [30, 20], reward_mode=None)
    with pytest.raises(ValueError, match="dialogue p carries no reward"):
        collate([unscored], batch_size=1)


def test_collate_pads_rows_and_length():
    rng = np.random.default_rng(0)
    seqs = [dialogue(rng, 0, [30.0, 50.0, 60.0]), dialogue(rng, 0, [30.0, 20.0, 10.0], n_turns=1)]
    b = collate(seqs, batch_size=4, length_multiple=8)
    assert b.tokens.shape == (4, 24)
    assert b.rewards[0, seqs[0].turn_ends[-1]] == pytest.approx(0.6)
    assert b.rewards.sum() == pytest.approx(0.7) and b.policy_mask[2:].sum() == 0
    assert set(b.group[2:]) == {6, 7}


def test_policy_positions_pad_rows_to_a_quarter_bucket():
    mask = np.zeros((3, 16), np.float32)
    mask[0, [3, 4, 9, 10, 11]] = 1
    mask[1, [15]] = 1
    pos = policy_positions(mask)  # longest row 5 -> width 8 (quarters of 16)
    np.testing.assert_array_equal(pos, [[3, 4, 9, 10, 11, 0, 0, 0], [15, 0, 0, 0, 0, 0, 0, 0], [0] * 8])
    assert policy_positions(np.ones((2, 10), np.float32)).shape == (2, 10)  # T not a multiple of 4


def _hand_made(tokens, mask, ends, emotions, logprobs=None, reward_mode="final", **kw):
    seq = DialogueSequence(profile_id="p", group=3, tokens=tokens, policy_mask=mask,
                           logprobs=logprobs or [0.0] * len(tokens), turn_ends=ends, emotions=emotions,
                           end_reason="turn_limit", **kw)
    return seq if reward_mode is None else score(seq, reward_mode)


def test_collate_arrays_by_hand():
    seqs = [_hand_made([5, 6, 7, 8, 9, 10, 11], [0, 0, 1, 1, 0, 1, 1], [3, 6], [30, 50, 70],
                       logprobs=[0.0, 0.0, -0.5, -0.25, 0.0, -1.0, -2.0]),
            _hand_made([1, 2, 3], [0, 1, 1], [2], [30, 20])]
    b = collate([score(s, "per_turn") for s in seqs], batch_size=3, length_multiple=4, pad_id=9)
    np.testing.assert_array_equal(b.tokens, [[5, 6, 7, 8, 9, 10, 11, 9], [1, 2, 3] + [9] * 5, [9] * 8])
    np.testing.assert_array_equal(b.attention_mask, [[1] * 7 + [0], [1] * 3 + [0] * 5, [0] * 8])
    np.testing.assert_array_equal(b.policy_mask, [[0, 0, 1, 1, 0, 1, 1, 0], [0, 1, 1, 0, 0, 0, 0, 0], [0] * 8])
    # per_turn: each turn's emotion change / 100 on its last policy token.
    np.testing.assert_allclose(b.rewards, [[0, 0, 0, 0.2, 0, 0, 0.2, 0], [0, 0, -0.1, 0, 0, 0, 0, 0], [0] * 8])
    np.testing.assert_array_equal(b.sample_logprobs[0], [0, 0, -0.5, -0.25, 0, -1, -2, 0])
    assert b.group.tolist() == [3, 3, 5]  # the padding row's own id: its index + batch_size
    # Policy positions: the longest row has 4 policy tokens -> width 4 (quarters of T = 8).
    np.testing.assert_array_equal(b.arrays()["policy_positions"], [[2, 3, 5, 6], [1, 2, 0, 0], [0, 0, 0, 0]])


def test_collate_rejects_what_cannot_be_trained():
    seq = _hand_made([1, 2, 3], [0, 1, 1], [2], [30, 20])
    with pytest.raises(ValueError, match="do not fit a batch of 1"):
        collate([seq, seq], batch_size=1)
    failed = _hand_made([1, 2, 3], [0, 1, 1], [2], [30], simulator_error=True)
    with pytest.raises(ValueError, match="not trainable"):
        collate([failed], batch_size=1)


def test_turn_rows_collate_by_hand():
    """A dialogue of two turn rows (think_history "drop") and one of a single row, 2 dialogue
    slots: 3 rows need 4 (a multiple of the slots). Each row carries the dialogue's return from
    its turn on: final, 0.7 on both rows; per_turn, (0.5 - 0.3) + (0.7 - 0.5) = 0.4 on the
    first row, 0.2 on the second."""
    two = _hand_made([1, 2, 3, 1, 2, 4, 5, 6], [0, 1, 1, 0, 0, 0, 1, 1], [2, 7], [30, 50, 70],
                     row_starts=[0, 3])
    one = _hand_made([7, 8, 9], [0, 0, 1], [2], [30, 20])
    b = collate([two, one], batch_size=2, length_multiple=4, pad_id=0)
    assert b.tokens.shape == (4, 8)
    np.testing.assert_array_equal(b.tokens[:3, :5], [[1, 2, 3, 0, 0], [1, 2, 4, 5, 6], [7, 8, 9, 0, 0]])
    np.testing.assert_array_equal(b.policy_mask[:3, :5], [[0, 1, 1, 0, 0], [0, 0, 0, 1, 1], [0, 0, 1, 0, 0]])
    assert b.policy_mask[3].sum() == 0 and b.attention_mask.sum(-1).tolist() == [3, 5, 3, 0]
    assert b.dialogue.tolist() == [0, 0, 1, 7] and b.group.tolist() == [3, 3, 3, 7]
    np.testing.assert_allclose(b.rewards.sum(-1), [0.7, 0.7, 0.2, 0.0])
    assert b.rewards[0, 2] == pytest.approx(0.7) and b.rewards[1, 4] == pytest.approx(0.7)
    assert collate([two, one], batch_size=2, rows=6).tokens.shape[0] == 6
    with pytest.raises(ValueError, match="multiple of batch_size=2 of at least 4"):
        collate([two, one], batch_size=2, rows=2)
    per_turn = collate([score(two, "per_turn"), score(one, "per_turn")], batch_size=2, length_multiple=4)
    np.testing.assert_allclose(per_turn.rewards.sum(-1), [0.4, 0.2, -0.1, 0.0])
    assert token_rewards(two) == pytest.approx({2: 0.4, 7: 0.2})


def test_row_starts_are_checked():
    bad = _hand_made([1, 2, 3, 4], [0, 1, 0, 1], [1, 3], [30, 40, 50], row_starts=[0, 4])
    with pytest.raises(ValueError, match="row_starts"):
        bad.check()


def test_turn_arrays_by_hand():
    """The turn arrays the update's overlong shaping and turn credit read: each policy token's
    turn (-1 elsewhere); each scored turn's emotion change / 100 on its last policy token, never
    summed over later turns whatever the rows; a format failure's turn carries -(emotion before)/100;
    a batch built without them has none."""
    one_row = _hand_made([5, 6, 7, 8, 9, 10, 11], [0, 0, 1, 1, 0, 1, 1], [3, 6], [30, 50, 70])
    two_rows = _hand_made([1, 2, 3, 1, 2, 4, 5, 6], [0, 1, 1, 0, 0, 0, 1, 1], [2, 7], [30, 40, 25],
                          row_starts=[0, 3])
    failed = score(DialogueSequence(profile_id="p", group=4, tokens=[7, 8, 9, 1, 2], policy_mask=[0, 1, 0, 1, 1],
                                    logprobs=[0.0] * 5, turn_ends=[1, 4], emotions=[30, 45],
                                    end_reason="format_failure", format_failure=True), "final")
    b = collate([one_row, two_rows, failed], batch_size=4, length_multiple=4)
    np.testing.assert_array_equal(b.turn[:4, :7], [[-1, -1, 0, 0, -1, 1, 1], [-1, 0, 0, -1, -1, -1, -1],
                                                    [-1, -1, -1, 1, 1, -1, -1], [-1, 0, -1, 1, 1, -1, -1]])
    assert (b.turn[4:] == -1).all() and (b.turn[b.policy_mask == 0] == -1).all()
    want = np.zeros_like(b.turn_rewards)
    want[0, 3], want[0, 6], want[1, 2], want[2, 4], want[3, 1], want[3, 4] = 0.2, 0.2, 0.1, -0.15, 0.15, -0.45
    np.testing.assert_allclose(b.turn_rewards, want, atol=1e-6)
    np.testing.assert_array_equal(b.turn_scored, want != 0)
    bare = TrainBatch(**{k: getattr(b, k) for k in ("tokens", "attention_mask", "policy_mask", "rewards",
                                                     "sample_logprobs", "group", "dialogue")})
    assert (bare.turn == -1).all() and not bare.turn_scored.any() and set(bare.arrays()) >= {"turn", "turn_rewards"}
