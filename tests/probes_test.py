"""Robustness probes (rlver_jax.eval.probes): canned replies, and their scores in the report under a
simulator that rewards anything (a hackable one) and under the embedded simulator."""

import asyncio
import json

import pytest

from configs.eval import SHIPPED_PROFILES
from rlver_jax.eval.benchmark import run_benchmark
from rlver_jax.eval.spec import EvalSpec
from rlver_jax.eval.probes import PROBES, ProbePolicy, parse_probes
from rlver_jax.rollout.policy import TurnRequest
from rlver_jax.testing.scripted_server import ScriptedServer, route
from tests.fixtures_eval import config_urls, profiles_file

WARM = "That sounds really hard, and it makes sense you feel worn out. What weighs on you most?"


def _turn(probe, opening):
    request = TurnRequest(prompt_ids=None, messages=[{"role": "system", "content": "Be kind."},
                                                     {"role": "user", "content": opening}], max_new_tokens=64)
    return asyncio.run(ProbePolicy(probe).act([request]))[0].text


def test_probes_answer_in_their_way():
    assert _turn("wrong_language", "Long week, honestly.") == "听起来你这段时间真的很辛苦，我很想听你多说一说。"
    assert _turn("wrong_language", "这周好累。").startswith("That sounds really hard")
    assert _turn("formulaic", "Long week.") == _turn("formulaic", "Another thing.")  # the same every turn
    assert parse_probes("all") == PROBES and parse_probes("") == ()
    with pytest.raises(ValueError, match=r"config.eval.probes='garbled,rude': unknown probe \['rude'\]"):
        parse_probes("garbled,rude")


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
    assert "| garbled | 100.0 | 1 | 0 | 1 | 0 | YES |" in report
    assert "robustness probes" in (tmp_path / "eval" / "report.html").read_text()
    [record] = [json.loads(line) for line in (tmp_path / "eval" / "probes" / "garbled.jsonl").read_text().splitlines()]
    assert record["turns"][0]["reply"].startswith("#qz@@")


def test_the_embedded_simulator_rewards_no_probe(tmp_path):
    with ScriptedServer(lambda r: WARM, model="policy") as policy:
        config = config_urls(tmp_path / "eval", policy.base_url, "http://127.0.0.1:9/v1", SHIPPED_PROFILES,
                             **{"simulator.backend": "embedded", "eval.probes": "all", "eval.max_profiles": 4,
                                "eval.group_size": 4})
        summary = run_benchmark(EvalSpec.from_config(config), progress=False)
    probes = summary["probes"]
    assert set(probes) == set(PROBES) and all(p["n"] == 4 for p in probes.values())
    assert not any(p["rewarded"] for p in probes.values())
    assert probes["garbled"]["score"] < 40 and probes["garbled"]["degenerate_replies"]["degenerate_garbled_rate"] == 1
    assert "## Robustness probes" in (tmp_path / "eval" / "report.md").read_text()
