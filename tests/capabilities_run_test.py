"""launch/capabilities.py's run end to end against a scripted OpenAI-compatible policy with
planned right and wrong answers: exact scores, the think rule, resume, the comparison, and the
JAX backend on a tiny model."""

import json
import subprocess
import sys

import pytest

from rlver_jax.testing.scripted_server import ScriptedServer
from tests import capabilities_fixtures as fx

fx.require_extra()

from configs.capabilities import get_config  # noqa: E402
from rlver_jax.eval.capabilities import report, runner  # noqa: E402
from rlver_jax.eval.spec import CapabilitiesSpec  # noqa: E402


def _config(tmp_path, server, paths, name="run", **overrides):
    c = get_config()
    c.workdir = str(tmp_path / name)
    c.policy.backend = "openai"
    c.policy.base_url = server.base_url
    c.policy.model = server.model
    c.policy.max_retries = 0
    c.code.test_timeout_s = 2
    for b, p in paths.items():
        c.data[b] = p
    for k, v in overrides.items():
        target = c
        *head, last = k.split(".")
        for h in head:
            target = target[h]
        target[last] = v
    return c


def test_scores_are_the_graders_and_outputs_are_written(tmp_path):
    paths = fx.write_all(tmp_path / "data")
    table = fx.replies()
    with ScriptedServer(lambda r: fx.answer_for(r, table), model="policy") as server:
        scores = runner.run(CapabilitiesSpec.from_config(_config(tmp_path, server, paths)), progress=False)
        assert all(r["temperature"] == 0.0 for r in server.requests)  # greedy by default
    assert scores["math500"]["n"] == 3 and scores["math500"]["accuracy"] == pytest.approx(2 / 3)
    assert scores["ifeval"]["n"] == 3
    assert {k: scores["ifeval"][k] for k in fx.IFEVAL_SCORES} == pytest.approx(fx.IFEVAL_SCORES)
    assert scores["livecodebench"]["n"] == 2 and scores["livecodebench"]["pass@1"] == 0.5
    assert set(scores["livecodebench"]["sandbox_layers"]) == {"landlock", "network_namespace", "nobody", "seccomp"}
    out = tmp_path / "run"
    saved = json.loads((out / "capabilities.json").read_text())
    assert saved["math500"]["accuracy"] == pytest.approx(2 / 3) and saved["livecodebench"]["pass@1"] == 0.5
    # items.jsonl is in finishing order
    items = {i["key"]: i for i in map(json.loads, (out / "items.jsonl").read_text().splitlines())}
    assert [items[f"math500/{r['unique_id']}"]["correct"] for r, *_ in fx.MATH] == [right for *_, right in fx.MATH]
    assert [items[f"livecodebench/{r['question_id']}"]["correct"] for r, *_ in fx.LCB] == [ok for *_, ok in fx.LCB]
    assert "| MATH500 | 3 | accuracy | 66.7 |" in (out / "report.md").read_text()
    card = saved["run"]["protocol"]  # how it was obtained: the data's hash, sampling, the served ids, version
    assert card["data.math500.sha256"] and card["policy.temperature"] == 0.0
    assert card["policy.served_models"] == ["policy"] and {"run.date", "run.commit"} <= set(card)
    assert "| policy.served_models | [\"policy\"] |" in (out / "report.md").read_text()
    page = (out / "capabilities.html").read_text()
    assert 'data-bench="ifeval"' in page and 'data-result="wrong"' in page and "&lt;" not in fx.MATH[0][1]
    assert page.count("<article") == 8


def test_think_mode_grades_after_the_last_close_and_counts_the_unclosed(tmp_path):
    paths = {"math500": fx.write_jsonl(tmp_path / "m.jsonl", [r for r, *_ in fx.MATH])}
    first = fx.MATH[0][0]["problem"]

    def script(request):
        text = request["messages"][-1]["content"]
        reply = fx.answer_for(request, fx.replies())
        if first in text:  # right answer, but no </think>: graded as empty
            return "<think>" + reply
        return "<think>maybe \\boxed{6}</think>" + reply  # only the text after </think> counts

    with ScriptedServer(script, model="policy") as server:
        scores = runner.run(CapabilitiesSpec.from_config(_config(tmp_path, server, paths, **{"policy.think": True})),
                            progress=False)
        assert "<think>" in server.requests[0]["messages"][0]["content"]  # the think instruction
    assert scores["math500"]["think_unclosed"] == 1
    assert scores["math500"]["accuracy"] == pytest.approx(1 / 3)  # item 2 wrong after </think>, item 1 unclosed


def test_unclosed_thinking_is_no_pass_in_pass_at_1_either(tmp_path):
    """LiveCodeBench in think mode: replies whose <think> never closes, the right program after it,
    pass nowhere; pass@1 is computed from the same verdicts capabilities.json counts."""
    good = fx.LCB[0]  # a problem and a reply whose program passes every test
    rows = [{**good[0], "question_id": f"abc00{n}_a", "question_content": f"{good[0]['question_content']} (#{n})"}
            for n in range(6)]
    unclosed = {0, 2, 3, 5}  # items 1 and 4 close their thinking: the only passes

    def script(request):
        n = next(n for n, row in enumerate(rows) if row["question_content"] in request["messages"][-1]["content"])
        return ("<think>" if n in unclosed else "<think>a plan</think>") + good[1]

    paths = {"livecodebench": fx.write_jsonl(tmp_path / "lcb.jsonl", rows)}
    with ScriptedServer(script, model="policy") as server:
        scores = runner.run(CapabilitiesSpec.from_config(_config(tmp_path, server, paths, **{"policy.think": True})),
                            progress=False)
    lcb = scores["livecodebench"]
    assert (lcb["n"], lcb["correct"], lcb["think_unclosed"]) == (6, 2, 4)
    assert lcb["pass@1"] == pytest.approx(2 / 6)
    saved = json.loads((tmp_path / "run" / "capabilities.json").read_text())["livecodebench"]
    assert saved["pass@1"] == pytest.approx(saved["correct"] / saved["n"])
    items = [json.loads(line) for line in (tmp_path / "run" / "items.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in items if r["correct"]) == ["abc001_a", "abc004_a"]
    assert all(r["error"] == runner.UNCLOSED for r in items if r["think_closed"] is False)
    # every reply unclosed: pass@1 0, as the count (it was 1.0: no tests run read as all passed)
    records = [{**r, "correct": False, "think_closed": False, "results": []} for r in items]
    assert report.scores(records)["livecodebench"]["pass@1"] == 0.0


def test_resume_asks_and_grades_only_what_is_missing(tmp_path):
    paths = fx.write_all(tmp_path / "data")
    table = fx.replies()
    with ScriptedServer(lambda r: fx.answer_for(r, table), model="policy") as server:
        config = _config(tmp_path, server, paths)
        first = runner.run(CapabilitiesSpec.from_config(config), progress=False)
        out = tmp_path / "run"
        answers = (out / "answers.jsonl").read_text().splitlines()
        items = (out / "items.jsonl").read_text().splitlines()
        # as if killed: the last answer never came, and the one before it was never graded
        (out / "answers.jsonl").write_text("\n".join(answers[:-1]) + "\n")
        lost = {json.loads(answers[-1])["key"], json.loads(answers[-2])["key"]}
        (out / "items.jsonl").write_text("".join(item + "\n" for item in items if json.loads(item)["key"] not in lost))
        asked = len(server.requests)
        again = runner.run(CapabilitiesSpec.from_config(config), progress=False)
        assert len(server.requests) == asked + 1
    assert again == first
    config.policy.max_new_tokens = 7  # a different set-up is refused, not mixed in
    with pytest.raises(ValueError, match="different set-up"):
        runner.run(CapabilitiesSpec.from_config(config), progress=False)


def test_compare_to_the_base_shows_both_sides(tmp_path):
    paths = {"math500": fx.write_jsonl(tmp_path / "m.jsonl", [r for r, *_ in fx.MATH])}
    trained = fx.replies()
    base = dict(trained)
    base[fx.MATH[0][0]["problem"]] = "\\boxed{1}"  # base wrong where trained is right
    base[fx.MATH[1][0]["problem"]] = "\\boxed{6}"  # base right where trained is wrong
    with ScriptedServer(lambda r: fx.answer_for(r, base), model="policy") as server:
        runner.run(CapabilitiesSpec.from_config(_config(tmp_path, server, paths, name="base")), progress=False)
    with ScriptedServer(lambda r: fx.answer_for(r, trained), model="policy") as server:
        runner.run(CapabilitiesSpec.from_config(_config(tmp_path, server, paths, compare_to=str(tmp_path / "base"))),
                   progress=False)
    result = json.loads((tmp_path / "run" / "compare_capabilities.json").read_text())["benchmarks"]["math500"]
    assert (result["base"], result["trained"]) == pytest.approx((2 / 3, 2 / 3))
    assert result["gained"] == [fx.MATH[0][0]["unique_id"]] and result["lost"] == [fx.MATH[1][0]["unique_id"]]
    low, high = result["ci95"]
    assert low < 0 < high and result["difference"] == 0
    assert result["paper_percent"] == {"base": 77.8, "ppo": 76.6, "note": "settings unpublished"}
    md = (tmp_path / "run" / "compare_capabilities.md").read_text()
    assert "| MATH500 | accuracy | 3 | 66.7 | 66.7 | +0.0 |" in md and "settings unpublished" in md


def test_paired_bootstrap_matches_a_plain_loop():
    import numpy as np

    from rlver_jax.eval.capabilities.compare import paired_bootstrap

    b = np.array([1, 0, 1, 1, 0, 0, 1, 0], float)
    t = np.array([1, 1, 1, 0, 1, 0, 1, 1], float)
    rng = np.random.default_rng(3)
    diffs = []
    for _ in range(500):
        idx = rng.integers(0, 8, size=8)
        diffs.append(sum(t[i] for i in idx) / 8 - sum(b[i] for i in idx) / 8)
    assert paired_bootstrap(b, t, seed=3, samples=500) == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])))


def test_no_benchmark_is_one_clear_error(tmp_path):
    c = get_config()
    c.workdir = str(tmp_path / "w")
    c.policy.backend = "openai"
    with pytest.raises(ValueError, match="set at least one of --config.data.math500"):
        runner.run(CapabilitiesSpec.from_config(c), progress=False)


@pytest.mark.slow  # a fresh interpreter: what it imports
def test_launch_command_runs_a_served_policy_without_jax(tmp_path):
    paths = {"ifeval": fx.write_jsonl(tmp_path / "i.jsonl", [r for r, *_ in fx.IFEVAL])}
    table = fx.replies()
    with ScriptedServer(lambda r: fx.answer_for(r, table), model="policy") as server:
        code = ("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path('launch/capabilities.py', "
                "run_name='__main__')")
        done = subprocess.run(
            [sys.executable, "-c", code + "\nassert 'jax' not in sys.modules", "launch/capabilities.py",
             "--config=configs/capabilities.py", f"--config.workdir={tmp_path / 'w'}",
             "--config.policy.backend=openai", f"--config.policy.base_url={server.base_url}",
             "--config.policy.model=policy", f"--config.data.ifeval={paths['ifeval']}"],
            capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "IFEval: prompt_level_strict_acc 33.3% (n 3)" in done.stdout


@pytest.mark.slow
def test_jax_backend_on_a_tiny_model(tmp_path):
    paths = fx.write_all(tmp_path / "data")
    c = get_config("tiny")
    c.workdir = str(tmp_path / "tiny")
    c.code.test_timeout_s = 1
    for b, p in paths.items():
        c.data[b] = p
    scores = runner.run(CapabilitiesSpec.from_config(c), progress=False)
    assert {b: s["n"] for b, s in scores.items()} == {"math500": 3, "ifeval": 3, "livecodebench": 2}
    records = [json.loads(line) for line in (tmp_path / "tiny" / "items.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(isinstance(r["reply"], str) for r in records)
    assert (tmp_path / "tiny" / "capabilities.html").exists()


def test_a_request_the_endpoint_refuses_is_counted_not_fatal(tmp_path):
    from rlver_jax.testing.scripted_server import Reply

    paths = {"math500": fx.write_jsonl(tmp_path / "m.jsonl", [r for r, *_ in fx.MATH])}
    table = fx.replies()

    def script(request):
        if fx.MATH[0][0]["problem"] in request["messages"][-1]["content"]:
            return Reply(status=400, body={"error": {"message": "too long for the context"}})
        return fx.answer_for(request, table)

    with ScriptedServer(script, model="policy") as server:
        scores = runner.run(CapabilitiesSpec.from_config(_config(tmp_path, server, paths)), progress=False)
    assert scores["math500"]["rejected"] == 1 and scores["math500"]["accuracy"] == pytest.approx(1 / 3)


def test_an_endpoint_policy_fills_the_client_limit(tmp_path):
    rows = [{"problem": f"What is {i}+1?", "answer": str(i + 1), "unique_id": f"p{i}"} for i in range(12)]
    paths = {"math500": fx.write_jsonl(tmp_path / "m.jsonl", rows)}
    with ScriptedServer(lambda r: "\\boxed{1}", model="policy", delay_s=0.2) as server:
        scores = runner.run(CapabilitiesSpec.from_config(_config(tmp_path, server, paths, **{"eval.max_in_flight": 4})),
                            progress=False)
        assert server.peak_in_flight == 4
    assert scores["math500"]["correct"] == 1  # only 0+1 is 1


def test_fetch_writes_the_local_layout_with_checksums(tmp_path, monkeypatch):
    import hashlib
    import types

    from rlver_jax.eval.capabilities import fetch

    def download(repo, name, repo_type):
        assert repo_type == "dataset"
        path = tmp_path / "hub" / repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{repo}/{name}\n")
        return str(path)

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(hf_hub_download=download))
    sums = fetch.fetch(tmp_path / "caps").read_text().splitlines()
    assert len(sums) == 8
    assert sums[0].endswith("  math500/test.jsonl") and sums[-1].endswith("  livecodebench/test6.jsonl")
    digest, name = sums[1].split("  ")
    assert digest == hashlib.sha256((tmp_path / "caps" / name).read_bytes()).hexdigest()
    copied = (tmp_path / "caps" / "ifeval" / "ifeval_input_data.jsonl").read_text()
    assert copied == "google/IFEval/ifeval_input_data.jsonl\n"
