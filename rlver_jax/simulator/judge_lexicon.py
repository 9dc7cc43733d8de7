"""Phrase families the calibrated judge counts (judge_features.py), each in English and Chinese, so
that what the fit learns about a family in SAGE's Chinese dialogues carries over to English.

English entries are lower-case and match at word boundaries (a trailing "*" matches any ending);
Chinese entries match as substrings. Written for this project.
"""

from __future__ import annotations

import functools
import re

from rlver_jax.simulator import lexicon

FAMILIES: dict[str, dict[str, tuple[str, ...]]] = {
    "empathy": {"en": lexicon.EMPATHY["en"], "zh": lexicon.EMPATHY["zh"]},
    "curiosity": {"en": lexicon.CURIOUS["en"], "zh": lexicon.CURIOUS["zh"]},
    "dismissive": {"en": lexicon.DISMISSIVE["en"], "zh": lexicon.DISMISSIVE["zh"]},
    # Advice that fits anyone: self-care, a professional, time.
    "stock_advice": {
        "en": ("professional help", "therap*", "counsel*", "self-care", "take care of yourself",
               "deep breath*", "exercise", "meditat*", "relax*", "get some rest", "give yourself time",
               "reach out to", "support system", "journal*", "mindful*", "a walk"),
        "zh": ("专业", "心理咨询", "咨询师", "深呼吸", "运动", "冥想", "放松", "照顾好自己", "给自己一些时间",
               "给自己一点时间", "寻求支持", "倾诉", "休息", "散步", "写日记", "正念"),
    },
    # Encouragement that fits anyone.
    "cliche": {
        "en": ("you've got this", "you got this", "believe in yourself", "everything will be",
               "it will get better", "things will get better", "hang in there", "stay strong",
               "keep going", "stay positive", "everything happens for a reason", "time heals",
               "you are not alone", "you're not alone", "tomorrow is another day"),
        "zh": ("加油", "相信自己", "一切都会好起来", "会好起来的", "你并不孤单", "你不是一个人", "都会过去",
               "会过去的", "坚持下去", "保持积极", "阳光总在风雨后", "时间会"),
    },
    "validation": {
        "en": ("makes sense", "understandable", "not your fault", "you did your best", "that's valid",
               "completely normal", "anyone would", "of course you", "you have every right", "fair enough"),
        "zh": ("很正常", "可以理解", "不是你的错", "你已经做得很好", "有道理", "换谁都会", "当然会",
               "你有权", "情有可原", "人之常情"),
    },
    "praise": {
        "en": ("amazing", "brilliant", "wise", "incredible", "so smart", "proud of you", "impressive",
               "admire", "strong person", "so brave", "wonderful", "absolutely right", "perfect"),
        "zh": ("你真棒", "厉害", "了不起", "聪明", "优秀", "佩服", "值得骄傲", "很勇敢", "太棒了",
               "完全正确", "完美", "你说得对"),
    },
    "apology": {
        "en": ("sorry", "apologi*", "forgive me"),
        "zh": ("抱歉", "对不起", "不好意思", "原谅我"),
    },
    "hedge": {
        "en": ("maybe", "perhaps", "might", "possibly", "could be", "i wonder"),
        "zh": ("可能", "也许", "或许", "大概", "说不定"),
    },
    "directive": {
        "en": ("you should", "you need to", "you must", "you have to", "make sure", "don't forget"),
        "zh": ("你应该", "你需要", "你必须", "一定要", "记得", "别忘了"),
    },
    "self": {
        "en": ("i think", "i feel", "i believe", "for me", "in my experience", "i remember", "i'd"),
        "zh": ("我觉得", "我认为", "我感觉", "对我来说", "我记得", "我会"),
    },
}
NAMES = tuple(FAMILIES)


@functools.lru_cache(maxsize=None)
def _pattern(phrases: tuple[str, ...], language: str) -> re.Pattern[str]:
    if language == "zh":
        return re.compile("|".join(re.escape(p) for p in phrases))
    spelled = [re.escape(p[:-1]) + r"[a-z']*" if p.endswith("*") else re.escape(p) for p in phrases]
    return re.compile(r"(?<![a-z'])(?:" + "|".join(spelled) + r")(?![a-z'])")


def _count(phrases: tuple[str, ...], text: str, language: str) -> int:
    return len(_pattern(phrases, language).findall(text))


def counts(text: str, language: str) -> dict[str, int]:
    """Occurrences of each family's phrases in a normalised text of `language` ("zh" or "en")."""
    return {family: _count(FAMILIES[family][language], text, language) for family in NAMES}


def other_goal_kinds(text: str, language: str, goal: str | None) -> int:
    """How many kinds of hidden goal other than `goal` the phrases of `text` meet (lexicon.GOAL_FIT):
    a reply that tries every goal at once is aimed at nobody in particular."""
    return sum(_count(phrases[language], text, language) > 0 for kind, phrases in lexicon.GOAL_FIT.items()
               if kind != goal)


def goal_counts(text: str, language: str, goal: str | None) -> tuple[int, int]:
    """Occurrences of the phrases that meet hidden goal `goal` (lexicon.GOAL_FIT), and of blame
    (lexicon.BLAME) said to a user who wants to hear it was not their fault, "not your fault" aside."""
    if goal is None:
        return 0, 0
    fit_phrases = lexicon.GOAL_FIT[goal][language]
    if goal != "not_at_fault":
        return _count(fit_phrases, text, language), 0
    cleared = text
    for phrase in fit_phrases:  # "not your fault" is no blame
        cleared = cleared.replace(phrase, " ")
    return _count(fit_phrases, text, language), _count(lexicon.BLAME[language], cleared, language)
