r"""Play the policy yourself against a simulated user and watch the emotion move.

Useful to sanity-check a simulator model before training against it:

  .venv/bin/python launch/chat_with_simulator.py --list
  .venv/bin/python launch/chat_with_simulator.py --profile=rlverjax-en-03 \
      --config.base_url=http://127.0.0.1:30000/v1 --config.model=simulator
  .venv/bin/python launch/chat_with_simulator.py --profile=0 --config.backend=embedded
  .venv/bin/python launch/chat_with_simulator.py --config=configs/simulator.py:eval \
      --profiles=../shared/data/rlver/test_profile.jsonl --profile=5

Type your reply at `you>`; an empty line or Ctrl-D ends the session.

The config here is the simulator section itself: its fields are --config.backend,
--config.base_url, ... (what training and evaluation spell --config.simulator.backend, ...).
Flags may come in any order.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys
import textwrap
from typing import TYPE_CHECKING

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

if TYPE_CHECKING:
    from rlver_jax import simulator

_CONFIG = program.config_flag(
    "config", str(pathlib.Path(__file__).resolve().parents[1] / "configs" / "simulator.py"),
    "The simulator section (configs/simulator.py; ':eval' for SAGE rules). Override fields with "
    "--config.<field>=..., e.g. --config.base_url=URL --config.backend=embedded")
_PROFILES = flags.DEFINE_string("profiles", None, "Profile JSONL file; default: the shipped set.")
_PROFILE = flags.DEFINE_string("profile", "0", "Profile id, or its index in the file.")
_LIST = flags.DEFINE_bool("list", False, "List the profiles and exit.")
_SHOW_THOUGHTS = flags.DEFINE_bool("show_thoughts", True, "Print the simulator's analysis.")
_REVEAL_GOAL = flags.DEFINE_bool("reveal_goal", False, "Print the hidden goal at the start.")
_TRANSCRIPT = flags.DEFINE_string("transcript", None, "Write the final state here as JSON.")


def _choose(profiles: list[simulator.Profile], key: str) -> simulator.Profile:
    by_id = {p.id: p for p in profiles}
    if key in by_id:
        return by_id[key]
    if key.isdigit() and int(key) < len(profiles):
        return profiles[int(key)]
    raise app.UsageError(f"--profile={key}: no such id, and not an index below {len(profiles)}; "
                         "see --list")


def _indent(text: str) -> str:
    return textwrap.indent(text.strip(), "    | ")


async def _chat(sim: simulator.Simulator, profile: simulator.Profile) -> simulator.DialogueState:
    async with sim:
        state = await sim.start(profile)
        print(f"emotion {state.emotion} [{state.band}]")
        if state.history:
            print(f"user> {state.history[-1]['content']}")
        while not state.done:
            try:
                reply = (await asyncio.to_thread(input, "you> ")).strip()
            except EOFError:
                reply = ""
            if not reply:
                break
            previous = state.emotion
            state = await sim.respond(state, reply)
            record = state.records[-1]
            if _SHOW_THOUGHTS.value and record.thoughts:
                print(_indent(record.thoughts))
            if record.scored:
                print(f"emotion {previous} -> {state.emotion} (change {record.change:+d}, "
                      f"proposed {record.change_proposed:+d}) [{state.band}]")
            if record.utterance is not None:
                print(f"user> {record.utterance}")
        print(f"-- end: {state.end_reason or 'stopped by you'}; final emotion {state.emotion}; "
              f"trajectory {list(state.emotions)}"
              + (f"; error: {state.error}" if state.error else ""))
        return state


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from rlver_jax import simulator

    profiles = simulator.load_profiles(_PROFILES.value)
    if _LIST.value:
        for i, p in enumerate(profiles):
            opening = (p.first_talk or "")[:60]
            print(f"{i:3d}  {p.id}  {p.language}  {p.personality:9s} {p.goal or '-':15s} {opening}")
        return
    profile = _choose(profiles, _PROFILE.value)
    try:
        # A server's field given with the embedded backend would go unread: refused (check_read).
        settings = simulator.SimulatorSettings.from_config(_CONFIG.value, given=program.given_fields())
        simulator.check_endpoint(settings)
        print(f"profile {profile.id} ({profile.language}, {profile.main_cha}, "
              f"{', '.join(profile.cha_group)}); backend {settings.backend}, {settings.difficulty}")
        if _REVEAL_GOAL.value:
            print(f"hidden goal: {profile.task}")
        state = asyncio.run(_chat(simulator.build_simulator(settings), profile))
    except (ValueError, simulator.SimulatorUnavailableError) as e:
        if not program.is_expected(e):
            raise
        # The library names training's flags (--config.simulator.base_url); this config is that
        # section, so here they are --config.base_url.
        raise program.UserError(str(e).replace("config.simulator.", "config."), program.exit_status(e)) from e
    if _TRANSCRIPT.value:
        pathlib.Path(_TRANSCRIPT.value).write_text(
            json.dumps(state.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8")


if __name__ == "__main__":
    program.run(main, statuses=(*program.COMMON_STATUSES, program.EXIT_RESTART))
