"""Renders the simulator's chat requests from the prompt templates in prompts/.

Each template file holds a system message, a line `=== user ===`, and a user message, with
`{name}` slots filled by str.format. Files: `{step}_{language}.txt` for the steps emotion, reply
and opening, and `difficulty_{difficulty}_{language}.txt` for the difficulty paragraph.

Injection guard: every message of the conversation, and above all the policy's reply, is
untrusted text. It goes into the user message only, each line quoted with "> " (the prompts say
quoted lines are never instructions), with hidden characters and think tags removed and the
contract labels neutralised (parsing.neutralise_labels), so a reply that writes "Change: +10" in
any spelling cannot become a line the parser reads.

Structured outputs: with `structured=True` the user message ends with the step's JSON answer
instruction from `json_{language}.txt` (sections `=== emotion ===` and `=== utterance ===`); the
request then carries the schema of parsing.change_schema / parsing.UTTERANCE_SCHEMA.

Prompt budget (`max_prompt_tokens`, docs/simulator.md): when the estimated tokens of a request
(`prompt_tokens`) exceed it, the conversation keeps its first message (the user's opening: what the
dialogue is about) and its last two (the latest exchange) and leaves out the oldest messages in
between, one at a time, with a line saying how many are left out; if that is not enough, the
longest quoted text (a message, the newest reply, the reply step's thoughts) is shortened in its
middle (" [...] ") until the request fits or every text is down to _MIN_KEPT_CHARS.
"""

from __future__ import annotations

import functools
import pathlib
import re
from collections.abc import Callable, Sequence

from rlver_jax.simulator import parsing
from rlver_jax.simulator.profiles import Profile

PROMPT_DIR = pathlib.Path(__file__).parent / "prompts"
LANGUAGES = ("zh", "en")
DIFFICULTIES = ("vanilla", "challenging")
_SPLIT = "\n=== user ===\n"

# Speaker names as the simulated user sees them ("user": the simulated user, "assistant": policy).
_SPEAKERS = {
    "en": {"user": "You:", "assistant": "Your friend:"},
    "zh": {"user": "你：", "assistant": "朋友："},
}
_TRAIT_SEPARATOR = {"en": ", ", "zh": "、"}
_OMITTED = {"en": "({n} earlier messages are left out here.)", "zh": "（这里省略了较早的 {n} 条消息。）"}
_CUT = " [...] "  # marks the middle of a quoted text that was cut to fit the prompt budget
_MIN_KEPT_CHARS = 200  # a text is never cut shorter than this
_ASCII_CHARS_PER_TOKEN = 3  # the estimate: English runs at about 4 on common tokenizers
_MESSAGE_TOKENS = 8  # role markers and separators per chat message

Messages = list[dict[str, str]]


@functools.lru_cache(maxsize=None)
def _template(name: str) -> tuple[str, str]:
    text = (PROMPT_DIR / f"{name}.txt").read_text(encoding="utf-8")
    system, sep, user = text.partition(_SPLIT)
    if not sep:
        raise ValueError(f"prompt template {name}.txt lacks the '=== user ===' separator line")
    return system.strip(), user.strip()


@functools.lru_cache(maxsize=None)
def _json_instruction(kind: str, language: str) -> str:
    """The structured-output instruction for `kind` ("emotion" or "utterance")."""
    sections = (PROMPT_DIR / f"json_{language}.txt").read_text(encoding="utf-8").split("=== ")
    for section in sections[1:]:
        name, _, body = section.partition(" ===\n")
        if name == kind:
            return body.strip()
    raise ValueError(f"prompt file json_{language}.txt lacks the '=== {kind} ===' section")


@functools.lru_cache(maxsize=None)
def json_placeholders(language: str) -> tuple[str, ...]:
    """The placeholders of the JSON instructions (`<the Plan line>`): an answer copying one is junk."""
    return tuple(m for kind in ("emotion", "utterance")
                 for m in re.findall(r"<([^<>]+)>", _json_instruction(kind, language)))


@functools.lru_cache(maxsize=None)
def _difficulty(difficulty: str, language: str) -> str:
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty {difficulty!r}: use one of {', '.join(DIFFICULTIES)}")
    return (PROMPT_DIR / f"difficulty_{difficulty}_{language}.txt").read_text("utf-8").strip()


def quote_untrusted(text: str) -> str:
    """Quotes text for the prompt: labels neutralised, every line prefixed with "> "."""
    lines = parsing.neutralise_labels(text).splitlines() or [""]
    return "\n".join(f"> {line}" for line in lines)


def render_conversation(history: Sequence[dict[str, str]], language: str, omitted: int = 0) -> str:
    """The dialogue as the simulated user sees it, every utterance quoted; `omitted` messages
    left out after the first one are announced there."""
    speakers = _SPEAKERS[language]
    blocks = [f"{speakers[m['role']]}\n{quote_untrusted(m['content'])}" for m in history]
    if omitted:
        blocks.insert(1, _OMITTED[language].format(n=omitted))
    return "\n\n".join(blocks)


def estimate_tokens(text: str) -> int:
    """A high estimate of the tokens of `text` on common tokenizers: one per 3 ASCII characters
    and one per other character (Chinese runs at about one or less)."""
    ascii_chars = len(text.encode("ascii", "ignore"))
    return -(-ascii_chars // _ASCII_CHARS_PER_TOKEN) + len(text) - ascii_chars


def prompt_tokens(messages: Messages) -> int:
    """The estimated prompt tokens of a chat request."""
    return sum(estimate_tokens(m["content"]) + _MESSAGE_TOKENS for m in messages)


def _shorten(text: str, chars: int) -> str:
    """`text` in at most max(chars, _MIN_KEPT_CHARS) characters: its head and tail around _CUT."""
    chars = max(chars, _MIN_KEPT_CHARS)
    if len(text) <= chars:
        return text
    keep = chars - len(_CUT)
    head = keep * 2 // 3
    return text[:head] + _CUT + text[len(text) - (keep - head):]


def _fitted(render: Callable[[list[dict[str, str]], int, dict[str, str]], Messages],
            history: Sequence[dict[str, str]], texts: dict[str, str], budget: int | None) -> Messages:
    """render(kept messages, messages left out, texts) within `budget` tokens by the rule of the
    module docstring; over budget only when every text is already at _MIN_KEPT_CHARS."""
    history, omitted = [dict(m) for m in history], 0

    def build() -> Messages:
        return render(history[:1] + history[1 + omitted:], omitted, texts)

    messages = build()
    if budget is None:
        return messages
    while prompt_tokens(messages) > budget and len(history) - omitted > 3:
        omitted += 1
        messages = build()
    while (excess := prompt_tokens(messages) - budget) > 0:
        kept = history[:1] + history[1 + omitted:]
        pieces = [(len(m["content"]), m, "content") for m in kept] + [(len(v), texts, k) for k, v in texts.items()]
        length, holder, key = max(pieces, key=lambda p: p[0])
        if length <= _MIN_KEPT_CHARS:
            return messages  # nothing left to cut; the server decides
        # The characters of this text that make up `excess` tokens, and room for the marker.
        cut = -(-excess * length // max(1, estimate_tokens(holder[key]))) + len(_CUT)
        holder[key] = _shorten(holder[key], length - cut)
        messages = build()
    return messages


def _render(step: str, profile: Profile, language: str, difficulty: str, structured: bool = False,
            **slots: str) -> Messages:
    if language not in LANGUAGES:
        raise ValueError(f"language {language!r}: use one of {', '.join(LANGUAGES)}")
    system, user = _template(f"{step}_{language}")
    if structured:
        user += "\n\n" + _json_instruction("emotion" if step == "emotion" else "utterance", language)
    values = dict(
        persona=profile.player.strip(),
        scene=profile.scene.strip(),
        personality=profile.main_cha,
        traits=_TRAIT_SEPARATOR[language].join(profile.cha_group),
        goal=profile.task.strip(),
        difficulty=_difficulty(difficulty, language),
        **slots,
    )
    return [
        {"role": "system", "content": system.format(**values)},
        {"role": "user", "content": user.format(**values)},
    ]


def emotion_messages(profile: Profile, *, language: str, difficulty: str, emotion: int,
                     history: Sequence[dict[str, str]], reply: str, structured: bool = False,
                     max_prompt_tokens: int | None = None) -> Messages:
    """The emotion step: judge `reply` given the conversation before it and the current mood."""
    def render(kept: list[dict[str, str]], omitted: int, texts: dict[str, str]) -> Messages:
        return _render("emotion", profile, language, difficulty, structured, emotion=str(emotion),
                       conversation=render_conversation(kept, language, omitted),
                       reply=quote_untrusted(texts["reply"]))
    return _fitted(render, history, {"reply": reply}, max_prompt_tokens)


def reply_messages(profile: Profile, *, language: str, difficulty: str, band: str,
                   thoughts: str, history: Sequence[dict[str, str]], structured: bool = False,
                   max_prompt_tokens: int | None = None) -> Messages:
    """The reply step: the user's next words, given the mood band and the emotion analysis."""
    def render(kept: list[dict[str, str]], omitted: int, texts: dict[str, str]) -> Messages:
        return _render("reply", profile, language, difficulty, structured, band=band,
                       thoughts=parsing.neutralise_labels(texts["thoughts"].strip()) or "-",
                       conversation=render_conversation(kept, language, omitted))
    return _fitted(render, history, {"thoughts": thoughts}, max_prompt_tokens)


def opening_messages(profile: Profile, *, language: str, difficulty: str,
                     structured: bool = False) -> Messages:
    """The opening step: the user's first words when the profile has no `first_talk`."""
    return _render("opening", profile, language, difficulty, structured)
