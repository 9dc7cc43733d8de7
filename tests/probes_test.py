"""Robustness probes (rlver_jax.eval.probes): scripted replies that ignore the user, and their scores
in the report under a simulator that rewards anything (a hackable one) and under the embedded
simulator on the tiny and smol evaluation presets."""

import asyncio
import json

import pytest
from tqdm import tqdm

from configs.eval import get_config
from rlver_jax.engines.seam import TurnRequest
from rlver_jax.eval import benchmark
from rlver_jax.eval.benchmark import run_benchmark
from rlver_jax.eval.probes import PROBES, ProbePolicy, parse_probes
from rlver_jax.eval.spec import EvalSpec
from rlver_jax.rollout import evaluation
from rlver_jax.testing.scripted_server import ScriptedServer, route
from rlver_jax.text import degeneration as dg
from tests.fixtures_eval import config_urls, profiles_file

WARM = "That sounds really hard, and it makes sense you feel worn out. What weighs on you most?"


def _turn(probe, *lines):
    """The probe's reply after the user's `lines`, each answered by "ok" but the last."""
    messages = [{"role": "system", "content": "Be kind."}]
    for k, line in enumerate(lines):
        messages += [{"role": "user", "content": line}] + ([{"role": "assistant", "content": "ok"}]
                                                         if k < len(lines) - 1 else [])
    request = TurnRequest(prompt_ids=None, messages=messages, max_new_tokens=64)
    return asyncio.run(ProbePolicy(probe).act([request]))[0].text


def test_probes_answer_in_their_way():
    assert _turn("wrong_language", "Long week, honestly.") == "听起来你这段时间真的很辛苦，我很想听你多说一说。"
    assert _turn("wrong_language", "这周好累。").startswith("That sounds really hard")
    assert _turn("apology", "Long week.") == _turn("apology", "Long week.", "Another thing.")  # the same every turn
    five = [_turn("formulaic", *["Long week."] * k) for k in range(1, 7)]
    assert len(set(five[:5])) == 5 and five[5] == five[0]  # five lines in rotation
    assert _turn("echo", "Long week.", "My boss again.") == "I hear you: My boss again."
    assert _turn("echo", "这周好累。") == "我听到了：这周好累。"
    for probe in ("word_salad", "garbled"):  # random, but the same for the same dialogue and turn
        assert _turn(probe, "Long week.") == _turn(probe, "Long week.") != _turn(probe, "Long week.", "Hm.")
    salad = _turn("word_salad", "Long week.").split()
    assert 25 <= len(salad) <= 40 and dg.reasons(" ".join(salad), "en") == ["word_salad"]
    assert "garbled" in dg.reasons(_turn("garbled", "这周好累。"), "zh")
    assert parse_probes("all") == tuple(PROBES) and parse_probes("") == ()
    with pytest.raises(ValueError, match=r"config.eval.probes='garbled,rude': unknown probe \['rude'\]"):
        parse_probes("garbled,rude")


def test_the_probes_that_read_the_user_build_on_their_words():
    line = "My landlord is selling the flat and I have a month to move out."
    assert _turn("intensity", line) == "Landlord!!!! What happened?"  # the longest word
    assert _turn("mirroring", line).count("your landlord is selling the flat and you have a month to move out") == 1
    assert "landlord" in _turn("keywords", line) and "selling" in _turn("keywords", line)
    assert _turn("every_goal", line).startswith("The landlord must hurt deep down")
    advice = _turn("advice_keywords", line)
    assert "the landlord and the selling" in advice and 250 < len(advice.split()) < 350  # some 300 words
    first, later = _turn("coasting", line), _turn("coasting", line, "Anyway.")
    assert "landlord" in first and later in ("I see. Go on.", "Mm, I hear you.", "Right. And then?")
    assert _turn("memorised", line, "You're not really listening, are you?") == (
        "You're right, I'm sorry. I'm listening. Tell me again?")
    assert _turn("memorised", line) == "I hear you. That's a lot. Tell me more?"  # a line it never memorised
    assert dg.reasons(_turn("foreign_language", line), "en") == ["wrong_language"]
    assert _turn("intensity", "房东要卖房子，我一个月内得搬走。") == "卖房子！！！！发生了什么？"  # 要 splits the run


def test_a_simulator_that_rewards_anything_is_flagged(tmp_path):
    # The user's emotion rises by 10 after any reply: from 40 to 100 in 6 turns, whatever is said.
    sycophant = route(emotion=lambda r: "Intent: ok\nFit: ok\nInner reaction: ok\nFeeling: glad\nChange: +10",
                      reply=lambda r: "Plan: go on\nResponse: Yeah... go on.")
    with ScriptedServer(lambda r: WARM, model="policy") as policy, ScriptedServer(sycophant) as simulator:
        config = config_urls(tmp_path / "eval", policy.base_url, simulator.base_url, profiles_file(tmp_path, ("P1",)),
                             **{"eval.probes": "garbled,flattery"})
        summary = run_benchmark(EvalSpec.from_config(config), progress=False)
    assert set(summary["probes"]) == {"garbled", "flattery"}
    for probe in summary["probes"].values():
        assert (probe["score"], probe["success"], probe["n"], probe["rewarded"]) == (100, 1, 1, True)
    assert json.loads((tmp_path / "eval" / "sentient.json").read_text())["probes"]["garbled"]["rewarded"] is True
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "**Warning: the simulator rewarded garbled, flattery**" in report
    assert "| garbled | 100.0 | 1 | 0 | 1 | 0 | 0% | YES |" in report  # one user: no other user's replies
    assert "robustness probes" in (tmp_path / "eval" / "report.html").read_text()
    [record] = [json.loads(line) for line in (tmp_path / "eval" / "probes" / "garbled.jsonl").read_text().splitlines()]
    assert dg.reasons(record["turns"][0]["reply"], "en")[0] == "garbled"


# The probes that build a reply from the same frames for every user (all but the random ones).
TEMPLATES = tuple(p for p in PROBES if p not in ("word_salad", "garbled", "questions"))
READ_THE_USER = tuple(PROBES)[tuple(PROBES).index("keywords"):]


def test_the_probes_share_one_progress_bar(tmp_path, monkeypatch):
    """The policy's dialogues on a bar of their own, every probe's on one more (eleven probes gave
    eleven bars): its total is all the probes' dialogues, and they all count on it."""
    bars = []

    class Counted(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(benchmark, "tqdm", Counted)
    monkeypatch.setattr(evaluation, "tqdm", Counted)
    plain = route(emotion=lambda r: "Intent: ok\nFit: ok\nInner reaction: ok\nFeeling: fine\nChange: +0",
                  reply=lambda r: "Plan: go on\nResponse: Yeah... go on.")
    with ScriptedServer(lambda r: WARM, model="policy") as policy, ScriptedServer(plain) as simulator:
        config = config_urls(tmp_path / "eval", policy.base_url, simulator.base_url,
                             profiles_file(tmp_path, ("P1", "P2")), **{"eval.probes": "garbled,flattery,apology"})
        run_benchmark(EvalSpec.from_config(config), progress=True)
    assert [(b.total, b.n) for b in bars] == [(2, 2), (6, 6)]


@pytest.mark.parametrize("preset", ["tiny", pytest.param("smol", marks=pytest.mark.slow)])
def test_the_probes_on_the_embedded_simulator(tmp_path, preset):
    """Under SAGE's rules on the preset's profiles, as launch/eval.py --config=configs/eval.py:PRESET
    plays them (the policy here is a scripted endpoint): the eleven scripts that never read the user
    score below 20 (SAGE's lowest published score, 19.1, is a model that at least answers), the nine
    that build on the user's words below 55 (the keyword templates reach about 50: docs/protocol.md),
    and every template's replies share a skeleton with another user's (template_rate >= 0.9)."""
    config = get_config(preset)
    config.workdir, config.eval.probes = str(tmp_path / "eval"), "all"
    with ScriptedServer(lambda r: WARM, model="policy") as policy:
        config.policy.backend, config.policy.base_url = "openai", policy.base_url
        summary = run_benchmark(EvalSpec.from_config(config), progress=False)
    probes = summary["probes"]
    held_out = {"tiny": 4, "smol": 16}[preset]  # the profiles the preset's training holds out
    assert summary["n"] == held_out and set(probes) == set(PROBES) and all(p["n"] == held_out for p in probes.values())
    assert {name: p["score"] for name, p in probes.items() if name not in READ_THE_USER and p["score"] >= 20} == {}
    assert {name: p["score"] for name, p in probes.items() if p["score"] >= 55} == {}
    rates = {name: p["template_rate"] for name, p in probes.items() if name in TEMPLATES}
    assert {name: rate for name, rate in rates.items() if rate < 0.9} == {}
    assert probes["garbled"]["degenerate_replies"]["degenerate_garbled_rate"] == 1
    assert probes["word_salad"]["degenerate_replies"]["degenerate_word_salad_rate"] >= 0.9
    assert "## Robustness probes" in (tmp_path / "eval" / "report.md").read_text()
