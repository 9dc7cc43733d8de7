"""The estimators by name and the shaping around them (rlver_jax.rl.estimators) on batch arrays,
against hand-computed values and the numpy transcriptions of tests/verl_reference.py."""

import jax.numpy as jnp
import numpy as np
import pytest

from rlver_jax.rl import estimators, settings
from rlver_jax.rl.batch import collate
from rlver_jax.rollout.sequence import DialogueSequence
from tests import verl_reference as ref
from tests.rl_helpers import score


def _seq(group, turn_lengths, emotions, rows="one", ctx=2):
    """[ctx user tokens][turn policy tokens] per turn; rows "turn": one row per turn (think_history "drop")."""
    tokens, mask, ends, starts = [], [], [], []
    for n in turn_lengths:
        if rows == "turn":
            starts.append(len(tokens))
        tokens += [1] * ctx + [2] * n
        mask += [0] * ctx + [1] * n
        ends.append(len(tokens) - 1)
    return score(DialogueSequence(profile_id=f"p{group}", group=group, tokens=tokens, policy_mask=mask,
                                  logprobs=[0.0] * len(tokens), turn_ends=ends, emotions=emotions,
                                  end_reason="turn_limit", row_starts=starts or [0]), "final")


def _arrays(seqs, slots):
    b = collate(seqs, batch_size=slots, length_multiple=4)
    return b, {k: jnp.asarray(v) for k, v in b.arrays().items()}


def test_overlong_penalty_per_turn_in_both_layouts():
    """Budget 5, buffer 2: a turn of 3 tokens is free, 4 costs 0.5, 5 costs 1 (DAPO's ramp). One row
    per dialogue: each turn's penalty on its own last token. One row per turn: each row is its own
    episode, so its last token carries its turn's and the later turns' penalties."""
    rl = settings.RLSettings(algo="dapo", max_new_tokens=5, overlong_buffer=2, max_turns=3)
    b, x = _arrays([_seq(0, [3, 5, 4], [30, 40, 50, 60]), _seq(0, [4, 5], [30, 20, 10], rows="turn")], 4)
    got = np.asarray(estimators.overlong_rewards(rl, x["policy_mask"], x["turn"], x["dialogue"]))
    want = np.zeros_like(got)
    ends = np.flatnonzero(b.policy_mask[0][:-1] > b.policy_mask[0][1:])  # the last token of each turn
    want[0, ends] = [0.0, -1.0, -0.5]
    want[1, 5], want[2, 6] = -1.5, -1.0
    np.testing.assert_allclose(got, want)
    assert got[3].sum() == 0  # the padding row
    for length in range(8):
        assert ref.overlong_penalty(length, 5, 2, 1.0) == pytest.approx(
            float(np.asarray(estimators.adv_lib.overlong_penalty(jnp.array([length]), 5, 2, 1.0))[0]))


def test_kept_rows_drop_groups_without_signal():
    """Group 0's two dialogues end alike, group 2 has one dialogue: both filtered (their rows, turn
    rows included, get no loss weight); group 1 is kept; padding counts for no group."""
    seqs = [_seq(0, [2], [30, 40]), _seq(0, [2, 2], [30, 35, 40], rows="turn"), _seq(1, [2], [30, 10]),
            _seq(1, [2], [30, 60]), _seq(2, [2], [30, 50])]
    b, x = _arrays(seqs, 6)
    keep, filtered = estimators.kept_rows(x["rewards"], x["policy_mask"], x["group"], x["dialogue"])
    assert np.asarray(keep).tolist()[:6] == [False, False, False, True, True, False]
    assert float(filtered) == 2.0


@pytest.mark.parametrize("seed", [0, 1])
def test_turn_credit_matches_reference(seed):
    """Random groups of one-row dialogues with 1-3 turns and random emotions: the dialogue-level
    advantage plus weight x (turn k's emotion change normalised among the group's turns k),
    each token of a turn carrying its turn's (verl_reference.turn_group, mix_turns)."""
    rng = np.random.default_rng(seed)
    seqs = []
    for d in range(8):
        turns = int(rng.integers(1, 4))
        emotions = [30.0] + list(rng.integers(0, 100, turns).astype(float))
        seqs.append(_seq(d % 2, list(rng.integers(1, 4, turns)), emotions))
    rl = settings.RLSettings(algo="grpo", turn_credit_weight=0.5, max_turns=3)
    b, x = _arrays(seqs, 8)
    base = jnp.asarray(rng.normal(size=b.policy_mask.shape).astype(np.float32)) * x["policy_mask"]
    got = np.asarray(estimators.turn_credit(rl, base, x["policy_mask"], x["group"], x["turn"], x["turn_rewards"],
                                            x["turn_scored"]))
    rows, turns = b.turn.shape[0], 3
    turn_rewards, valid = np.zeros((rows, turns)), np.zeros((rows, turns), bool)
    for r, t in zip(*np.nonzero(b.turn_scored)):
        turn_rewards[r, b.turn[r, t]], valid[r, b.turn[r, t]] = b.turn_rewards[r, t], True
    turn_adv = ref.turn_group(turn_rewards, valid, b.group, np.ones(rows, bool), True, rl.grpo_eps)
    want = ref.mix_turns(np.asarray(base), turn_adv, b.turn, 0.5) * b.policy_mask
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(turn_adv).sum() > 0  # the test has turn-level signal


def test_turn_credit_lands_on_turn_rows():
    """One row per turn: turn 1 of the two dialogues of a group (changes +20 and -10) gets +-0.7071 x
    the weight on its own row; turn 0 (changes +10, +10) adds nothing."""
    seqs = [_seq(0, [2, 2], [30, 40, 60], rows="turn"), _seq(0, [2, 2], [30, 40, 30], rows="turn")]
    rl = settings.RLSettings(algo="grpo", turn_credit_weight=2.0, max_turns=2)
    b, x = _arrays(seqs, 2)
    got = np.asarray(estimators.turn_credit(rl, jnp.zeros(b.policy_mask.shape), x["policy_mask"], x["group"],
                                            x["turn"], x["turn_rewards"], x["turn_scored"]))
    per_row = got.sum(-1) / np.maximum(b.policy_mask.sum(-1), 1)
    a = 2.0 * 0.15 / (np.std([0.2, -0.1], ddof=1) + 1e-6)
    np.testing.assert_allclose(per_row, [0.0, a, 0.0, -a], atol=1e-5)
