"""What the calibrated judge (judge.py) reads in a reply: named features that mean the same in
English and Chinese, and the reply's character n-grams (Chinese only).

Every feature is a pure function of the reply, the dialogue before it (the policy's view), the
profile and the emotion trajectory. Lengths count English words and Chinese characters, a Chinese
character taken as ZH_CHARS_PER_WORD of a word, so one scale serves both languages. Topic keys are
English content-word stems and Chinese content-character bigrams (not stop characters).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence

from rlver_jax.simulator import judge_lexicon
from rlver_jax.simulator.patterns import CJK
from rlver_jax.simulator.profiles import GOALS, Profile
from rlver_jax.simulator.user_lines import story
from rlver_jax.text import skeletons
from rlver_jax.text.function_words import STOPCHARS_ZH, STOPWORDS_EN

ZH_CHARS_PER_WORD = 1.7  # a Chinese reply of 170 characters says about what 100 English words do
NGRAM_SIZES = (1, 2, 3)  # the Chinese character n-grams
REPEAT_SHARE = 0.6  # a reply whose character trigrams come this much from one earlier reply repeats it
OFF_TOPIC_SHARE = 0.1  # a reply of OFF_TOPIC_WORDS or more with fewer of its topic words in the user's
OFF_TOPIC_WORDS = 6  # lines and background says nothing of the user's situation
COPIED_RUN = 3  # tokens in a row said by the user are copied, not taken up
THEME_KEYS = 5  # theme_fit: this many keys of what meets the user's hidden theme count in full
OFF_TARGET_KEYS = 3  # off_target_keys: this many keys of what misses it count in full
SITUATION_KEYS = 5  # situation: this many keys of the user's situation (its lines and story) count in full
_EN_WORD = re.compile(r"[a-z][a-z']*")
_QUESTION = re.compile(r"[?？]")
_EXCLAIM = re.compile(r"[!！]")
_SENTENCE_END = re.compile(r"[.!?。！？…]+")
_LIST_ITEM = re.compile(r"^\s*(?:\d+[.、)）]|[-*•·]\s|#+\s|[（(]?[一二三四五六七八九十]+[、.)）])", re.MULTILINE)
_BOLD = re.compile(r"\*\*[^*\n]+\*\*")
_HEADING = re.compile(r"^\s*#")
_BULLET = re.compile(r"^\s*[-*•]\s")
_THEME = re.compile(r"hidden theme|隐藏主题", re.IGNORECASE)
_ON_TARGET = re.compile(r"on target|贴合", re.IGNORECASE)
_OFF_TARGET = re.compile(r"off target|偏离", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)  # the dialogue's earlier lines, read at every turn
def normalise(text: str) -> str:
    """Lower case, straight apostrophes, single spaces."""
    return re.sub(r"\s+", " ", text.replace("’", "'").replace("‘", "'").lower()).strip()


def words(text: str) -> float:
    """The length of a normalised text in English-word equivalents."""
    return len(_EN_WORD.findall(text)) + len(CJK.findall(text)) / ZH_CHARS_PER_WORD


@functools.lru_cache(maxsize=4096)  # the dialogue's earlier lines and the scene, read at every turn
def topic_keys(text: str) -> frozenset[str]:
    """English content-word stems (first 5 letters) and Chinese content-character bigrams."""
    stems = {w[:5] for w in _EN_WORD.findall(text) if len(w) >= 4 and w not in STOPWORDS_EN}
    chars = [c if CJK.match(c) and c not in STOPCHARS_ZH else " " for c in text]
    return frozenset(stems | {a + b for a, b in zip(chars, chars[1:]) if a != " " and b != " "})


@functools.lru_cache(maxsize=4096)
def _shingles(text: str) -> frozenset[str]:
    """Character trigrams of a normalised text (spaces dropped): for copies and repeats."""
    t = text.replace(" ", "")
    return frozenset(t[i:i + 3] for i in range(len(t) - 2))


def _contained(part: frozenset[str], whole: frozenset[str]) -> float:
    return len(part & whole) / len(part) if part else 0.0


def _recall(found: frozenset[str], wanted: frozenset[str]) -> float:
    return len(found & wanted) / len(wanted) if wanted else 0.0


def ngrams(text: str) -> set[str]:
    """The distinct Chinese character n-grams of a normalised text (NGRAM_SIZES; runs of Han
    characters and Chinese punctuation only)."""
    out: set[str] = set()
    for run in re.findall(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]+", text):
        for n in NGRAM_SIZES:
            out.update(run[i:i + n] for i in range(len(run) - n + 1))
    return out


@functools.lru_cache(maxsize=256)
def theme(scene: str) -> tuple[frozenset[str], frozenset[str]]:
    """The topic keys of what a profile's scene says meets the user's hidden theme (its hidden-theme
    section, the reaction to an on-target reply) and of what misses it (the reaction to an
    off-target reply), in its own words; the two sets disjoint."""
    on: list[str] = []
    off: list[str] = []
    mode = None
    for line in scene.splitlines():
        if _HEADING.match(line):
            mode = "on" if _THEME.search(line) else None
        elif _ON_TARGET.search(line):
            mode = "on"
        elif _OFF_TARGET.search(line):
            mode = "off"
        elif _BULLET.match(line):
            mode = None
        if mode:
            (on if mode == "on" else off).append(line)
    keys_on = topic_keys(normalise("\n".join(on)))
    return keys_on, topic_keys(normalise("\n".join(off))) - keys_on


@functools.lru_cache(maxsize=256)
def _told(profile: Profile) -> frozenset[str]:
    """The topic keys of the user's story (user_lines.story): the situation it tells."""
    return topic_keys(normalise(" ".join(story(profile))))


_COPY_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]|[a-z0-9']+|[^\sa-z0-9'\u3400-\u4dbf\u4e00-\u9fff]")


def own_words(text: str, users: Sequence[str], language: str) -> str:
    """A normalised reply without what it copies of the user's normalised lines `users` (runs of
    COPIED_RUN tokens or more said in that order by the user), so only what it says in its own
    words counts as taking up the user's words."""
    toks = _COPY_TOKEN.findall(text)
    said = {tuple(line[i:i + COPIED_RUN]) for line in map(_COPY_TOKEN.findall, users)
            for i in range(len(line) - COPIED_RUN + 1)}
    keep = [True] * len(toks)
    for i in range(len(toks) - COPIED_RUN + 1):
        if tuple(toks[i:i + COPIED_RUN]) in said:
            keep[i:i + COPIED_RUN] = [False] * COPIED_RUN
    joiner = "" if language == "zh" else " "
    return joiner.join(t if k else " | " for t, k in zip(toks, keep))


def features(reply: str, *, history: Sequence[dict[str, str]], profile: Profile, language: str,
             emotions: Sequence[int]) -> dict[str, float]:
    """The named features of `reply`, said after `history` (the policy's view) to the user of
    `profile`, whose emotion went through `emotions` (the initial emotion first)."""
    text = normalise(reply)
    users = [normalise(m["content"]) for m in history if m["role"] == "user"]
    earlier = [normalise(m["content"]) for m in history if m["role"] == "assistant"]
    length = words(text)
    sentences = max(len(_SENTENCE_END.findall(text)), 1)
    # What the reply takes up of the user counts in its own words (own_words), not copied.
    mine, last = topic_keys(own_words(text, users, language)), topic_keys(users[-1]) if users else frozenset()
    said = frozenset().union(*(topic_keys(u) for u in users))
    background = _background(profile.player + "\n" + profile.scene) - said
    shingles = _shingles(text)
    used = frozenset().union(*(topic_keys(e) for e in earlier))
    # Phrase counts, not shares: a short reply with one stock phrase is not a long one full of them.
    found = judge_lexicon.counts(text, language)
    goal_fit, blame = judge_lexicon.goal_counts(text, language, profile.goal)
    previous = emotions[-1] - emotions[-2] if len(emotions) >= 2 else 0
    repeats = max((_contained(shingles, _shingles(e)) for e in earlier), default=0.0)
    topic_share = _contained(mine, said | background)
    on_theme, off_theme = theme(profile.scene)
    user_lines = tuple(m["content"] for m in history if m["role"] == "user")
    skeleton = skeletons.shingles(skeletons.skeleton(reply, user_lines))
    reused = frozenset().union(*(skeletons.shingles(skeletons.skeleton(m["content"], user_lines))
                                 for m in history if m["role"] == "assistant"))
    return {
        "log_words": math.log1p(length),
        "words_per_sentence": min(length / sentences, 60.0) / 10,
        "questions": min(len(_QUESTION.findall(text)), 4),
        "ends_with_question": float(bool(re.search(r"[?？]\W*$", text))),
        "exclamations": min(len(_EXCLAIM.findall(text)), 4),
        "list_items": min(len(_LIST_ITEM.findall(reply)), 10) / 5,
        "bold": min(len(_BOLD.findall(reply)), 10) / 5,
        "paragraphs": min(len([p for p in re.split(r"\n\s*\n", reply) if p.strip()]), 8) / 4,
        "recall_last_line": _recall(mine, last),
        "recall_user_lines": _recall(mine, said),
        "background_keys": min(len(mine & background), 10) / 5,
        "topic_share": topic_share,
        "off_topic": float(length >= OFF_TOPIC_WORDS and topic_share < OFF_TOPIC_SHARE),
        "copied_from_user": max((_contained(shingles, _shingles(u)) for u in users), default=0.0),
        "repeats_itself": repeats,
        "near_repeat": float(repeats >= REPEAT_SHARE),
        "new_keys_share": 1.0 - _contained(mine, used) if earlier else 1.0,
        # How much of the reply's skeleton (the user's words masked: text/skeletons.py) its earlier
        # replies already said: a template says the same around whatever words it slots in.
        "skeleton_reuse": _contained(skeleton, reused),
        # A frame said over and over within the reply ("You handled the X so well! You handled the Y...").
        "frame_repeats": 1.0 - len(skeleton) / max(len(skeletons.skeleton(reply, user_lines)), 1),
        "theme_fit": min(len((mine & on_theme) - said), THEME_KEYS) / THEME_KEYS,
        "off_target_keys": min(len((mine & off_theme) - said), OFF_TARGET_KEYS) / OFF_TARGET_KEYS,
        # Taking up the user's situation, its lines and its story, with more than one literal word.
        "situation": min(len(mine & (said | _told(profile))), SITUATION_KEYS) / SITUATION_KEYS,
        "turn": min(len(earlier), 9) / 9,
        **{f"lex_{k}": math.log1p(v) for k, v in sorted(found.items())},
        "lex_goal_fit": math.log1p(goal_fit),
        "lex_other_goals": math.log1p(judge_lexicon.other_goal_kinds(text, language, profile.goal)),
        "lex_blame": math.log1p(blame),
        "negative_user": float(profile.personality == "negative"),
        "passive_user": float(profile.personality == "passive"),
        **{f"goal_{g}": float(profile.goal == g) for g in tuple(GOALS)[1:]},  # the first goal: none of them
        # The mood: how far the emotion has come since the start, and its last step.
        "mood": (emotions[-1] - emotions[0]) / 30,
        "previous_change": max(-10, min(10, previous)) / 10,
    }


@functools.lru_cache(maxsize=256)
def _background(text: str) -> frozenset[str]:
    return topic_keys(normalise(text))
