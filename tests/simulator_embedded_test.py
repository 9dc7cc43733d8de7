"""The embedded simulator and its calibrated judge (rlver_jax.simulator.judge): outright verdicts,
caps, the bounded mood and phrasing and the fitted sum by hand on a model of known weights; graded,
deterministic, in the profile's language with the shipped weights; the user tells its own story."""

import asyncio
import dataclasses

import pytest

from configs.simulator import get_simulator_config
from rlver_jax import simulator
from rlver_jax.simulator import judge_features
from rlver_jax.simulator.judge import score_reply
from rlver_jax.simulator.judge_weights import DenseModel, JudgeWeights, NgramModel
from rlver_jax.text.function_words import STOPWORDS_EN

PROFILES = simulator.load_profiles()
EN = next(p for p in PROFILES if p.language == "en" and p.goal == "empathy")  # rlverjax-en-01
ZH = next(p for p in PROFILES if p.language == "zh" and p.goal == "empathy")  # rlverjax-zh-01
BY_ID = {p.id: p for p in PROFILES}


def _known(**weights):
    """A judge whose only fitted parts are `weights` (feature: weight, on the raw value, unclipped)
    and an intercept of 0.5; no n-grams."""
    names = tuple(judge_features.features("x", history=[{"role": "user", "content": "y"}], profile=EN,
                                          language="en", emotions=(40,)))
    n = len(names)
    return JudgeWeights(DenseModel(names, (-1e9,) * n, (1e9,) * n, (0.0,) * n, (1.0,) * n,
                                   tuple(float(weights.get(k, 0.0)) for k in names), 0.5),
                        NgramModel({}, 0.0, 1), ())


def _score(reply, profile=EN, *, history=None, emotions=(40,), difficulty="vanilla", weights=None, language=None):
    history = history or [{"role": "user", "content": profile.first_talk}]
    return score_reply(reply, profile=profile, language=language or profile.language, difficulty=difficulty,
                       history=history, emotions=emotions, weights=weights)


def test_a_score_is_the_fitted_sum_by_hand():
    # Two questions (weight 2 each) and the mood: emotion 46 after a start at 40 is (46 - 40) / 30 =
    # 0.2 (weight 3); intercept 0.5. The reply takes up "work" of the user's line: no cap.
    # 0.5 + 4 + 0.6 = 5.1, rounded: 5.
    known = _known(questions=2.0, mood=3.0)
    score = _score("What happened at work? How long has it been?", emotions=(40, 46), weights=known)
    assert score.change == 5
    assert {name: round(points, 6) for name, points, _ in score.parts if points} == {
        "baseline": 0.5, "questions": 4.0, "your mood so far": 0.6}
    # A challenging user feels positives half: 5.1 - 2.55 = 2.55, rounded: 3.
    assert _score("What happened at work? How long has it been?", emotions=(40, 46), weights=known,
                  difficulty="challenging").change == 3


def test_the_mood_and_the_phrase_families_are_bounded():
    # The mood 70 after 40 (1.0, weight 9): 9, bounded to MOOD_BOUND = 3; with the reply's own 0.5 it
    # adds at most 0.5 + MOOD_MARGIN = 2.5. A bad mood (10: -1.0) takes at most 3.
    reply = "What happened at work? How long has it been?"
    assert _score(reply, emotions=(40, 70), weights=_known(mood=9.0)).change == round(0.5 + 2.5)
    assert _score(reply, emotions=(40, 10), weights=_known(mood=9.0)).change == round(0.5 - 3)
    # Two empathy phrases (log1p(2) = 1.10, weight 5: 5.49) add at most PHRASING_BOUND = 1.5.
    phrased = _score("That sounds so hard about work. I hear you.", weights=_known(lex_empathy=5.0))
    assert [p for n, p, _ in phrased.parts if n == "phrasing"] == [1.5] and phrased.change == 2


@pytest.mark.parametrize("reply, questions, cap", [
    # 0.5 + 2 a question before the cap; a challenging user is not asked here
    ("I hear you: I'm fine, mostly. Work keeps me busy. Just been sleeping badly lately?", 1,
     ("echoes your words", -6)),
    ("That sounds so hard. How can I help? What is it?", 2, ("takes up nothing you said", -4)),
    ("Okay?", 1, ("a word or two", -5)),
    ("Calm down, your work is not a big deal? Is it?", 2, ("brushes you off", -5)),
    # one frame said over and over ("work" the user's word): 21 tokens, 14 different shingles, 1 - 14/21 = 0.33
    ("It is so hard at work? It is so hard at night? It is so hard at home?", 3, ("says one thing over and over", -3)),
])
def test_a_fault_caps_the_change_whatever_else_the_reply_does(reply, questions, cap):
    score = _score(reply, weights=_known(questions=2.0))
    name, limit = cap
    before = 0.5 + 2 * questions
    capped = [(n, round(p, 6), e) for n, p, e in score.parts if n == name]
    assert capped == [(name, limit - before, f"at most {limit:+d}")]
    assert score.change == limit


def test_a_reply_that_says_what_it_said_before_is_not_felt():
    # The same frame around other words: its whole skeleton (the user's words masked) was said
    # before, so the change is at most 0 however much it earns (0.5 + 2 for its question).
    history = [{"role": "user", "content": EN.first_talk},
               {"role": "assistant", "content": "The work must be so hard. What happened?"},
               {"role": "user", "content": "My father died two months ago."}]
    again = _score("The father must be so hard. What happened?", history=history, weights=_known(questions=2.0))
    assert again.change == 0 and [n for n, _, _ in again.parts][-1] == "says the same again"
    fresh = _score("Two months is no time at all. What was he like?", history=history, weights=_known(questions=2.0))
    assert fresh.change == round(2.5)


def test_blame_hurts_a_user_who_wants_to_hear_it_was_not_their_fault():
    teacher = next(p for p in PROFILES if p.language == "en" and p.goal == "not_at_fault")
    said = teacher.first_talk
    cleared = _score(f"About {said.split()[-1]} - it's not your fault; you did nothing wrong.", teacher,
                     weights=_known())
    blamed = _score(f"About {said.split()[-1]} - honestly it's partly your fault.", teacher, weights=_known())
    assert "blames you" not in [n for n, _, _ in cleared.parts]
    assert [p for n, p, _ in blamed.parts if n == "blames you"] == [-3.5]  # 0.5 capped at -3
    assert blamed.change == -3


@pytest.mark.parametrize("reply, language, change, reason", [
    ("!!!! $$$ ### @@@ :-) 123 456 ???", "en", -10, "garbled"),
    ("time the of people and but we the an way feel", "en", -10, "word salad"),
    ("sorry sorry sorry sorry", "en", -8, "repetition"),
    ("听起来你真的很累，我在这里陪着你。", "en", -6, "wrong language"),
    ("   ", "zh", -10, "empty"),
])
def test_degenerate_replies_get_outright_changes(reply, language, change, reason):
    score = _score(reply, language=language)
    assert score.change == change and score.parts[0][0] == f"degenerate: {reason}"


# From worst to best with the shipped weights: garbage (-10, the worst there is), dismissive, warm
# but generic, warm and about what the user said; after the garbage strictly increasing.
LADDERS = {
    "en": (EN, ["!!!! $$$ ### @@@ :-) 123 456 ???",
                "Just get over it, it's not a big deal.",
                "I'm so sorry. That sounds really exhausting. What happened?",
                "Sleeping badly while work keeps you that busy sounds exhausting. What keeps you up at night?"]),
    "zh": (ZH, ["！！！￥￥￥###@@@……",
                "你想多了吧，这有什么大不了的。",
                "听起来真的很辛苦，我很心疼你。",
                "那些心血被一句话否定，换作是我也会特别委屈、特别难受。你现在心里一定很不是滋味吧？愿意跟我说说吗？"]),
}


@pytest.mark.parametrize("language", ["en", "zh"])
def test_warmer_replies_about_the_user_score_higher(language):
    profile, ladder = LADDERS[language]
    changes = [_score(reply, profile).change for reply in ladder]
    assert changes[0] == -10 and changes[1:] == sorted(set(changes[1:])), changes  # a graded signal
    assert changes[1] < 0 <= changes[-1]


def _dialogue(profile, replies, **overrides):
    cfg = get_simulator_config()
    cfg.backend = "embedded"
    cfg.update(overrides)

    async def run():
        async with simulator.build_simulator(simulator.SimulatorSettings.from_config(cfg)) as sim:
            state = await sim.start(profile)
            for reply in replies:
                if not state.done:
                    state = await sim.respond(state, reply)
            return state
    return asyncio.run(run())


def test_dialogues_are_deterministic_and_show_the_judgement():
    warm = [LADDERS["en"][1][3], "Work keeping you busy can hide a lot. How have the nights been?",
            "Not sleeping for weeks wears anyone down. What is on your mind when you lie awake?"]
    first, second = _dialogue(EN, warm), _dialogue(EN, warm)
    assert first.to_dict() == second.to_dict()
    for record in first.records[1:]:
        # the chat tool and the transcripts show the judgement's parts and its change
        assert "baseline" in record.thoughts and record.thoughts.endswith(f"=> {record.change_proposed:+d}")
        assert record.raw_emotion.endswith(f"Change: {record.change_proposed:+d}") and record.utterance


def test_users_who_feel_unheard_leave_in_their_language():
    generic = "听起来真的很辛苦，我很心疼你。"
    state = _dialogue(ZH, [generic] * 4)
    # Warm, but nothing of what the user said, again and again (at most -4 a turn, and saying it again):
    # 30 -> 26 -> 21 -> 15 -> 9, band F: the user says goodbye (in Chinese) before the floor.
    state = _dialogue(ZH, [generic] * 5)
    assert state.emotions == (30, 26, 21, 15, 9) and state.end_reason == "goodbye"
    assert simulator.is_goodbye(state.history[-1]["content"])
    assert simulator.detect_language(state.history[-1]["content"]) == "zh"
    assert all(simulator.detect_language(r.utterance) == "zh" for r in state.records[1:])


@pytest.mark.parametrize("profile", simulator.load_profiles(simulator.profiles.ENGLISH_PROFILES),
                         ids=lambda p: p.id)
def test_every_english_profile_plays_a_first_turn(profile):
    """The smol presets' profiles: each opens with its first_talk; a reply that takes up the
    user's words is felt better than a dismissive one, which cools the user; the user answers in
    English."""
    warm = f"That sounds really hard. I'm here for you. What happened with the {_topic(profile)}?"
    cold = "Just calm down. It's not a big deal."
    states = [_dialogue(profile, [reply]) for reply in (warm, cold)]
    for state in states:
        assert state.history[0] == {"role": "user", "content": profile.first_talk}
        assert not state.done and simulator.detect_language(state.history[-1]["content"]) == "en"
    warmed, cooled = (s.records[1].change for s in states)
    assert cooled < min(0, warmed), (profile.id, states[0].records[1].thoughts)


def test_opening_line_without_first_talk():
    state = _dialogue(dataclasses.replace(EN, first_talk=None), [])
    assert state.history[0]["role"] == "user"
    assert simulator.detect_language(state.history[0]["content"]) == "en"
    assert not simulator.is_goodbye(state.history[0]["content"])


def _topic(profile):
    """The longest content word of the user's first line."""
    words = [w.strip(",.'\"?!") for w in profile.first_talk.split()]
    return max((w for w in words if w.lower() not in STOPWORDS_EN), key=len)


def _script(profile):
    """Replies of every quality for scripted dialogues whose changes go both ways at every level:
    about the user's first words or not, warm, curt, dismissive, repeated."""
    said = profile.first_talk
    if profile.language == "zh":
        return [f"“{said[:6]}”……换作是我也会特别难受。你现在心里一定很不是滋味吧？愿意跟我说说吗？", "你想多了吧。",
                "嗯，我知道了。", f"{said[2:8]}这件事，你一定憋了很久了。当时发生了什么？", "随便你",
                "不是你的错，你已经做得很好了。", "别想了。", f"我在听，{said[:4]}的事你慢慢说。"]
    topic = _topic(profile)
    return [f"I'm so sorry about the {topic}. That must feel heavy. What happened?",
            "Just calm down. It's not a big deal.", "Okay. I see.",
            f"The {topic} sounds like a lot to carry. I'm here. How are you holding up?", "ok",
            "It makes sense you feel this way; you did nothing wrong.", "Whatever, get over it.",
            f"I hear you. Tell me more about the {topic}?"]


def test_the_user_tells_its_story_whatever_the_judgement():
    """The user's lines are the profile's background and current state in the first person, one a
    turn, the same after a warm reply as after a cold one (no verdict read out, no stock line to
    memorise), then again after a lead-in; only a colder turn into band F is a goodbye."""
    from rlver_jax.simulator import user_lines

    story = user_lines.story(EN)  # "Daniel's father died ..." told by Daniel
    assert story[:2] == ("My father died of a heart attack two months ago.",
                         "I went back to work a week after the funeral.")
    assert story[-1] == "I have not cried once and wonder what is wrong with me."
    assert user_lines.line(EN, 1) == story[0] and user_lines.line(EN, len(story) + 1).endswith(story[0][1:])
    assert user_lines.line(EN, len(story) + 1) != story[0]  # a lead-in the second time round
    assert user_lines.story(ZH)[0] == "我带头做了三个月的新项目，几乎每天加班到凌晨。"  # 陈默带头做了...
    warm, cold = _dialogue(EN, [LADDERS["en"][1][3]]), _dialogue(EN, ["Whatever. Calm down, it's nothing."])
    assert warm.records[1].change > cold.records[1].change
    assert warm.history[-1] == cold.history[-1] == {"role": "user", "content": story[0]}
    leaving = _dialogue(EN, ["Whatever. Calm down, it's nothing."] * 8)
    assert leaving.end_reason == "goodbye" and leaving.records[-1].band == "F"
