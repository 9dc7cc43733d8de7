"""A scripted OpenAI-compatible HTTP server for tests and benchmarks (stdlib only).

Tests and benchmarks run the real `openai` client against it, playing the simulator, the policy or
both:

    def script(request: dict) -> str | Reply:     # request: the JSON body of the POST
        return "Intent: ...\\nChange: +3"

    with ScriptedServer(script, delay_s=0.2, fail_statuses=[500, 503]) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x")
        ...
        server.requests      # every chat request body, in arrival order
        server.arrivals      # their time.perf_counter() on arrival
        server.peak_in_flight

Endpoints: POST /v1/chat/completions (answers `n` choices, one script call each), GET /health,
GET /v1/models. Per request, in arrival order: the first len(fail_statuses) requests are answered
with those HTTP statuses (an OpenAI-style error body) without calling the script; the first
len(delays) requests sleep delays[i] seconds first; every request sleeps `delay_s`; the script
may return a Reply to set the status, add a delay or send a body of its own for that answer. An exception in the script
becomes an HTTP 500 and is kept in `server.errors`.

Faults of a served simulator, from any thread while it serves (tests/outage_test.py):
`down(for_s)` goes away for that long (connections refused, those open dropped, the requests in
work lost; `downtimes` records when) and comes back on the same port (`answered` lists the chat
requests, by index, whose answers were sent whole: a request answered twice shows there); `throttle(for_s,
retry_after_s)` answers every chat request HTTP 429 with a Retry-After header for that long
(`throttled` records when each was sent and the seconds it asked); `slow_down(for_s, factor)`
makes `delay_s` that many times longer for the requests arriving in that time. `at_request(n,
fault)` runs `fault()` (one of those) as the n-th chat request arrives, before it is answered.

`one_at_a_time=True` serves as llama-cpp-python's server does: one request at a time, in arrival
order, the others queued; a request whose client gave up (a timeout) is still worked on, since
the server cannot cancel it. `server.peak_in_flight` then counts the queued ones too.

`route(emotion=..., reply=..., policy=...)` builds a script that tells the simulator's two kinds
of request apart by their system prompt (the emotion step asks for a `Change:` line, the reply
and opening steps for a `Response:` line), answers the simulator's start-up probe (any other
request with a `response_format`) with a JSON utterance, and sends anything else to `policy`. `echoing(script)`
wraps an emotion-step script like a simulator model that repeats the reply it judges (as the
prompt quotes it, without the "> " markers) before and after its own answer.

Structured outputs, `response_format=`: "pass" (default) hands the request to the script as it
is; "validate" acts as a server that enforces the request's JSON schema: the schema must use only
the keywords servers commonly support (SCHEMA_KEYWORDS) and the script's answer must validate,
else HTTP 500 and an entry in `errors`; "reject" answers every request that carries
`response_format` with HTTP 400 "Invalid parameter: 'response_format' ..." (as OpenAI does for a
model without structured outputs) and `rejected` counts them; "json_object" acts as
llama-cpp-python's server: a request of type `json_schema` gets HTTP 500 with a validation error
naming `response_format` (counted in `rejected`), one of type `json_object` with a `schema` goes to
the script.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Reply:
    """A scripted answer with control over the HTTP status and timing."""

    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    body: Any = None  # when set, the whole response body instead of a chat completion (a str as text)


Script = Callable[[dict[str, Any]], "str | Reply"]


def system_prompt(request: dict[str, Any]) -> str:
    """The text of the request's system message(s)."""
    return "\n".join(m.get("content") or "" for m in request.get("messages", [])
                     if m.get("role") == "system")


def quoted_reply(request: dict[str, Any]) -> str:
    """The newest policy reply as the emotion-step prompt quotes it (the last run of "> " lines of
    the user message), markers removed."""
    runs: list[list[str]] = [[]]
    for line in request["messages"][-1]["content"].splitlines():
        if line.startswith(">"):
            runs[-1].append(line[2:])
        elif runs[-1]:
            runs.append([])
    return "\n".join(next(run for run in reversed(runs) if run))


def echoing(script: Script) -> Script:
    """An emotion-step script that repeats the quoted reply before and after its own answer."""
    def echo(request: dict[str, Any]) -> str:
        reply = quoted_reply(request)
        return f"{reply}\n{script(request)}\n{reply}"
    return echo


SCHEMA_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "minimum", "maximum"})
_JSON_TYPES = {"object": dict, "string": str, "integer": int}


def schema_errors(instance: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Why `instance` does not validate against `schema` (the SCHEMA_KEYWORDS subset of JSON
    Schema); an empty list when it does."""
    if unknown := set(schema) - SCHEMA_KEYWORDS:
        return [f"{where}: unsupported schema keywords {sorted(unknown)}"]
    kind = _JSON_TYPES.get(schema.get("type"))
    if kind is None:
        return [f"{where}: unsupported type {schema.get('type')!r}"]
    if not isinstance(instance, kind) or isinstance(instance, bool):
        return [f"{where}: {instance!r} is not of type {schema['type']}"]
    errors = []
    if "minimum" in schema and instance < schema["minimum"]:
        errors.append(f"{where}: {instance} < minimum {schema['minimum']}")
    if "maximum" in schema and instance > schema["maximum"]:
        errors.append(f"{where}: {instance} > maximum {schema['maximum']}")
    if kind is dict:
        properties = schema.get("properties", {})
        errors += [f"{where}: missing {k!r}" for k in schema.get("required", []) if k not in instance]
        if schema.get("additionalProperties") is False:
            errors += [f"{where}: unexpected {k!r}" for k in instance if k not in properties]
        for k, sub in properties.items():
            if k in instance:
                errors += schema_errors(instance[k], sub, f"{where}.{k}")
    return errors


def route(*, emotion: Script | None = None, reply: Script | None = None,
          policy: Script | None = None) -> Script:
    """A script dispatching simulator emotion-step, reply/opening-step and other requests."""

    def script(request: dict[str, Any]) -> str | Reply:
        system = system_prompt(request)
        if "Change:" in system:
            handler, kind = emotion, "emotion-step"
        elif "Response:" in system:
            handler, kind = reply, "reply-step"
        elif request.get("response_format") is not None:  # the simulator's start-up probe
            return json.dumps({"reasoning": "", "utterance": "ok"})
        else:
            handler, kind = policy, "policy"
        if handler is None:
            raise AssertionError(f"no script for {kind} requests")
        return handler(request)

    return script


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body in one segment, sent at once: otherwise Nagle's algorithm and delayed
    # ACKs add ~40 ms to every keep-alive request.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> bool:
        """Whether the answer was sent whole."""
        data = (body if isinstance(body, str) else json.dumps(body)).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type",
                             "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # broken pipe, reset
            return False  # the client gave up (a timeout test), or the server went down; nothing to answer
        return True

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, "OK")
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [
                {"id": self.server.owner.model, "object": "model", "owned_by": "tests"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}", "code": 404}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        self.server.owner._arrived()
        if (throttled := self.server.owner._throttled()) is not None:
            self._send(429, {"error": {"message": "rate limited", "type": "scripted", "code": 429}},
                       {"Retry-After": f"{throttled:g}"})
            return
        owner = self.server.owner
        index, status, body = owner._answer(request)
        if self._send(status, body) and status == 200:
            with owner._lock:
                owner.answered.append(index)


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # do not wait for handlers still sleeping when a test ends
    request_queue_size = 256  # many dialogues connect at once; a short backlog drops SYNs
    owner: ScriptedServer

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.connections: set[Any] = set()  # open connections, dropped when the server goes down
        self.lock = threading.Lock()

    def finish_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.connections.add(request)
        try:
            super().finish_request(request, client_address)
        finally:
            with self.lock:
                self.connections.discard(request)

    def drop_connections(self) -> None:
        with self.lock:
            for connection in self.connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):  # a client gave up: no news
            super().handle_error(request, client_address)


class _Turns:
    """A lock taken in arrival order (threading.Lock promises no order)."""

    def __init__(self):
        self._turn = threading.Condition()
        self._next = self._serving = 0

    def __enter__(self) -> None:
        with self._turn:
            ticket, self._next = self._next, self._next + 1
            self._turn.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc_info: object) -> None:
        with self._turn:
            self._serving += 1
            self._turn.notify_all()


class ScriptedServer:
    """Context manager: serves on 127.0.0.1 at `port` (an ephemeral one by default) in a background thread."""

    def __init__(self, script: Script, *, delay_s: float = 0.0,
                 fail_statuses: Sequence[int] = (), delays: Sequence[float] = (),
                 model: str = "simulator", response_format: str = "pass", one_at_a_time: bool = False,
                 port: int = 0):
        if response_format not in ("pass", "validate", "reject", "json_object"):
            raise ValueError(f"response_format={response_format!r}: use 'pass', 'validate', 'reject' or "
                             "'json_object'")
        self.response_format = response_format
        self.rejected = 0
        self.script = script
        self.delay_s = delay_s
        self.fail_statuses = list(fail_statuses)
        self.delays = list(delays)
        self.model = model
        self.port = port  # 0: an ephemeral one
        self.requests: list[dict[str, Any]] = []
        self.arrivals: list[float] = []
        self.errors: list[BaseException] = []
        self.peak_in_flight = 0
        self.downtimes: list[tuple[float, float]] = []  # (from, to) in time.perf_counter()
        self.answered: list[int] = []  # the indices of the chat requests answered (HTTP 200) and sent whole
        self.throttled: list[tuple[float, float]] = []  # (sent at, Retry-After seconds) of each 429
        self._throttle: tuple[float, float] = (float("-inf"), 0.0)  # (until, Retry-After seconds)
        self._slow: tuple[float, float] = (float("-inf"), 1.0)  # (until, factor)
        self._restart: threading.Timer | None = None
        self._posted = 0  # chat requests arrived, answered or not
        self._faults: dict[int, Callable[[], None]] = {}  # `at_request`
        self._in_flight = 0
        self._lock = threading.Lock()
        self._turns = _Turns() if one_at_a_time else contextlib.nullcontext()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as base_url."""
        return self.url + "/v1"

    def _answer(self, request: dict[str, Any]) -> tuple[int, int, Any]:
        """(the request's index, the status and body of its answer)."""
        with self._lock:
            index = len(self.requests)
            self.requests.append(request)
            self.arrivals.append(time.perf_counter())
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
        try:
            with self._turns:
                return index, *self._work(index, request)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _work(self, index: int, request: dict[str, Any]) -> tuple[int, Any]:
        until, factor = self._slow
        delay_s = self.delay_s * (factor if self.arrivals[index] < until else 1.0)
        time.sleep(delay_s + (self.delays[index] if index < len(self.delays) else 0.0))
        if index < len(self.fail_statuses):
            return self._error(self.fail_statuses[index], "scripted failure")
        if self.response_format == "reject" and request.get("response_format") is not None:
            with self._lock:
                self.rejected += 1
            return self._error(400, "Invalid parameter: 'response_format' of type 'json_schema' is not "
                                    "supported with this model.")
        if self.response_format == "json_object" and (request.get("response_format") or {}).get(
                "type") == "json_schema":
            with self._lock:
                self.rejected += 1
            return self._error(500, "1 validation error for CreateChatCompletionRequest\nresponse_format\n  "
                                    "Input should be a valid dictionary or instance of ResponseFormat")
        choices = []
        for i in range(max(1, int(request.get("n") or 1))):
            try:
                answer = self.script(request)
            except Exception as e:  # surfaced to the test through `errors`
                self.errors.append(e)
                return self._error(500, f"script raised {e!r}")
            if isinstance(answer, str):
                answer = Reply(answer)
            time.sleep(answer.delay_s)
            if answer.status != 200:
                return self._error(answer.status, "scripted status")
            if answer.body is not None:
                return 200, answer.body
            if problem := self._schema_problem(request, answer.content):
                self.errors.append(AssertionError(problem))
                return self._error(500, problem)
            choices.append({"index": i, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": answer.content}})
        return 200, {
            "id": f"chatcmpl-{index}", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model", self.model), "choices": choices,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    def _schema_problem(self, request: dict[str, Any], content: str) -> str:
        """In "validate" mode, what is wrong with the request's schema or the answer under it."""
        fmt = request.get("response_format")
        if self.response_format != "validate" or fmt is None:
            return ""
        if fmt.get("type") != "json_schema" or "schema" not in fmt.get("json_schema", {}):
            return f"response_format {fmt!r} is not a json_schema request"
        try:
            answer = json.loads(content)
        except ValueError as e:
            return f"the scripted answer {content!r} is not JSON: {e}"
        return "; ".join(schema_errors(answer, fmt["json_schema"]["schema"]))

    @staticmethod
    def _error(status: int, message: str) -> tuple[int, Any]:
        return status, {"error": {"message": message, "type": "scripted", "code": status}}

    def at_request(self, n: int, fault: Callable[[], None]) -> None:
        """Run `fault()` (down, throttle, slow_down) as the `n`-th chat request arrives (1-based),
        before it is answered: it is the first the fault meets."""
        self._faults[n] = fault

    def _arrived(self) -> None:
        with self._lock:
            self._posted += 1
            fault = self._faults.pop(self._posted, None)
        if fault is not None:
            fault()

    def _throttled(self) -> float | None:
        """The Retry-After seconds of a 429 for a chat request arriving now, None when not throttled."""
        until, retry_after = self._throttle
        now = time.perf_counter()
        if now >= until:
            return None
        with self._lock:
            self.throttled.append((now, retry_after))
        return retry_after

    def throttle(self, for_s: float, retry_after_s: float) -> None:
        """For `for_s` seconds, answer every chat request HTTP 429 with `Retry-After: retry_after_s`."""
        self._throttle = (time.perf_counter() + for_s, retry_after_s)

    def slow_down(self, for_s: float, factor: float) -> None:
        """For `for_s` seconds, requests arriving take `factor` times delay_s."""
        self._slow = (time.perf_counter() + for_s, factor)

    def down(self, for_s: float) -> None:
        """Go away for `for_s` seconds (a crash and restart): connections are refused, those open
        are dropped with the requests in work; then serve again on the same port."""
        now = time.perf_counter()
        self.downtimes.append((now, now + for_s))
        self._stop()
        self._restart = threading.Timer(for_s, self._start)
        self._restart.daemon = True
        self._restart.start()

    def _start(self) -> None:
        self._httpd = _HTTPServer(("127.0.0.1", self.port), _Handler)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]  # the same port when it comes back
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.05})
        self._thread.start()

    def _stop(self) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.drop_connections()
        self._thread.join()

    def __enter__(self) -> ScriptedServer:
        self._start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._restart is not None:
            self._restart.cancel()
            self._restart.join()
        self._stop()
