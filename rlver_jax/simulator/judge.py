"""The calibrated judge of the embedded simulator: how a reply moves the user's emotion.

1. A degenerate reply (text/degeneration.py: empty, garbled, word salad, a loop, the wrong
   language) gets an outright change (OUTRIGHT): no fit is asked.
2. Otherwise the change SAGE's DeepSeek-V3 simulator would make, as fitted on its released results
   (judge_fit.py, launch/fit_judge.py): a ridge model on named features that mean the same in
   English and Chinese (judge_features.py: lengths, layout, questions, what the reply takes up of
   the user's words and background, repeating itself, phrase families, the user's type and goal,
   the mood so far), plus, for Chinese replies, one on character n-grams.
3. Penalties for what SAGE's tested models (almost) never did, so no fit could learn it
   (PENALTIES): a reply that echoes the user's words, takes up none of them, is a word or two,
   brushes the user off (lexicon.DISMISSIVE) or blames one who wants to hear it was not their fault.
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
PENALTIES = {"echoes your words": -6.0, "takes up nothing you said": -4.0, "a word or two": -5.0,
             "brushes you off": -5.0, "blames you": -3.0}
# The parts the named features are shown in, by name prefix or name.
_GROUPS = (("length and layout", ("log_words", "words_per_sentence", "paragraphs", "list_items", "bold",
                                  "exclamations")),
           ("questions", ("questions", "ends_with_question")),
           ("takes up what you said", ("recall_", "background_keys", "topic_share", "off_topic", "copied_from_user")),
           ("says something new", ("repeats_itself", "near_repeat", "new_keys_share")),
           ("phrasing", ("lex_",)),
           ("who you are", ("negative_user", "passive_user", "goal_")),
           ("your mood so far", ("mood", "previous_change", "turn")))


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
    parts = [("baseline", weights.dense.intercept, "")] + [(g, points.get(g, 0.0), "") for g, _ in _GROUPS]
    if language == "zh":
        grams = judge_features.ngrams(judge_features.normalise(reply))
        parts.append(("wording", weights.ngrams.contribution(grams), ""))
    return parts


def _penalties(x: dict[str, float], length: float) -> list[Part]:
    found = {"echoes your words": x["copied_from_user"] >= ECHO_SHARE,
             "takes up nothing you said": length >= CURT_WORDS and x["recall_user_lines"] == 0,
             "a word or two": length < CURT_WORDS, "brushes you off": x["lex_dismissive"] > 0,
             "blames you": x["lex_blame"] > 0}
    return [(name, PENALTIES[name], "") for name, hit in found.items() if hit]


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
    parts = _fitted(x, reply, language, weights) + _penalties(x, judge_features.words(judge_features.normalise(reply)))
    total = sum(points for _, points, _ in parts)
    if difficulty == "challenging":
        parts.append(("a challenging user", total * (-0.5 if total > 0 else 0.25), ""))
        total = sum(points for _, points, _ in parts)
    return Score(max(-MAX_CHANGE, min(MAX_CHANGE, int(round(total)))), tuple(parts))
