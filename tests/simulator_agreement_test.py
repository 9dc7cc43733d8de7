"""SAGE's results replayed through a simulator's judgement (rlver_jax.simulator.agreement,
sage_results, launch/simulator_agreement.py): the files read, the statistics against hand-computed
values, and the launch script against a scripted served simulator whose changes are known."""

import json
import lzma
import math
import pathlib
import re

import pytest

from rlver_jax.simulator import agreement
from rlver_jax.simulator.judge_weights import DEFAULT_WEIGHTS
from rlver_jax.simulator.profiles import DEFAULT_PROFILES
from rlver_jax.simulator.sage_results import read_results, stem
from rlver_jax.testing.scripted_server import ScriptedServer, route
from tests.fixtures_cli import run_script


def test_pearson_and_spearman_match_hand_computed_values():
    assert agreement.spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)  # 1 - 6 * 2 / (4 * 15)
    # ties at their mean rank: ranks [1.5, 1.5, 3] against [1, 2, 3]; r = 1.5 / sqrt(1.5 * 2)
    assert agreement.spearman([1, 1, 2], [5, 6, 7]) == pytest.approx(1.5 / math.sqrt(3))
    # deviations [-1, 0, 1], [-7, -1, 8] / 3
    assert agreement.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    assert math.isnan(agreement.pearson([1, 1], [2, 3]))


def _dialogue(pid, turns):
    """A SAGE result line: (reply, emotion after it) per judged turn, then one reply never judged."""
    history = [{"role": "user", "content": "first words", "emotion-point": 40}]
    for k, (reply, emotion) in enumerate(turns):
        history += [{"role": "assistant", "content": reply},
                    {"role": "user", "content": f"user line {k}", "emotion-point": emotion, "planning": {}}]
    history.append({"role": "assistant", "content": "the 10th reply, never judged"})
    return {"id": pid, "emo_point": turns[-1][1], "history": history}


def _write(path, dialogues):
    text = "".join(json.dumps(d) + "\n" for d in dialogues)
    if path.name.endswith(".xz"):
        path.write_bytes(lzma.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_results_become_judged_replies_with_their_context(tmp_path):
    path = _write(tmp_path / "sim__model-a.jsonl.xz",
                  [_dialogue("rlverjax-en-01", [("hi [c+5]", 45), ("more [c-3]", 42)])])
    replies = read_results(path)
    assert stem(path) == "sim__model-a"
    assert [(r.turn, r.reply, r.change, r.emotions) for r in replies] == [
        (1, "hi [c+5]", 5, (40,)), (2, "more [c-3]", -3, (40, 45))]
    assert [m["content"] for m in replies[1].history] == ["first words", "hi [c+5]", "user line 0"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_dialogue("x", [("a", 41)])) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_results(bad)
    with pytest.raises(ValueError, match=r"ends with .jsonl or .jsonl.xz"):
        read_results(_write(tmp_path / "x.json", []))


def _scripted_judge(request):
    """Proposes the change written in the newest reply's marker `[c+N]`: the judge is known."""
    change = re.findall(r"\[c([+-]\d+)\]", request["messages"][-1]["content"])[-1]  # the newest reply is quoted last
    return f"Intent: x\nFit: x\nInner reaction: x\nFeeling: x\nChange: {change}"


def test_the_script_compares_a_served_simulator_with_the_recorded_changes(tmp_path):
    # Model a: recorded +5, -3 and +2; the judge proposes +4, -1 and +12 (clipped to +10).
    a = _write(tmp_path / "sim__a.jsonl.xz", [
        _dialogue("rlverjax-en-01", [("Warm [c+4]", 45), ("Cold [c-1]", 42)]),
        _dialogue("rlverjax-zh-01", [("好 [c+12]", 42)])])
    # Model b: recorded -2, -4; the judge proposes -1, -6.
    b = _write(tmp_path / "sim__b.jsonl", [_dialogue("rlverjax-en-02", [("Meh [c-1]", 38), ("Bad [c-6]", 34)])])
    out = tmp_path / "agreement.json"
    with ScriptedServer(route(emotion=_scripted_judge)) as server:
        done = run_script("simulator_agreement.py", f"--config.base_url={server.base_url}",
                          f"--results={a},{b}", f"--profiles={DEFAULT_PROFILES}", f"--out={out}")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert set(result) == {"pooled_r", "spearman", "models"}
    model_a, model_b = result["models"]["sim__a"], result["models"]["sim__b"]
    assert (model_a["turns"], model_a["llm_mean_change"], model_a["judge_mean_change"]) == (3, 4 / 3, 13 / 3)
    assert model_a["r"] == pytest.approx(agreement.pearson([5, -3, 2], [4, -1, 10]))
    assert (model_b["turns"], model_b["llm_mean_change"], model_b["judge_mean_change"]) == (2, -3, -3.5)
    assert model_b["r"] == pytest.approx(1.0)
    assert result["pooled_r"] == pytest.approx(agreement.pearson([5, -3, 2, -2, -4], [4, -1, 10, -1, -6]))
    assert result["spearman"] == pytest.approx(1.0)
    assert "sim__a" in done.stdout and "pooled per-turn r" in done.stdout


def test_the_script_names_a_dialogue_without_a_profile(tmp_path):
    a = _write(tmp_path / "sim__a.jsonl", [_dialogue("no-such-profile", [("Warm [c+4]", 45)])])
    done = run_script("simulator_agreement.py", "--config.backend=embedded", f"--results={a}",
                      f"--profiles={DEFAULT_PROFILES}")
    assert done.returncode == 1 and "'no-such-profile'" in done.stderr and "test_profile.jsonl" in done.stderr


SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"
SAGE_RESULTS = sorted((SHARED / "sage" / "dialogues").glob("*.jsonl.xz"))
TEST_PROFILES = SHARED / "rlver" / "test_profile.jsonl"
needs_sage = pytest.mark.skipif(not (SAGE_RESULTS and TEST_PROFILES.exists()),
                                reason="SAGE's released results and RLVER's test profiles (../shared/data) are not "
                                       "here")


@needs_sage
@pytest.mark.slow
def test_the_fit_reproduces_the_shipped_weights(tmp_path):
    """launch/fit_judge.py on the 8 shipped result files writes the shipped weights byte for byte.
    Its leave-one-model-out figures (--lomo: eight more fits, minutes on two cores) are a documented
    command with its numbers in docs/simulator.md, not a test."""
    weights = tmp_path / "weights.json"
    done = run_script("fit_judge.py", f"--results={','.join(map(str, SAGE_RESULTS))}", f"--profiles={TEST_PROFILES}",
                      f"--out={weights}")
    assert done.returncode == 0, done.stderr
    assert weights.read_bytes() == DEFAULT_WEIGHTS.read_bytes()


@needs_sage
@pytest.mark.slow
def test_the_embedded_simulator_replays_sages_results(tmp_path):
    """launch/simulator_agreement.py with the embedded simulator on the 8 files writes the figures;
    the shipped judge, fitted on them, orders the models as SAGE's simulator did (Spearman >= 0.9)."""
    out = tmp_path / "agreement.json"
    done = run_script("simulator_agreement.py", "--config.backend=embedded",
                      f"--results={','.join(map(str, SAGE_RESULTS))}", f"--profiles={TEST_PROFILES}", f"--out={out}")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert set(result["models"]) == {stem(p) for p in SAGE_RESULTS}
    gpt = result["models"]["deepseek-v3-1227_simulator__gpt-4.1"]
    assert (gpt["turns"], round(gpt["llm_mean_change"], 2)) == (848, 3.32)  # the data's own figures
    assert result["pooled_r"] >= 0.5 and result["spearman"] >= 0.9
