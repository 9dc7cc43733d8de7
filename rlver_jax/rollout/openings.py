"""Whether a profile's fixed opening (`first_talk`) leaves the policy room for a turn.

A dialogue whose first user message fills the policy's token budget ends "truncated" before the
policy has spoken: it holds no policy turn, so it says nothing about the policy (and is never
scored, rlver_jax.rollout.summary). Training and the benchmark refuse such profiles at start-up,
naming each profile and the budget, instead of playing them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlver_jax.checks import InputError
from rlver_jax.rollout.episodes import RolloutSettings
from rlver_jax.rollout.history import TokenHistory
from rlver_jax.rollout.prompts import system_prompt
from rlver_jax.simulator.profiles import Profile
from rlver_jax.text import chat


def openings_over_budget(chat_tokens: chat.ChatTokens, settings: RolloutSettings, profiles: Sequence[Profile],
                         language: str = "") -> list[tuple[str, int]]:
    """(profile id, tokens of the system prompt and the opening) of every profile of `profiles`
    whose `first_talk` leaves no room for a policy turn within `settings.max_total_tokens`
    (`language`: the simulator's forced language, "" = each profile's own)."""
    over = []
    for profile in profiles:
        if profile.first_talk is None:  # the simulator writes the opening: not known before it plays
            continue
        history = TokenHistory(chat_tokens, settings.max_new_tokens, settings.max_total_tokens,
                               settings.drop_thoughts)
        history.add_system(settings.system_prompt or system_prompt(language or profile.language, settings.think))
        if not history.add_user(profile.first_talk):
            ids, _ = chat.encode_message(chat_tokens, "user", profile.first_talk)
            over.append((profile.id, len(history.context) + len(ids)))
    return over


def check_openings(chat_tokens: chat.ChatTokens, settings: RolloutSettings, profiles: Sequence[Profile],
                   what: str, language: str = "") -> None:
    """InputError (exit 2) naming every profile of `profiles` (`what`: where they come from, e.g.
    "config.data.train_profiles") whose opening leaves the policy no turn (`openings_over_budget`)."""
    over = openings_over_budget(chat_tokens, settings, profiles, language)
    if not over:
        return
    shown = ", ".join(f"{pid} ({n} tokens)" for pid, n in over[:5]) + (f" and {len(over) - 5} more" if len(over) > 5
                                                                       else "")
    raise InputError(
        f"{len(over)} profile(s) of {what} open with more than the policy's token budget leaves for a turn "
        f"({settings.where}max_total_tokens={settings.max_total_tokens}, system prompt and opening included): "
        f"{shown}. Their dialogues would end before the policy spoke; raise {settings.where}max_total_tokens or "
        "leave these profiles out")
