"""Whether a policy's reply has degenerated: the signs a run that collapses into noise or loops shows
(the RLVER GRPO no-think report of garbled multilingual text from step 2 on, SmolLM2's
"no-nonsense no-nonsense no-nonsense"), each a pure function of the reply's text.

A reply is degenerate for any of these reasons (`REASONS`):
  empty: nothing but whitespace;
  garbled: most of its visible characters are not letters, or its letters mix scripts (Latin,
    Han, Cyrillic, ...), those outside its main script at least MIXED_SHARE of them, or it holds
    BROKEN_CHARS or more broken characters (U+FFFD, control characters but tab and newlines: bytes
    that are no text; one may be a multi-byte character cut at the token budget), or symbols no
    prose uses ("|{}<>\\^~=_$@") make up SYMBOL_SHARE of its visible characters, or letters at
    random: at least NOISE_WORDS of its Latin words, and NOISE_SHARE of them, have no vowel or
    change case inside ("nOAjfgbA", "julcz");
  word_salad: real words in no order: English whose clauses join function words no grammar joins
    ("the of", "and but", "is will", "an way") at least SALAD_PAIRS times and in at least SALAD_SHARE of its
    word pairs or once in a clause of SALAD_CLAUSE words, or a run of at least SALAD_HAN Han
    characters without a punctuation mark (SAGE's
    released replies, real models' Chinese, never run past 42);
  repetition: a word, or a phrase of up to MAX_NGRAM words, said REPEATS times or more in a row
    (Han characters count as words);
  wrong_language: an "en" dialogue answered mostly in letters that are not Latin (Han, Cyrillic,
    Hangul, ...) or in Latin letters whose function words are another language's (Spanish,
    French, German, ...: FOREIGN_WORDS or more of text/function_words.FOREIGN, more than twice its
    English ones); a "zh" one with almost no Han characters, or with kana or Hangul;
  repeat_turn: the same text as one of the dialogue's earlier replies.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence

from rlver_jax.text.function_words import ENGLISH, FOREIGN

REASONS = ("empty", "garbled", "word_salad", "repetition", "wrong_language", "repeat_turn")
LETTER_SHARE = 0.5  # garbled: fewer than this share of visible characters are letters
MIXED_SHARE = 0.2  # garbled: the scripts other than the main one hold at least this share of the letters
BROKEN_CHARS = 2  # garbled: at least this many broken characters
MAX_NGRAM = 4  # repetition: phrases of 1..MAX_NGRAM words
REPEATS = 3  # repetition: said this many times in a row
HAN_SHARE_EN = 0.5  # wrong_language: an "en" reply whose letters are at least this share Han
HAN_SHARE_ZH = 0.1  # wrong_language: a "zh" reply whose letters are under this share Han
LATIN_SHARE_EN = 0.5  # wrong_language: an "en" reply whose letters are under this share Latin
OTHER_SHARE_ZH = 0.2  # wrong_language: a "zh" reply whose letters are this share kana or Hangul
FOREIGN_WORDS = 3  # wrong_language: an "en" reply with this many foreign function words (and twice the English)
SYMBOL_SHARE = 0.08  # garbled: this share of the visible characters are symbols prose never uses
NOISE_WORDS = 3  # garbled: at least this many Latin words of 3+ letters without a vowel or with a case change
NOISE_SHARE = 0.3  # ... and at least this share of them
SALAD_PAIRS = 2  # word_salad: at least this many ungrammatical function-word pairs
SALAD_SHARE = 0.08  # ... in at least this share of the English word pairs within clauses,
SALAD_CLAUSE = 20  # or one such pair in a clause of this many words or more (no punctuation)
SALAD_HAN = 48  # word_salad: a run of this many Han characters without punctuation

# English function words by class, and the words that cannot follow each class within a clause
# (words of more than one class are left out: "that", "this", "his", "her", "each", "so", ...).
_DETERMINER = frozenset("the a an my your its our their every".split())
_PREPOSITION = frozenset("of in on at for with from by about into onto".split())
_CONJUNCTION = frozenset("and or but".split())
_SUBJECT = frozenset("i he she we they".split())
_OBJECT = frozenset("him them me us it".split())
_COPULA = frozenset("is are was were am".split())
_MODAL = frozenset("will would can could should may might must does did".split())
_BASE = frozenset("have has had be been".split())
_WH = frozenset("what when how who which where why".split())
_FINITE = _COPULA | _MODAL
_NOT_AFTER = {  # first word's class: the words the next one may not be
    "determiner": _DETERMINER | _PREPOSITION | _CONJUNCTION | _SUBJECT | _OBJECT | _FINITE | _BASE | _WH
    | frozenset("not there than all if then some any each this these those his her that".split()),
    "preposition": _PREPOSITION | _CONJUNCTION | _SUBJECT | _FINITE | _BASE | {"to"},
    "to": _PREPOSITION | _CONJUNCTION | _SUBJECT | _FINITE | {"to"},
    "conjunction": _CONJUNCTION,
    "subject": _DETERMINER | _SUBJECT | _OBJECT | _PREPOSITION | {"to", "not", "be", "been"},
    "wh": _WH,
    "copula": _FINITE | _BASE,
    "modal": _FINITE | {"been", "has", "had"},
}
_CLASS_OF = {w: c for c, words_ in (("determiner", _DETERMINER), ("preposition", _PREPOSITION), ("to", {"to"}),
                                    ("conjunction", _CONJUNCTION), ("subject", _SUBJECT), ("copula", _COPULA),
                                    ("modal", _MODAL), ("wh", _WH)) for w in words_}
_CLAUSE = re.compile(r"[^,.;:!?()\[\]\"“”\n]+")
_EN_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?")
_HAN_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]{%d,}" % SALAD_HAN)

# a run of letters (hyphenated or with an apostrophe), or digits
_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*|\d+")
_ODD_SYMBOLS = frozenset("|{}<>\\^~=_$@")
_LATIN_WORD = re.compile(r"(?<![^\W\d_])[A-Za-z]{3,}(?![^\W\d_])")
_NOISY = re.compile(r"^[^aeiouyAEIOUY]+$|[a-z][A-Z]")
_NOT_NOISE = frozenset("hmm hmmm shh mmm nth pls thx".split())  # real words without a vowel


@functools.lru_cache(maxsize=65536)
def _script(ch: str) -> str:
    """The Unicode script of a letter by its name's first word (LATIN, CJK, CYRILLIC, HANGUL, ...)."""
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0] if name else "UNKNOWN"


def _letters(text: str) -> list[str]:
    return [ch for ch in text if ch.isalpha()]


def _han_share(letters: Sequence[str]) -> float:
    return sum(_script(ch) == "CJK" for ch in letters) / len(letters) if letters else 0.0


def garbled(text: str) -> bool:
    """Mostly non-letters, letters of several scripts mixed, or broken characters (see the module
    docstring)."""
    visible = [ch for ch in text if not ch.isspace()]
    letters = _letters(text)
    if not visible or len(letters) < LETTER_SHARE * len(visible):
        return bool(visible)
    if sum(ch == "\ufffd" or (unicodedata.category(ch) == "Cc" and ch not in "\t\n\r") for ch in text) >= BROKEN_CHARS:
        return True
    if sum(ch in _ODD_SYMBOLS for ch in visible) >= SYMBOL_SHARE * len(visible) or _random_letters(text):
        return True
    counts = _script_counts(letters)
    return len(letters) - max(counts.values()) >= MIXED_SHARE * len(letters)


def _script_counts(letters: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ch in letters:
        counts[_script(ch)] = counts.get(_script(ch), 0) + 1
    return counts


def _random_letters(text: str) -> bool:
    """Latin letters at random: many words without a vowel or with a case change inside them."""
    latin = _LATIN_WORD.findall(text)
    noisy = sum(bool(_NOISY.search(w)) and w.lower() not in _NOT_NOISE and not w.isupper() for w in latin)
    return noisy >= NOISE_WORDS and noisy >= NOISE_SHARE * len(latin)


def _ungrammatical(a: str, b: str) -> bool:
    """Whether English words `a` `b` cannot follow each other: function words no grammar joins,
    or an article before the wrong sound ("an way", "a it")."""
    if a == "an" and b[0] not in "aeiouh":
        return True
    if a == "a" and b[0] in "ai":
        return True
    return a in _CLASS_OF and b in _NOT_AFTER[_CLASS_OF[a]]


def _ungrammatical_pairs(text: str) -> list[tuple[int, int]]:
    """Per clause of English `text`: (function-word pairs no grammar joins, words)."""
    out = []
    for clause in _CLAUSE.findall(text.lower()):
        tokens = _EN_TOKEN.findall(clause)
        bad = sum(_ungrammatical(a, b) for a, b in zip(tokens, tokens[1:]))
        out.append((bad, len(tokens)))
    return out


def word_salad(text: str) -> bool:
    """Real words in no order (see the module docstring)."""
    if _HAN_RUN.search(text):
        return True
    clauses = _ungrammatical_pairs(text)
    bad, pairs = sum(b for b, _ in clauses), sum(max(n - 1, 0) for _, n in clauses)
    return (bad >= SALAD_PAIRS and bad >= SALAD_SHARE * pairs) or any(b and n >= SALAD_CLAUSE for b, n in clauses)


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
    """Not the dialogue's language (see the module docstring); "" (unknown): never."""
    letters = _letters(text)
    if not letters or language not in ("en", "zh"):
        return False
    counts = _script_counts(letters)
    if language == "zh":
        other = sum(counts.get(s, 0) for s in ("HIRAGANA", "KATAKANA", "HANGUL"))
        return _han_share(letters) < HAN_SHARE_ZH or other >= OTHER_SHARE_ZH * len(letters)
    if _han_share(letters) >= HAN_SHARE_EN or counts.get("LATIN", 0) < LATIN_SHARE_EN * len(letters):
        return True
    ws = words(text)
    foreign = sum(w in FOREIGN for w in ws)
    return foreign >= FOREIGN_WORDS and foreign > 2 * sum(w in ENGLISH for w in ws)


def _normal(text: str) -> str:
    return " ".join(text.split()).lower()


def reasons(reply: str, language: str, earlier: Sequence[str] = ()) -> list[str]:
    """Why `reply` (in a dialogue of `language`, after the dialogue's `earlier` replies) is
    degenerate, in the order of REASONS; [] when it is not."""
    if not reply.strip():
        return ["empty"]
    found = {"garbled": garbled(reply), "word_salad": word_salad(reply), "repetition": repetition(reply),
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
