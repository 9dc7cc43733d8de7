"""The Sentient benchmark end to end, with the scripted server playing the policy and the
simulated user: hand-computed scores, resume, simulator errors, outputs, comparison, a checkpoint
policy and the command line."""

import json
import os
import subprocess
import sys

import pytest

from configs.eval import get_config
from rlver_jax.checks import InputError
from rlver_jax.eval.benchmark import needs_jax, run_benchmark
from rlver_jax.eval.compare import compare_runs
from rlver_jax.eval.sentient import breakdown, summarize
from rlver_jax.eval.spec import EvalSpec, like_training
from rlver_jax.files import read_jsonl
from rlver_jax.llm_client import EndpointUnavailableError
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.testing.scripted_server import Reply, ScriptedServer, route
from tests.conftest import REPO
from tests.export_test import make_run
from tests.fixtures_eval import CHANGES, Servers, _emotion, _policy, _reply, config_urls, profiles_file
from tests.summary_test import DIALOGUES

# The scripted profiles (tests/fixtures_eval.py) end under the SAGE rules as:
EXPECTED = {"P1": (100, 6, "success"), "P2": (0, 4, "failure"), "P3": (49, 10, "turn_limit"),
            "P4": (50, 2, "goodbye")}
SCORE = (100 + 0 + 49 + 50) / 4


def _config(tmp_path, servers, profiles, workdir="eval", **overrides):
    return config_urls(tmp_path / workdir, servers.policy.base_url, servers.simulator.base_url, profiles,
                       **overrides)


def test_sentient_scores_of_crafted_dialogues():
    # DIALOGUES: A success at 100 (2 turns), B failure at 0 (2), C 40 (3), D simulator error (1), E 60 (1).
    s = summarize(DIALOGUES)
    assert {k: v for k, v in s.items() if k not in ("per_profile", "degenerate_replies")} == {
        "score": 50.0, "success": 1, "failure": 1, "n": 4, "simulator_errors": 1, "no_policy_turn": 0,
        "mean_turns": 2.0, "template_rate": 0.0}  # no messages recorded: no replies to compare
    assert s["degenerate_replies"]["degenerate_repetition_rate"] == pytest.approx(3 / 9)  # C's 3 of the 9 replies
    assert s["per_profile"][3] == {"id": "D", "final_emotion": 55, "turns": 1, "end_reason": "simulator_error"}
    groups = breakdown(DIALOGUES, lambda d: "long" if len(d.turns) > 1 else "short")
    assert groups == [
        {"group": "long", "n": 3, "score": pytest.approx(140 / 3), "success": 1, "failure": 1, "simulator_errors": 0},
        {"group": "short", "n": 1, "score": 60.0, "success": 0, "failure": 0, "simulator_errors": 1}]


def test_scores_equal_hand_computed_values(tmp_path):
    with Servers() as servers:
        config = _config(tmp_path, servers, profiles_file(tmp_path), **{"eval.max_dialogues": 3})
        summary = run_benchmark(EvalSpec.from_config(config), progress=False)
        assert servers.policy.peak_in_flight <= 3
    assert summary["score"] == pytest.approx(SCORE)
    assert (summary["success"], summary["failure"], summary["n"], summary["simulator_errors"]) == (1, 1, 4, 0)
    assert summary["per_profile"] == [
        {"id": f"id-{n}", "final_emotion": e, "turns": t, "end_reason": r} for n, (e, t, r) in EXPECTED.items()]
    # SAGE: the 10th reply is generated but never judged, so P3 has 9 emotion updates.
    workdir = tmp_path / "eval"
    p3 = next(t for t in read_jsonl(workdir / "transcripts.jsonl") if t["profile_id"] == "id-P3")
    assert p3["emotions"] == list(range(40, 50))
    assert json.loads((workdir / "sentient.json").read_text())["score"] == pytest.approx(SCORE)
    report = (workdir / "report.md").read_text()
    assert "| score (mean final emotion) | 49.8 |" in report and "Warning" not in report
    assert "| id-P2 | en | 0 | 4 | failure | 40 30 20 10 0 |" in report
    for png in ("trajectories.png", "final_emotions.png"):
        assert (workdir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_dialogue_is_saved_when_it_ends(tmp_path):
    with Servers() as servers:  # one group of four dialogues in lockstep; they end at different turns
        run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles_file(tmp_path),
                                                   **{"eval.group_size": 4})), progress=False)
    order = [r["profile_id"] for r in read_jsonl(tmp_path / "eval" / "transcripts.jsonl")]
    assert order == ["id-P4", "id-P2", "id-P1", "id-P3"]  # after 2, 4, 6 and 10 replies


def test_resume_skips_finished_profiles(tmp_path):
    profiles = profiles_file(tmp_path)
    with Servers() as servers:
        run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles, **{"eval.max_profiles": 2})),
                      progress=False)
        assert servers.policy_requests("P1") == 6 and servers.policy_requests("P3") == 0
    # A crash mid-append leaves a torn last line; the rerun drops it and starts a clean one.
    with open(tmp_path / "eval" / "transcripts.jsonl", "a") as f:
        f.write('{"profile_id": "id-P3", "turns": [')
    with Servers() as servers:
        summary = run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles)), progress=False)
        assert servers.policy_requests("P1") == servers.policy_requests("P2") == 0
        assert (servers.policy_requests("P3"), servers.policy_requests("P4")) == (10, 2)
    assert summary["score"] == pytest.approx(SCORE)
    records = read_jsonl(tmp_path / "eval" / "transcripts.jsonl")
    assert sorted(r["profile_id"] for r in records) == ["id-P1", "id-P2", "id-P3", "id-P4"]
    with Servers() as servers:  # a different set-up is not mixed into these results
        with pytest.raises(ValueError, match="different set-up .*policy.temperature: 0.7 -> 1.0"):
            run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles, **{"policy.temperature": 1.0})),
                          progress=False)
        assert not servers.policy.requests


def test_a_policy_endpoint_failing_mid_run_keeps_the_finished_dialogues(tmp_path):
    def failing_policy(request):
        return Reply(status=400) if "[P3]" in request["messages"][1]["content"] else _policy(request)

    profiles = profiles_file(tmp_path)
    with Servers() as servers:
        servers.policy.script = failing_policy
        config = _config(tmp_path, servers, profiles, **{"eval.max_dialogues": 1, "policy.max_retries": 0})
        with pytest.raises(EndpointUnavailableError, match="rerun the same command to resume"):
            run_benchmark(EvalSpec.from_config(config), progress=False)
    saved = [r["profile_id"] for r in read_jsonl(tmp_path / "eval" / "transcripts.jsonl")]
    assert saved == ["id-P1", "id-P2"]  # one dialogue at a time: P3 failed before P4 started
    with Servers() as servers:
        assert (run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles)), progress=False)["score"]
                == pytest.approx(SCORE))
        assert servers.policy_requests("P1") == servers.policy_requests("P2") == 0


def test_a_simulator_answering_malformed_text_is_counted_not_fatal(tmp_path):
    with Servers() as servers:
        summary = run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles_file(tmp_path, ("P1", "P5")))),
                                progress=False)
        p5_judgements = [r for r in servers.simulator.requests if "Name: P5" in r["messages"][0]["content"]]
        assert len(p5_judgements) == 2  # the first answer and one retry (malformed_retries=1)
    assert (summary["simulator_errors"], summary["n"], summary["score"]) == (1, 1, 100)
    assert summary["per_profile"][1] == {"id": "id-P5", "final_emotion": 40, "turns": 1,
                                         "end_reason": "simulator_error"}
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "| simulator errors (not scored) | 1 |" in report
    # Prominent, before the scores: this score is not comparable with published ones.
    assert report.index("**Warning: 1 of 2 dialogues ended in a simulator error.**") < report.index("| score")


def test_all_simulator_errors_give_a_null_score(tmp_path):
    with Servers() as servers:
        run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles_file(tmp_path, ("P5",)))),
                      progress=False)
    saved = json.loads((tmp_path / "eval" / "sentient.json").read_text())
    assert (saved["score"], saved["n"], saved["simulator_errors"]) == (None, 0, 1)


def test_bad_input_names_the_field(tmp_path):
    with Servers() as servers:
        with pytest.raises(ValueError, match="config.policy.backend='vllm'"):
            run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles_file(tmp_path),
                                                       **{"policy.backend": "vllm"})))
        with pytest.raises(ValueError, match="config.eval.profiles: .*nowhere.jsonl: profile file not found"):
            run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, tmp_path / "nowhere.jsonl")))
        with pytest.raises(FileNotFoundError, match="config.policy.checkpoint='.*no_run': no such directory"):
            run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles_file(tmp_path), **{
                "policy.backend": "jax", "policy.checkpoint": str(tmp_path / "no_run")})))
        with pytest.raises(EndpointUnavailableError, match="--config.policy.model='gpt'"):
            run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles_file(tmp_path),
                                                       **{"policy.model": "gpt"})))
        stopped = servers.policy.base_url
    with ScriptedServer(route(emotion=_emotion(CHANGES), reply=_reply)) as simulator:
        with pytest.raises(EndpointUnavailableError, match="no server answers at --config.policy.base_url"):
            run_benchmark(EvalSpec.from_config(config_urls(tmp_path / "eval", stopped, simulator.base_url,
                                                           profiles_file(tmp_path))))


SAGE_POLICY_PROMPT = REPO.parent / "shared" / "data" / "sage" / "policy_system_prompt.txt"


@pytest.mark.skipif(not SAGE_POLICY_PROMPT.exists(), reason=f"needs SAGE's policy prompt at {SAGE_POLICY_PROMPT}")
def test_the_policy_gets_the_system_prompt_of_the_configured_file(tmp_path):
    """policy.system_prompt_file: every policy request opens with the file's text (SAGE's own
    prompt), not the project's; both fields set, or an unreadable file, name the field."""
    want = SAGE_POLICY_PROMPT.read_text(encoding="utf-8").strip()
    with Servers() as servers:
        config = _config(tmp_path, servers, profiles_file(tmp_path, names=("P1",)),
                         **{"policy.system_prompt_file": str(SAGE_POLICY_PROMPT)})
        assert run_benchmark(EvalSpec.from_config(config), progress=False)["n"] == 1
        assert servers.policy.requests and all(
            r["messages"][0] == {"role": "system", "content": want} for r in servers.policy.requests)
        config.policy.system_prompt = "Be kind."
        with pytest.raises(ValueError, match="config.policy.system_prompt and config.policy.system_prompt_file"):
            run_benchmark(EvalSpec.from_config(config), progress=False)
        config.policy.system_prompt, config.policy.system_prompt_file = "", str(tmp_path / "none.txt")
        with pytest.raises(ValueError, match="config.policy.system_prompt_file=.*none.txt.* cannot be read"):
            run_benchmark(EvalSpec.from_config(config), progress=False)


def test_only_a_policy_of_ours_or_a_multi_process_run_needs_jax(monkeypatch):
    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "RLVER_MULTIHOST"):
        monkeypatch.delenv(var, raising=False)
    c = get_config()
    assert needs_jax(EvalSpec.from_config(c))  # configs/eval.py's default policy: ours, on JAX
    c.policy.backend = "openai"
    assert not needs_jax(EvalSpec.from_config(c))
    c.mesh.distributed.num_processes = 2
    assert needs_jax(EvalSpec.from_config(c))
    c.mesh.distributed.num_processes = None
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")  # launch/eval.py on each host
    assert needs_jax(EvalSpec.from_config(c))
    c.mesh.distributed.initialize = "never"
    assert not needs_jax(EvalSpec.from_config(c))


def test_compare_pairs_runs_perprofile(tmp_path):
    profiles = profiles_file(tmp_path)
    with Servers() as servers:
        run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles, workdir="a")), progress=False)
    # b: P2 +5 x9 -> 85 at the turn limit (better); P4 -10 x2 -> 20, goodbye (worse); P1, P3 equal
    with Servers({"P1": 10, "P2": 5, "P3": 1, "P4": -10}) as servers:
        run_benchmark(EvalSpec.from_config(_config(tmp_path, servers, profiles, workdir="b")), progress=False)
    result = compare_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp")
    b = result["runs"]["b"]
    assert b["score"] == pytest.approx((100 + 85 + 49 + 20) / 4)
    assert b["vs_baseline"]["mean_diff"] == pytest.approx(((85 - 0) + (20 - 50)) / 4)
    assert (b["vs_baseline"]["wins"], b["vs_baseline"]["ties"], b["vs_baseline"]["losses"]) == (1, 2, 1)
    assert (tmp_path / "cmp" / "compare.png").exists() and "paired comparison" in \
        (tmp_path / "cmp" / "compare.md").read_text()
    # With a capability run per evaluation run: one table of empathy and retention (percent).
    for name, scores in {"caps_a": {"math500": {"n": 4, "accuracy": 0.75},
                                    "ifeval": {"n": 2, "prompt_level_strict_acc": 0.5}},
                         "caps_b": {"math500": {"n": 4, "accuracy": 0.5}}}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "capabilities.json").write_text(json.dumps(scores))
    result = compare_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp2",
                          capabilities=[tmp_path / "caps_a", tmp_path / "caps_b"])
    assert result["capabilities"] == {"a": {"math500": 0.75, "ifeval": 0.5, "livecodebench": None},
                                      "b": {"math500": 0.5, "ifeval": None, "livecodebench": None}}
    text = (tmp_path / "cmp2" / "compare.md").read_text()
    assert "| run | Sentient score | MATH500 | IFEval | LiveCodeBench |" in text
    assert "| b | 63.5 | 50.0 |" in text.replace(".00", ".0")
    with pytest.raises(InputError, match="--capabilities names 1 directories for 2 runs"):
        compare_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp3", capabilities=[tmp_path / "caps_a"])


def test_the_profiles_a_run_trained_on_are_its_file_less_its_holdout(tmp_path):
    """A tiny run trains on the first 12 of the 16 shipped profiles (data.eval_holdout 4); with
    eval_profiles of its own it trains on the whole file."""
    from configs.grpo_think import get_config as train_config
    from rlver_jax.eval.run_checkpoint import RunCheckpoint
    from rlver_jax.simulator.profiles import DEFAULT_PROFILES

    ids = [json.loads(line)["id"] for line in DEFAULT_PROFILES.read_text().splitlines() if line.strip()]
    config = train_config("tiny")
    (tmp_path / "config.json").write_text(config.to_json_best_effort())
    run = RunCheckpoint(tmp_path, tmp_path / "checkpoints", None)
    assert len(ids) == 16 and run.trained_profile_ids() == set(ids[:12])
    config.data.eval_profiles = str(DEFAULT_PROFILES)
    (tmp_path / "config.json").write_text(config.to_json_best_effort())
    assert run.trained_profile_ids() == set(ids)


@pytest.mark.slow
def test_checkpoint_and_fresh_policies_on_the_cpu(tmp_path, tiny_tokenizer_dir):
    make_run(tmp_path / "run", tiny_tokenizer_dir, think=False)
    config = get_config("tiny")
    config.workdir = str(tmp_path / "eval")
    config.policy.checkpoint = str(tmp_path / "run")
    config.eval.max_profiles = 1  # one dialogue of two turns: few shapes to compile
    config.policy.max_new_tokens = 8
    config.simulator.max_turns = 2
    summary = run_benchmark(EvalSpec.from_config(config), progress=False)
    assert summary["n"] == 1 and summary["run"]["policy"] == "run step 3" and summary["run"]["think"] is False
    assert "trained_on" not in summary["per_profile"][0]  # the tiny evaluation plays the run's held-out profiles
    [dialogue] = read_jsonl(tmp_path / "eval" / "transcripts.jsonl")
    assert len(dialogue["turns"]) == 2 and dialogue["turns"][0]["raw"]  # the sampler wrote both replies

    config.workdir, config.policy.checkpoint = str(tmp_path / "fresh"), ""
    summary = run_benchmark(EvalSpec.from_config(config), progress=False)
    assert summary["run"]["policy"] == "fresh tiny model (seed 0)" and summary["n"] == 1
    assert (tmp_path / "fresh" / "tokenizer" / "tokenizer.json").exists()


@pytest.mark.slow
def test_command_line_contract(tmp_path):
    with Servers() as servers:
        cmd = [sys.executable, str(REPO / "launch" / "eval.py"), "--config=configs/eval.py",
               f"--config.workdir={tmp_path / 'dir'}", f"--config.eval.profiles={profiles_file(tmp_path)}",
               "--config.policy.backend=openai", f"--config.policy.base_url={servers.policy.base_url}",
               "--config.policy.model=policy", "--config.simulator.backend=openai",
               f"--config.simulator.base_url={servers.simulator.base_url}", "--config.simulator.model=simulator"]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stderr
    assert "score 49.8  success 1  failure 1  n 4" in done.stdout
    saved = json.loads((tmp_path / "dir" / "sentient.json").read_text())
    assert set(saved) >= {"score", "success", "failure", "n", "simulator_errors", "per_profile"}
    dialogues = [DialogueSequence.from_record(t) for t in read_jsonl(tmp_path / "dir" / "transcripts.jsonl")]
    assert summarize(dialogues)["score"] == saved["score"]


def test_like_training_plays_under_the_runs_own_settings(tmp_path):
    from configs.grpo_think import get_config as training_config

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    trained = training_config("tiny")
    trained.simulator.base_url = "http://trainhost:1/v1"
    (run / "config.json").write_text(trained.to_json_best_effort())
    config = get_config("tiny")
    config.eval.like_training = str(run)
    like = like_training(config)
    # The tiny think run: 1 round of 48-token turns at temperature 1, from emotion 30, floor 0.
    assert (like.policy.max_new_tokens, like.policy.max_total_tokens, like.policy.temperature) == (48, 1024, 1.0)
    assert like.policy.think is True and like.policy.format_failure == "continue"
    assert (like.simulator.max_turns, like.simulator.initial_emotion, like.simulator.floor,
            like.simulator.floor_inclusive, like.simulator.score_final_turn) == (1, 30, 0, True, True)
    assert like.simulator.base_url == config.simulator.base_url  # how it is reached stays the evaluation's
    assert (config.policy.max_new_tokens, config.simulator.max_turns) == (32, 10)  # the given config is untouched
    config.policy.think = False
    assert like_training(config).policy.think is False  # an explicit think mode wins
    config.eval.like_training = str(tmp_path / "nowhere")
    config.workdir = str(tmp_path / "eval")
    with pytest.raises(FileNotFoundError, match="config.eval.like_training=.*nowhere.*: no such directory"):
        run_benchmark(EvalSpec.from_config(config), progress=False)


def test_an_old_runs_config_json_gets_the_fields_added_since(tmp_path):
    """A run saved before config.model.attention and mlp_chunk existed reads as one that trained with
    the defaults of the time (auto attention, no MLP chunks); every other field as it was saved."""
    from configs.grpo_think import get_config as training_config
    from rlver_jax.eval.run_checkpoint import locate_checkpoint
    from rlver_jax.train.spec import model_source

    (tmp_path / "checkpoints").mkdir()
    old = json.loads(training_config("tiny").to_json_best_effort())
    del old["model"]["attention"], old["model"]["mlp_chunk"]
    old["model"]["dtype"] = "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(old))
    run = locate_checkpoint(tmp_path, "--run").config()
    assert model_source(run).overrides() == dict(param_dtype="float32", dtype="bfloat16", scan_layers=False,
                                                 remat="none", attention="auto", mlp_chunk=0)
    assert run.to_dict() == {**old, "model": {**old["model"], "attention": "auto", "mlp_chunk": 0}}
