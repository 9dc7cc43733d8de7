"""The protocol card of every result (rlver_jax.eval.protocol) and comparisons that respect it: two
evaluations that differ only in the simulator's temperature, against the scripted servers."""

import hashlib
import json

import pytest

from rlver_jax.eval import protocol
from rlver_jax.eval.benchmark import run_benchmark
from rlver_jax.eval.compare import ProtocolMismatchError, compare_runs
from rlver_jax.eval.spec import EvalSpec
from tests.fixtures_cli import run_script
from tests.fixtures_eval import Servers, config_urls, profiles_file


def _evaluate(tmp_path, servers, profiles, name, temperature):
    config = config_urls(tmp_path / name, servers.policy.base_url, servers.simulator.base_url, profiles,
                         **{"simulator.temperature": temperature})
    run_benchmark(EvalSpec.from_config(config), progress=False)
    return json.loads((tmp_path / name / "sentient.json").read_text())


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Runs a (simulator at temperature 0.5) and b (0.9): the same policy, profiles and scripts."""
    tmp_path = tmp_path_factory.mktemp("protocol")
    profiles = profiles_file(tmp_path, ("P1", "P3"))
    with Servers() as servers:
        a = _evaluate(tmp_path, servers, profiles, "a", 0.5)
        b = _evaluate(tmp_path, servers, profiles, "b", 0.9)
        sent = sorted({r["temperature"] for r in servers.simulator.requests if "temperature" in r})
    return tmp_path, profiles, a, b, sent


def test_every_result_records_its_protocol(two_runs):
    tmp_path, profiles, a, b, sent = two_runs
    assert sent == [0.5, 0.9]  # the simulator was asked at the temperatures the cards record
    card = a["protocol"]
    assert (card["simulator.temperature"], b["protocol"]["simulator.temperature"]) == (0.5, 0.9)
    assert card["profiles.sha256"] == hashlib.sha256(profiles.read_bytes()).hexdigest()
    assert card["profiles.count"] == 2
    assert card["simulator.backend"] == "openai" and card["simulator.model"] == "simulator"
    assert card["simulator.served_models"] == ["simulator"]  # what GET /v1/models listed
    assert card["policy.served_models"] == ["policy"] and card["policy.temperature"] == 0.7
    assert (card["rules.initial_emotion"], card["rules.max_turns"], card["rules.score_final_turn"]) == (40, 10, False)
    assert card["prompts.policy_system"] == protocol.OWN_PROMPT and len(card["policy.system_prompt_sha256"]) == 64
    assert {"prompts.simulator.emotion_en.txt", "run.date", "run.commit", "run.version"} <= set(card)
    report = (tmp_path / "a" / "report.md").read_text()
    assert "## Protocol" in report and "| simulator.temperature | 0.5 |" in report
    assert f"(vanilla, temperature 0.5, at most 2048 tokens). Profiles: {profiles} (2 profiles, sha256 " in report
    assert f"| profiles.sha256 | {card['profiles.sha256'][:12]} |" in report
    assert "simulator.temperature" in (tmp_path / "a" / "report.html").read_text()


def test_differences_name_every_field_and_which_move_scores():
    a = {"simulator.temperature": 0.5, "policy.source": "x", "run.date": "d1", "rules.floor": 10}
    b = {"simulator.temperature": 0.9, "policy.source": "y", "run.date": "d2", "rules.floor": 10}
    diff = protocol.differences({"a": a, "b": b})
    assert diff == {"policy.source": {"a": "x", "b": "y"}, "simulator.temperature": {"a": 0.5, "b": 0.9}}
    assert protocol.score_moving(diff) == ["simulator.temperature"]
    assert protocol.describe(diff, ["simulator.temperature"]) == "simulator.temperature (a 0.5, b 0.9)"
    old = protocol.differences({"a": a, "old": {}})  # a result written before cards were recorded
    assert protocol.score_moving(old) == ["protocol"]


def test_compare_refuses_unless_forced(two_runs):
    tmp_path, _, _, _, _ = two_runs
    with pytest.raises(ProtocolMismatchError, match=r"simulator\.temperature \(a 0\.5, b 0\.9\).*--force"):
        compare_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    result = compare_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "forced", force=True)
    assert result["mixed"] and result["score_moving_differences"] == ["simulator.temperature"]
    assert "policy.source" not in result["protocol_differences"]  # the same policy
    md = (tmp_path / "forced" / "compare.md").read_text()
    assert "MIXED" in md and "| simulator.temperature | 0.5 | 0.9 |" in md
    assert "MIXED" in (tmp_path / "forced" / "compare.html").read_text()
    assert json.loads((tmp_path / "forced" / "compare.json").read_text())["mixed"] is True


def test_the_command_line_refuses_in_one_line_with_exit_2(two_runs):
    tmp_path, _, _, _, _ = two_runs
    runs = f"--compare={tmp_path / 'a'},{tmp_path / 'b'}"
    done = run_script("eval.py", runs, f"--out={tmp_path / 'cli'}")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "simulator.temperature (a 0.5, b 0.9)" in done.stderr
    done = run_script("eval.py", runs, f"--out={tmp_path / 'cli'}", "--force")
    assert done.returncode == 0, done.stderr
    assert "MIXED protocols, compared under --force: " in done.stdout and "simulator.temperature" in done.stdout


def test_a_configured_policy_prompt_moves_scores(two_runs):
    tmp_path, profiles, _, _, _ = two_runs
    with Servers() as servers:
        config = config_urls(tmp_path / "kind", servers.policy.base_url, servers.simulator.base_url, profiles,
                             **{"simulator.temperature": 0.5, "policy.system_prompt": "Be kind."})
        run_benchmark(EvalSpec.from_config(config), progress=False)
    card = json.loads((tmp_path / "kind" / "sentient.json").read_text())["protocol"]
    assert card["prompts.policy_system"] == hashlib.sha256(b"Be kind.").hexdigest()
    with pytest.raises(ProtocolMismatchError, match=r"^the runs were played under different protocols: "
                                                    r"prompts\.policy_system \(a the project's own"):
        compare_runs([tmp_path / "a", tmp_path / "kind"], tmp_path / "kind_cmp")
