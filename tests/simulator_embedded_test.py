"""The embedded simulator: graded, deterministic, in the profile's language."""

import asyncio
import dataclasses

import pytest

from configs.simulator import get_simulator_config
from rlver_jax import simulator
from rlver_jax.simulator.embedded import score_reply

PROFILES = simulator.load_profiles()
EN = next(p for p in PROFILES if p.language == "en" and p.goal == "empathy")
ZH = next(p for p in PROFILES if p.language == "zh" and p.goal == "empathy")

# From worst to best; each language's list must score in strictly increasing order.
LADDERS = {
    "en": (EN, [
        "!!!! $$$ ### @@@ :-) 123 456 ???",
        "Just get over it, it's not a big deal.",
        "Okay. I see what you mean.",
        "I'm so sorry. That sounds really exhausting.",
        "I'm so sorry you're going through this. That sounds really exhausting, and it makes "
        "sense you feel this way. What happened?",
        "I'm so sorry about your father. It must feel so heavy, carrying it alone while everyone "
        "says you're fine. I'm here for you. How have you been sleeping since that call?",
    ]),
    "zh": (ZH, [
        "！！！￥￥￥###@@@……",
        "你想多了吧。",
        "嗯，我知道了，你说的这个事情。",
        "听起来真的很辛苦，我很心疼你。",
        "三个月的心血一句话就没了，换作是我也会特别委屈、特别难受。你现在心里一定很不是滋味吧？"
        "愿意跟我说说吗？",
    ]),
}


def _change(profile, reply, *, history=None, difficulty="vanilla"):
    history = history or [{"role": "user", "content": profile.first_talk}]
    return score_reply(reply, profile=profile, language=profile.language,
                       difficulty=difficulty, history=history).change


@pytest.mark.parametrize("language", ["en", "zh"])
def test_warmer_replies_score_higher(language):
    profile, ladder = LADDERS[language]
    changes = [_change(profile, reply) for reply in ladder]
    assert changes == sorted(set(changes)), changes  # strictly increasing: a graded signal
    assert changes[0] <= -8  # garbage
    assert changes[1] < 0  # dismissive
    assert changes[-2] > 0  # warm


BY_ID = {p.id: p for p in PROFILES}


@pytest.mark.parametrize("profile_id,difficulty,previous,reply,parts,change", [
    # Empathy goal, avoidant: "sorry" and "must feel" (2 x 1.5); one "?" plus "what happened"
    # (1 + 1); "heavy" is a topic word of the scene, not of the first line (0.5); "it must" and
    # "heavy" meet the goal (2 x 1.5); 9 words is neither curt (< 4) nor comfortable (12 to 120).
    # -2 + 3 + 2 + 0.5 + 3 = 6.5, rounded half to even: 6.
    ("rlverjax-en-01", "vanilla", None, "I'm so sorry. It must feel heavy. What happened?",
     {"baseline": -2.0, "empathy": 3.0, "curiosity": 2.0, "on topic": 0.5, "goal empathy": 3.0}, 6),
    # Negative personality: "calm down" and "not a big deal" (2 x -3) felt 1.25 times: -7.5.
    # -2 - 7.5 = -9.5, rounded half to even: -10.
    ("rlverjax-en-02", "vanilla", None, "Just calm down. It's not a big deal.",
     {"baseline": -2.0, "dismissive": -7.5}, -10),
    # Challenging, advice goal, the previous reply repeated word for word: "pension" and "numbers"
    # are scene words (2 x 0.5, halved: 0.5); "you could" and "try" meet the goal (2 x 1.5, goal
    # fit is not halved); the repetition (-4) weighs 1.25 times: -5. -2 + 0.5 + 3 - 5 = -3.5: -4.
    ("rlverjax-en-03", "challenging", "You could try asking HR about the pension numbers first.",
     "You could try asking HR about the pension numbers first.",
     {"baseline": -2.0, "on topic": 0.5, "goal advice": 3.0, "repeats the previous reply": -5.0}, -4),
])
def test_scores_equal_hand_computed_values(profile_id, difficulty, previous, reply, parts, change):
    profile = BY_ID[profile_id]
    history = [{"role": "user", "content": profile.first_talk}]
    if previous is not None:
        history += [{"role": "assistant", "content": previous}, {"role": "user", "content": "Maybe."}]
    score = score_reply(reply, profile=profile, language="en", difficulty=difficulty, history=history)
    assert {name: points for name, points, _ in score.parts if points} == parts
    assert score.change == change


def test_hidden_goal_and_blame_matter():
    teacher = next(p for p in PROFILES if p.language == "en" and p.goal == "not_at_fault")
    cleared = "I'm sorry, that sounds unfair. It's not your fault; you did nothing wrong."
    blamed = "I'm sorry, that sounds unfair. But honestly it's partly your fault."
    assert _change(teacher, cleared) > _change(teacher, blamed) + 3
    shop = next(p for p in PROFILES if p.language == "zh" and p.goal == "advice")
    advice = "可以试试先跟房东谈谈，争取一个折中的涨幅，也不妨先算算搬店的成本。"
    comfort = "别担心，一切都会好起来的，加油。"
    assert _change(shop, advice) > _change(shop, comfort)


def test_penalties_for_repetition_length_and_language():
    reply = "I'm so sorry. That sounds really exhausting. What happened after that?"
    history = [{"role": "user", "content": EN.first_talk}, {"role": "assistant", "content": reply},
               {"role": "user", "content": "It's complicated."}]
    assert _change(EN, reply, history=history) < _change(EN, reply)
    assert _change(EN, "ok") < 0
    rambling = " ".join(["I'm sorry, that sounds hard, and I keep thinking about it."] * 5 + [
        f"Another thought number {i} about work, sleep, family and everything else." for i in
        range(30)])
    assert _change(EN, rambling) < _change(EN, reply)
    assert _change(ZH, "I'm so sorry, that sounds exhausting. What happened?") < 0


def test_challenging_users_are_harder_to_please():
    reply = LADDERS["en"][1][4]
    assert 0 < _change(EN, reply, difficulty="challenging") < _change(EN, reply)


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


def test_dialogues_are_deterministic_and_move_the_emotion():
    warm = [LADDERS["en"][1][4], "That must have been so lonely. I'm here. What was he like?",
            "It makes sense you can't sleep. How are you holding up at work?"]
    first, second = _dialogue(EN, warm), _dialogue(EN, warm)
    assert first.to_dict() == second.to_dict()
    assert first.emotion > 30 and all(c > 0 for c in (r.change for r in first.records[1:]))
    assert all(r.utterance and r.raw_emotion.endswith(f"Change: {r.change_proposed:+d}")
               for r in first.records[1:])


def test_dismissive_users_leave_in_their_language():
    state = _dialogue(ZH, ["@@@###", "！！！", "你想多了吧。", "随便你"])
    # 30 -> 20 -> 10 -> 4, band F: the user says goodbye (in Chinese) before the floor.
    assert state.end_reason == "goodbye" and state.emotion < 10
    assert simulator.is_goodbye(state.history[-1]["content"])
    assert simulator.detect_language(state.history[-1]["content"]) == "zh"
    assert all(simulator.detect_language(r.utterance) == "zh" for r in state.records[1:])


@pytest.mark.parametrize("profile", simulator.load_profiles(simulator.profiles.ENGLISH_PROFILES),
                         ids=lambda p: p.id)
def test_every_english_profile_plays_a_first_turn(profile):
    """The smol presets' profiles: each opens with its first_talk, a warm on-topic reply warms the
    user, a dismissive one cools them, and the user answers in English."""
    warm, cold = ("I'm so sorry, that sounds really hard. I'm here for you. What happened?",
                  "Just calm down. It's not a big deal.")
    for reply, sign in ((warm, 1), (cold, -1)):
        state = _dialogue(profile, [reply])
        assert state.history[0] == {"role": "user", "content": profile.first_talk}
        assert sign * state.records[1].change > 0, (profile.id, reply, state.records[1].thoughts)
        assert not state.done and simulator.detect_language(state.history[-1]["content"]) == "en"


def test_opening_line_without_first_talk():
    state = _dialogue(dataclasses.replace(EN, first_talk=None), [])
    assert state.history[0]["role"] == "user"
    assert simulator.detect_language(state.history[0]["content"]) == "en"
    assert not simulator.is_goodbye(state.history[0]["content"])


# Replies of every quality, for scripted dialogues whose changes go both ways at every level.
_SCRIPT = {
    "en": ["I'm so sorry. It must feel heavy. What happened?", "Just calm down. It's not a big deal.",
           "Okay. I see what you mean.", "That must have been so lonely. I'm here. What was he like?",
           "ok", "It makes sense you feel this way; you did nothing wrong. How are you holding up?",
           "Whatever, get over it.", "I hear you. Tell me more about it?"],
    "zh": ["听起来真的很辛苦，我很心疼你。愿意跟我说说吗？", "你想多了吧。", "嗯，我知道了，你说的这个事情。",
           "换作是我也会特别委屈、特别难受。你现在心里一定很不是滋味吧？", "随便你", "不是你的错，你已经做得很好了。",
           "别想了。", "我在听，你慢慢说。"],
}


def test_the_users_words_agree_with_the_change_just_judged():
    """Over many scripted turns in both languages and difficulties, every utterance comes from the
    template group of the change the turn's judgement made: warmer after +3 or more, colder after
    -3 or less (a goodbye when that leaves the emotion in band F), neutral in between."""
    from rlver_jax.simulator.embedded import REPLIES, change_kind

    group_of = {line: kind for language in REPLIES for kind, lines in REPLIES[language].items() for line in lines}
    seen, warm_at_low_mood = set(), 0
    for profile in PROFILES:
        script = _SCRIPT[profile.language]
        for difficulty in ("vanilla", "challenging"):
            for shift in range(len(script)):
                replies = script[shift:] + script[:shift]
                state = _dialogue(profile, replies * 2, difficulty=difficulty, max_turns=len(replies) * 2)
                for record in state.records[1:]:
                    if record.utterance is None:  # an end (success, failure, turn limit) says nothing
                        continue
                    kind = change_kind(record.change)
                    assert kind == change_kind(record.change_proposed)  # clipping keeps sign and band
                    expected = "leave" if kind == "colder" and record.band == "F" else kind
                    assert group_of[record.utterance] == expected, (profile.id, record.change, record.band,
                                                                    record.utterance)
                    seen.add(expected)
                    warm_at_low_mood += kind == "warmer" and record.band in ("C", "F")
    assert seen == {"warmer", "neutral", "colder", "leave"}
    assert warm_at_low_mood > 0  # the case that once drew "You're not really listening, are you?"
