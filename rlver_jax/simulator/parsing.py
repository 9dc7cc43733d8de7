"""Parsing the simulator model's answers, and neutralising the contract labels in untrusted text.

The output contract (prompts/*.txt; docs/simulator.md has the rules with examples):
  emotion step: analysis sections (Intent, Fit, Inner reaction, Feeling), then `Change: <signed
    integer>`; the change is clipped to +-max_change later, but a value beyond +-100, a
    non-integer, an absurdly long number or a value holding more than one number
    (`Change: 1#+2.-5+6`) is malformed.
  reply and opening steps: `Plan: ...`, then `Response: <the user's words>`; the words end at a
    blank line, the next label line, a quoted line, a heading or an echoed line, and are cut at
    `max_chars` (at a sentence end); words that repeat the policy's last reply are malformed.
  structured outputs (config.simulator.structured_output="json_schema"): one JSON object,
    {"reasoning", "change"} or {"reasoning", "utterance"} (`change_schema`, UTTERANCE_SCHEMA); an
    empty field, or one that copies the instruction's placeholders (`<the Plan line>`), is malformed.

Every decision is taken on one view of the text:
  1. `_strip_hidden`: format characters (zero-width spaces and joiners, bidi marks, soft hyphens)
     and think tags (blocks, and lone `<think>` / `</think>`, in any spelling the folding below
     reveals) are removed from the text itself, until none is left;
  2. `fold`, per character and for matching only: compatibility forms (full-width letters, digits
     and colons, mathematical letters, ligatures) decomposed, combining marks dropped, Cyrillic,
     Greek and Armenian look-alikes mapped to Latin letters and colon look-alikes to ":".
Label lines are recognised in the folded view; values are taken from the text of step 1.
Tolerated: full-width colons (`Change：+3`), markdown emphasis (`**Change:** **-2**`), brackets
and quotes around the value (`[+3]`, `【-2】`, `"+1"`), Unicode minus signs, numbered or bulleted
lines, label aliases (Change in mood, Mood change, 变化/情绪变化, 回复/回应). Quoted lines (`> ...`)
never count.

Which line is the simulator's own (a simulator model may echo the policy's reply, which is quoted
in the prompt, before or after its answer):
  - a label line that repeats a line of the untrusted text shown in the prompt (compared in the
    folded view with labels neutralised, emphasis, quotes and spacing ignored) is an echo and
    does not count, nor does any quoted line;
  - the own Change line is the first well-formed one after the last analysis-section label
    (Intent/Fit/Inner reaction/Feeling; for Response: the last Plan label), else the last
    well-formed one before it. "Well-formed" means the value starts with a number.
`neutralise_labels` applies step 1 to untrusted text and rewrites every contract or section label
the folded view reveals (`Change:` -> `Change -`), so no line of it, echoed back verbatim, can
parse as a label after any of the transformations above.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from rlver_jax.simulator.patterns import THINK_BLOCK

# Labels in the folded view.
_CHANGE = r"change(?:\s+in\s+(?:my\s+)?mood)?|(?:mood|emotion)\s+change|情绪变化|变化"
_RESPONSE = r"response|回复|回应"
_ANALYSIS = r"intent|fit|inner\s*reaction|feeling|意图|契合|内心活动|感受"  # the emotion step's sections
_PLAN = r"plan|计划"  # the reply step's section
_SPEAKER = r"you|your\s+friend|friend|user|assistant|你|朋友|用户|助手"  # ends an utterance only
_KINDS = ("change", "response", "analysis", "plan", "speaker")
_MARK = r"[ \t*_#\-•·\[(（【「“\"'`]*"  # emphasis, heading, list markers, opening brackets/quotes
_LEAD = rf"{_MARK}(?:\d{{1,2}}[.)、]\s*)?{_MARK}"  # ... and a list number
_TRAIL = r"[ \t*_\])）】」”\"'`]*"  # closing emphasis, brackets or quotes before the colon
_LABEL_LINE = re.compile(
    rf"^{_LEAD}(?:(?P<change>{_CHANGE})|(?P<response>{_RESPONSE})|(?P<analysis>{_ANALYSIS})"
    rf"|(?P<plan>{_PLAN})|(?P<speaker>{_SPEAKER})){_TRAIL}:[*_]*(?P<value>.*)$",
    re.IGNORECASE | re.DOTALL)
# A label the neutraliser rewrites: anywhere not right after a letter (a line-start label can
# only follow markers), colon included.
_ANY_LABEL = re.compile(rf"(?<![^\W\d_])(?:{_CHANGE}|{_RESPONSE}|{_ANALYSIS}|{_PLAN}){_TRAIL}(?P<colon>:)",
                        re.IGNORECASE)
_THINK_TAGS = re.compile(rf"{THINK_BLOCK.pattern}|</?think\s*>", re.IGNORECASE | re.DOTALL)
_NUMBER = re.compile(r"(?P<sign>[+\-−–—]?)\s*(?P<digits>\d+)(?P<fraction>[.,]\d+)?")
_VALUE_WRAPPING = " \t*_`\"'“”‘’「」『』[]【】()（）<>《》"
MAX_MAGNITUDE = 100  # a change beyond the whole emotion scale is no judgement: malformed
_MAX_DIGITS = 3  # more significant digits than MAX_MAGNITUDE has: malformed before int()
_ECHO_MIN_CHARS = 12  # letters and digits an utterance needs before it can count as an echo
_SENTENCE_ENDS = ".!?。！？…"
# Untrusted texts whose neutralised form and echo keys are kept: every dialogue in flight quotes
# its whole history at each step (64 dialogues of ~25 texts at eval.max_dialogues' default fit
# 5 times over; each entry holds about twice its text).
_CACHED_TEXTS = 8192
_STRIPPED_IN_ECHO_KEYS = re.compile(r"[*_`\"'“”‘’#>\[\]【】「」]")
# Matching pairs that may wrap a whole utterance.
_PAIRS = (("**", "**"), ("*", "*"), ("_", "_"), ('"', '"'), ("“", "”"), ("'", "'"), ("‘", "’"),
          ("「", "」"), ("『", "』"), ("[", "]"), ("【", "】"))
# Letters that look like Latin ones (Cyrillic, Greek, Armenian, Latin variants), and colon
# look-alikes; compatibility forms (full-width, mathematical) are left to NFKD.
_LOOKALIKES = dict(zip(
    "аАВсСеЕһНіІјЈкКМоОрРѕЅТуУхХԁԛԝӏ" "αΑΒεΕΗιΙκΚΜνΝοΟρΡτΤυΥχΧΖ" "օոսց" "ıɡɑ" "∶꞉˸։׃",
    "aABcCeEhHiIjJkKMoOpPsSTyYxXdqwl" "aABeEHiIkKMvNoOpPtTuYxXZ" "onug" "iga" ":::::",
    strict=True))

UTTERANCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "utterance": {"type": "string"}},
    "required": ["reasoning", "utterance"], "additionalProperties": False,
}


def change_schema(max_change: int) -> dict[str, Any]:
    """The emotion step's JSON schema: the reasoning first (so it is written before the number),
    then an integer change within the clip range."""
    return {
        "type": "object",
        "properties": {"reasoning": {"type": "string"},
                       "change": {"type": "integer", "minimum": -max_change, "maximum": max_change}},
        "required": ["reasoning", "change"], "additionalProperties": False,
    }


SPELLINGS = ("json_schema", "json_object")  # the two ways servers take a JSON schema, tried in this order


def response_format(name: str, schema: dict[str, Any], spelling: str = "json_schema") -> dict[str, Any]:
    """The chat request's `response_format` for a JSON schema: "json_schema" as OpenAI, SGLang, vLLM
    and llama.cpp's C++ server take it, "json_object" (with the schema beside it) as
    llama-cpp-python's server takes it."""
    if spelling == "json_object":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


class MalformedOutputError(ValueError):
    """The simulator's answer does not follow the output contract."""


@dataclasses.dataclass(frozen=True)
class ParsedChange:
    change: int  # as written by the simulator, before any clipping
    thoughts: str  # everything before the simulator's own Change line (or the JSON reasoning)


@dataclasses.dataclass(frozen=True)
class ParsedResponse:
    utterance: str
    thoughts: str  # everything before the simulator's own Response line (or the JSON reasoning)


@functools.lru_cache(maxsize=8192)
def _fold_char(ch: str) -> str:
    if ch in _LOOKALIKES:
        return _LOOKALIKES[ch]
    if unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return ""
    decomposed = unicodedata.normalize("NFKD", ch)
    return ch if decomposed == ch else "".join(_fold_char(c) for c in decomposed)


def _folded(text: str) -> tuple[str, Sequence[int]]:
    """The folded view of `text`, and for each of its characters the index of the original one."""
    if text.isascii():  # no look-alike, mark, format character or compatibility form: itself
        return text, range(len(text))
    out: list[str] = []
    index: list[int] = []
    for i, ch in enumerate(text):
        f = _fold_char(ch)
        out.append(f)
        index.extend([i] * len(f))
    return "".join(out), index


def fold(text: str) -> str:
    """The folded view of `text` (step 2 of the module docstring): what labels are matched on."""
    return text if text.isascii() else "".join(_fold_char(ch) for ch in text)


def _strip_hidden(text: str) -> str:
    """Step 1: format characters and think tags removed, until none is left."""
    if not text.isascii():  # format characters are not ASCII
        text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    while True:
        view, index = _folded(text)
        spans = [(index[m.start()], index[m.end() - 1] + 1) for m in _THINK_TAGS.finditer(view)]
        if not spans:
            return text
        kept, last = [], 0
        for start, end in spans:
            kept.append(text[last:start])
            last = end
        text = "".join(kept) + text[last:]


@functools.lru_cache(maxsize=_CACHED_TEXTS)
def neutralise_labels(text: str) -> str:
    """Untrusted text made safe to quote: hidden characters and think tags removed, and every
    contract or section label rewritten (`Change:` -> `Change -`), so that no line of it can parse
    as a label (module docstring). Cached: each step of a dialogue quotes its whole history again."""
    return _neutralise(text)


def _neutralise(text: str) -> str:
    lines = []
    for line in _strip_hidden(text).splitlines(keepends=True):
        while True:  # until a pass finds no label: a rewrite could reveal one (`Change::`)
            view, origin = _folded(line)
            colons = sorted({origin[m.start("colon")] for m in _ANY_LABEL.finditer(view)}, reverse=True)
            if not colons:
                break
            for at in colons:
                line = f"{line[:at]} -{line[at + 1:]}"
        lines.append(line)
    return "".join(lines)


def _echo_key(line: str) -> str:
    view = fold(_neutralise(line)).lower()  # uncached: an answer's lines are seen once
    return " ".join(_STRIPPED_IN_ECHO_KEYS.sub(" ", view).split()).lstrip("-•· ")


@functools.lru_cache(maxsize=_CACHED_TEXTS)
def _text_echo_keys(text: str) -> frozenset[str]:
    """The keys of every line of one untrusted text; cached, as neutralise_labels."""
    return frozenset(_echo_key(line) for line in _strip_hidden(text).splitlines() if line.strip())


def _echo_keys(untrusted: Sequence[str]) -> frozenset[str]:
    """The keys of every line of the untrusted text the prompt showed (its echoes do not count)."""
    return frozenset().union(*map(_text_echo_keys, untrusted))


@dataclasses.dataclass(frozen=True)
class _Label:
    index: int  # line number in the text of step 1
    kind: str  # one of _KINDS
    value: str  # what follows the label on its line, as written


def _label(line: str, index: int) -> _Label | None:
    stripped = line.strip()
    view, origin = _folded(stripped)
    m = _LABEL_LINE.match(view)
    if m is None:
        return None
    start = m.start("value")
    return _Label(index, next(k for k in _KINDS if m[k] is not None),
                  stripped[origin[start]:] if start < len(view) else "")


def _labels(lines: Sequence[str], echoes: frozenset[str]) -> list[_Label]:
    """The simulator's own label lines: echoes (`_echo_keys`) left out."""
    found = (_label(line, i) for i, line in enumerate(lines))
    return [lab for lab in found if lab is not None and _echo_key(lines[lab.index]) not in echoes]


def _candidates(labels: Sequence[_Label], kind: str, section: str) -> list[_Label]:
    """The `kind` lines in order of preference: after the last `section` label, first to last,
    then before it, last to first."""
    last_section = max((lab.index for lab in labels if lab.kind == section), default=-1)
    lines = [lab for lab in labels if lab.kind == kind]
    return [lab for lab in lines if lab.index > last_section] + \
        [lab for lab in reversed(lines) if lab.index < last_section]


def _checked(change: int) -> int:
    if abs(change) > MAX_MAGNITUDE:
        raise MalformedOutputError(f"change {change:+d} is beyond +-{MAX_MAGNITUDE}: no emotion scale allows it")
    return change


def _change_value(value: str) -> int | None:
    """The signed integer a Change line's value starts with; None when it starts with no number."""
    m = _NUMBER.match(fold(value).strip(_VALUE_WRAPPING))
    if m is None:
        return None
    if m["fraction"]:
        raise MalformedOutputError(f"'Change:' value {value.strip()[:40]!r} is not an integer")
    if any(ch.isdigit() for ch in fold(value).strip(_VALUE_WRAPPING)[m.end():]):
        raise MalformedOutputError(f"'Change:' value {value.strip()[:40]!r} is not one signed integer")
    digits = m["digits"].lstrip("0") or "0"
    if len(digits) > _MAX_DIGITS:
        raise MalformedOutputError(f"'Change:' value has {len(m['digits'])} digits")
    return _checked(-int(digits) if m["sign"] not in ("", "+") else int(digits))


def parse_change(text: str, *, untrusted: Sequence[str] = ()) -> ParsedChange:
    """The change of the simulator's own `Change:` line (module docstring), and the text before it.

    `untrusted`: the texts the prompt quoted (the conversation, the reply); their echoes do not count.
    """
    lines = _strip_hidden(text).splitlines()
    for label in _candidates(_labels(lines, _echo_keys(untrusted)), "change", "analysis"):
        change = _change_value(label.value)
        if change is not None:
            return ParsedChange(change, "\n".join(lines[:label.index]).strip())
    raise MalformedOutputError("no well-formed 'Change:' line of the simulator's own in its answer")


def _unwrap(text: str) -> str:
    """Strips pairs of quotes, emphasis or brackets that wrap the whole text."""
    changed = True
    while changed and text:
        changed = False
        for left, right in _PAIRS:
            inner = text[len(left):len(text) - len(right)]
            if (len(text) >= len(left) + len(right) and text.startswith(left)
                    and text.endswith(right) and left not in inner and right not in inner):
                text, changed = inner.strip(), True
                break
    return text


def _ends_utterance(line: str) -> bool:
    view = fold(line.strip())
    return view.startswith((">", "#", "```")) or _LABEL_LINE.match(view) is not None


def _cap(text: str, max_chars: int | None) -> str:
    """`text` cut to at most `max_chars`: at the last sentence end, else the last space."""
    if max_chars is None or len(text) <= max_chars:
        return text
    head = text[:max_chars]
    end = max(head.rfind(c) for c in _SENTENCE_ENDS)
    if end >= max_chars // 4:
        return head[:end + 1]
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head).rstrip()


def _normal(text: str) -> str:
    return "".join(ch for ch in fold(text).lower() if ch.isalnum())


def repeats(utterance: str, reply: str) -> bool:
    """Whether the utterance echoes the policy's reply: letters and digits compared, one inside the
    other, with at least _ECHO_MIN_CHARS of them (the reply making up at least half the utterance)."""
    u, r = _normal(utterance), _normal(reply)
    if len(u) >= _ECHO_MIN_CHARS and u in r:
        return True
    return len(r) >= _ECHO_MIN_CHARS and r in u and 2 * len(r) >= len(u)


def _finish(parts: Sequence[str], *, last_reply: str, max_chars: int | None,
            echoes: frozenset[str] = frozenset()) -> str:
    """The utterance of `parts` (its first line, then the lines that continue it up to a blank line,
    a label, quoted line or heading, or an echo of the quoted text): unwrapped, cut at `max_chars`,
    checked against the policy's last reply; "" when empty."""
    kept = [parts[0]]
    for line in parts[1:]:
        if not line.strip():
            if "".join(kept).strip():
                break  # a blank line after content ends the utterance
            continue
        if _ends_utterance(line) or _echo_key(line) in echoes:
            break
        kept.append(line)
    utterance = _cap(_unwrap("\n".join(kept).strip()), max_chars)
    if utterance and last_reply and repeats(utterance, last_reply):
        raise MalformedOutputError("the utterance repeats the policy's last reply")
    return utterance


def parse_response(text: str, *, untrusted: Sequence[str] = (), last_reply: str = "",
                   max_chars: int | None = None) -> ParsedResponse:
    """The user's words after the simulator's own `Response:` label (module docstring).

    untrusted: the texts the prompt quoted; last_reply: the policy reply the words answer (an
    utterance repeating it is malformed); max_chars: the utterance's length cap (None: no cap).
    """
    lines = _strip_hidden(text).splitlines()
    echoes = _echo_keys(untrusted)
    for label in _candidates(_labels(lines, echoes), "response", "plan"):
        utterance = _finish([label.value, *lines[label.index + 1:]], last_reply=last_reply, max_chars=max_chars,
                            echoes=echoes)
        if utterance:
            return ParsedResponse(utterance, "\n".join(lines[:label.index]).strip())
    raise MalformedOutputError("no 'Response:' line of the simulator's own with words after it")


def _json_answer(text: str, fields: dict[str, type]) -> dict[str, Any]:
    """The JSON object the answer starts with (think tags and a code fence allowed before it)."""
    body = re.sub(r"^```[a-zA-Z]*\s*", "", _strip_hidden(text).strip())
    if not body.startswith("{"):
        raise MalformedOutputError("the answer is not a JSON object")
    try:
        answer, _ = json.JSONDecoder().raw_decode(body)
    except ValueError as e:  # invalid JSON, or an integer too long to convert
        raise MalformedOutputError(f"invalid JSON answer: {e}") from e
    if not isinstance(answer, dict):
        raise MalformedOutputError("the answer is not a JSON object")
    for name, kind in fields.items():
        if not isinstance(answer.get(name), kind) or isinstance(answer.get(name), bool):
            raise MalformedOutputError(f"JSON answer field {name!r} is missing or not a {kind.__name__}")
    return answer


# An angle-bracketed span as the JSON instructions write their placeholders (`<the Plan line>`):
# an answer holding one copied the instruction instead of answering it.
_PLACEHOLDER = re.compile(r"<[^<>\n]{2,80}>")


def _own_words(answer: dict[str, Any], field: str, placeholders: Sequence[str]) -> str:
    """The answer's `field`, stripped; malformed when it is empty or copies a placeholder of the
    instruction (an angle-bracketed span, the words of one of `placeholders`, or "<" and a
    placeholder's first word: SmolLM2 wrote `<Response 那一行觉…`, the bracket never closed)."""
    text = answer[field].strip()
    if not text:
        raise MalformedOutputError(f"JSON answer field {field!r} is empty")
    normal, lower = _normal(text), text.lower()
    if (_PLACEHOLDER.search(text) or any(p and p in normal for p in map(_normal, placeholders))
            or any(f"<{p.split()[0].lower()}" in lower for p in placeholders if p.split())):
        raise MalformedOutputError(f"JSON answer field {field!r} copies the instruction's placeholder: "
                                   f"{text[:60]!r}")
    return text


def parse_change_json(text: str, *, placeholders: Sequence[str] = ()) -> ParsedChange:
    """The change of a structured emotion-step answer ({"reasoning": str, "change": int}); empty
    reasoning or a copied placeholder (`_own_words`) is malformed, as a change beyond the scale."""
    answer = _json_answer(text, {"reasoning": str, "change": int})
    return ParsedChange(_checked(answer["change"]), _own_words(answer, "reasoning", placeholders))


def parse_response_json(text: str, *, last_reply: str = "", max_chars: int | None = None,
                        placeholders: Sequence[str] = ()) -> ParsedResponse:
    """The words of a structured reply-step answer ({"reasoning": str, "utterance": str}), cut and
    checked as in `parse_response`; empty fields or copied placeholders (`_own_words`) are malformed."""
    answer = _json_answer(text, {"reasoning": str, "utterance": str})
    reasoning = _own_words(answer, "reasoning", placeholders)
    words = _own_words(answer, "utterance", placeholders)
    utterance = _finish(words.splitlines() or [""], last_reply=last_reply, max_chars=max_chars)
    if not utterance:
        raise MalformedOutputError("JSON answer field 'utterance' is empty")
    return ParsedResponse(utterance, reasoning)
