"""Degenerate replies (rlver_jax.text.degeneration): each reason on hand-made replies, and the rates
of a batch counted by hand."""

import pathlib

import pytest

from rlver_jax.text import degeneration as dg

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("reply, language, earlier, want", [
    ("That sounds really hard. I'm here with you.", "en", (), []),
    ("听起来你这周真的很累，我在这里陪着你。", "zh", (), []),
    ("I use ChatGPT 每天 at work, it helps.", "en", (), []),  # 2 Han of 20 letters: under MIXED_SHARE
    ("   \n", "en", (), ["empty"]),
    ("#@!% 3$ ^&*( a", "en", (), ["garbled"]),  # 1 letter of 12 visible characters
    ("hello мир привет", "en", (), ["garbled"]),  # 5 Latin, 9 Cyrillic letters
    ("no-nonsense no-nonsense no-nonsense", "en", (), ["repetition"]),
    ("I hear you, I hear you, I hear you.", "en", (), ["repetition"]),  # the 3-word phrase x3
    ("好好好", "zh", (), ["repetition"]),
    ("I hear you, I hear you.", "en", (), []),  # twice is not a loop
    ("我明白你的感受。", "en", (), ["wrong_language"]),
    ("I understand how you feel.", "zh", (), ["wrong_language"]),
    ("I understand how you feel.", "", (), []),  # no profile language: nothing to be wrong about
    ("I understand.", "en", ("Hmm.", "i  UNDERSTAND."), ["repeat_turn"]),
    ("ПРИВЕТ друг ああ 가나 好 þð word", "en", (), ["garbled"]),  # 8 Cyrillic of 18 letters; 10 outside it
    # "the of", "and but", "we the", "an way": 4 ungrammatical pairs of 10
    ("time the of people and but we the an way feel", "en", (), ["word_salad"]),
    # one pair ("to is") in a clause of 20 words
    ("when you go out to see how people feel to is what we all want from our life after work most days",
     "en", (), ["word_salad"]),
    ("I think that is a fair point, and to be honest an hour is not much for all of us.", "en", (), []),
    ("我们时候工作因为所以但是已经可以自己朋友家里事情觉得一个没有什么这样那么非常还是今天生活知道喜欢",
     "zh", (), ["word_salad"]),  # 48 Han
    ("我们时候工作因为所以但是已经可以自己朋友家里事情觉得一个没有什么这样那么非常还是今天生活知道喜",
     "zh", (), []),  # 47
])
def test_reasons(reply, language, earlier, want):
    assert dg.reasons(reply, language, earlier) == want


def test_words_split_han_characters_and_keep_hyphenated_words():
    assert dg.words("No-nonsense, it's 42 好的!") == ["no-nonsense", "it's", "42", "好", "的"]


def test_rates_count_replies_by_hand():
    # 5 replies: fine; empty; "la la la" (repetition); in the zh dialogue an English reply (wrong
    # language), then the same reply again (wrong language and repeat_turn): 4 of 5 degenerate.
    batch = [("en", ["Thanks for telling me.", "", "la la la"]),
             ("zh", ["Okay then.", "okay  then."])]
    got = dg.rates(batch)
    assert got == pytest.approx({"degenerate_rate": 4 / 5, "degenerate_empty_rate": 1 / 5,
                                 "degenerate_garbled_rate": 0.0, "degenerate_word_salad_rate": 0.0,
                                 "degenerate_repetition_rate": 1 / 5,
                                 "degenerate_wrong_language_rate": 2 / 5, "degenerate_repeat_turn_rate": 1 / 5})
    assert set(dg.rates([])) == set(got) and not any(dg.rates([]).values())
    assert dg.describe(got) == "80% (empty 20%, repetition 20%, wrong_language 40%, repeat_turn 20%)"


def test_the_alarm_compares_with_the_runs_lowest_rate(caplog):
    import dataclasses

    from configs.grpo_think import get_config
    from rlver_jax.train import alarms
    from rlver_jax.train.spec import LoopSettings

    s = dataclasses.replace(LoopSettings.from_config(get_config("tiny")), degenerate_alarm=0.3)
    step = {"degenerate_rate": 0.9, "degenerate_empty_rate": 0.9, "degenerate_garbled_rate": 0.0}
    lowest = alarms.check_degeneration(0, None, step, s)  # a random model: high, but nothing to rise from
    lowest = alarms.check_degeneration(1, lowest, {**step, "degenerate_rate": 0.1}, s)
    assert lowest == 0.1 and not caplog.records
    rise = {"degenerate_rate": 0.45, "degenerate_garbled_rate": 0.45, "degenerate_empty_rate": 0.0}
    assert alarms.check_degeneration(2, lowest, rise, s) == 0.1  # 0.35 above 0.1: warned
    assert "step 2: 45% (garbled 45%) of the policy's replies are degenerate, up from 10%" in caplog.text
    with pytest.raises(alarms.DegenerateRepliesError, match="step 2: .*degenerate_alarm=0.3.*not saved"):
        alarms.check_degeneration(2, lowest, rise, dataclasses.replace(s, degenerate_alarm_action="stop"))
    assert alarms.check_degeneration(2, lowest, {**rise, "degenerate_rate": 0.39}, s) == 0.1
    with pytest.raises(ValueError, match="degenerate_alarm_action='halt'"):
        dataclasses.replace(s, degenerate_alarm_action="halt")


SAGE_RESULTS = sorted((REPO.parent / "shared" / "data" / "sage" / "dialogues").glob("*.jsonl.xz"))


@pytest.mark.skipif(not SAGE_RESULTS, reason="SAGE's released results (../shared/data/sage) are not here")
def test_few_of_sages_released_replies_are_degenerate():
    """Real models' answers (8 models' Sentient-benchmark dialogues): at most 5% flagged, on every
    fourth dialogue of each model's file (1,651 of the 6,645 replies, 3.0% flagged; all of them:
    3.2%, and each of the four such samples 2.9-3.7%): judging all 3.2 M characters took a minute."""
    import json
    import lzma

    dialogues, sample = [], []
    for path in SAGE_RESULTS:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            ours = [("zh", [m["content"] for m in json.loads(line)["history"] if m["role"] == "assistant"])
                    for line in f]
        dialogues += ours
        sample += ours[::4]
    assert sum(len(replies) for _, replies in dialogues) == 6645  # every reply, judged or not
    assert len(sample) == 200 and dg.rates(sample)["degenerate_rate"] <= 0.05


@pytest.mark.parametrize("language", ["en", "zh"])
def test_noise_and_word_salad_are_flagged(language):
    """The robustness probes' random bytes and mixed scripts, and their 25-40 common words in random
    order: at least 90% of each flagged, 200 draws."""
    from rlver_jax.eval.probes import probe_reply

    for probe, reason in (("garbled", "garbled"), ("word_salad", "word_salad")):
        replies = [probe_reply(probe, [{"role": "user", "content": f"dialogue {k}"}]) for k in range(200)]
        assert sum(reason in dg.reasons(r, language) for r in replies) >= 0.9 * len(replies), probe
