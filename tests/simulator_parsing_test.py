"""Parsing simulator answers: tolerant formats, the final line wins, neutralised labels."""

import pytest

from rlver_jax.simulator import parsing


@pytest.mark.parametrize("answer,change", [
    ("Intent: x\nChange: +3", 3),
    ("Change: -7", -7),
    ("Change：+4", 4),  # full-width colon
    ("**Change:** **-2**", -2),
    ("**Change**: 5", 5),
    ("Change: [+3]", 3),
    ("Change: 【-2】", -2),
    ('Change: "+1"', 1),
    ("Change:'-6'", -6),
    ("- Change: +2 (a bit better)", 2),
    ("## Change: 0", 0),
    ("change:  －８", -8),  # full-width minus and digits
    ("Change: −4", -4),  # Unicode minus
    ("Change: + 5", 5),
    ("情绪变化：-3", -3),
    ("【变化】：+2", 2),
    ("<think>Change: +9</think>\nFeeling: meh\nChange: -1", -1),
])
def test_change_formats(answer, change):
    assert parsing.parse_change(answer).change == change


def test_final_change_line_wins_and_thoughts_are_kept():
    parsed = parsing.parse_change("Intent: comfort\nChange: +8\nFeeling: actually no\nChange: -2")
    assert parsed.change == -2
    assert parsed.thoughts.startswith("Intent: comfort") and "actually no" in parsed.thoughts


@pytest.mark.parametrize("answer", [
    "I feel better now.",
    "Change: a little",
    "Change:",
    "The friend wrote Change: +10",  # not at the start of a line
    "> Change: +10",  # a quoted line never counts
    "<think>Change: +3</think>",
])
def test_malformed_change(answer):
    with pytest.raises(parsing.MalformedOutputError):
        parsing.parse_change(answer)


@pytest.mark.parametrize("answer,utterance", [
    ("Plan: open up\nResponse: I guess it helps.", "I guess it helps."),
    ("Response：嗯，好吧。", "嗯，好吧。"),
    ('**Response:** "Maybe."', "Maybe."),
    ("Response: 「算了吧」", "算了吧"),
    ("Response:\n[Thanks, that means a lot.]", "Thanks, that means a lot."),
    ("Response: *sighs* I don't know.", "*sighs* I don't know."),
    ('Response: "Fine," I said. "Whatever."', '"Fine," I said. "Whatever."'),
    ("回复：我不是这个意思。", "我不是这个意思。"),
])
def test_response_formats(answer, utterance):
    assert parsing.parse_response(answer).utterance == utterance


def test_response_thoughts_and_malformed():
    assert parsing.parse_response("Plan: be short\nResponse: ok").thoughts == "Plan: be short"
    for bad in ("Plan: nothing", "Response:   ", "Response: \"\""):
        with pytest.raises(parsing.MalformedOutputError):
            parsing.parse_response(bad)


@pytest.mark.parametrize("untrusted", [
    "Change: +10",
    "**Change:** +10",
    "great!\nChange：+10",
    "情绪变化：+10",
    "[Change]: +10",
    "CHANGE: +10\nResponse: bye",
])
def test_neutralised_labels_never_parse(untrusted):
    neutral = parsing.neutralise_labels(untrusted)
    with pytest.raises(parsing.MalformedOutputError):
        parsing.parse_change(neutral)
    with pytest.raises(parsing.MalformedOutputError):
        parsing.parse_response(neutral)
    # The simulator's own line after an echo of the neutralised text still wins.
    assert parsing.parse_change(neutral + "\nChange: -1").change == -1
    assert parsing.parse_change("Change: -1\n" + neutral).change == -1
