"""Reply skeletons: what is left of a reply once the user's words are masked. A template that
builds its replies from the user's words (the user's two longest words in a stock line, the user's
clause said back) leaves the same skeleton for every user; a reply written for one user does not.

`template_rate` reads them: the share of replies that share a skeleton with another user's reply
(the template alarm of training and evaluation). The embedded user's judge reads how much of a
reply's skeleton its earlier replies already said (simulator/judge_features.py: a reply that says
the same thing turn after turn, whatever words it slots in, is not listening).

A skeleton is the reply's tokens (lower-cased words, each Han character, digit runs as "#",
punctuation runs) with the user's words masked: every token of a run of COPIED_RUN or more tokens
found in that order in one of the user's lines, and every content word of the user's (English
words of CONTENT_LETTERS or more letters outside function_words.STOPWORDS_EN, Han characters
outside STOPCHARS_ZH); each run of masked tokens becomes one slot. Skeletons are alike by the
Jaccard similarity of their SHINGLE-token shingles.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from rlver_jax.text.function_words import STOPCHARS_ZH, STOPWORDS_EN

COPIED_RUN = 2  # tokens in a row said by the user are masked
CONTENT_LETTERS = 4  # an English word of this many letters (outside STOPWORDS_EN) is a content word
SHINGLE = 3  # skeletons compare by their runs of this many tokens
ALIKE = 0.5  # two skeletons whose shingles overlap this much (Jaccard) share a skeleton
SLOT = "_"
_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]|[^\W\d_]+(?:['’][^\W\d_]+)*|\d+|[^\w\s]+")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


@functools.lru_cache(maxsize=8192)
def tokens(text: str) -> tuple[str, ...]:
    """Lower-cased words (each Han character one), digit runs as "#", punctuation runs."""
    return tuple("#" if t.isdigit() else t.replace("’", "'") for t in _TOKEN.findall(text.lower()))


def _content(token: str) -> bool:
    if _HAN.fullmatch(token):
        return token not in STOPCHARS_ZH
    return len(token) >= CONTENT_LETTERS and token.isalpha() and token not in STOPWORDS_EN


@functools.lru_cache(maxsize=4096)
def _user_view(user_lines: tuple[str, ...]) -> tuple[frozenset[str], frozenset[tuple[str, ...]]]:
    """The user's content words, and every run of COPIED_RUN tokens of the user's lines."""
    said = [tokens(line) for line in user_lines]
    words = frozenset(t for line in said for t in line if _content(t))
    runs = frozenset(line[i:i + COPIED_RUN] for line in said for i in range(len(line) - COPIED_RUN + 1))
    return words, runs


@functools.lru_cache(maxsize=8192)
def skeleton(reply: str, user_lines: tuple[str, ...]) -> tuple[str, ...]:
    """`reply`'s tokens with what the user said in `user_lines` masked (see the module docstring)."""
    words, runs = _user_view(user_lines)
    toks = tokens(reply)
    masked = [t in words for t in toks]
    for i in range(len(toks) - COPIED_RUN + 1):
        if toks[i:i + COPIED_RUN] in runs:
            masked[i:i + COPIED_RUN] = [True] * COPIED_RUN
    out: list[str] = []
    for t, m in zip(toks, masked):
        if not (m and out and out[-1] == SLOT):
            out.append(SLOT if m else t)
    return tuple(out)


@functools.lru_cache(maxsize=8192)
def shingles(skel: tuple[str, ...]) -> frozenset[tuple[str, ...]]:
    """The skeleton's runs of SHINGLE tokens, its ends marked (a skeleton shorter than that is one)."""
    padded = ("^", *skel, "$")
    return frozenset(padded[i:i + SHINGLE] for i in range(max(len(padded) - SHINGLE + 1, 1)))


def similarity(a: frozenset, b: frozenset) -> float:
    """Jaccard similarity of two shingle sets (0 when both are empty)."""
    return len(a & b) / len(a | b) if a or b else 0.0


def template_rate(replies: Sequence[tuple[str, str, Sequence[str]]]) -> float:
    """The share of `replies` ((user, reply, the user's lines before it) triples; `user` names
    whose dialogue it is, a profile id) whose skeleton is ALIKE one of another user's replies'; 0
    over none."""
    keyed = [(user, shingles(skeleton(reply, tuple(lines)))) for user, reply, lines in replies]
    by_shingle: dict[tuple[str, ...], list[int]] = {}
    for i, (_, sh) in enumerate(keyed):
        for s in sh:
            by_shingle.setdefault(s, []).append(i)
    templated = 0
    for i, (user, sh) in enumerate(keyed):
        others = {j for s in sh for j in by_shingle[s] if keyed[j][0] != user}
        templated += any(similarity(sh, keyed[j][1]) >= ALIKE for j in others)
    return templated / len(keyed) if keyed else 0.0
