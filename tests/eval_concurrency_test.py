"""Evaluation against served models overlaps its dialogues (issue 17): launch/eval.py's code path
with an openai policy and simulator on one scripted server that sleeps per request."""

import json

import jax

from configs.eval import get_config
from rlver_jax.eval.benchmark import run_benchmark
from rlver_jax.eval.spec import EvalSpec
from rlver_jax.simulator.profiles import load_profiles
from rlver_jax.testing.scripted_server import ScriptedServer, route

DIALOGUES, LATENCY_S, TURNS = 10, 0.5, 3
# Per dialogue, one request after the other: a policy reply each turn, the emotion and reply steps
# on all but the last (SAGE does not judge the final reply).
REQUESTS_PER_DIALOGUE = TURNS + 2 * (TURNS - 1)


def _no_device(*args, **kwargs):
    raise AssertionError("an evaluation of served models touched a JAX device")


def test_dialogues_of_a_group_wait_on_the_server_together(tmp_path, monkeypatch):
    for name in ("devices", "local_devices", "device_count", "local_device_count", "process_index", "process_count"):
        monkeypatch.setattr(jax, name, _no_device)  # served policy and simulator: no backend start-up
    profiles = tmp_path / "profiles.jsonl"
    shipped = load_profiles()
    profiles.write_text("".join(
        json.dumps({**shipped[i % len(shipped)].to_dict(), "id": f"p{i}", "first_talk": "Long week."}) + "\n"
        for i in range(DIALOGUES)))
    script = route(emotion=lambda r: "Analysis: neutral.\nChange: 0",
                   reply=lambda r: "Plan: go on.\nResponse: I see. Tell me more.",
                   policy=lambda r: "That sounds like a lot. What weighs on you most?")
    with ScriptedServer(script, delay_s=LATENCY_S) as server:
        c = get_config()  # default group_size and max_dialogues: all 10 in flight, in two groups
        c.workdir, c.eval.profiles, c.simulator.max_turns = str(tmp_path / "eval"), str(profiles), TURNS
        c.policy.backend, c.policy.base_url, c.policy.model = "openai", server.base_url, "simulator"
        c.simulator.base_url = server.base_url
        summary = run_benchmark(EvalSpec.from_config(c), progress=False)
    assert summary["n"] == DIALOGUES and summary["simulator_errors"] == 0
    assert len(server.requests) == DIALOGUES * REQUESTS_PER_DIALOGUE
    # Every dialogue's request is at the server at once, not one dialogue's after another's.
    assert server.peak_in_flight == DIALOGUES
    critical_path = REQUESTS_PER_DIALOGUE * LATENCY_S  # 3.5 s; one request at a time: 35 s
    span = server.arrivals[-1] + LATENCY_S - server.arrivals[0]
    # The latency dominates the client's own work per request (a loaded CI machine included).
    assert span < 2 * critical_path, (span, critical_path)
