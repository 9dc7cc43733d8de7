"""Whether a policy's reply has degenerated: the signs a run that collapses into noise or loops shows
(the RLVER GRPO no-think report of garbled multilingual text from step 2 on, SmolLM2's
"no-nonsense no-nonsense no-nonsense"), each a pure function of the reply's text.

A reply is degenerate for any of these reasons (`REASONS`):
  empty: nothing but whitespace;
  garbled: most of its visible characters are not letters, or its letters mix scripts (Latin,
    Han, Cyrillic, ...) with the second script at least MIXED_SHARE of them;
  repetition: a word, or a phrase of up to MAX_NGRAM words, said REPEATS times or more in a row
    (Han characters count as words);
  wrong_language: an "en" dialogue answered mostly in Han characters, a "zh" one with almost none;
  repeat_turn: the same text as one of the dialogue's earlier replies.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

REASONS = ("empty", "garbled", "repetition", "wrong_language", "repeat_turn")
LETTER_SHARE = 0.5  # garbled: fewer than this share of visible characters are letters
MIXED_SHARE = 0.2  # garbled: the second script holds at least this share of the letters
MAX_NGRAM = 4  # repetition: phrases of 1..MAX_NGRAM words
REPEATS = 3  # repetition: said this many times in a row
HAN_SHARE_EN = 0.5  # wrong_language: an "en" reply whose letters are at least this share Han
HAN_SHARE_ZH = 0.1  # wrong_language: a "zh" reply whose letters are under this share Han

_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*|\d+")  # a run of letters (hyphenated or with an apostrophe), or digits


def _script(ch: str) -> str:
    """The Unicode script of a letter by its name's first word (LATIN, CJK, CYRILLIC, HANGUL, ...)."""
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0] if name else "UNKNOWN"


def _letters(text: str) -> list[str]:
    return [ch for ch in text if ch.isalpha()]


def _han_share(letters: Sequence[str]) -> float:
    return sum(_script(ch) == "CJK" for ch in letters) / len(letters) if letters else 0.0


def garbled(text: str) -> bool:
    """Mostly non-letters, or letters of two scripts mixed (see the module docstring)."""
    visible = [ch for ch in text if not ch.isspace()]
    letters = _letters(text)
    if not visible or len(letters) < LETTER_SHARE * len(visible):
        return bool(visible)
    counts: dict[str, int] = {}
    for ch in letters:
        counts[_script(ch)] = counts.get(_script(ch), 0) + 1
    ranked = sorted(counts.values(), reverse=True)
    return len(ranked) > 1 and ranked[1] >= MIXED_SHARE * len(letters)


def words(text: str) -> list[str]:
    """The reply's words, lower-cased; each Han character is a word of its own."""
    out = []
    for w in _WORD.findall(text.lower()):
        if any(_script(ch) == "CJK" for ch in w):
            out.extend(w)
        else:
            out.append(w)
    return out


def repetition(text: str) -> bool:
    """Some phrase of 1..MAX_NGRAM words occurs REPEATS times or more in a row."""
    ws = words(text)
    for n in range(1, MAX_NGRAM + 1):
        for start in range(len(ws) - n * REPEATS + 1):
            phrase = ws[start:start + n]
            if all(ws[start + k * n:start + (k + 1) * n] == phrase for k in range(1, REPEATS)):
                return True
    return False


def wrong_language(text: str, language: str) -> bool:
    """An "en" reply mostly in Han characters, or a "zh" one with almost none; "" (unknown): never."""
    letters = _letters(text)
    if not letters or language not in ("en", "zh"):
        return False
    share = _han_share(letters)
    return share >= HAN_SHARE_EN if language == "en" else share < HAN_SHARE_ZH


def _normal(text: str) -> str:
    return " ".join(text.split()).lower()


def reasons(reply: str, language: str, earlier: Sequence[str] = ()) -> list[str]:
    """Why `reply` (in a dialogue of `language`, after the dialogue's `earlier` replies) is
    degenerate, in the order of REASONS; [] when it is not."""
    if not reply.strip():
        return ["empty"]
    found = {"garbled": garbled(reply), "repetition": repetition(reply),
             "wrong_language": wrong_language(reply, language),
             "repeat_turn": _normal(reply) in {_normal(e) for e in earlier}}
    return [r for r in REASONS if found.get(r)]


def rates(dialogues: Sequence[tuple[str, Sequence[str]]]) -> dict[str, float]:
    """Over every reply of `dialogues` ((language, replies in order) pairs): `degenerate_rate`,
    the share of replies degenerate for any reason, and `degenerate_<reason>_rate` for each
    reason; 0 over no reply."""
    total, any_reason = 0, 0
    counts = dict.fromkeys(REASONS, 0)
    for language, replies in dialogues:
        for i, reply in enumerate(replies):
            found = reasons(reply, language, replies[:i])
            total += 1
            any_reason += bool(found)
            for r in found:
                counts[r] += 1
    share = (lambda k: k / total) if total else (lambda k: 0.0)
    return {"degenerate_rate": share(any_reason), **{f"degenerate_{r}_rate": share(c) for r, c in counts.items()}}


def describe(rates: dict[str, float]) -> str:
    """"45% (garbled 40%, empty 5%)": the share of degenerate replies of `rates` and its reasons."""
    parts = [f"{r} {rates[f'degenerate_{r}_rate']:.0%}" for r in REASONS if rates.get(f"degenerate_{r}_rate")]
    return f"{rates['degenerate_rate']:.0%}" + (f" ({', '.join(parts)})" if parts else "")
