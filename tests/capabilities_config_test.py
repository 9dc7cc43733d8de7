"""configs/capabilities.py and what runs without the graders' extra: the shared policy section,
presets, and the one-line message of a missing extra."""

import pytest

from configs.capabilities import get_config
from configs.eval import get_config as get_eval_config
from rlver_jax.eval.capabilities import extra


@pytest.mark.parametrize("preset,eval_preset", [("default", "sage"), ("tiny", "tiny")])
def test_the_policy_section_is_eval_s_but_greedy(preset, eval_preset):
    ours, theirs = get_config(preset).policy, get_eval_config(eval_preset).policy
    assert sorted(ours.keys()) == sorted(theirs.keys())
    changed = {k for k in ours.keys() if ours[k] != theirs[k]}
    assert changed <= {"temperature", "max_new_tokens", "cache_slots"}
    assert ours.temperature == 0.0


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'big'"):
        get_config("big")


def test_missing_extra_is_one_line():
    with pytest.raises(extra.MissingExtraError,
                       match=r"install the 'capabilities' extra: pip install -e '\.\[capabilities\]'"):
        extra.require("no_such_grader_module", "no-such-grader")
