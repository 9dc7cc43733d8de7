"""eval/degenerate.py: degenerate simulator judgements named, real ones left alone (hand-made records)."""

from rlver_jax.eval.degenerate import degenerate_judgements


def _state(*turns):
    return {"records": [{"scored": False, "change_proposed": None, "thoughts": ""}]
            + [{"scored": True, "change_proposed": c, "thoughts": t} for c, t in turns]}


def test_changes_at_the_bounds_and_empty_reasoning_are_named():
    states = [_state((10, ""), (-10, ""), (10, "")), _state((10, ""), (2, "felt heard"))]
    assert degenerate_judgements(states, 10) == "4 of 5 changes at +-10; 4 of 5 reasonings empty"


def test_repeated_reasoning_is_named_beside_changes_at_the_bounds():
    states = [_state((10, "ok"), (-10, " ok"), (10, "ok"), (4, "felt heard"))]
    assert degenerate_judgements(states, 10) == "3 of 4 changes at +-10; 3 of 4 reasonings repeated"
    assert degenerate_judgements([_state((3, "ok"), (-2, "ok"), (1, "ok"), (4, "ok"))], 10) == ""


def test_real_judgements_and_too_few_turns_pass():
    assert degenerate_judgements([_state((3, "a"), (-2, "b"), (10, "c"), (1, "d"))], 10) == ""
    assert degenerate_judgements([_state((10, ""), (10, ""))], 10) == ""


def test_judgements_of_degenerate_replies_are_no_sign():
    """-10 for noise is what a sound simulator says (the embedded one's outright verdict): only the
    judgements of real replies count, here 1 of them, too few to say anything."""
    noise = {"scored": True, "change_proposed": -10, "thoughts": "degenerate: garbled", "policy_reply": "#@%&∆∑ Щя 好"}
    real = {"scored": True, "change_proposed": 3, "thoughts": "fine", "policy_reply": "That sounds hard."}
    state = {"language": "en", "records": [noise] * 6 + [real]}
    assert degenerate_judgements([state], 10) == ""
    assert degenerate_judgements([{**state, "records": [{**noise, "policy_reply": "Okay then."}] * 6}], 10) != ""
