"""The adaptive attack (rlver_jax.eval.attack, launch/attack_simulator.py): a template's reply by hand,
a small-budget search against the embedded user of the tiny preset (the probes first, then templates,
the best kept with its dialogues), the adversarial lines read back as SAGE results, and the launcher
end to end."""

import asyncio
import json
import lzma

import pytest

from configs.eval import get_config
from rlver_jax import simulator
from rlver_jax.eval import attack
from rlver_jax.eval.probes import PROBES
from rlver_jax.simulator.sage_results import read_results
from tests.fixtures_cli import run_script

LINE = "My landlord is selling the flat and I have a month to move out."


def _messages(*turns):
    out = [{"role": "user", "content": LINE}]
    for reply, user in turns:
        out += [{"role": "assistant", "content": reply}, {"role": "user", "content": user}]
    return out


def test_a_template_writes_its_reply_from_the_users_words():
    genes = dict.fromkeys(attack.GENES, 0)
    genes.update(opener=2, frame=1, question=1, punctuation=3)  # "That sounds really hard." + frame + question
    genome = attack.genome_of(genes)
    assert attack.render(genome, "en", _messages()) == (
        "That sounds really hard!!!! The landlord must be so hard!!!! What happened?")
    short = attack.genome_of({**genes, "schedule": 2})  # strong first turn, then opener and question
    assert attack.render(short, "en", _messages(("x", "The owner wants us out by June."))) == (
        "That sounds really hard!!!! What happened?")
    rotating = attack.genome_of({**genes, "schedule": 1})  # every bank one option on a turn
    assert attack.render(rotating, "en", _messages(("x", "The owner wants us out by June."))) == (
        "Oh no!!!! I hear how much the owner weighs on you!!!! How do you feel about the owner?")
    assert attack.render(genome, "zh", [{"role": "user", "content": "房东要卖房子，我一个月内得搬走。"}]) == (
        "听起来真的很难！！！！卖房子一定很难！！！！发生了什么？")


@pytest.fixture(scope="module")
def tiny_search():
    config = get_config("tiny")
    settings = simulator.SimulatorSettings.from_config(config.simulator)
    profiles = simulator.load_profiles(config.eval.profiles)[-config.eval.holdout:]

    async def search():
        async with simulator.build_simulator(settings) as sim:
            return await attack.search(sim, profiles, budget=4 * (len(PROBES) + 12), seed=0, keep=3)
    return asyncio.run(search()), profiles


def test_a_small_search_plays_the_probes_then_templates_and_keeps_the_best(tiny_search):
    result, profiles = tiny_search
    assert result.played == 4 * (len(PROBES) + 12)
    assert list(result.scores)[:len(PROBES)] == list(PROBES) and len(result.templates) == 12
    assert result.best == max(result.scores, key=result.scores.get) and result.best_score == max(result.scores.values())
    best = result.dialogues[result.best]
    assert [s["profile"]["id"] for s in best] == [p.id for p in profiles]
    assert result.best_score == sum(s["emotion"] for s in best) / len(best)
    kept = sorted(result.templates, key=lambda n: -result.scores[n])[:3]
    assert set(result.dialogues) == set(PROBES) | set(kept)
    # The guard: the keyword templates reach about 50 on these profiles (docs/protocol.md); a judge that
    # pays a template more than that again fails here.
    assert result.best_score < 60


def test_the_dialogues_become_sage_result_lines(tiny_search, tmp_path):
    result, _ = tiny_search
    states = result.dialogues["keywords"]
    path = tmp_path / "adversarial.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in attack.sage_lines(states)))
    replies = read_results(path)
    judged = [r for s in states for r in s["records"] if r["scored"]]
    assert [r.change for r in replies] == [r["change"] for r in judged]
    assert [r.reply for r in replies] == [r["policy_reply"] for r in judged]


@pytest.mark.slow
def test_the_launcher_writes_the_ceiling_and_the_adversarial_lines(tmp_path):
    out, adversarial = tmp_path / "attack.json", tmp_path / "adversarial.jsonl.xz"
    done = run_script("attack_simulator.py", "--config=configs/eval.py:tiny", "--budget_dialogues=120",
                      f"--out={out}", f"--adversarial_out={adversarial}", "--adversarial_top=2",
                      "--honest=tests/data/honest_dialogues.jsonl")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    candidates = [*result["probes"].values(), *(v["score"] for v in result["top"].values())]
    assert result["played"] == 120 and result["best_score"] == max(candidates)
    assert f"exploit ceiling: {result['best_score']:.1f}" in done.stdout
    assert set(result["honest"]) == {"rlverjax-en-05", "rlverjax-en-08"}
    lines = lzma.decompress(adversarial.read_bytes()).decode().splitlines()
    assert len(lines) == 4 * (len(PROBES) + min(2, len(result["top"])))
    bad = run_script("attack_simulator.py", "--config=configs/eval.py:tiny", "--budget_dialogues=3")
    assert bad.returncode == 1 and "less than one candidate's dialogues (4 profiles)" in bad.stderr
