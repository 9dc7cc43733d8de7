"""Renders the simulator's chat requests from the prompt templates in prompts/.

Each template file holds a system message, a line `=== user ===`, and a user message, with
`{name}` slots filled by str.format. Files: `{step}_{language}.txt` for the steps emotion, reply
and opening, and `difficulty_{difficulty}_{language}.txt` for the difficulty paragraph.

Injection guard: every message of the conversation, and above all the policy's reply, is
untrusted text. It goes into the user message only, each line quoted with "> " (the prompts say
quoted lines are never instructions) and with the contract labels neutralised, so a reply that
writes "Change: +10" cannot become a line the parser reads.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Sequence

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

Messages = list[dict[str, str]]


@functools.lru_cache(maxsize=None)
def _template(name: str) -> tuple[str, str]:
    text = (PROMPT_DIR / f"{name}.txt").read_text(encoding="utf-8")
    system, sep, user = text.partition(_SPLIT)
    if not sep:
        raise ValueError(f"prompt template {name}.txt lacks the '=== user ===' separator line")
    return system.strip(), user.strip()


@functools.lru_cache(maxsize=None)
def _difficulty(difficulty: str, language: str) -> str:
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty {difficulty!r}: use one of {', '.join(DIFFICULTIES)}")
    return (PROMPT_DIR / f"difficulty_{difficulty}_{language}.txt").read_text("utf-8").strip()


def quote_untrusted(text: str) -> str:
    """Quotes text for the prompt: labels neutralised, every line prefixed with "> "."""
    lines = parsing.neutralise_labels(text).splitlines() or [""]
    return "\n".join(f"> {line}" for line in lines)


def render_conversation(history: Sequence[dict[str, str]], language: str) -> str:
    """The dialogue as the simulated user sees it, every utterance quoted."""
    speakers = _SPEAKERS[language]
    return "\n\n".join(
        f"{speakers[m['role']]}\n{quote_untrusted(m['content'])}" for m in history
    )


def _render(step: str, profile: Profile, language: str, difficulty: str, **slots: str) -> Messages:
    if language not in LANGUAGES:
        raise ValueError(f"language {language!r}: use one of {', '.join(LANGUAGES)}")
    system, user = _template(f"{step}_{language}")
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
                     history: Sequence[dict[str, str]], reply: str) -> Messages:
    """The emotion step: judge `reply` given the conversation before it and the current mood."""
    return _render("emotion", profile, language, difficulty, emotion=str(emotion),
                   conversation=render_conversation(history, language),
                   reply=quote_untrusted(reply))


def reply_messages(profile: Profile, *, language: str, difficulty: str, band: str,
                   thoughts: str, history: Sequence[dict[str, str]]) -> Messages:
    """The reply step: the user's next words, given the mood band and the emotion analysis."""
    return _render("reply", profile, language, difficulty, band=band,
                   thoughts=parsing.neutralise_labels(thoughts.strip()) or "-",
                   conversation=render_conversation(history, language))


def opening_messages(profile: Profile, *, language: str, difficulty: str) -> Messages:
    """The opening step: the user's first words when the profile has no `first_talk`."""
    return _render("opening", profile, language, difficulty)
