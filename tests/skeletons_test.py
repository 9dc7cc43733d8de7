"""Reply skeletons (rlver_jax.text.skeletons): the user's words masked by hand, the template rate of
hand-made replies counted by hand, and the template alarm of training."""

import dataclasses

import pytest

from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.rollout.summary import template_rate
from rlver_jax.text import skeletons as sk

USER_A = ("My boss yelled at me in front of the whole team today.",)
USER_B = ("Our landlord is selling the flat and we have a month to move.",)


def test_the_users_words_are_masked():
    # "boss", "yelled", "team", ... are the user's content words; "yelled at" and "in front of" are
    # runs of tokens the user said in that order; "you" and "the" alone are function words and stay.
    assert sk.skeleton("The boss yelled at you in front of everyone? That's awful.", USER_A) == (
        "the", "_", "you", "_", "everyone", "?", "that's", "awful", ".")
    # 老板 and 又骂 the user said (and 了。); 你 is no content character
    assert sk.skeleton("好难受，老板又骂你了。", ("老板今天又骂我了。",)) == ("好", "难", "受", "，", "_", "你", "_")
    assert sk.tokens("It's 42!!") == ("it's", "#", "!!")


def test_one_template_for_two_users_is_one_skeleton():
    template = "I hear how much the {} weighs on you. What happened with the {}?"
    a = template.format("boss", "team")
    b = template.format("landlord", "flat")
    # 16 and 15 shingles, 13 shared ("... happened with the _ ?" against "... happened with _ ?": the
    # second user said "the flat", a run of two)
    assert sk.similarity(sk.shingles(sk.skeleton(a, USER_A)), sk.shingles(sk.skeleton(b, USER_B))) == 13 / 18
    free = "Being shouted at with everyone watching is humiliating. Did anyone stand up for you?"
    other = "A month is no time at all to find somewhere new. Have you started looking yet?"
    assert sk.similarity(sk.shingles(sk.skeleton(free, USER_A)), sk.shingles(sk.skeleton(other, USER_B))) < sk.ALIKE


def test_template_rate_counts_replies_alike_another_users():
    template = "That sounds so hard, the {}. I'm here for you."
    replies = [("a", template.format("boss"), USER_A), ("b", template.format("landlord"), USER_B),
               ("a", "Being shouted at with everyone watching is humiliating. Did anyone stand up for you?", USER_A),
               ("b", "A month is no time at all to find somewhere new. Have you started looking yet?", USER_B),
               ("a", template.format("team"), USER_A)]  # alike only the same user's first: one more for b's
    assert sk.template_rate(replies) == pytest.approx(3 / 5)
    assert sk.template_rate([]) == 0.0
    assert sk.template_rate(replies[:1] + replies[4:]) == 0.0  # one user: nobody else's to share


def _dialogue(pid, first, reply):
    return DialogueSequence(profile_id=pid, group=0, tokens=[], policy_mask=[], logprobs=[], turn_ends=[],
                            emotions=[40.0], end_reason="turn_limit", language="en",
                            messages=[{"role": "system", "content": "Be kind."}, {"role": "user", "content": first},
                                      {"role": "assistant", "content": reply}])


def test_the_summary_knows_a_user_by_the_dialogues_first_line():
    # Two GRPO samples of one profile say the same: one user, no template; a second profile's alike reply makes
    # all three templated.
    same = "That sounds so hard. I'm here for you, whatever happens."
    group = [_dialogue("p1", USER_A[0], same), _dialogue("p1", USER_A[0], same)]
    assert template_rate(group) == 0.0
    assert template_rate(group + [_dialogue("p2", USER_B[0], same)]) == 1.0


def test_the_template_alarm_warns_or_stops(caplog):
    from configs.grpo_nothink import get_config
    from rlver_jax.train import alarms
    from rlver_jax.train.spec import LoopSettings

    s = LoopSettings.from_config(get_config("tiny"))
    assert s.template_alarm == 0.5
    alarms.check_templates(3, {"template_rate": 0.49}, s)
    assert not caplog.records
    alarms.check_templates(3, {"template_rate": 0.75}, s)
    assert "step 3: 75% of the policy's replies share a skeleton with another user's" in caplog.text
    with pytest.raises(alarms.TemplateRepliesError, match="template_alarm=0.5.*not saved"):
        alarms.check_templates(3, {"template_rate": 0.75}, dataclasses.replace(s, template_alarm_action="stop"))
    alarms.check_templates(3, {"template_rate": 1.0}, dataclasses.replace(s, template_alarm=0.0))  # off
    with pytest.raises(ValueError, match="template_alarm_action='halt'"):
        dataclasses.replace(s, template_alarm_action="halt")
