r"""Attack a simulated user: search a grammar of template policies built from the user's words for
the highest score one reaches (the exploit ceiling), under an evaluation config's simulator, rules
and profiles (rlver_jax/eval/attack.py, docs/protocol.md).

  .venv/bin/python launch/attack_simulator.py --config=configs/eval.py:smol --budget_dialogues=20000 \
      --out=attack.json
  .venv/bin/python launch/attack_simulator.py --config=configs/eval.py:tiny --budget_dialogues=2000 \
      --out=attack_tiny.json --honest=tests/data/honest_dialogues.jsonl
  # a served simulator (any backend of rlver_jax/simulator/backends.py):
  .venv/bin/python launch/attack_simulator.py --config=configs/eval.py:smol \
      --config.simulator.backend=openai --config.simulator.base_url=http://simhost:30000/v1 \
      --config.simulator.model=simulator --budget_dialogues=640 --out=attack_served.json

It plays the robustness probes first, then random templates, then mutations of the best, each with
every profile of the config (eval.profiles, its last eval.holdout, its first eval.max_profiles),
until --budget_dialogues dialogues are played. It prints the ceiling (`best_score`, the mean final
emotion of the best template), the winning template with its dialogues, and writes --out (JSON):
best_score, best, template (its genes), per_profile, dialogues, the probes' and the top templates'
scores, played, cpu_seconds. --adversarial_out writes the probes' and the --adversarial_top best
templates' dialogues as SAGE result lines (.jsonl or .jsonl.xz) for launch/fit_judge.py
--adversarial. --honest scores hand-written dialogues ({"profile", "replies"} lines) on their own
profiles beside the best template's.
"""

from __future__ import annotations

import asyncio
import json
import lzma
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runs from a checkout

from rlver_jax.cli import program  # noqa: E402  (first: one line outside the venv)

from absl import flags  # noqa: E402

_CONFIG = program.config_flag(
    "config", str(pathlib.Path(__file__).resolve().parents[1] / "configs" / "eval.py") + ":smol",
    "An evaluation config (configs/eval.py:smol); its simulator, rules and profiles are attacked.")
_BUDGET = flags.DEFINE_integer("budget_dialogues", 2000, "Dialogues to play in all (each candidate plays one "
                               "with every profile).")
_OUT = flags.DEFINE_string("out", None, "Write the result here (JSON).")
_SEED = flags.DEFINE_integer("seed", 0, "The search's random seed.")
_ADVERSARIAL_OUT = flags.DEFINE_string("adversarial_out", None, "Write the probes' and the best templates' "
                                       "dialogues here as SAGE result lines (.jsonl or .jsonl.xz).")
_ADVERSARIAL_TOP = flags.DEFINE_integer("adversarial_top", 20, "Templates whose dialogues --adversarial_out keeps.")
_HONEST = flags.DEFINE_string("honest", None, "Hand-written dialogues ({\"profile\", \"replies\"} per line) to "
                              "score on their own profiles beside the best template.")
TOP = 50  # templates whose scores --out keeps


def _profiles(config):
    from rlver_jax import simulator

    profiles = simulator.load_profiles(config.eval.profiles or None)
    if config.eval.holdout:
        profiles = profiles[-config.eval.holdout:]
    return profiles[:config.eval.max_profiles or None]


def _show(name: str, dialogues: list[dict]) -> str:
    lines = []
    for state in dialogues[:2]:
        lines.append(f"  {state['profile']['id']}: {state['end_reason']}, emotions {state['emotions']}")
        for message in state["history"]:
            lines.append(f"    {message['role']}: {message['content']}")
    return f"{name}'s first dialogues:\n" + "\n".join(lines)


async def _honest(sim, profiles, path: str) -> dict[str, dict]:
    from rlver_jax.eval import attack

    by_id = {p.id: p for p in profiles}
    out = {}
    for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines():
        written = json.loads(line)
        if written["profile"] not in by_id:
            continue
        replies = written["replies"]
        [state] = await attack.play(sim, [by_id[written["profile"]]],
                                    lambda m: replies[min(sum(x["role"] == "assistant" for x in m), len(replies) - 1)])
        out[written["profile"]] = state.emotion
    return out


async def _attack(config, settings):
    from rlver_jax import simulator
    from rlver_jax.eval import attack

    profiles = _profiles(config)
    best = [-1.0]

    def progress(name: str, score: float, played: int) -> None:
        if score > best[0]:
            best[0] = score
            print(f"{played:8d} dialogues: {name} scores {score:.1f}", flush=True)

    async with simulator.build_simulator(settings) as sim:
        result = await attack.search(sim, profiles, _BUDGET.value, seed=_SEED.value, keep=_ADVERSARIAL_TOP.value,
                                     on_candidate=progress)
        honest = await _honest(sim, profiles, _HONEST.value) if _HONEST.value else {}
    return profiles, result, honest


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise program.UserError(f"unexpected arguments: {argv[1:]}")
    from rlver_jax import simulator
    from rlver_jax.eval import attack
    from rlver_jax.eval.probes import PROBES

    config = _CONFIG.value
    try:
        settings = simulator.SimulatorSettings.from_config(config.simulator)
        simulator.check_endpoint(settings)
        t0, cpu0 = time.time(), time.process_time()
        profiles, result, honest = asyncio.run(_attack(config, settings))
    except (ValueError, simulator.SimulatorUnavailableError) as e:
        if not program.is_expected(e):
            raise
        raise program.UserError(str(e)) from e
    if not result.scores:
        raise program.UserError(f"--budget_dialogues={_BUDGET.value} is less than one candidate's dialogues "
                                f"({len(profiles)} profiles)")
    best = result.dialogues[result.best]
    per_profile = {s["profile"]["id"]: s["emotion"] for s in best}
    out = {"best_score": result.best_score, "best": result.best, "template": result.templates.get(result.best),
           "per_profile": per_profile, "played": result.played, "budget_dialogues": _BUDGET.value,
           "cpu_seconds": time.process_time() - cpu0, "wall_seconds": time.time() - t0, "seed": _SEED.value,
           "profiles": [p.id for p in profiles], "simulator": settings.backend,
           "probes": {n: result.scores[n] for n in PROBES if n in result.scores},
           "top": {n: {"score": result.scores[n], "template": result.templates[n]}
                   for n in [n for n in result.top(len(result.scores)) if n in result.templates][:TOP]},
           "honest": {pid: {"honest": score, "best_template": per_profile.get(pid)} for pid, score in honest.items()},
           "dialogues": best}
    print(_show(result.best, best))
    if result.best in result.templates:
        print(f"winning template: {json.dumps(result.templates[result.best])}")
    for pid, row in out["honest"].items():
        print(f"honest dialogue on {pid}: {row['honest']}; the best template there: {row['best_template']}")
    print(f"exploit ceiling: {result.best_score:.1f} ({result.best}) over {len(profiles)} profiles, "
          f"{result.played} dialogues played in {out['cpu_seconds']:.0f} CPU s")
    if _OUT.value:
        pathlib.Path(_OUT.value).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if _ADVERSARIAL_OUT.value:
        kept = [n for n in result.dialogues if n in result.templates]  # the --adversarial_top best templates
        lines = attack.sage_lines([s for n in [*PROBES, *kept] for s in result.dialogues.get(n, [])])
        text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        path = pathlib.Path(_ADVERSARIAL_OUT.value)
        path.write_bytes(lzma.compress(text.encode()) if path.name.endswith(".xz") else text.encode())


if __name__ == "__main__":
    program.run(main)
