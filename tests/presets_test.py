"""Every shipped preset's settings agree with each other: its KV caches hold what a session can
need (worked out here by hand, not with rlver_jax.sampling.cache_bound, which the presets use), its
turns fit its rows, its dialogues split into mini-batches of micro-batches; the tiny presets also
run their whole default length (slow, on request)."""

import json
import os
import subprocess
import sys

import pytest

from configs import eval as eval_config
from configs import grpo_nothink, grpo_think, ppo_nothink, ppo_think
from configs.base import PRESETS
from rlver_jax.eval.benchmark import BenchmarkSettings, load_eval_profiles
from rlver_jax.eval.spec import EvalSpec
from rlver_jax.simulator.patterns import CJK
from rlver_jax.simulator.profiles import DEFAULT_PROFILES, ENGLISH_PROFILES, GOALS, load_profiles
from rlver_jax.train.run import split_profiles
from rlver_jax.train.spec import RunSpec

TRAINING = {"ppo_think": ppo_think, "grpo_think": grpo_think, "ppo_nothink": ppo_nothink,
            "grpo_nothink": grpo_nothink}


def _padded(n: int) -> int:
    """The length bucket a fresh prompt of n tokens is left-padded to, by hand: the smallest of
    16, 24, 32, 48, 64, 96, ... (powers of two and 1.5x powers of two from 16) that holds n."""
    size = 16
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


def _worst_call(max_total_tokens: int, max_new_tokens: int) -> int:
    """The KV-cache slots the worst call of a session needs (rlver_jax.sampling.cache_bound's
    docstring, written out): one row holds the longest prompt a turn can send (its row less one
    sampled token and <|im_end|>), another row starts a prompt as long afresh, left-padded to its
    bucket, then the call decodes max_new_tokens. Neither the turns nor the rows of a session
    enter: a row's prompt is bounded by max_total_tokens whatever the turn."""
    prompt = max_total_tokens - 2
    return prompt + _padded(prompt) + max_new_tokens


def test_the_worst_call_by_hand():
    assert [_padded(n) for n in (1, 16, 17, 24, 25, 33, 49, 1022, 1025, 14998)] == [
        16, 16, 24, 24, 32, 48, 64, 1024, 1536, 16384]
    assert _worst_call(1024, 48) == 1022 + 1024 + 48  # tiny training
    assert _worst_call(15000, 5000) == 14998 + 16384 + 5000  # 7B without thinking


def _sampling_fits(sampling, rollout) -> None:
    """A turn leaves room for a prompt in its row, and a KV cache (when on) holds what a session can
    need: a run survives a smaller one by encoding such turns afresh, but a preset must not ship it."""
    assert sampling.max_new_tokens < rollout.max_total_tokens
    need = _worst_call(rollout.max_total_tokens, sampling.max_new_tokens)
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


def _ids(profiles) -> list[str]:
    return [p.id for p in profiles]


@pytest.mark.parametrize("name", TRAINING)
def test_smol_trains_and_evaluates_on_disjoint_english_profiles(name):
    """Issue 42: SmolLM2 is an English model, so the smol presets play English profiles only, and
    configs/eval.py:smol plays exactly the (at least 16) profiles smol training holds out: base
    against trained is a held-out comparison."""
    train, held_out = split_profiles(RunSpec.from_config(TRAINING[name].get_config("smol")).data)
    evaluated = load_eval_profiles(EvalSpec.from_config(eval_config.get_config("smol")))
    assert _ids(evaluated) == _ids(held_out)
    assert not set(_ids(train)) & set(_ids(evaluated))
    assert len(evaluated) >= 16 and len(train) >= 16
    assert len(train) + len(evaluated) == len(load_profiles(ENGLISH_PROFILES))  # every profile in one of the two
    for profile in train + evaluated:
        text = " ".join((profile.player, profile.scene, profile.task, profile.first_talk or "", *profile.cha_group))
        assert profile.language == "en" and not CJK.search(text), profile.id
    for part in (train, evaluated):  # both halves: every hidden goal and personality type
        assert {p.goal for p in part} == set(GOALS)
        assert {p.personality for p in part} == {"negative", "passive", "avoidant"}


@pytest.mark.parametrize("name", TRAINING)
def test_tiny_keeps_the_shipped_mixed_profiles(name):
    """The tiny presets (bit-identical runs) still train on the shipped English and Chinese profiles,
    holding out the last 4, and the tiny evaluation plays exactly those 4 (issue 56: never a profile
    the tiny run trained on)."""
    data = RunSpec.from_config(TRAINING[name].get_config("tiny")).data
    assert (data.train_profiles, data.eval_profiles, data.eval_holdout) == (str(DEFAULT_PROFILES.resolve()), "", 4)
    tiny = eval_config.get_config("tiny")
    assert (tiny.eval.profiles, tiny.eval.holdout) == (str(DEFAULT_PROFILES.resolve()), 4)
    assert _ids(load_eval_profiles(EvalSpec.from_config(tiny))) == _ids(load_profiles(DEFAULT_PROFILES))[-4:]


def test_an_eval_holdout_beyond_the_file_is_refused():
    config = eval_config.get_config("tiny")
    config.eval.holdout = 100
    with pytest.raises(ValueError, match="config.eval.holdout=100: .* holds 16 profiles; set --config.eval.holdout=0"):
        load_eval_profiles(EvalSpec.from_config(config))


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


@pytest.mark.parametrize("name", TRAINING)
def test_the_one_gpu_lora_preset(name):
    """7b_lora: the 7B setting (lengths, bf16 base, offload) on one device with rank-64 adapters,
    one row per micro-batch and 8 dialogues per sampling call (PPO 32 / 4 groups, GRPO 128 / 16):
    what launch/plan.py planned at 78.2 (PPO) and 78.4 (GRPO) GB of 80 (docs/pods.md, "7B on one GPU")."""
    seven, lora = TRAINING[name].get_config("7b"), TRAINING[name].get_config("7b_lora")
    assert (lora.lora.rank, tuple(lora.mesh.shape), lora.rl.micro_batch_size) == (64, (1, 1, 1), 1)
    assert lora.lora.base_dtype == "bfloat16" and lora.train.offload == "state"
    assert lora.rollout.max_total_tokens == seven.rollout.max_total_tokens == 15000
    dialogues = {"ppo": 32, "grpo": 32 * 4}[name.split("_")[0]]
    assert lora.rollout.profiles_per_step * lora.rollout.n == dialogues
    assert dialogues / lora.rollout.pipeline_groups == 8
