r"""How closely a simulator judges like SAGE's: replay SAGE's released results through its emotion step.

Each judged reply of the result files is judged again by the configured simulator, with the
recorded dialogue before it as its context and the recorded emotion as its state (profiles by id
from --profiles, RLVER's test_profile.jsonl); the printout and --out compare the changes
(rlver_jax/simulator/agreement.py, docs/simulator.md):

  .venv/bin/python launch/simulator_agreement.py --config.backend=embedded \
      --results=../shared/data/sage/dialogues/deepseek-v3-1227_simulator__gpt-4.1.jsonl.xz,... \
      --profiles=../shared/data/rlver/test_profile.jsonl --out=agreement.json
  .venv/bin/python launch/simulator_agreement.py --config=configs/simulator.py:eval \
      --config.base_url=http://simhost:30000/v1 --config.model=simulator --results=... --profiles=...

The config is the simulator section itself (--config.backend, --config.base_url, ...), SAGE's
rules by default. A served simulator's malformed answers (after its retries) are counted per file
and left out of the figures.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import app, flags  # noqa: E402

_CONFIG = program.config_flag(
    "config", str(pathlib.Path(__file__).resolve().parents[1] / "configs" / "simulator.py") + ":eval",
    "The simulator section (configs/simulator.py:eval, SAGE's rules). Override fields with "
    "--config.<field>=..., e.g. --config.backend=embedded or --config.base_url=URL")
_RESULTS = flags.DEFINE_list("results", None, "SAGE result files (.jsonl or .jsonl.xz), comma-separated.")
_PROFILES = flags.DEFINE_string("profiles", None, "The profiles of the results by id: RLVER's test_profile.jsonl.")
_OUT = flags.DEFINE_string("out", None, "Write the figures here as JSON.")


async def _replay(settings, profiles) -> dict:
    from rlver_jax import simulator
    from rlver_jax.simulator import agreement, sage_results

    changes = {}
    async with simulator.build_simulator(settings) as sim:
        for path in _RESULTS.value:
            replies = sage_results.read_results(path)
            judged = await agreement.judge_replies(sim.backend, replies, profiles, settings.rules,
                                                   difficulty=settings.difficulty, language=settings.language)
            changes[sage_results.stem(path)] = ([r.change for r in replies], judged)
    return agreement.summary(changes)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from rlver_jax import simulator
    from rlver_jax.simulator import agreement

    try:
        settings = simulator.SimulatorSettings.from_config(_CONFIG.value, given=program.given_fields())
        profiles = {p.id: p for p in simulator.load_profiles(_PROFILES.value)}
        simulator.check_endpoint(settings)
        result = asyncio.run(_replay(settings, profiles))
    except (ValueError, simulator.SimulatorUnavailableError) as e:
        if not program.is_expected(e):
            raise
        raise program.UserError(str(e).replace("config.simulator.", "config."), program.exit_status(e)) from e
    print(agreement.table(result))
    if _OUT.value:
        pathlib.Path(_OUT.value).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    program.run(main, required=["results", "profiles"], statuses=(*program.COMMON_STATUSES, program.EXIT_RESTART))
