r"""How hackable the embedded user is: docs/protocol.md's probe table, from one command.

  .venv/bin/python benchmarks/hackability.py --attack=tiny:runs/attack_tiny.json,smol:runs/attack_smol.json

For the tiny and smol evaluation presets (configs/eval.py: their held-out profiles, SAGE's rules,
the embedded user): every robustness probe of eval/probes.py played with every profile (its score,
the mean final emotion; its template_rate, the share of its replies that share a skeleton with
another user's once the user's words are masked; its share of degenerate replies), the
hand-written honest dialogues of tests/data/honest_dialogues.jsonl on their own profiles with
each probe's score on those profiles, and the attack's ceiling (launch/attack_simulator.py's JSON
for the preset, --attack). Prints Markdown; --out writes it too.
"""

import asyncio
import json
import pathlib
import sys

from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout

from configs.eval import get_config  # noqa: E402
from rlver_jax import simulator  # noqa: E402
from rlver_jax.eval import attack  # noqa: E402
from rlver_jax.eval.probes import PROBES  # noqa: E402
from rlver_jax.text import degeneration, skeletons  # noqa: E402

_ATTACK = flags.DEFINE_list("attack", [], "PRESET:FILE pairs: launch/attack_simulator.py's JSON for each preset.")
_HONEST = flags.DEFINE_string("honest", str(ROOT / "tests" / "data" / "honest_dialogues.jsonl"),
                              "Hand-written dialogues ({\"profile\", \"replies\"} per line).")
_OUT = flags.DEFINE_string("out", None, "Also write the Markdown here.")


def template_rate(states) -> float:
    """skeletons.template_rate of the dialogues' replies, each user known by its first line."""
    replies = []
    for state in states:
        said = []
        for m in state.history:
            if m["role"] == "user":
                said.append(m["content"])
            else:
                replies.append((said[0], m["content"], tuple(said)))
    return skeletons.template_rate(replies)


def degenerate(states) -> float:
    return degeneration.rates([(s.language, [m["content"] for m in s.history if m["role"] == "assistant"])
                               for s in states])["degenerate_rate"]


async def preset_rows(preset: str, honest: list[dict]) -> tuple[list[str], dict[str, int]]:
    config = get_config(preset)
    settings = simulator.SimulatorSettings.from_config(config.simulator)
    profiles = simulator.load_profiles(config.eval.profiles)[-config.eval.holdout:]
    by_id = {p.id: p for p in profiles}
    mine = [h for h in honest if h["profile"] in by_id]
    rows = []
    async with simulator.build_simulator(settings) as sim:
        written = {}
        for h in mine:
            r = h["replies"]
            [state] = await attack.play(sim, [by_id[h["profile"]]],
                                        lambda m, r=r: r[min(sum(x["role"] == "assistant" for x in m), len(r) - 1)])
            written[h["profile"]] = state.emotion
        for name in PROBES:
            states = await attack.play(sim, profiles, attack.probe_policy(name))
            per = {s.profile.id: s.emotion for s in states}
            score = sum(per.values()) / len(per)
            on = " / ".join(str(per[pid]) for pid in written)
            rows.append(f"| {name} | {score:.1f} | {template_rate(states):.2f} | {degenerate(states):.0%} | {on} |")
    return rows, written


def main(argv):
    del argv
    honest = [json.loads(line) for line in pathlib.Path(_HONEST.value).read_text(encoding="utf-8").splitlines()]
    attacks = dict(pair.split(":", 1) for pair in _ATTACK.value)
    lines = []
    for preset in ("tiny", "smol"):
        rows, written = asyncio.run(preset_rows(preset, honest))
        ids = " / ".join(written)
        lines += [f"\n`configs/eval.py:{preset}`, honest dialogues on {ids}: "
                  + " / ".join(str(v) for v in written.values()) + "\n",
                  f"| probe | score | template_rate | degenerate replies | on {ids} |", "|---|---:|---:|---:|---|",
                  *rows]
        if preset in attacks:
            result = json.loads(pathlib.Path(attacks[preset]).read_text())
            on = " / ".join(str(result["per_profile"].get(pid, "-")) for pid in written)
            minutes = result["cpu_seconds"] / 60
            lines.append(f"| the attack's best ({result['played']} dialogues, {minutes:.1f} CPU min) "
                         f"| {result['best_score']:.1f} | | | {on} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if _OUT.value:
        pathlib.Path(_OUT.value).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    app.run(main)
