"""A scripted OpenAI-compatible HTTP server for tests (stdlib only).

Tests run the real `openai` client against it, playing the simulator, the policy, or both:

    def script(request: dict) -> str | Reply:     # request: the JSON body of the POST
        return "Intent: ...\\nChange: +3"

    with ScriptedServer(script, delay_s=0.2, fail_statuses=[500, 503]) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x")
        ...
        server.requests      # every chat request body, in arrival order
        server.peak_in_flight

Endpoints: POST /v1/chat/completions (answers `n` choices, one script call each), GET /health,
GET /v1/models. Per request, in arrival order: the first len(fail_statuses) requests are answered
with those HTTP statuses (an OpenAI-style error body) without calling the script; the first
len(delays) requests sleep delays[i] seconds first; every request sleeps `delay_s`; the script
may return a Reply to set the status or add a delay for that answer. An exception in the script
becomes an HTTP 500 and is kept in `server.errors`.

`route(emotion=..., reply=..., policy=...)` builds a script that tells the simulator's two kinds
of request apart by their system prompt (the emotion step asks for a `Change:` line, the reply
and opening steps for a `Response:` line) and sends anything else to `policy`.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
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


Script = Callable[[dict[str, Any]], "str | Reply"]


def system_prompt(request: dict[str, Any]) -> str:
    """The text of the request's system message(s)."""
    return "\n".join(m.get("content") or "" for m in request.get("messages", [])
                     if m.get("role") == "system")


def route(*, emotion: Script | None = None, reply: Script | None = None,
          policy: Script | None = None) -> Script:
    """A script dispatching simulator emotion-step, reply/opening-step and other requests."""

    def script(request: dict[str, Any]) -> str | Reply:
        system = system_prompt(request)
        if "Change:" in system:
            handler, kind = emotion, "emotion-step"
        elif "Response:" in system:
            handler, kind = reply, "reply-step"
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

    def _send(self, status: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type",
                             "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to answer

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
        status, body = self.server.owner._answer(request)
        self._send(status, body)


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # do not wait for handlers still sleeping when a test ends
    request_queue_size = 256  # many dialogues connect at once; a short backlog drops SYNs
    owner: ScriptedServer


class ScriptedServer:
    """Context manager: serves on 127.0.0.1 at an ephemeral port in a background thread."""

    def __init__(self, script: Script, *, delay_s: float = 0.0,
                 fail_statuses: Sequence[int] = (), delays: Sequence[float] = (),
                 model: str = "simulator"):
        self.script = script
        self.delay_s = delay_s
        self.fail_statuses = list(fail_statuses)
        self.delays = list(delays)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []
        self.peak_in_flight = 0
        self._in_flight = 0
        self._lock = threading.Lock()
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

    def _answer(self, request: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            index = len(self.requests)
            self.requests.append(request)
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
        try:
            time.sleep(self.delay_s + (self.delays[index] if index < len(self.delays) else 0.0))
            if index < len(self.fail_statuses):
                return self._error(self.fail_statuses[index], "scripted failure")
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
                choices.append({"index": i, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": answer.content}})
            return 200, {
                "id": f"chatcmpl-{index}", "object": "chat.completion", "created": int(time.time()),
                "model": request.get("model", self.model), "choices": choices,
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
        finally:
            with self._lock:
                self._in_flight -= 1

    @staticmethod
    def _error(status: int, message: str) -> tuple[int, Any]:
        return status, {"error": {"message": message, "type": "scripted", "code": status}}

    def __enter__(self) -> ScriptedServer:
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
