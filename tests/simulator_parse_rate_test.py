"""benchmarks/simulator_parse_rate.py against scripted servers: one that enforces the JSON schema
and answers text badly for curt replies, and one that refuses response_format."""

import json

from rlver_jax.testing.scripted_server import ScriptedServer, quoted_reply, route
from tests.fixtures_cli import run_script

CURT = ("Okay.", "哦。")


def _emotion(request):
    if request.get("response_format"):
        return json.dumps({"reasoning": "Feeling: hm", "change": 1})
    if quoted_reply(request) in CURT:
        return "I think I feel a bit let down, honestly."  # no Change line: malformed
    return "Intent: x\nFeeling: hm\nChange: +1"


def _reply(request):
    if request.get("response_format"):
        return json.dumps({"reasoning": "Plan: go on", "utterance": "Mm, maybe."})
    return "Plan: go on\nResponse: Mm, maybe."


def _run(server, tmp_path):
    """The script's main in this process (tests/fixtures_cli.run_script)."""
    out = tmp_path / "rate.json"
    done = run_script("benchmarks/simulator_parse_rate.py", f"--base_url={server.base_url}", "--model=simulator",
                      "--profiles=2", f"--out={out}")
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())["modes"], done.stdout


def test_parse_rates_of_both_modes(tmp_path):
    with ScriptedServer(route(emotion=_emotion, reply=_reply), response_format="validate") as server:
        modes, stdout = _run(server, tmp_path)
        assert not server.errors
        # 2 profiles x 3 replies x 2 steps per mode; JSON requests (and the start-up probe) carry the schema.
        assert sum("response_format" in r for r in server.requests) == 1 + 12 == len(server.requests) - 12
    # Text: the curt reply of each profile gets an answer without a Change line.
    assert {k: modes["off"]["emotion"][k] for k in ("answers", "parsed")} == {"answers": 6, "parsed": 4}
    assert modes["off"]["reply"]["parsed"] == 6 and not modes["off"]["refused_response_format"]
    assert (modes["json_schema"]["emotion"]["rate"], modes["json_schema"]["reply"]["rate"]) == (1.0, 1.0)
    assert "| off | emotion | 6 | 4 | 67% |" in stdout and "| json_schema | emotion | 6 | 6 | 100% |" in stdout


def test_a_server_refusing_response_format_is_reported(tmp_path):
    with ScriptedServer(route(emotion=_emotion, reply=_reply), response_format="reject") as server:
        modes, stdout = _run(server, tmp_path)
        assert server.rejected == 2  # each spelling tried once
    assert modes["json_schema"]["refused_response_format"] and modes["json_schema"]["emotion"]["parsed"] == 4
    assert "| json_schema (refused: text) | emotion | 6 | 4 | 67% |" in stdout


def test_a_mode_that_cannot_run_is_reported_and_the_others_kept(tmp_path):
    def emotion(request):  # text answers parse; every JSON request fails (retried, then given up)
        if request.get("response_format"):
            raise RuntimeError("no JSON today")
        return _emotion(request)
    with ScriptedServer(route(emotion=emotion, reply=_reply)) as server:
        modes, stdout = _run(server, tmp_path)
    assert modes["off"]["reply"]["parsed"] == 6 and "failed 3 times" in modes["json_schema"]["error"]
    assert "| json_schema | could not run: " in stdout and "Traceback" not in stdout
