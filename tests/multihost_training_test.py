"""Training on two local processes (4 CPU devices each, gloo collectives) is the training of one
process with 8 devices: the same step-0 dialogues, reward, emotion and losses; the two-process run
resumes from its checkpoint; metrics and transcripts hold each step and dialogue exactly once.

The processes run the multi-host commands of docs/pods.md (the block after "two processes on one
machine") on the PPO preset in place of the GRPO one, with a free port for the coordinator, a
temporary work directory and overrides that shrink the run to seconds. (No persistent compilation
cache: it stays off on virtual CPU devices, rlver_jax.cli.program.compilation_cache_dir.)
"""

import collections
import json
import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# Metrics that must agree between topologies (the rest are timings and throughputs).
COMPARED = ("reward_mean", "emotion_mean", "format_failure_rate", "sequence_tokens_mean", "policy_loss",
            "entropy", "actor_grad_norm", "actor_update_norm", "actor_param_norm", "logprob_diff_sampler")
PPO_COMPARED = ("value_loss", "critic_grad_norm", "critic_param_norm")
# What the actor's update makes of its advantages (noise when every reward is the same).
ACTOR_FROM_SIGNAL = ("policy_loss", "entropy", "actor_grad_norm", "actor_update_norm", "actor_param_norm")
# Shrink the tiny preset to seconds: 8 dialogues of one 16-token turn, raw replies shown to the
# user (a random model rarely writes </think>, so emotions would not move otherwise), an in-loop
# evaluation of 8 held-out profiles (one turn each) after step 2.
SMALL = ["--config.rollout.max_new_tokens=16", "--config.rollout.format_failure=continue",
         "--config.data.eval_holdout=8", "--config.train.eval_every=3",
         "--config.train.eval_rules.max_turns=1", "--config.train.eval_policy.max_new_tokens=16",
         "--config.checkpoint.async_save=False"]


def readme_commands() -> tuple[dict[str, str], list[list[str]]]:
    """The two-process example of docs/pods.md: (environment, one argv per process)."""
    text = (REPO / "docs" / "pods.md").read_text()
    block = re.search(r"two processes on one machine.*?```bash\n(.*?)```", text, re.S).group(1)
    env, argvs = {}, []
    for line in block.splitlines():
        words = shlex.split(line.split("#")[0].rstrip(" &"))
        if words[:1] == ["export"]:
            env.update(w.split("=", 1) for w in words[1:])
        elif words:
            prefix = [w for w in words if re.match(r"^[A-Z_]+=", w)]
            argvs.append((dict(w.split("=", 1) for w in prefix), words[len(prefix):]))
    return env, argvs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(config: str, workdir: pathlib.Path, overrides: list[str], *,
          processes: int = 2) -> list[subprocess.Popen]:
    """Start the docs/pods.md commands for `config` (`processes`=1: one process with all 8 devices)."""
    env_block, argvs = readme_commands()
    env = dict(os.environ, **env_block, PYTHONPATH=str(REPO))
    env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{_free_port()}"
    # Backend optimisation level 0: a third of the compile time on CPU, the same HLO.
    env["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
    if processes == 1:
        env["XLA_FLAGS"] = env["XLA_FLAGS"].replace("device_count=4", "device_count=8")
        for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES"):
            env.pop(k)
        argvs = argvs[:1]
    procs = []
    for own_env, argv in argvs:
        argv = [sys.executable if w == "python" else w for w in argv]
        argv = [f"--config={config}" if w.startswith("--config=") else
                f"--config.workdir={workdir}" if w.startswith("--config.workdir=") else w for w in argv]
        own = {} if processes == 1 else own_env
        # A session of its own: a test signals the whole process (the launcher's watch and its run, a
        # child: rlver_jax/cli/watchdog.py) as a host's death or freeze would.
        procs.append(subprocess.Popen(argv + overrides, env={**env, **own}, cwd=REPO, stdout=subprocess.PIPE,
                                      start_new_session=True,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def finish(procs: list[subprocess.Popen], *, check: bool = True, timeout: float = 900) -> list[tuple[int, str]]:
    """Each process's (exit status, log), all of them 0 when `check`."""
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    if check:
        for p, log in zip(procs, logs):
            assert p.returncode == 0, log[-4000:]
    return [(p.returncode, log) for p, log in zip(procs, logs)]


def metrics(workdir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def transcripts(workdir: pathlib.Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (workdir / "transcripts" / name).read_text().splitlines()]


def dialogue_view(record: dict) -> dict:
    """What a dialogue is, without the policy version (the same here) or float noise."""
    return {k: record[k] for k in ("profile_id", "group", "emotions", "turns", "messages", "end_reason")}


def check_each_once(workdir: pathlib.Path, steps: int, dialogues: int, n: int) -> None:
    assert [m["step"] for m in metrics(workdir)] == list(range(steps))
    names = sorted(p.name for p in (workdir / "transcripts").iterdir() if p.name.startswith("train_"))
    assert names == [f"train_{s:06d}.jsonl" for s in range(steps)]
    for name in names:
        records = transcripts(workdir, name)
        assert len(records) == dialogues
        assert set(collections.Counter(r["group"] for r in records).values()) == {n}  # each dialogue once


def compare_step0(one: pathlib.Path, two: pathlib.Path, keys) -> None:
    a, b = metrics(one)[0], metrics(two)[0]
    for k in keys:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-4, err_msg=k)
    assert ([dialogue_view(r) for r in transcripts(two, "train_000000.jsonl")]
            == [dialogue_view(r) for r in transcripts(one, "train_000000.jsonl")])


def alone_lengths(log: str) -> dict[int, tuple[int, int]]:
    """Per step, the (T, policy tokens) this process's dialogues alone would have asked for."""
    pattern = (r"step (\d+): batch length T=\d+, policy tokens \d+, rows \d+ per process "
               r"\(this process's dialogues alone: T=(\d+), (\d+)\)")
    return {int(s): (int(t), int(c)) for s, t, c in re.findall(pattern, log)}


@pytest.mark.slow
def test_ppo_two_processes_train_as_one_and_resume(tmp_path):
    """PPO, the heavier row (a critic, GAE, mini-batches), stands for every algorithm: mini-batches
    of 4 of the 8 turn rows on 4 data shards (tensor axis 2), two optimizer steps per model, each
    process holding half of every mini-batch in the one process's row order."""
    # Length buckets of 4 tokens: the processes' own dialogues would ask for different lengths.
    overrides = SMALL + ["--config.rollout.profiles_per_step=8", "--config.rl.mini_batch_size=4",
                         "--config.mesh.shape=(1,-1,2)", "--config.train.length_multiple=4"]
    one, two = tmp_path / "one", tmp_path / "two"
    # The reference runs beside the two processes: while they wait on each other, it computes.
    reference = start("configs/ppo_think.py:tiny", one, overrides + ["--config.train.steps=1"], processes=1)
    # The pair moves each idle model and, between steps, the whole state to host memory (the 7B
    # presets' train.offload): it changes nothing, and checkpoints are written and resumed from there.
    overrides += ["--config.train.offload=state"]
    pair = start("configs/ppo_think.py:tiny", two, overrides + ["--config.train.steps=2"])
    finish(reference)
    logs = [log for _, log in finish(pair)]
    # Under the SAGE-fitted judge a random tiny model's replies all get its verdict for degenerate
    # text, so every dialogue of step 0 may end with one reward: then the actor's gradient is float
    # noise that Adam scales up, and only what does not follow from it can be compared.
    rewards = {r["reward"] for r in transcripts(one, "train_000000.jsonl")}
    compare_step0(one, two, COMPARED + PPO_COMPARED if len(rewards) > 1 else
                  tuple(k for k in COMPARED + PPO_COMPARED if k not in ACTOR_FROM_SIGNAL))
    assert [m["optimizer_steps"] for m in metrics(one) + metrics(two)] == [2, 2, 2]
    # The processes' longest dialogues differ, so they had to agree on the batch shapes.
    lengths = [alone_lengths(log) for log in logs]
    assert sorted(lengths[0]) == sorted(lengths[1]) == [0, 1]
    assert any(lengths[0][s] != lengths[1][s] for s in (0, 1)), lengths
    assert "process 1 of 2: 4 local devices (cpu), dialogues 4-7 of the 8 per step" in logs[1]

    finish(start("configs/ppo_think.py:tiny", two,
                 overrides + ["--config.train.steps=3", "--config.checkpoint.allow_changes=train.steps"]))
    check_each_once(two, steps=3, dialogues=8, n=1)
    assert sorted(int(p.name) for p in (two / "checkpoints").iterdir() if p.name.isdigit())[-1] == 3
    assert "eval_score" in metrics(two)[2]
    evals = transcripts(two, "eval_000002.jsonl")
    assert [r["group"] for r in evals] == list(range(8))  # every held-out profile once, in order


@pytest.mark.slow
def test_a_mismatch_stops_every_process_with_the_fix(tmp_path):
    """3 profiles x 4 dialogues on 4 batch shards: a GRPO group would span the two processes."""
    overrides = ["--config.rollout.profiles_per_step=3", "--config.mesh.shape=(1,4,2)",
                 "--config.rl.micro_batch_size=4"]
    results = finish(start("configs/grpo_think.py:tiny", tmp_path / "bad", overrides), check=False,
                     timeout=300)
    for code, log in results:
        assert code != 0 and "make config.rollout.profiles_per_step a multiple of 2" in log, log[-3000:]


@pytest.mark.slow
def test_packed_rows_on_two_processes_train_as_one_process_unpacked(tmp_path):
    """config.rl.pack_rows on two processes: each packs its own turn rows (two turns a dialogue,
    rows of different lengths) to the shapes both need, and the update packs each micro-batch of
    the global batch from both processes' rows; step 0 is one process's padded step, to rounding."""
    overrides = SMALL + ["--config.rollout.profiles_per_step=8", "--config.rl.mini_batch_size=4",
                         "--config.rl.micro_batch_size=4", "--config.simulator.max_turns=2",
                         "--config.mesh.shape=(1,-1,2)", "--config.train.length_multiple=4", "--config.train.steps=1",
                         "--config.train.eval_every=0"]
    one, two = tmp_path / "one", tmp_path / "two"
    reference = start("configs/ppo_think.py:tiny", one, overrides, processes=1)
    pair = start("configs/ppo_think.py:tiny", two, overrides + ["--config.rl.pack_rows=True"])
    finish(reference)
    finish(pair)
    rewards = {r["reward"] for r in transcripts(one, "train_000000.jsonl")}
    compare_step0(one, two, COMPARED + PPO_COMPARED if len(rewards) > 1 else
                  tuple(k for k in COMPARED + PPO_COMPARED if k not in ACTOR_FROM_SIGNAL))
    assert metrics(one)[0]["optimizer_steps"] == metrics(two)[0]["optimizer_steps"] > 1
