"""Every shipped preset's settings agree with each other: its KV caches hold what a session can
need (rlver_jax.rollout.cache_bound), its turns fit its rows, its dialogues split into
mini-batches of micro-batches; the tiny presets also run their whole default length (slow)."""

import json
import os
import subprocess
import sys

import pytest

from configs import eval as eval_config
from configs import grpo_nothink, grpo_think, ppo_nothink, ppo_think
from configs.base import PRESETS
from rlver_jax.cli.config_checks import check_config, consistency_problems

TRAINING = {"ppo_think": ppo_think, "grpo_think": grpo_think, "ppo_nothink": ppo_nothink,
            "grpo_nothink": grpo_nothink}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", TRAINING)
def test_every_training_preset_is_consistent(name, preset):
    config = TRAINING[name].get_config(preset)
    check_config(config)
    assert consistency_problems(config) == []


@pytest.mark.parametrize("preset", eval_config.PRESETS)
def test_every_evaluation_preset_is_consistent(preset):
    config = eval_config.get_config(preset)
    check_config(config)
    assert consistency_problems(config) == []


def test_a_cache_below_the_bound_and_other_contradictions_are_named():
    config = ppo_nothink.get_config("7b")
    config.rollout.cache_slots = 35000  # 2 x 15000 + 5000: the old rule, below 14998 + 16384 + 5000
    config.train.eval_policy.max_new_tokens = 16384
    config.rl.mini_batch_size, config.rl.micro_batch_size = 12, 8
    assert consistency_problems(config) == [
        "config.rollout.cache_slots=35000 is below the 36384 slots a session of max_total_tokens=15000 and "
        "max_new_tokens=5000 can need: set it to 36384 (or 0)",
        "config.train.eval_policy.max_new_tokens=16384 leaves no room for a prompt in "
        "config.train.eval_policy.max_total_tokens=16384",
        "32 dialogues per step (config.rollout.profiles_per_step x n) are not a multiple of "
        "config.rl.mini_batch_size=12",
        "config.rl.mini_batch_size=12 is not a multiple of config.rl.micro_batch_size=8"]


def check_full_run(workdir, config) -> None:
    """A finished run of `config` in `workdir`: every step's metrics line once, an in-loop
    evaluation every eval_every steps, its transcripts, and the last checkpoint."""
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    steps = config.train.steps
    assert [r["step"] for r in lines] == list(range(steps))
    evaluated = [r["step"] for r in lines if "eval_score" in r]
    assert evaluated == list(range(config.train.eval_every - 1, steps, config.train.eval_every))
    assert all("kv_cache_reencodes" in r for r in lines)
    names = sorted(p.name for p in (workdir / "transcripts").iterdir())
    expected = [f"train_{s:06d}.jsonl" for s in range(steps)] + [f"eval_{s:06d}.jsonl" for s in evaluated]
    assert names == sorted(expected)
    assert str(steps) in os.listdir(workdir / "checkpoints")


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINING)
def test_every_tiny_training_preset_runs_its_default_steps(name, tmp_path):
    """launch/train.py with nothing but the preset and a work directory: all its default steps
    (40) with their in-loop evaluations (every 10), exit 0 (a few minutes each on CPU)."""
    config = TRAINING[name].get_config("tiny")
    workdir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "launch/train.py", f"--config=configs/{name}.py:tiny",
                          f"--config.workdir={workdir}"], capture_output=True, text=True, env=env, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    check_full_run(workdir, config)
