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
from rlver_jax.eval.benchmark import BenchmarkSettings
from rlver_jax.rollout.cache_bound import session_slots
from rlver_jax.train.spec import RunSpec

TRAINING = {"ppo_think": ppo_think, "grpo_think": grpo_think, "ppo_nothink": ppo_nothink,
            "grpo_nothink": grpo_nothink}


def _sampling_fits(sampling, rollout) -> None:
    """A turn leaves room for a prompt in its row, and a KV cache (when on) holds what a session can
    need: a run survives a smaller one by encoding such turns afresh, but a preset must not ship it."""
    assert sampling.max_new_tokens < rollout.max_total_tokens
    need = session_slots(rollout.max_total_tokens, sampling.max_new_tokens)
    assert sampling.cache_slots == 0 or sampling.cache_slots >= need, (sampling.cache_slots, need)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", TRAINING)
def test_every_training_preset_is_consistent(name, preset):
    """Every settings type accepts the preset (ranges, mini-batches of micro-batches, GRPO groups),
    and both the rollout's and the in-loop evaluation's sampling fit their rows and caches."""
    s = RunSpec.from_config(TRAINING[name].get_config(preset))
    _sampling_fits(s.sampling, s.rollout)
    _sampling_fits(s.eval.sampling, s.eval.rollout)
    assert s.rollout.pipeline_groups <= s.loop.profiles_per_step * s.loop.n


@pytest.mark.parametrize("preset", eval_config.PRESETS)
def test_every_evaluation_preset_is_consistent(preset):
    s = BenchmarkSettings.from_config(eval_config.get_config(preset))
    _sampling_fits(s.sampling, s.rollout)


def test_session_slots_by_hand():
    """The 7B no-think rollout: a prompt of 14,998 tokens, another row's fresh prompt in its bucket
    (16,384), 5,000 new tokens: 36,382, rounded up to a multiple of 16. The old rule
    (2 x 15,000 + 5,000 = 35,000) fell short."""
    assert session_slots(15000, 5000) == 36384


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
@pytest.mark.skipif(os.environ.get("RLVER_PRESET_RUNS") != "1",
                    reason="about 8 minutes per preset on 2 cores, 33 for the four: beyond CI's suite budget; "
                           "RLVER_PRESET_RUNS=1 runs them (docs/faults.md)")
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


@pytest.mark.parametrize("name", TRAINING)
def test_paper_training_simulator_does_not_clip(name):
    """As the reference: the change is added as written (+-100 is the parser's bound); the in-loop
    evaluation keeps SAGE's +-10, and so do the tiny presets."""
    for preset, change in (("7b", 100), ("0.5b", 100), ("tiny", 10)):
        c = TRAINING[name].get_config(preset)
        assert (c.simulator.max_change, c.train.eval_rules.max_change) == (change, 10), preset
