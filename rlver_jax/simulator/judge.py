"""The calibrated judge of the embedded simulator: how a reply moves the user's emotion.

1. A degenerate reply (text/degeneration.py: empty, garbled, word salad, a loop, the wrong
   language) gets an outright change (OUTRIGHT): no fit is asked.
2. Otherwise the change SAGE's DeepSeek-V3 simulator would make, as fitted on its released results
   (judge_fit.py, launch/fit_judge.py): a ridge model on named features that mean the same in
   English and Chinese (judge_features.py: lengths, layout, questions, what the reply takes up of
   the user's words, story and hidden theme, repeating itself and its own skeleton, phrase
   families, the user's type and goal, the mood so far), plus, for Chinese replies, one on
   character n-grams. The fit pays nothing for what SAGE's tested models never varied beyond their
   average (exclamation marks, copying a little of the user's line: more than the average reply's
   counts as the average) or for the absence of faults (a reply with fewer than the average reply's
   gets nothing for it; judge_fit.py). The phrase families add at most PHRASING_BOUND: stock phrases
   fit every user. The mood (how the dialogue went so far) adds at most MOOD_BOUND either way, and
   at most MOOD_MARGIN more than the reply earns itself: it cannot carry a dialogue of replies that
   do nothing.
3. Caps for what SAGE's tested models (almost) never did, so no fit could learn it (CAPS): a reply
   that echoes the user's words, takes up none of the user's words (but what it copies of them:
   judge_features.own_words; SAGE's simulator gave such replies -4.3 on average), is a word or two,
   brushes the user off (lexicon.DISMISSIVE), blames one who wants to hear it was not their fault,
   says what it said before around other words (SKELETON_REUSE of its skeleton, the user's words
   masked, in its earlier replies: text/skeletons.py; SAGE's simulator gave such replies -1.5 to -2.5
   on average) or says one thing over and over changes the emotion by at most its cap, whatever else
   it does.
4. A "challenging" user feels positives half and negatives 1.25 times.
The change is the rounded sum, within +-MAX_CHANGE. `Score.parts` holds each group's points, shown
as the thoughts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from rlver_jax.simulator import judge_features
from rlver_jax.simulator.judge_weights import JudgeWeights, load
from rlver_jax.simulator.profiles import Profile
from rlver_jax.text import degeneration

Part = tuple[str, float, str]  # (what, points, evidence)
MAX_CHANGE = 10  # SAGE's simulator judges within +-10
# Outright changes of degenerate replies, by degeneration reason (the first reason found counts).
# A repeat of an earlier reply is no outright case: SAGE's tested models repeat themselves, and the
# fit (judge_features: repeats_itself, near_repeat) weighs it as SAGE's simulator did.
OUTRIGHT = {"empty": -10, "garbled": -10, "word_salad": -10, "repetition": -8, "wrong_language": -6}
ECHO_SHARE = 0.6  # a reply whose character trigrams come this much from one of the user's lines echoes it
CURT_WORDS = 3  # a reply under this many words is a word or two
MOOD_BOUND = 3.0  # the most the mood so far adds to or takes from a reply's change
PHRASING_BOUND = 1.5  # the most the phrase families (lex_*) add: stock phrases fit every user
FRAME_REPEATS = 0.3  # a reply whose skeleton's shingles repeat this much within it says one thing over and over
MOOD_MARGIN = 2.0  # ... and it adds at most this more than the reply earns itself (if that is positive)
SKELETON_REUSE = 0.5  # a reply whose skeleton is this much its earlier replies' says the same again
# The most a reply with each fault changes the emotion by.
CAPS = {"echoes your words": -6, "takes up nothing you said": -4, "a word or two": -5, "brushes you off": -5,
        "blames you": -3, "says the same again": 0, "says one thing over and over": -3}
# The parts the named features are shown in, by name prefix or name.
_GROUPS = (("length and layout", ("log_words", "words_per_sentence", "paragraphs", "list_items", "bold",
                                  "exclamations")),
           ("questions", ("questions", "ends_with_question")),
           ("takes up what you said", ("recall_", "background_keys", "topic_share", "off_topic", "situation",
                                       "copied_from_user")),
           ("meets what you hoped for", ("theme_fit", "off_target_keys")),
           ("says something new", ("repeats_itself", "near_repeat", "new_keys_share", "skeleton_reuse",
                                   "frame_repeats")),
           ("phrasing", ("lex_",)),
           ("who you are", ("negative_user", "passive_user", "goal_")),
           ("your mood so far", ("mood", "previous_change")),
           ("how far we are", ("turn",)))
MOOD = "your mood so far"
PHRASING = "phrasing"


@dataclasses.dataclass(frozen=True)
class Score:
    change: int
    parts: tuple[Part, ...]

    def explain(self) -> str:
        shown = [f"{name} {points:+.1f}" + (f" [{evidence}]" if evidence else "")
                 for name, points, evidence in self.parts if points]
        return "; ".join(shown) + f" => {self.change:+d}"


@functools.lru_cache(maxsize=None)
def _group(name: str) -> str:
    return next(group for group, keys in _GROUPS if any(name.startswith(k) for k in keys))


def _fitted(x: dict[str, float], reply: str, language: str, weights: JudgeWeights) -> list[Part]:
    contributions = weights.dense.contributions(x)
    points: dict[str, float] = {}
    for name, value in contributions.items():
        points[_group(name)] = points.get(_group(name), 0.0) + value
    points[PHRASING] = min(points.get(PHRASING, 0.0), PHRASING_BOUND)
    parts = [("baseline", weights.dense.intercept, "")] + [(g, points.get(g, 0.0), "") for g, _ in _GROUPS if g != MOOD]
    if language == "zh":
        grams = judge_features.ngrams(judge_features.normalise(reply))
        parts.append(("wording", weights.ngrams.contribution(grams), ""))
    own = sum(p for _, p, _ in parts)
    mood = max(-MOOD_BOUND, min(MOOD_BOUND, points.get(MOOD, 0.0), max(own, 0.0) + MOOD_MARGIN))
    return parts + [(MOOD, mood, "")]


def _faults(x: dict[str, float], length: float) -> list[str]:
    found = {"echoes your words": x["copied_from_user"] >= ECHO_SHARE,
             "takes up nothing you said": length >= CURT_WORDS and not x["recall_user_lines"],
             "a word or two": length < CURT_WORDS, "brushes you off": x["lex_dismissive"] > 0,
             "blames you": x["lex_blame"] > 0, "says the same again": x["skeleton_reuse"] >= SKELETON_REUSE,
             "says one thing over and over": x["frame_repeats"] >= FRAME_REPEATS}
    return [name for name, hit in found.items() if hit]


def score_reply(reply: str, *, profile: Profile, language: str, difficulty: str,
                history: Sequence[dict[str, str]], emotions: Sequence[int],
                weights: JudgeWeights | None = None) -> Score:
    """The judgement of a policy `reply` said after `history` (the policy's view) to the user of
    `profile` in `language`, whose emotion went through `emotions` (the initial one first).
    `weights`: the fitted numbers (default: the shipped ones, data/judge_weights.json)."""
    reasons = [r for r in degeneration.reasons(reply, language) if r in OUTRIGHT]
    if reasons:
        change = OUTRIGHT[reasons[0]]
        return Score(change, ((f"degenerate: {reasons[0].replace('_', ' ')}", float(change), ", ".join(reasons)),))
    weights = weights or load()
    x = judge_features.features(reply, history=history, profile=profile, language=language, emotions=emotions)
    parts = _fitted(x, reply, language, weights)
    total = sum(points for _, points, _ in parts)
    for fault in _faults(x, judge_features.words(judge_features.normalise(reply))):
        if total > CAPS[fault]:
            parts.append((fault, CAPS[fault] - total, f"at most {CAPS[fault]:+d}"))
            total = CAPS[fault]
    if difficulty == "challenging":
        parts.append(("a challenging user", total * (-0.5 if total > 0 else 0.25), ""))
        total = sum(points for _, points, _ in parts)
    return Score(max(-MAX_CHANGE, min(MAX_CHANGE, int(round(total)))), tuple(parts))
