"""The one OpenAI-compatible client against the scripted server: retries, refusals with their
hints, timeouts; and the simulator, the policy under test and the LLM judge all go through it."""

import ast
import asyncio
import json
import logging
import pathlib
import socket
import threading
import time

import httpx
import openai
import pytest

from configs.simulator import get_simulator_config
from rlver_jax import simulator
from rlver_jax.engines.seam import TurnRequest
from rlver_jax.eval.llm_judge import Judge, JudgeSettings
from rlver_jax.inflight import EndpointBound, activity, aimd
from rlver_jax.llm_client import (
    ChatClient,
    ClientSettings,
    EndpointUnavailableError,
    RequestRejectedError,
    check_chat_endpoint,
)
from rlver_jax.rollout.served_policy import OpenAIPolicy
from rlver_jax.testing.scripted_server import Reply, ScriptedServer, route

REPO = pathlib.Path(__file__).resolve().parents[1]
HELLO = [{"role": "user", "content": "hello"}]
RATING = json.dumps({"scores": {k: 4 for k in ("empathy_depth", "insight", "solution_crafting",
                                                "dialogue_guidance", "style_adaptability")},
                     "strategies": [["question"]]})


def _settings(url, **overrides):
    fields = dict(name="policy endpoint", flag_prefix="--config.policy.", base_url=url, model="served",
                  api_key_env="TEST_KEY", timeout_s=5.0, max_concurrency=4, max_retries=3,
                  backoff_initial_s=0.001, backoff_max_s=0.01)
    return ClientSettings(**{**fields, **overrides})


def _complete(settings):
    async def run():
        client = ChatClient(settings)
        try:
            return await client.complete(HELLO, temperature=0.0, max_tokens=8)
        finally:
            await client.aclose()
    return asyncio.run(run())


def test_a_500_is_retried_after_a_backoff_then_the_answer_is_used():
    with ScriptedServer(lambda r: "hi there", fail_statuses=[500]) as server:
        start = time.perf_counter()
        answer = _complete(_settings(server.base_url, backoff_initial_s=0.2, backoff_max_s=1.0))
        elapsed = time.perf_counter() - start
        assert len(server.requests) == 2
        assert server.requests[1]["messages"] == HELLO and server.requests[1]["model"] == "served"
    assert (answer.text, answer.finish_reason) == ("hi there", "stop")
    assert elapsed >= 0.5 * 0.2  # the first wait: 0.2 s scaled by a jitter in [0.5, 1]


@pytest.mark.parametrize("body,answer", [
    ({"choices": []}, ("", None)),
    ({"choices": [{"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "length"}]},
     ("", "length")),
    ({"choices": [{"message": {"content": "a"}, "finish_reason": "stop"}, {"message": {"content": "b"}}]},
     ("a", "stop")),
])
def test_the_first_choice_is_the_answer(body, answer):
    with ScriptedServer(lambda r: Reply(body=body)) as server:
        completion = _complete(_settings(server.base_url))
    assert (completion.text, completion.finish_reason) == answer


@pytest.mark.parametrize("body", ["<html>Sign in to the proxy</html>", {"data": []}, {"choices": "none"}])
def test_a_body_that_is_no_chat_completion_stops_with_the_fix(body):
    with ScriptedServer(lambda r: Reply(body=body)) as server:
        with pytest.raises(EndpointUnavailableError, match="no chat completion.*--config.policy.base_url"):
            _complete(_settings(server.base_url))
        assert len(server.requests) == 1  # not retried: the same server answers the same way


def test_408_409_and_5xx_are_retried_until_the_retries_run_out():
    with ScriptedServer(lambda r: "ok", fail_statuses=[408, 409, 500, 507]) as server:
        assert _complete(_settings(server.base_url, max_retries=4)).text == "ok"
        assert len(server.requests) == 5
    with ScriptedServer(lambda r: "ok", fail_statuses=[500] * 3) as server:
        with pytest.raises(EndpointUnavailableError, match="policy endpoint at .* failed 3 times; last error"):
            _complete(_settings(server.base_url, max_retries=2))
        assert len(server.requests) == 3


def test_429_and_502_to_504_are_waited_for_beyond_max_retries():
    """Throttled or behind a proxy whose server is gone: an outage (tests/outage_test.py), whatever
    max_retries says."""
    with ScriptedServer(lambda r: "ok", fail_statuses=[429, 502, 503, 504, 503]) as server:
        assert _complete(_settings(server.base_url, max_retries=0)).text == "ok"
        assert len(server.requests) == 6


@pytest.mark.parametrize("status,hint", [
    (401, r"Put the key in the environment variable \$TEST_KEY \(named by --config.policy.api_key_env\)"),
    (403, r"Put the key in the environment variable \$TEST_KEY"),
    (404, r"Check --config.policy.model \('served'\) and --config.policy.base_url"),
    (400, r"Check --config.policy.model \('served'\) and the API key in \$TEST_KEY"),
])
def test_client_errors_stop_at_once_with_the_fix(status, hint):
    with ScriptedServer(lambda r: "never", fail_statuses=[status]) as server:
        with pytest.raises(EndpointUnavailableError, match=f"refused the request with HTTP {status}: .*{hint}"):
            _complete(_settings(server.base_url))
        assert len(server.requests) == 1  # not retried


def test_the_semaphore_bounds_requests_in_flight():
    async def run(settings):
        client = ChatClient(settings)
        await asyncio.gather(*(client.complete(HELLO, temperature=0.0, max_tokens=8) for _ in range(10)))
        await client.aclose()

    with ScriptedServer(lambda r: "ok", delay_s=0.05) as server:
        asyncio.run(run(_settings(server.base_url, max_concurrency=3)))
        assert 2 <= server.peak_in_flight <= 3 and len(server.requests) == 10


def test_settings_out_of_range_name_the_flag():
    with pytest.raises(ValueError, match="config.policy.max_concurrency=0 must be >= 1"):
        _settings("http://x", max_concurrency=0)
    with pytest.raises(ValueError, match="config.policy.max_retries=-1 must be >= 0"):
        _settings("http://x", max_retries=-1)


def test_endpoint_check():
    with ScriptedServer(lambda r: "ok", model="served") as server:
        check_chat_endpoint(_settings(server.base_url))
        with pytest.raises(EndpointUnavailableError,
                           match=r"serves \['served'\], not --config.policy.model='other'"):
            check_chat_endpoint(_settings(server.base_url, model="other"))
        dead = server.base_url
    with pytest.raises(EndpointUnavailableError,
                       match="no server answers at --config.policy.base_url=.*Start an OpenAI-compatible server"):
        check_chat_endpoint(_settings(dead))


# ----------------------------------------------------------------------------- every caller uses it

def test_only_the_client_module_constructs_an_openai_client():
    constructors = {"OpenAI", "AsyncOpenAI"}
    found = []
    for path in sorted((REPO / "rlver_jax").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in constructors:
                    found.append(path.relative_to(REPO).as_posix())
    assert sorted(set(found)) == ["rlver_jax/llm_client.py"]


def _simulator_turn(url, **overrides):
    cfg = get_simulator_config()
    cfg.update(base_url=url, backoff_initial_s=0.001, api_key_env="TEST_KEY", **overrides)
    profile = next(p for p in simulator.load_profiles() if p.language == "en")

    async def run():
        async with simulator.build_simulator(simulator.SimulatorSettings.from_config(cfg)) as sim:
            return await sim.respond(await sim.start(profile), "That sounds hard.")
    return asyncio.run(run())


def _policy_turn(url):
    policy = OpenAIPolicy(_settings(url), temperature=0.3, max_tokens=16)

    async def run():
        try:
            return await policy.act([TurnRequest(prompt_ids=None, messages=HELLO, max_new_tokens=8)])
        finally:
            await policy.aclose()
    return asyncio.run(run())


def _judge_rating(url):
    judge = Judge(JudgeSettings(base_url=url, model="served", api_key_env="TEST_KEY", backoff_initial_s=0.001))
    transcript = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}

    async def run():
        try:
            return await judge.rate(transcript)
        finally:
            await judge.aclose()
    return asyncio.run(run())


def test_simulator_policy_and_judge_retry_a_500_through_the_client():
    script = route(emotion=lambda r: "Feeling: better\nChange: +4", reply=lambda r: "Response: Thanks.")
    with ScriptedServer(script, fail_statuses=[500]) as server:
        state = _simulator_turn(server.base_url)
        assert len(server.requests) == 1 + 2  # the failed emotion step, its retry, the reply step
    assert state.emotion == 34

    with ScriptedServer(lambda r: "I hear you.", fail_statuses=[500], model="served") as server:
        [turn] = _policy_turn(server.base_url)
        assert len(server.requests) == 2
        assert server.requests[1]["max_tokens"] == 8 and server.requests[1]["temperature"] == 0.3
    assert (turn.text, turn.stopped) == ("I hear you.", True)

    with ScriptedServer(lambda r: RATING, fail_statuses=[500], model="served") as server:
        record = _judge_rating(server.base_url)
        assert len(server.requests) == 2
    assert record["error"] is None and record["scores"]["insight"] == 4 and record["attempts"] == 1


def test_simulator_policy_and_judge_stop_on_401_with_the_key_hint():
    with ScriptedServer(lambda r: "x", fail_statuses=[401]) as server:
        with pytest.raises(simulator.SimulatorUnavailableError,
                           match=r"simulator at .*HTTP 401.*\$TEST_KEY \(named by --config.simulator.api_key_env\)"):
            _simulator_turn(server.base_url)
    with ScriptedServer(lambda r: "x", fail_statuses=[401]) as server:
        with pytest.raises(EndpointUnavailableError,
                           match=r"policy endpoint at .*HTTP 401.*\$TEST_KEY \(named by --config.policy.api_key_env\)"):
            _policy_turn(server.base_url)
    with ScriptedServer(lambda r: "x", fail_statuses=[401]) as server:
        with pytest.raises(EndpointUnavailableError,
                           match=r"judge at .*HTTP 401.*\$TEST_KEY \(named by --api_key_env\)"):
            _judge_rating(server.base_url)
    assert issubclass(simulator.SimulatorUnavailableError, EndpointUnavailableError)


# ----------------------------------------------------------------------------- faults: issue 18

@pytest.mark.parametrize("status", [400, 413, 422])
def test_a_refusal_of_the_request_is_its_own_error(status):
    with ScriptedServer(lambda r: "never", fail_statuses=[status]) as server:
        with pytest.raises(RequestRejectedError, match=f"HTTP {status}: .*Only this request was refused") as info:
            _complete(_settings(server.base_url))
        assert len(server.requests) == 1
    assert info.value.status == status and isinstance(info.value, EndpointUnavailableError)


def test_a_server_without_the_chat_api_is_told_at_once():
    with ScriptedServer(lambda r: "never", fail_statuses=[501]) as server:
        with pytest.raises(EndpointUnavailableError, match="HTTP 501: .*does not implement the OpenAI chat API"):
            _complete(_settings(server.base_url, max_retries=5))
        assert len(server.requests) == 1  # not retried for a minute


def test_the_simulator_marks_the_dialogue_of_a_refused_request_and_goes_on():
    script = route(emotion=lambda r: "Feeling: better\nChange: +4", reply=lambda r: "Response: Thanks.")
    with ScriptedServer(script, fail_statuses=[400]) as server:
        state = _simulator_turn(server.base_url)
        assert len(server.requests) == 1  # not retried, not re-sampled
    assert (state.done, state.end_reason) == (True, "simulator_error")
    assert "HTTP 400" in state.error and state.records[-1].error == state.error
    with ScriptedServer(script) as server:  # the next dialogue runs as usual
        assert _simulator_turn(server.base_url).emotion == 34


def test_retries_are_logged_once_per_interval(caplog):
    with ScriptedServer(lambda r: "ok", fail_statuses=[500, 507, 500]) as server:
        with caplog.at_level(logging.WARNING, logger="rlver_jax.llm_client"):
            assert _complete(_settings(server.base_url, max_retries=3)).text == "ok"
    [line] = [r.getMessage() for r in caplog.records if "retried" in r.getMessage()]  # 3 retries, one line in 30 s
    assert "policy endpoint at" in line and "1 request(s) retried" in line and "HTTP 500" in line


def test_clients_of_equal_settings_share_one_bound_across_event_loops():
    def run(client):
        async def many():
            await asyncio.gather(*(client.complete(HELLO, temperature=0.0, max_tokens=8) for _ in range(6)))
            await client.aclose()
        asyncio.run(many())

    with ScriptedServer(lambda r: "ok", delay_s=0.05) as server:
        clients = [ChatClient(_settings(server.base_url, max_concurrency=2)) for _ in range(2)]
        threads = [threading.Thread(target=run, args=(c,)) for c in clients]  # two loops, as training and its
        for t in threads:                                                     # in-loop evaluation
            t.start()
        for t in threads:
            t.join()
        assert len(server.requests) == 12 and server.peak_in_flight == 2
        assert "policy endpoint 0 in flight, 12 done" in activity()


def test_a_lone_surrogate_is_sent_as_a_replacement_character():
    with ScriptedServer(lambda r: "ok") as server:
        settings = _settings(server.base_url)

        async def run():
            client = ChatClient(settings)
            await client.complete([{"role": "user", "content": "half \ud83d an emoji"}], temperature=0.0,
                                  max_tokens=8)
            await client.aclose()
        asyncio.run(run())
        assert server.requests[0]["messages"][0]["content"] == "half \ufffd an emoji"


def test_the_start_up_check_tells_slow_from_down(caplog):
    busy = socket.socket()  # listens, never answers: a server busy with other requests
    busy.bind(("127.0.0.1", 0))
    busy.listen(8)
    url = f"http://127.0.0.1:{busy.getsockname()[1]}/v1"
    try:
        with caplog.at_level(logging.WARNING, logger="rlver_jax.llm_client"):
            check_chat_endpoint(_settings(url, timeout_s=0.5))  # a warning, not an error
        assert "did not answer GET /models within 0.5 s: it is up but busy" in caplog.text
    finally:
        busy.close()
    with pytest.raises(EndpointUnavailableError, match=r"no server answers at .*\(.*[Cc]onnection refused"):
        check_chat_endpoint(_settings(url))


# ----------------------------------------------------------------------------- adaptive concurrency: issue 30

def test_aimd_halves_what_was_in_flight_and_grows_back_by_one_per_bound_of_answers():
    # (requests in flight, congested) -> the bound, by hand: halve min(bound, in flight), floor 1;
    # an answer adds 1/bound, ceiling 3.
    steps = [((3, False), 3.0), ((3, True), 1.5), ((1, True), 1.0), ((1, False), 2.0), ((2, False), 2.5),
             ((2, False), 2.9), ((3, False), 3.0), ((2, True), 1.0)]
    limit = 3.0
    for (in_flight, congested), expected in steps:
        limit = aimd(limit, in_flight, 3, congested)
        assert limit == pytest.approx(expected)
    assert aimd(64.0, 16, 64, True) == 8.0  # 16 sent of 64 allowed: 8, not 32


def _timeout():
    return openai.APITimeoutError(request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"))


def test_a_burst_of_timeouts_halves_the_bound_once_and_later_ones_again(caplog):
    limit = EndpointBound(_settings("http://127.0.0.1:1/v1", max_concurrency=8))

    async def time_out():
        async with limit.slot():
            await asyncio.sleep(0.01)  # all in flight together
            raise _timeout()

    async def burst(n):
        results = await asyncio.gather(*(time_out() for _ in range(n)), return_exceptions=True)
        assert all(isinstance(r, openai.APITimeoutError) for r in results)

    with caplog.at_level(logging.WARNING, logger="rlver_jax.inflight"):
        asyncio.run(burst(8))
        assert limit.limit == 4.0  # the 7 timeouts after the first were sent under the old bound
        asyncio.run(burst(3))
        assert limit.limit == 1.5  # sent after the halving: min(4, 3) / 2
    assert limit.in_flight == 0 and limit.answered == 0
    [line] = [r.getMessage() for r in caplog.records]  # the second change falls within the log interval
    assert "now at most 4 request(s) in flight (was 8; --config.policy.max_concurrency=8)" in line


def test_a_retry_waits_a_jittered_doubling_backoff():
    client = ChatClient(_settings("http://127.0.0.1:1/v1", backoff_initial_s=0.1, backoff_max_s=1.0))
    assert all(0.05 <= client._backoff_s(0) <= 0.1 for _ in range(20))
    assert all(0.2 <= client._backoff_s(2) <= 0.4 for _ in range(20))
    assert all(0.5 <= client._backoff_s(6) <= 1.0 for _ in range(20))  # capped at backoff_max_s


@pytest.mark.parametrize("module", ["llm_client", "inflight"])
def test_every_function_that_calls_openai_imports_it(module):
    """rlver_jax.llm_client (and the bound it sends under, rlver_jax.inflight) imports openai lazily
    (a config check imports the module without it): a function that uses `openai.` at run time
    without its own `import openai` would fail with a NameError only when it runs. Read from the
    source (annotations aside)."""
    import ast
    import importlib
    import inspect

    tree = ast.parse(inspect.getsource(importlib.import_module(f"rlver_jax.{module}")))
    annotations = {id(n) for a in ast.walk(tree) if isinstance(a, ast.AnnAssign) for n in ast.walk(a.annotation)}
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = ast.Module(body=node.body, type_ignores=[])
            uses = any(isinstance(n, ast.Name) and n.id == "openai" and id(n) not in annotations
                       for n in ast.walk(body))
            imports = any(isinstance(n, ast.Import) and any(a.name == "openai" for a in n.names) for n in node.body)
            if uses and not imports:
                missing.append(node.name)
    assert not missing, missing
