"""Parsing the simulator model's answers, and neutralising the contract labels in untrusted text.

Output contract of the prompts (prompts/*.txt):
  emotion step: analysis sections, then a line `Change: <signed integer>`
  reply and opening steps: a short plan, then `Response: <the user's words>`

Parsing is tolerant of what models do to such lines: full-width colons (`Change：+3`), markdown
emphasis (`**Change:** **-2**`), brackets and quotes around the value (`[+3]`, `【-2】`, `"+1"`),
full-width or Unicode minus signs, Chinese label aliases (变化/情绪变化, 回复/回应), and a leading
`<think>...</think>` block. Only the LAST label line counts: that is the simulator's own final
answer, whatever it quoted earlier. A label line must start the line (after optional emphasis or
list markers); quoted lines (`> ...`) never count, and `neutralise_labels` rewrites any label in
untrusted text so that it cannot parse as one.
"""

from __future__ import annotations

import dataclasses
import re

from rlver_jax.simulator.patterns import THINK_BLOCK

_CHANGE_LABELS = r"change|情绪变化|变化"
_RESPONSE_LABELS = r"response|回复|回应"
_LEAD = r"[ \t*_#\-•·\[(（【「“\"'`]*"  # emphasis, heading, list markers, opening brackets/quotes
_TRAIL = r"[ \t*_\])）】」”\"'`]*"  # closing emphasis, brackets or quotes before the colon
_COLON = r"[:：]"


def _label_line(labels: str) -> re.Pattern[str]:
    # Emphasis right after the colon closes the label's own (`**Response:** ...`).
    return re.compile(rf"^{_LEAD}(?:{labels}){_TRAIL}{_COLON}[*_]*(?P<value>.*)$", re.IGNORECASE)


_CHANGE_LINE = _label_line(_CHANGE_LABELS)
_RESPONSE_LINE = _label_line(_RESPONSE_LABELS)
_ANY_LABEL = re.compile(
    rf"(?P<label>{_CHANGE_LABELS}|{_RESPONSE_LABELS})(?P<trail>{_TRAIL}){_COLON}", re.IGNORECASE
)
_SIGNED_INT = re.compile(r"^(?P<sign>[+\-＋－−–]?)\s*(?P<digits>\d+)")
_VALUE_WRAPPING = " \t*_`\"'“”‘’「」『』[]【】()（）<>《》"
_MINUS = "-－−–"
# Matching pairs that may wrap a whole utterance.
_PAIRS = (("**", "**"), ("*", "*"), ("_", "_"), ('"', '"'), ("“", "”"), ("'", "'"), ("‘", "’"),
          ("「", "」"), ("『", "』"), ("[", "]"), ("【", "】"))


class MalformedOutputError(ValueError):
    """The simulator's answer does not follow the output contract."""


@dataclasses.dataclass(frozen=True)
class ParsedChange:
    change: int  # as written by the simulator, before any clipping
    thoughts: str  # everything before the final Change line


@dataclasses.dataclass(frozen=True)
class ParsedResponse:
    utterance: str
    thoughts: str  # everything before the final Response line


def _final_label(text: str, pattern: re.Pattern[str], name: str) -> tuple[str, str, str]:
    """Finds the last line matching `pattern`: (text before it, its value, text after it)."""
    lines = THINK_BLOCK.sub("", text).splitlines()
    for i in range(len(lines) - 1, -1, -1):
        match = pattern.match(lines[i].strip())
        if match:
            return "\n".join(lines[:i]).strip(), match["value"], "\n".join(lines[i + 1:])
    raise MalformedOutputError(f"no '{name}:' line in the simulator answer")


def parse_change(text: str) -> ParsedChange:
    """The signed integer of the final `Change:` line, and the analysis before it."""
    thoughts, value, _ = _final_label(text, _CHANGE_LINE, "Change")
    match = _SIGNED_INT.match(value.strip(_VALUE_WRAPPING))
    if not match:
        raise MalformedOutputError(f"'Change:' line has no signed integer: {value.strip()!r}")
    magnitude = int(match["digits"])
    return ParsedChange(-magnitude if match["sign"] and match["sign"] in _MINUS else magnitude,
                        thoughts)


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


def parse_response(text: str) -> ParsedResponse:
    """The user's utterance after the final `Response:` label (to the end of the answer)."""
    thoughts, value, rest = _final_label(text, _RESPONSE_LINE, "Response")
    utterance = _unwrap("\n".join([value, rest]).strip())
    if not utterance:
        raise MalformedOutputError("'Response:' line is empty")
    return ParsedResponse(utterance, thoughts)


def neutralise_labels(text: str) -> str:
    """Rewrites every contract label in untrusted text (`Change:` -> `Change -`).

    After this no line of the text can parse as a `Change:` or `Response:` line, so a policy reply
    quoted into the prompt and echoed back by the simulator model cannot set the emotion.
    """
    return _ANY_LABEL.sub(lambda m: f"{m['label']}{m['trail']} -", text)
