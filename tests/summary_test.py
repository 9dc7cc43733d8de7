"""The one summary of finished dialogues, against rates computed by hand."""

import math

import pytest

from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.summary import reference_metrics, rollout_metrics, summarize
from tests.rl_helpers import score


def dialogue(pid, emotions, end_reason, turns, tokens, reply="I hear you. Go on.", **flags):
    return score(DialogueSequence(profile_id=pid, group=0, tokens=[1] * tokens, policy_mask=[1] * tokens,
                                  logprobs=[0.0] * tokens, turn_ends=[tokens - 1], emotions=emotions,
                                  end_reason=end_reason, language="en", **flags,
                                  turns=[{"turn": i + 1, "reply": f"{reply} ({i + 1})"} for i in range(turns)]),
                 "final")


# Final emotions 100, 0, 40, (55), 60; rewards 1, 0, 0 (format failure), (-), 0.6; turns 2, 2, 3, 1, 1;
# tokens 10, 8, 12, 4, 6. D is a simulator error: counted, in no score. C's 3 replies loop
# ("so so so"): 3 of the 9 replies are degenerate.
DIALOGUES = [
    dialogue("A", [30, 60, 100], "success", 2, 10),
    dialogue("B", [30, 10, 0], "failure", 2, 8),
    dialogue("C", [30, 35, 40], "format_failure", 3, 12, reply="so so so", format_failure=True),
    dialogue("D", [30, 55], "simulator_error", 1, 4, simulator_error=True),
    dialogue("E", [30, 60], "truncated", 1, 6, truncated=True),
]


def test_summary_by_hand():
    s = summarize(DIALOGUES)
    assert (s.dialogues, s.scored, s.simulator_errors, s.success, s.failure) == (5, 4, 1, 1, 1)
    assert s.score == pytest.approx((100 + 0 + 40 + 60) / 4)
    assert s.reward == pytest.approx((1.0 + 0 + 0 + 0.6) / 4)
    assert (s.success_rate, s.failure_rate) == (0.25, 0.25)
    assert s.scored_turns == pytest.approx((2 + 2 + 3 + 1) / 4) and s.turns == pytest.approx(9 / 5)
    assert s.tokens == pytest.approx(40 / 5)
    assert (s.format_failure_rate, s.truncated_rate) == (0.2, 0.2)


def test_training_metrics_by_hand():
    assert rollout_metrics(DIALOGUES) == pytest.approx({
        "reward_mean": 0.4, "emotion_mean": 50.0, "success_rate": 0.25, "user_left_rate": 0.25,
        "format_failure_rate": 0.2, "truncated_rate": 0.2, "simulator_errors": 1.0, "no_policy_turn": 0.0,
        "turns_mean": 1.8, "sequence_tokens_mean": 8.0, "degenerate_rate": 3 / 9, "degenerate_empty_rate": 0.0,
        "degenerate_garbled_rate": 0.0, "degenerate_word_salad_rate": 0.0, "degenerate_repetition_rate": 3 / 9,
        "degenerate_wrong_language_rate": 0.0, "degenerate_repeat_turn_rate": 0.0,
        "template_rate": 0.0})  # no messages recorded: no replies to compare (tests/skeletons_test.py)


def test_a_dialogue_without_a_policy_turn_is_counted_and_never_scored():
    """An opening that filled the policy's budget ends "truncated" at the initial emotion (40) before
    the policy spoke: counted in no_policy_turn, left out of the score, the reward and the rates."""
    silent = DialogueSequence(profile_id="F", group=0, tokens=[], policy_mask=[], logprobs=[], turn_ends=[],
                              emotions=[40], end_reason="truncated", truncated=True)
    s = summarize([*DIALOGUES, silent])
    assert (s.dialogues, s.scored, s.simulator_errors, s.no_policy_turn) == (6, 4, 1, 1)
    assert s.score == pytest.approx((100 + 0 + 40 + 60) / 4) and s.success_rate == 0.25
    metrics = rollout_metrics([*DIALOGUES, silent])
    assert metrics["no_policy_turn"] == 1.0 and metrics["reward_mean"] == pytest.approx(0.4)
    assert summarize([silent]).scored == 0 and rollout_metrics([silent])["emotion_mean"] == 0.0
    assert not silent.trainable


def test_no_scored_dialogue():
    only_errors = [DIALOGUES[3]]
    s = summarize(only_errors)
    assert s.scored == 0 and math.isnan(s.score) and math.isnan(s.success_rate)
    metrics = rollout_metrics(only_errors)
    assert metrics["simulator_errors"] == 1.0 and metrics["emotion_mean"] == metrics["success_rate"] == 0.0
    assert metrics["turns_mean"] == 1.0  # over every dialogue, the failed one too
    assert set(rollout_metrics([]).values()) == {0.0}


def test_reference_metrics_by_hand():
    """Rewards by group: g0 (A 1.0, B 0.0), g1 (C 0.35, E 0.6); D is a simulator error. Rows: A 3, B 1, C 2, E 1."""
    seqs = [dialogue("A", [30, 100], "success", 3, 9), dialogue("B", [30, 0], "failure", 1, 3),
            dialogue("C", [30, 35], "turn_limit", 2, 6, format_failure=True),
            dialogue("D", [30, 55], "simulator_error", 1, 4, simulator_error=True),
            dialogue("E", [30, 60], "truncated", 1, 6)]
    for s, group, starts in zip(seqs, [0, 0, 1, 1, 1], [[0, 3, 6], [0], [0, 3], [0], [0]]):
        s.group, s.row_starts = group, starts
    assert reference_metrics(seqs) == pytest.approx({
        "reward_above_0.4_rate": 2 / 4,
        "reward_group_std_mean": (math.sqrt(0.5) + math.sqrt((0.6 - 0.35) ** 2 / 2)) / 2,
        "success_rate_rows": 3 / 7, "failure_rate_rows": 1 / 7,
        "success_rate_reward": 1 / 4, "failure_rate_reward": 1 / 4})
    assert set(reference_metrics([]).values()) == {0.0}
