"""A panel of simulators (rlver_jax.eval.panel): two scripted simulated users judge the same policy
differently; the panel's report gives each one's scores, their mean and where they disagree."""

import dataclasses
import functools
import json

import pytest

from rlver_jax.eval.benchmark import run_benchmark
from rlver_jax.eval.compare import compare_runs, kendall_tau, rank_agreement
from rlver_jax.eval.panel import Member, parse_panel
from rlver_jax.eval.spec import EvalSpec
from rlver_jax.simulator import SimulatorUnavailableError, backends
from rlver_jax.simulator.embedded import EmbeddedBackend
from rlver_jax.testing.scripted_server import ScriptedServer, route
from tests.fixtures_cli import free_port, run_script
from tests.fixtures_eval import Servers, _emotion, _reply, config_urls, profiles_file

# Under the SAGE rules from 40 (fixtures_eval): simulator A gives P1 100, P2 0, P3 49, P4 50 (49.75);
# simulator B (P2 +5 x9 -> 85 at the turn limit, P4 -10 x2 -> 20) gives 100, 85, 49, 20 (63.5).
HARSHER_ON_P4 = {"P1": 10, "P2": 5, "P3": 1, "P4": -10}


def test_parse_panel_names_the_field_and_the_member():
    assert parse_panel("a@http://h:1/v1, b@https://k/v1") == (Member("openai", "a", "http://h:1/v1"),
                                                             Member("openai", "b", "https://k/v1"))
    assert parse_panel("embedded, openai:q@http://h/v1, openai") == (Member("embedded"),
                                                                     Member("openai", "q", "http://h/v1"),
                                                                     Member("openai"))
    assert parse_panel("") == ()
    with pytest.raises(ValueError, match=r"config.eval.simulators='gpt-4o': 'gpt-4o' is not MODEL@URL nor a backend "
                                         r"\(openai \| embedded\)"):
        parse_panel("gpt-4o")
    with pytest.raises(ValueError, match=r"'embedded:q7' gives a model, which backend 'embedded' does not read"):
        parse_panel("embedded,embedded:q7")
    with pytest.raises(ValueError, match="names a simulator twice"):
        parse_panel("a@http://h/v1,openai:a@http://h/v1")
    with pytest.raises(ValueError, match="names a simulator twice"):
        parse_panel("embedded,embedded")
    # /DIFFICULTY sets a member's user: the same simulator, a harsher user (a URL's slashes stay its own)
    assert parse_panel("embedded,embedded/challenging,q@http://h/v1/challenging") == (
        Member("embedded"), Member("embedded", difficulty="challenging"),
        Member("openai", "q", "http://h/v1", "challenging"))
    assert Member("embedded", difficulty="challenging").directory(1) == "simulators/1-embedded-challenging"


class _Kinder(EmbeddedBackend):
    """The embedded rules, every change 8 higher."""

    async def judge(self, state, reply):
        judged = await super().judge(state, reply)
        return dataclasses.replace(judged, change=judged.change + 8)


def _evaluate(tmp_path, servers, profiles, name, **overrides):
    """The benchmark's summary for WORKDIR tmp_path/name against the test servers, with `overrides`."""
    config = config_urls(tmp_path / name, servers.policy.base_url, servers.simulator.base_url, profiles, **overrides)
    return run_benchmark(EvalSpec.from_config(config), progress=False)


def test_a_panel_plays_on_a_cpu_under_any_backends_of_the_table(tmp_path):
    """Two members that need no server: the embedded rules and a kinder row registered in the
    table. Each member's score is the one its backend gets alone (config.simulator.backend)."""
    kinder = backends.BackendRow(build=lambda llm, client: _Kinder(), reads=frozenset(), served=False,
                                 summary="kinder rules (a test's)", card_model="kinder rules")
    profiles = profiles_file(tmp_path)
    with backends.BACKENDS.added("kinder", kinder), Servers() as servers:
        evaluate = functools.partial(_evaluate, tmp_path, servers, profiles)
        summary = evaluate("panel", **{"eval.simulators": "embedded,kinder"})
        alone = {b: evaluate(b, **{"simulator.backend": b})["score"] for b in ("embedded", "kinder")}
        assert not servers.simulator.requests  # config.simulator's served simulator was never asked
    assert {label: s["score"] for label, s in summary["panel"].items()} == alone
    assert alone["kinder"] > alone["embedded"] and summary["score"] == pytest.approx(sum(alone.values()) / 2)
    card = summary["protocol"]
    assert card["simulator.backend"] == ["embedded", "kinder"]
    assert card["simulator.model"] == ["embedded judge fitted on SAGE's results", "kinder rules"]
    assert card["run.simulator_url"] is None
    assert (tmp_path / "panel" / "simulators" / "1-kinder" / "transcripts.jsonl").exists()


def test_a_panel_of_two_embedded_members_runs_on_a_cpu(tmp_path):
    """The embedded simulator with its vanilla and its challenging user, no server asked: each
    member's score is its user's alone, and the two differ (the challenging judge feels positives
    half and negatives 1.25 times)."""
    profiles = profiles_file(tmp_path)
    with Servers() as servers:
        evaluate = functools.partial(_evaluate, tmp_path, servers, profiles)
        summary = evaluate("panel", **{"eval.simulators": "embedded,embedded/challenging"})
        alone = [evaluate(f"alone_{d}", **{"simulator.backend": "embedded", "simulator.difficulty": d})["score"]
                 for d in ("vanilla", "challenging")]
        assert not servers.simulator.requests
    assert [s["score"] for s in summary["panel"].values()] == alone and alone[1] != alone[0]
    assert summary["protocol"]["simulator.difficulty"] == ["vanilla", "challenging"]


def test_a_members_dead_server_is_named_by_the_panel(tmp_path):
    profiles = profiles_file(tmp_path, ("P1",))
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with Servers() as servers:
        config = config_urls(tmp_path / "panel", servers.policy.base_url, servers.simulator.base_url, profiles,
                             **{"eval.simulators": f"simulator@{servers.simulator.base_url},simulator@{dead}"})
        with pytest.raises(SimulatorUnavailableError, match=rf"config.eval.simulators: member 2 of 2, "
                                                            rf"'simulator@{dead}': simulator: no server answers"):
            run_benchmark(EvalSpec.from_config(config), progress=False)
    assert not (tmp_path / "panel").exists()  # the live first member did not start: nothing written


@pytest.mark.slow
def test_a_panel_of_two_simulators_scores_under_each(tmp_path):
    profiles = profiles_file(tmp_path)
    with Servers() as servers, ScriptedServer(route(emotion=_emotion(HARSHER_ON_P4), reply=_reply)) as second:
        a, b = servers.simulator.base_url, second.base_url
        config = config_urls(tmp_path / "panel", servers.policy.base_url, a, profiles,
                             **{"eval.simulators": f"simulator@{a},simulator@{b}"})
        summary = run_benchmark(EvalSpec.from_config(config), progress=False)
        assert second.requests and servers.simulator.requests  # both judged
    first, other = summary["panel"][f"simulator@{a}"], summary["panel"][f"simulator@{b}"]
    assert (first["score"], other["score"]) == (pytest.approx((100 + 0 + 49 + 50) / 4), pytest.approx(63.5))
    assert first["ci95"][0] <= first["score"] <= first["ci95"][1] and first["ci95"][0] < first["ci95"][1]
    assert summary["score"] == pytest.approx((49.75 + 63.5) / 2)
    assert [p["final_emotion"] for p in summary["per_profile"]] == [100, 42.5, 49, 35]
    assert [(d["id"], d["spread"]) for d in summary["disagreements"][:2]] == [("id-P2", 85), ("id-P4", 30)]
    assert summary["protocol"]["run.simulator_url"] == [a, b] and summary["protocol"]["rules.initial_emotion"] == 40
    for k in (0, 1):  # each member's own evaluation, report and transcripts
        assert (tmp_path / "panel" / "simulators" / f"{k}-simulator" / "transcripts.jsonl").exists()
    report = (tmp_path / "panel" / "report.md").read_text()
    assert "Panel mean score: **56.6**" in report and f"| simulator@{b} | 63.5 |" in report
    assert json.loads((tmp_path / "panel" / "sentient.json").read_text())["score"] == pytest.approx(56.625)
    # The panel's result compares like any other (the same panel: one protocol but for dates).
    result = compare_runs([tmp_path / "panel", tmp_path / "panel" / "simulators" / "1-simulator"], tmp_path / "cmp",
                          force=True)
    assert result["runs"]["panel"]["score"] == pytest.approx(56.625)


def test_the_command_line_prints_each_simulators_score(tmp_path):
    profiles = profiles_file(tmp_path, ("P1", "P2"))
    with Servers() as servers, ScriptedServer(route(emotion=_emotion(HARSHER_ON_P4), reply=_reply)) as second:
        a, b = servers.simulator.base_url, second.base_url
        done = run_script("eval.py", "--config=configs/eval.py", f"--config.workdir={tmp_path / 'cli'}",
                          f"--config.eval.profiles={profiles}", "--config.eval.group_size=1",
                          "--config.policy.backend=openai", f"--config.policy.base_url={servers.policy.base_url}",
                          f"--config.eval.simulators=simulator@{a},simulator@{b}")
    assert done.returncode == 0, done.stderr
    assert f"simulator@{a}: score 50.0" in done.stdout and f"simulator@{b}: score 92.5" in done.stdout
    assert "panel mean score 71.2 over 2 simulators" in done.stdout


def test_kendall_tau_by_hand():
    # pairs (0,1) and (0,2) ranked alike, (1,2) opposite: (2 - 1) / 3
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert kendall_tau([1, 2], [5, 9]) == 1 and kendall_tau([1, 2], [9, 5]) == -1


def test_rank_agreement_of_panels_in_a_compare():
    def panel(a, b, c):
        return {"panel": {"A": {"score": a}, "B": {"score": b}, "C": {"score": c}}}

    # Three policies: A and B rank them 1 < 2 < 3; C ranks the first two the other way.
    runs = {"p1": panel(10, 20, 30), "p2": panel(20, 40, 25), "p3": panel(30, 60, 50)}
    assert rank_agreement(runs) == [
        {"simulators": ["A", "B"], "kendall_tau": 1.0},
        {"simulators": ["A", "C"], "kendall_tau": pytest.approx(1 / 3)},
        {"simulators": ["B", "C"], "kendall_tau": pytest.approx(1 / 3)}]
    assert rank_agreement({"p1": panel(1, 2, 3), "plain": {"score": 5}}) == []  # not every run is a panel
