"""The dialogue record: its transcript (to_record / from_record) as JSON, with the reward stored on it."""

import dataclasses
import json

import pytest

from rlver_jax.rollout.sequence import RECORD_KEYS, REWARD_KEYS, DialogueSequence
from tests.rl_helpers import score

TURN = {"turn": 1, "raw": "<think>hm</think>Oh no.", "thinking": "hm", "reply": "Oh no.", "stopped": True,
        "format_ok": True, "change": 8, "emotion": 38, "band": "C", "simulator_thoughts": "kind", "user": "Yes."}
MESSAGES = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "I failed."},
            {"role": "assistant", "content": "Oh no."}, {"role": "user", "content": "Yes."}]


def _dialogue(**overrides):
    fields = dict(profile_id="p-1", group=2, tokens=[4, 5, 6, 7], policy_mask=[0, 1, 1, 0],
                  logprobs=[0.0, -0.5, -1.5, 0.0], turn_ends=[2], emotions=[30, 38], end_reason="turn_limit",
                  policy_version=7, language="en", turns=[TURN], messages=MESSAGES,
                  simulator_state={"emotion": 38, "done": True})
    return DialogueSequence(**{**fields, **overrides})


def test_record_is_the_transcript_format():
    """The keys and values of the transcripts saved so far (training logs and benchmark runs)."""
    assert _dialogue().to_record() == {
        "profile_id": "p-1", "group": 2, "language": "en", "end_reason": "turn_limit", "final_emotion": 38,
        "emotions": [30, 38], "turns": [TURN], "messages": MESSAGES, "format_failure": False, "truncated": False,
        "simulator_error": False, "simulator_state": {"emotion": 38, "done": True}, "policy_version": 7,
        "reward": None, "episode_rewards": None, "turn_rewards": None}
    assert tuple(_dialogue().to_record()) == RECORD_KEYS + REWARD_KEYS
    assert score(_dialogue(), "final").to_record() == {**_dialogue().to_record(), "reward": pytest.approx(0.38),
                                                       "episode_rewards": [pytest.approx(0.38)],
                                                       "turn_rewards": [pytest.approx(0.08)]}


def test_round_trip_through_json_keeps_all_but_the_token_view():
    seq = score(_dialogue(truncated=True, format_failure=True), "per_turn")
    line = json.dumps({**seq.to_record(), "step": 3})  # as the training logs write it
    back = DialogueSequence.from_record(json.loads(line))
    assert back == dataclasses.replace(seq, tokens=[], policy_mask=[], logprobs=[], turn_ends=[])
    assert back.to_record() == seq.to_record() and not back.trainable
    assert (back.reward, back.turn_rewards) == (pytest.approx(0.38), pytest.approx([0.08]))


def test_the_stored_reward_survives_the_processes_exchange():
    """Processes exchange dialogues as JSON of dataclasses.asdict (rlver_jax.train.loop, parallel.hosts):
    the token view and the reward, with its turns without one (None), come back equal. Its second
    turn was cut (truncated): the user never answered it."""
    seq = score(_dialogue(turns=[TURN, TURN], tokens=[4, 5, 6, 7], policy_mask=[0, 1, 0, 1], logprobs=[0.0] * 4,
                          turn_ends=[1, 3], truncated=True, end_reason="truncated"), "final")
    assert seq.reward == pytest.approx(0.38) and seq.episode_rewards == [None, pytest.approx(0.38)]
    assert seq.turn_rewards == [pytest.approx(0.08), None]
    assert DialogueSequence(**json.loads(json.dumps(dataclasses.asdict(seq)))) == seq


def test_records_written_before_rewards_were_stored_still_load():
    """A benchmark transcript of then has no reward; a training one, the reward alone."""
    record = {k: v for k, v in _dialogue().to_record().items() if k in RECORD_KEYS}
    old = DialogueSequence.from_record(record)
    assert (old.reward, old.episode_rewards, old.turn_rewards) == (None, None, None)
    assert DialogueSequence.from_record({**record, "reward": 0.38, "step": 2}).reward == 0.38


def test_from_record_rejects_what_to_record_never_wrote():
    record = _dialogue().to_record()
    with pytest.raises(ValueError, match=r"keys \['turns'\] missing"):
        DialogueSequence.from_record({k: v for k, v in record.items() if k != "turns"})
    with pytest.raises(ValueError, match="final_emotion 40 is not the last of its emotions"):
        DialogueSequence.from_record({**record, "final_emotion": 40})


def test_per_token_versions_come_from_the_turns():
    """Each policy token takes the version of its turn (the first turn ending at or after it); a
    transcript written before turns recorded their version reads as all turns at policy_version."""
    turns = [{**TURN, "turn": k + 1, "policy_version": v} for k, v in enumerate([3, 4, 4])]
    seq = _dialogue(tokens=list(range(10)), policy_mask=[0, 1, 1, 0, 0, 1, 1, 1, 0, 1], logprobs=[0.0] * 10,
                    turn_ends=[2, 7, 9], turns=turns, policy_version=3)
    assert seq.turn_versions() == [3, 4, 4]
    assert seq.policy_token_versions() == [3, 3, 4, 4, 4, 4]
    back = DialogueSequence.from_record(json.loads(json.dumps(seq.to_record())))
    assert back.turn_versions() == [3, 4, 4]
    old = DialogueSequence.from_record(json.loads(json.dumps(_dialogue().to_record())))  # TURN has no version
    assert old.turn_versions() == [7]
    assert _dialogue().policy_token_versions() == [7, 7]
