"""A server that is down, throttled or slow (rlver_jax.outage, rlver_jax.llm_client): the outage's
clock by hand, then the client against the scripted server going down, answering 429 with
Retry-After, and answering ten times slower, in seconds; an evaluation whose simulator stays down
past its budget. (Whole training runs under the same faults: tests/simulator_outage_test.py.)"""

import asyncio
import logging
import re
import socket
import threading
import time

import pytest

from rlver_jax import llm_client
from rlver_jax.cli import program
from rlver_jax.eval.benchmark import run_benchmark
from rlver_jax.eval.spec import EvalSpec
from rlver_jax.files import read_jsonl
from rlver_jax.inflight import shared_bound
from rlver_jax.llm_client import ChatClient, ClientSettings, EndpointUnavailableError, OutageError, check_chat_endpoint
from rlver_jax.outage import Outage, backoff_s, retry_after_s, span
from rlver_jax.simulator import SimulatorOutageError
from rlver_jax.testing.scripted_server import ScriptedServer
from tests.eval_test import EXPECTED
from tests.fixtures_eval import Servers, config_urls, profiles_file

HELLO = [{"role": "user", "content": "hello"}]


def _settings(url="http://127.0.0.1:1/v1", **overrides):
    fields = dict(name="simulator", flag_prefix="--config.simulator.", base_url=url, model="served",
                  api_key_env="TEST_KEY", timeout_s=5.0, max_concurrency=4, max_retries=0,
                  backoff_initial_s=0.05, backoff_max_s=0.2, outage_budget_s=30.0)
    return ClientSettings(**{**fields, **overrides})


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _outage(clock, **overrides):
    return Outage(_settings(**{"backoff_initial_s": 1.0, "backoff_max_s": 30.0, "outage_budget_s": 600.0,
                               **overrides}), clock=clock, jitter=lambda: 1.0)


def test_retry_after_in_seconds_milliseconds_or_a_date():
    now = 1_700_000_000.0
    assert retry_after_s({"Retry-After": "20"}, now) == 20.0
    assert retry_after_s({"retry-after-ms": "1500", "Retry-After": "20"}, now) == 1.5  # OpenAI's, preferred
    assert retry_after_s({"Retry-After": "Tue, 14 Nov 2023 22:13:40 GMT"}, now) == pytest.approx(20.0)
    assert retry_after_s({"Retry-After": "-3"}, now) == 0.0
    assert retry_after_s({"Retry-After": "soon"}, now) is None and retry_after_s({}, now) is None


def test_spans_read_as_a_person_says_them():
    assert [span(s) for s in (0.34, 45, 151, 1800, 3900)] == ["0.3 s", "45 s", "2 min 31 s", "30 min", "1 h 05 min"]


def test_the_gate_backs_off_doubling_to_the_cap_and_tries_last_at_the_budgets_end(caplog):
    clock = _Clock()
    outage = _outage(clock, outage_budget_s=100.0)
    with caplog.at_level(logging.WARNING, logger="rlver_jax.outage"):
        outage.failed("connection refused", None, sent_at=clock.now - 1)  # in flight when the server went
        assert outage.down and outage.wait_s() == backoff_s(0, 1.0, 30.0) == 1.0
        waits = []
        for _ in range(6):  # each try after the gate opened fails again
            clock.now += outage.wait_s()
            outage.failed("connection refused", None, sent_at=clock.now)
            waits.append(outage.wait_s())
        assert waits == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]  # doubling, capped at backoff_max_s
        clock.now += 30.0  # 91 s into the outage: the next try is at its budget's end, not 30 s later
        outage.failed("connection refused", None, sent_at=clock.now)
        assert outage.wait_s() == pytest.approx(9.0) and outage.exhausted() is None
        clock.now += 9.0
        outage.failed("connection refused", None, sent_at=clock.now)
        why = outage.exhausted()
    assert why == ("simulator at http://127.0.0.1:1/v1 did not answer for 1 min 40 s, the outage budget "
                   "(config.simulator.outage_budget_s=100); last error: connection refused")
    [first] = [r.getMessage() for r in caplog.records]  # said once: what it waits for and how long
    assert "is down or throttled (connection refused): waiting for it up to 1 min 40 s " \
           "(config.simulator.outage_budget_s=100)" in first


def test_a_retry_after_is_the_gate_and_one_past_the_budget_ends_the_wait_at_once():
    clock = _Clock()
    outage = _outage(clock)
    outage.failed("HTTP 429: rate limited", 20.0, sent_at=clock.now)
    assert outage.wait_s() == 20.0 and outage.exhausted() is None
    clock.now += 5
    outage.failed("HTTP 429: rate limited", None, sent_at=clock.now - 6)  # one sent before: the gate stays
    assert outage.wait_s() == 15.0
    clock.now += 15
    outage.failed("HTTP 429: daily quota", 86400.0, sent_at=clock.now)
    assert outage.exhausted().startswith("simulator at http://127.0.0.1:1/v1 asks to wait 24 h 00 min more "
                                         "(Retry-After), past the outage budget (config.simulator.outage_budget_s=600")


def test_a_line_every_few_minutes_while_down_and_one_when_it_answers(caplog):
    clock = _Clock()
    outage = _outage(clock)
    with caplog.at_level(logging.WARNING, logger="rlver_jax.outage"):
        outage.failed("HTTP 503: loading", None, sent_at=clock.now)
        for _ in range(30):  # 5 minutes in 10 s steps
            clock.now += 10
            outage.report()
        outage.answered(sent_at=clock.now - 400)  # taken before the outage: the server finished it, no more
        assert outage.down
        outage.answered(sent_at=clock.now - 1)
        assert not outage.down and outage.wait_s() == 0.0 and outage.exhausted() is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4  # the first, two reports (at 2 and 4 minutes), the answer
    assert "still down or throttled after 2 min (last error: HTTP 503: loading); waiting up to 8 min more" in lines[1]
    assert lines[3] == "simulator at http://127.0.0.1:1/v1 answers again after 5 min down or throttled; going on"


def _many(settings, n):
    async def run():
        client = ChatClient(settings)
        try:
            return await asyncio.gather(*(client.complete(HELLO, temperature=0.0, max_tokens=8) for _ in range(n)))
        finally:
            await client.aclose()
    return asyncio.run(run())


def test_a_server_that_restarts_is_waited_for_and_each_request_answered_once():
    with ScriptedServer(lambda r: "back", delay_s=0.05) as server:
        settings = _settings(server.base_url, outage_budget_s=20.0)
        server.down(0.8)
        start = time.perf_counter()
        answers = _many(settings, 4)
        assert time.perf_counter() - start >= 0.7
        assert [a.text for a in answers] == ["back"] * 4 and len(server.requests) == 4
    assert not shared_bound(settings).outage.down


def test_no_request_is_sent_inside_a_retry_after_window():
    with ScriptedServer(lambda r: "ok", delay_s=0.05) as server:
        settings = _settings(server.base_url, outage_budget_s=20.0, max_concurrency=8)
        server.throttle(1.2, retry_after_s=0.5)
        answers = _many(settings, 8)
        assert [a.text for a in answers] == ["ok"] * 8
        assert len(server.throttled) >= 2  # throttled at first, tried again after each window
        for sent, retry_after in server.throttled:
            # Nothing arrives in a window but what was sent before its 429 came back (a few ms).
            inside = [t for t in server.arrivals if sent + 0.2 < t < sent + retry_after - 0.01]
            assert not inside, (sent, retry_after, server.arrivals)
        # While throttled, one request at a time tries: a 429 per window, not one per request.
        assert len(server.throttled) <= 8 + 1.2 / 0.5 + 1


def test_past_the_budget_the_wait_ends_with_exit_status_75():
    with ScriptedServer(lambda r: "late") as server:
        server.down(10.0)
        start = time.perf_counter()
        with pytest.raises(OutageError, match=r"simulator at .* did not answer for 1\.\d s, the outage budget "
                                              r"\(config\.simulator\.outage_budget_s=1\.2\); last error: connection"):
            _many(_settings(server.base_url, outage_budget_s=1.2), 2)
        assert 1.1 < time.perf_counter() - start < 5
    assert OutageError.exit_status == 75
    with ScriptedServer(lambda r: "never") as server:
        server.throttle(10.0, retry_after_s=3600)
        with pytest.raises(OutageError, match=r"asks to wait 1 h 00 min more \(Retry-After\), past the outage"):
            _many(_settings(server.base_url, outage_budget_s=60.0), 1)
        assert len(server.throttled) == 1  # not asked again


def test_slow_is_not_down_a_request_is_waited_for_and_never_sent_twice(caplog):
    with ScriptedServer(lambda r: "slow but sure", delay_s=0.2) as server:
        settings = _settings(server.base_url, timeout_s=0.8, max_concurrency=4)
        server.slow_down(1.0, factor=10)  # 2 s an answer, past timeout_s
        with caplog.at_level(logging.WARNING):
            answers = _many(settings, 4)
        assert [a.text for a in answers] == ["slow but sure"] * 4
        assert len(server.requests) == 4  # none sent again
    assert "it is slow, not down: the request waits on (not sent twice)" in caplog.text
    assert "now at most 2 request(s) in flight (was 4" in caplog.text  # fewer sent meanwhile


def test_a_server_that_answers_nothing_is_down(monkeypatch):
    monkeypatch.setattr(llm_client, "_ALIVE_MIN_S", 0.4)  # asked whether it is there: 0.4 s (5 s at least in runs)
    silent = socket.socket()  # takes connections, answers nothing: a hung server
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        with pytest.raises(OutageError, match=r"did not answer for .*last error: no answer within 0\.\d s, and none "
                                              r"to GET /models either"):
            _many(_settings(url, timeout_s=0.4, outage_budget_s=0.3), 1)
    finally:
        silent.close()


def test_a_rerun_waits_at_start_up_for_a_simulator_still_down():
    with ScriptedServer(lambda r: "ok", model="served") as server:
        server.down(1.0)
        with pytest.raises(EndpointUnavailableError, match="no server answers at --config.simulator.base_url="):
            check_chat_endpoint(_settings(server.base_url))  # a first start: a wrong address is said at once
        start = time.perf_counter()
        check_chat_endpoint(_settings(server.base_url), wait=True)  # a rerun: it waits for the server
        assert time.perf_counter() - start > 0.5
        server.down(5.0)
        with pytest.raises(OutageError, match=r"did not answer for 0\.\d s, the outage budget"):
            check_chat_endpoint(_settings(server.base_url, outage_budget_s=0.5), wait=True)


def test_an_evaluation_past_its_budget_keeps_its_finished_dialogues_and_resumes_from_them(tmp_path):
    """The Sentient benchmark of four scripted profiles (tests/fixtures_eval.py: P4 ends after 2
    replies, P2 after 4, P1 after 6, P3 after 10): the simulator goes down for good once two
    dialogues are saved; past a budget of 1 s the evaluation stops (exit status 75) with them kept,
    and the rerun plays the other two, to the scores the hand computed (tests/eval_test.py)."""
    workdir, profiles = tmp_path / "eval", profiles_file(tmp_path)
    transcripts = workdir / "transcripts.jsonl"
    with Servers() as servers:
        servers.simulator.delay_s = 0.05  # P1 and P3 still have a second of turns to go when P2 ends
        config = config_urls(workdir, servers.policy.base_url, servers.simulator.base_url, profiles,
                             **{"simulator.outage_budget_s": 1.0})

        def after_two_saved():
            while not transcripts.exists() or len(transcripts.read_text().splitlines()) < 2:
                time.sleep(0.01)
            servers.simulator.down(60.0)

        threading.Thread(target=after_two_saved, daemon=True).start()
        with pytest.raises(SimulatorOutageError) as stopped:
            run_benchmark(EvalSpec.from_config(config), progress=False)
    assert program.exit_status(stopped.value) == 75
    assert re.search(r"simulator at \S+ did not answer for 1\.\d s, the outage budget \(config\.simulator\."
                     r"outage_budget_s=1\); last error: connection failed", str(stopped.value)), stopped.value
    assert str(stopped.value).endswith(f"The finished dialogues are saved in {transcripts}; rerun the same command "
                                       "to resume.")
    kept = {r["profile_id"] for r in read_jsonl(transcripts)}
    assert kept == {"id-P4", "id-P2"}
    with Servers() as servers:  # back, at another address (not part of the set-up)
        config = config_urls(workdir, servers.policy.base_url, servers.simulator.base_url, profiles)
        summary = run_benchmark(EvalSpec.from_config(config), progress=False)
        assert servers.policy_requests("P4") == servers.policy_requests("P2") == 0  # not played again
    assert summary["per_profile"] == [{"id": f"id-{n}", "final_emotion": e, "turns": t, "end_reason": r}
                                      for n, (e, t, r) in EXPECTED.items()]
