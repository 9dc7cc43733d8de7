"""End to end: the tiny GRPO and PPO configs train on CPU, log, checkpoint and resume exactly."""

import errno
import json
import logging
import pathlib
import signal

import jax
import numpy as np
import pytest

from configs import eval as eval_config
from configs import grpo_nothink, grpo_think, ppo_nothink, ppo_think
from configs.simulator import get_simulator_config
from rlver_jax import files
from rlver_jax.eval import run_view
from rlver_jax.files import read_jsonl
from rlver_jax.parallel import sharding
from rlver_jax.rl import program as rl_program
from rlver_jax.rollout.sequence import DialogueSequence
from rlver_jax.simulator.profiles import DEFAULT_PROFILES, load_profiles
from rlver_jax.train import alarms, checkpoint, loop, metrics, resume
from rlver_jax.train import run as run_lib
from rlver_jax.train.interrupts import TrainingInterrupted
from rlver_jax.train.spec import RunSpec

REQUIRED_METRICS = {"step", "reward_mean", "emotion_mean", "success_rate", "user_left_rate", "policy_loss",
                    "entropy", "tokens_per_second"}


def small(config, workdir, steps):
    """The tiny preset cut down to seconds: 2 profiles x n dialogues of 2 short turns, and
    evaluations of 2 held-out profiles in the same 2 short turns (no KV cache kept between them)."""
    config.workdir = str(workdir)
    config.train.steps = steps
    config.rollout.profiles_per_step = 2
    config.rollout.max_new_tokens = 8
    config.simulator.max_turns = 2
    config.rl.micro_batch_size = 2
    config.train.eval_every = 2
    config.data.eval_holdout = 2
    config.train.eval_max_profiles = 2
    config.train.eval_rules.max_turns = 2
    config.train.eval_policy.max_new_tokens = 8
    config.train.eval_policy.cache_slots = 0
    config.checkpoint.save_every = 2
    config.checkpoint.async_save = False
    return config


def _state(workdir):
    manager = checkpoint.make_manager(workdir / "checkpoints", save_every=1, keep=5)
    restored = manager.restore(manager.latest_step())
    manager.close()
    return restored["state"]


@pytest.fixture(scope="module")
def grpo_straight(tmp_path_factory):
    """The small GRPO run, 4 steps without a stop (evaluations after steps 1 and 3): what
    test_grpo_tiny_trains_and_logs reads, and what the run that is stopped, killed and resumed in
    test_interrupts_kills_and_a_full_disk_keep_each_step_once must end equal to."""
    config = small(grpo_think.get_config("tiny"), tmp_path_factory.mktemp("grpo") / "straight", steps=4)
    loop.train(RunSpec.from_config(config), progress=False)
    return config


@pytest.mark.slow
@pytest.mark.xdist_group("training_grpo")  # one worker runs the straight run once for both tests
def test_grpo_tiny_trains_and_logs(grpo_straight):
    workdir = pathlib.Path(grpo_straight.workdir)
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    assert REQUIRED_METRICS <= set(lines[0]) and "eval_score" in lines[1] and "eval_score" in lines[3]
    assert all(np.isfinite(m["policy_loss"]) for m in lines)
    transcripts = sorted(p.name for p in (workdir / "transcripts").iterdir())
    assert transcripts == ["eval_000001.jsonl", "eval_000003.jsonl"] + [f"train_{s:06d}.jsonl" for s in range(4)]
    # Training under RLVER's rules (initial emotion 30), the in-loop evaluation under SAGE's (40).
    first_emotions = {name: {r["emotions"][0] for r in read_jsonl(workdir / "transcripts" / name)}
                      for name in ("eval_000001.jsonl", "train_000000.jsonl")}
    assert first_emotions == {"eval_000001.jsonl": {40}, "train_000000.jsonl": {30}}
    assert any((workdir / "tensorboard").iterdir())
    _check_transcript_advantages(workdir, grpo_straight.rl.grpo_eps)


def _check_transcript_advantages(workdir, eps):
    """A GRPO step's transcripts carry the trainer's advantages: each trained dialogue's reward
    normalised over its group's trained dialogues (plain numpy; none for the others), and the
    step's page shows them."""
    records = read_jsonl(workdir / "transcripts" / "train_000000.jsonl")
    trained = [not r["simulator_error"] and bool(r["turns"]) for r in records]
    for group in {r["group"] for r in records}:
        members = [i for i, r in enumerate(records) if r["group"] == group and trained[i]]
        rewards = np.array([records[i]["reward"] for i in members])
        std = rewards.std(ddof=1) if len(rewards) > 1 else 0.0
        expected = np.zeros_like(rewards) if std == 0 else (rewards - rewards.mean()) / (std + eps)
        np.testing.assert_allclose([records[i]["advantage"] for i in members], expected, atol=1e-5)
    assert all(r["advantage"] is None for r, t in zip(records, trained) if not t)
    page = (run_view.write_run_view(workdir).parent / "train_000000.html").read_text()
    assert all(f"advantage {r['advantage']:+.3f}" in page for r in records if r["advantage"])


@pytest.mark.slow
def test_ppo_tiny_trains_with_a_critic(tmp_path):
    config = small(ppo_nothink.get_config("tiny"), tmp_path / "ppo", steps=2)
    config.train.eval_every = 0
    config.mesh.shape = (1, 1, -1)  # 2 dialogues a step: tensor parallelism over the 8 devices
    metrics = loop.train(RunSpec.from_config(config), progress=False)
    assert metrics["value_loss"] >= 0 and metrics["critic_grad_norm"] > 0


def test_config_errors_name_the_fix(tmp_path):
    config = small(grpo_think.get_config("tiny"), tmp_path / "bad", steps=1)
    config.rollout.n = 1
    with pytest.raises(ValueError, match="config.rollout.n"):
        loop.train(RunSpec.from_config(config), progress=False)
    config = small(grpo_think.get_config("tiny"), tmp_path / "bad_mesh", steps=1)
    config.rollout.profiles_per_step = 1  # 4 dialogues cannot split over 8 fsdp shards
    with pytest.raises(ValueError, match="config.mesh.shape"):
        loop.train(RunSpec.from_config(config), progress=False)
    config = small(grpo_think.get_config("7b"), tmp_path / "bad7b", steps=1)
    with pytest.raises(ValueError, match="config.data.train_profiles"):
        loop.train(RunSpec.from_config(config), progress=False)
    config.data.train_profiles = str(DEFAULT_PROFILES)
    config.simulator.backend = "embedded"
    with pytest.raises(ValueError, match="config.model.path"):
        loop.train(RunSpec.from_config(config), progress=False)


@pytest.mark.slow
def test_pipeline_groups_and_the_engine_do_not_change_the_dialogues(tmp_path):
    """A dialogue's sampling key is a function of (seed, step, its index), so running the step's
    8 two-turn dialogues in one group or in two concurrent groups of static calls (other batch rows,
    other KV cache rows, another call order), or through the rollout engine, samples the same
    dialogues."""
    def step0(groups, engine="static"):
        config = small(grpo_think.get_config("tiny"), tmp_path / f"{engine}{groups}", steps=1)
        config.rollout.pipeline_groups = groups
        config.rollout.engine = engine
        config.rollout.format_failure = "continue"  # raw replies reach the user: two turns each
        run = run_lib.build_run(RunSpec.from_config(config))
        buffer = loop._rollout_buffer(run, sharding.replicated_value(run.state.rng), 0)
        buffer.publish(0, run.sampling_layout.copy(run.state.actor))
        try:
            return buffer.get().sequences
        finally:
            buffer.close()

    one = step0(1)
    assert [len(s.turn_ends) for s in one] == [2] * 8
    assert len({tuple(s.tokens) for s in one}) == 8  # the n dialogues of a profile differ
    for other in (step0(2), step0(1, "continuous")):
        assert [s.tokens for s in other] == [s.tokens for s in one]
        assert [s.messages for s in other] == [s.messages for s in one]
        np.testing.assert_allclose(np.concatenate([s.logprobs for s in other]),
                                   np.concatenate([s.logprobs for s in one]), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_a_sampler_group_samples_the_same_dialogues_beside_the_update(tmp_path):
    """config.mesh.sampler_devices=4 of the 8: the rollout engine samples on a copy on 4 devices of
    its own, the update runs on a mesh of the other 4. Step 0's dialogues are those of the run
    without the split, and a max_staleness=1 run trains with batch 1 sampled on the sampler's
    devices while step 0's update runs on the trainer's."""
    def step0(sampler_devices):
        config = small(grpo_think.get_config("tiny"), tmp_path / f"sampler{sampler_devices}", steps=1)
        config.mesh.sampler_devices = sampler_devices
        config.rollout.format_failure = "continue"  # raw replies reach the user: two turns each
        run = run_lib.build_run(RunSpec.from_config(config))
        buffer = loop._rollout_buffer(run, sharding.replicated_value(run.state.rng), 0)
        copy = run.sampling_layout.copy(run.state.actor)
        buffer.publish(0, copy)
        try:
            return run, copy, buffer.get().sequences
        finally:
            buffer.close()

    split, copy, dialogues = step0(4)
    assert dict(split.mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 1}
    trainer = {d.id for d in split.mesh.devices.flat}
    sampler = {d.id for leaf in jax.tree.leaves(copy) for d in leaf.sharding.device_set}
    assert len(trainer) == len(sampler) == 4 and not trainer & sampler
    _, _, whole = step0(0)
    assert [s.tokens for s in dialogues] == [s.tokens for s in whole]
    config = small(grpo_think.get_config("tiny"), tmp_path / "stale", steps=2)
    config.mesh.sampler_devices, config.rollout.max_staleness, config.train.eval_every = 4, 1, 0
    loop.train(RunSpec.from_config(config), progress=False)
    lines = read_jsonl(tmp_path / "stale" / "metrics.jsonl")
    assert [m["step"] for m in lines] == [0, 1] and lines[1]["policy_lag"] == 1.0


def test_profiles_for_step_is_a_pure_function_of_step():
    profiles = load_profiles()
    a = [p.id for p in loop.profiles_for_step(profiles, 5, 3, seed=0)]
    assert a == [p.id for p in loop.profiles_for_step(profiles, 5, 3, seed=0)]
    epoch = [p.id for s in range(len(profiles)) for p in loop.profiles_for_step(profiles, s, 1, seed=0)]
    assert sorted(epoch) == sorted(p.id for p in profiles)  # every profile once per epoch


# ----------------------------------------------------------------------------- faults (issue 18)

def _steps(workdir):
    return [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().split("\n") if line]


def _transcripts(workdir):
    return sorted(p.name for p in (workdir / "transcripts").iterdir())


@pytest.mark.slow
@pytest.mark.xdist_group("training_grpo")
def test_interrupts_kills_and_a_full_disk_keep_each_step_once(tmp_path, monkeypatch, capsys, grpo_straight):
    """A run stopped by SIGTERM, by a kill and by a full disk, each time rerun, keeps every step's
    metrics and transcripts once and ends exactly where the run without stops ends (resume is exact:
    the data order and the sampling keys are functions of the step)."""
    workdir = tmp_path / "run"
    config = small(grpo_think.get_config("tiny"), workdir, steps=4)  # eval after steps 1 and 3, checkpoints 2, 4

    # A preemption's SIGTERM (handled as Ctrl-C is, with exit status 143) during the update of step 1
    # (the update donates the state): the step is finished (its evaluation skipped: the checkpoint
    # must come in bounded time), and the checkpoint the loop just wrote is not written twice.
    config.checkpoint.stop_within_s = 600.0  # the clock would end pytest's process on a slow machine
    update = rl_program.train_on_batch

    def interrupted_update(*args):
        out = update(*args)
        if int(out[0].step) == 2:
            signal.raise_signal(signal.SIGTERM)
        return out

    monkeypatch.setattr(rl_program, "train_on_batch", interrupted_update)
    with pytest.raises(TrainingInterrupted, match=r"^stopped by SIGTERM: the checkpoint of step 2 is in .*Rerun the "
                                                  r"same command") as stop:
        loop.train(RunSpec.from_config(config), progress=False)
    monkeypatch.undo()
    assert stop.value.exit_status == 143
    assert checkpoint.saved_steps(workdir / "checkpoints")[-1] == 2
    assert _steps(workdir) == [0, 1]
    assert "eval_score" not in read_jsonl(workdir / "metrics.jsonl")[1]
    assert _transcripts(workdir) == ["train_000000.jsonl", "train_000001.jsonl"]

    # What a kill -9 after step 2's metrics line (before its checkpoint) and mid-append leaves.
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "reward_mean": 0.5}\n{"step": 3, "rew')
    for stale in ("train_000002.jsonl", "eval_000003.jsonl"):
        (workdir / "transcripts" / stale).write_text('{"stale": true}\n')

    # The disk fills up while step 3's transcripts are written: the error names the file; the
    # last checkpoint and every finished transcript stay.
    write = files.atomic_write_bytes

    def full_disk(path, data):
        if "train_000003" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write(path, data)

    monkeypatch.setattr(files, "atomic_write_bytes", full_disk)
    with pytest.raises(OSError, match="No space left on device.*train_000003.jsonl"):
        loop.train(RunSpec.from_config(config), progress=False)
    monkeypatch.undo()
    kept = checkpoint.saved_steps(workdir / "checkpoints")[-1]
    assert kept == 2 and _steps(workdir) == [0, 1, 2]
    assert _transcripts(workdir) == ["train_000000.jsonl", "train_000001.jsonl",
                                     "train_000002.jsonl"]  # the stale ones removed, no temporary files
    assert read_jsonl(workdir / "transcripts" / "train_000002.jsonl")[0]["step"] == 2

    loop.train(RunSpec.from_config(config), progress=False)  # the rerun resumes at the checkpoint
    assert _steps(workdir) == [0, 1, 2, 3]
    assert _transcripts(workdir) == ["eval_000003.jsonl", "train_000000.jsonl",
                                     "train_000001.jsonl", "train_000002.jsonl", "train_000003.jsonl"]
    assert checkpoint.saved_steps(workdir / "checkpoints")[-1] == 4
    capsys.readouterr()
    assert loop.train(RunSpec.from_config(config), progress=False) == {}  # nothing left to do, said on stdout
    assert "nothing left to train" in capsys.readouterr().out
    # Every model and optimizer number equals the run's without a stop.
    jax.tree.map(np.testing.assert_array_equal, _state(workdir), _state(pathlib.Path(grpo_straight.workdir)))


def test_a_step_whose_dialogues_all_failed_writes_them_before_it_stops(tmp_path):
    failed = [DialogueSequence(profile_id=f"p{i}", group=i, tokens=[], policy_mask=[], logprobs=[], turn_ends=[],
                               emotions=[30.0], end_reason="simulator_error", simulator_error=True,
                               simulator_state={"error": "simulator refused the request with HTTP 400"})
              for i in range(2)]
    with pytest.raises(alarms.AllDialoguesFailedError,
                       match=r"step 5: .*2 of 2 ended as simulator_error \(last: .*HTTP 400\).*train_000005.jsonl"):
        alarms.check_trainable(5, failed, tmp_path / "transcripts")
    assert [r["profile_id"] for r in read_jsonl(tmp_path / "transcripts" / "train_000005.jsonl")] == ["p0", "p1"]


def _turns_of(versions, error=False):
    n = len(versions)
    return DialogueSequence(profile_id="p", group=0, tokens=[1] * 2 * n, policy_mask=[0, 1] * n,
                            logprobs=[0.0] * 2 * n, turn_ends=list(range(1, 2 * n, 2)), emotions=[30.0],
                            end_reason="simulator_error" if error else "turn_limit", simulator_error=error,
                            policy_version=versions[0], turns=[{"turn": k + 1, "policy_version": v}
                                                               for k, v in enumerate(versions)])


def test_a_dialogue_beyond_the_staleness_bound_is_dropped_not_trained(caplog):
    """A dialogue with a turn older than step - max_staleness is left out of the update and counted."""
    old, fresh, failed = _turns_of([2, 3, 4]), _turns_of([3, 4]), _turns_of([0], error=True)
    # Step 5, max_staleness 2: version 2 is 3 behind (beyond), 3 is 2 behind (within).
    before = metrics.staleness_metrics(5, 2, [old, fresh, failed])
    assert before["stale_token_frac"] == 1 / 5 and before["staleness_max"] == 3.0
    with caplog.at_level(logging.WARNING, logger=loop.__name__):
        assert loop._drop_stale(5, 2, [old, fresh, failed]) == 1
    assert old.stale and not old.trainable
    assert not fresh.stale and fresh.trainable and not failed.stale  # failed: not trainable anyway, not counted
    assert "1 dialogue(s) hold turns more than max_staleness=2 versions behind (oldest: version 2)" in caplog.text
    assert loop._drop_stale(5, 2, [old, fresh, failed]) == 0  # dropped once
    assert metrics.staleness_metrics(5, 2, [old, fresh])["stale_token_frac"] == 0.0  # what is trained


def test_config_ranges_are_checked_before_anything_starts(tmp_path):
    config = small(grpo_think.get_config("tiny"), tmp_path / "never", steps=1)
    config.train.steps = -1
    config.rollout.temperature = -0.5
    config.simulator.max_concurrency = 0
    config.simulator.timeout_s = 0.0
    config.optim.actor.lr = -2e-3  # issue 44: a negative, NaN or infinite rate was accepted
    config.optim.critic.lr = float("nan")
    with pytest.raises(ValueError, match=r"config.train.steps=-1 must be >= 0; config.rollout.temperature=-0.5 "
                                         r"must be >= 0; config.simulator.max_concurrency=0 must be >= 1; "
                                         r"config.simulator.timeout_s=0.0 must be > 0; config.optim.actor.lr=-0.002 "
                                         r"must be a finite number >= 0; config.optim.critic.lr=nan must be"):
        loop.train(RunSpec.from_config(config), progress=False)
    assert not (tmp_path / "never").exists()


# SAGE's rules: start at 40, a change clipped to +-10, success at 100, failure below 10, bands
# S/A/B/C at 100/70/40/10, 10 rounds with the last reply unjudged.
_SAGE_RULES = dict(initial_emotion=40, max_change=10, ceiling=100, floor=10, floor_inclusive=False, band_a=70,
                   band_b=40, band_c=10, max_turns=10, score_final_turn=False)
# The benchmark's policy: temperature 0.7, no top-p/top-k, 2048 new tokens a turn, earlier thoughts dropped.
_BENCHMARK_POLICY = dict(temperature=0.7, top_p=1.0, top_k=0, max_new_tokens=2048, max_total_tokens=16384,
                         cache_slots=0, format_failure="continue", think_history="drop")
_TINY_POLICY = dict(max_new_tokens=32, max_total_tokens=1024, cache_slots=2 * 1024 + 32)  # the tiny preset's lengths


@pytest.mark.parametrize("module", [ppo_think, grpo_think, ppo_nothink, grpo_nothink])
def test_paper_configs_hold_the_reference_values(module):
    """The official training script's values (docs/fidelity.md) in the paper presets; the
    in-loop evaluation under SAGE's rules with the benchmark's policy sampling."""
    c = module.get_config("7b")
    rl = RunSpec.from_config(c).rl  # the loss aggregation resolved from the algorithm's row
    assert (rl.entropy_coef, rl.loss_agg_mode) == (0.001, "seq_mean_token_mean")
    assert (c.rollout.think_history, c.rollout.format_failure) == ("drop", "continue")
    assert (c.rollout.temperature, c.rollout.top_p, c.rl.kl_coef, c.simulator.max_turns) == (1.0, 1.0, 0.0, 8)
    assert c.simulator.max_tokens == 2048
    # SAGE's emotion machine (docs/fidelity.md): the in-loop evaluation's and launch/eval.py's simulator's.
    assert dict(c.train.eval_rules) == _SAGE_RULES
    sage = get_simulator_config(eval_mode=True)
    assert {k: sage[k] for k in _SAGE_RULES} == _SAGE_RULES
    # The benchmark's policy sampling, in the in-loop evaluation as in launch/eval.py.
    tiny, tiny_policy = module.get_config("tiny"), {**_BENCHMARK_POLICY, **_TINY_POLICY}
    assert dict(c.train.eval_policy) == _BENCHMARK_POLICY and dict(tiny.train.eval_policy) == tiny_policy
    for policy, expected in ((eval_config.get_config().policy, _BENCHMARK_POLICY),
                             (eval_config.get_config("tiny").policy, tiny_policy)):
        assert {k: policy[k] for k in expected} == expected  # beside the backend's fields
    assert tiny.rollout.format_failure == "end"  # documented: a random tiny model learns </think> first


@pytest.mark.slow
def test_lora_ppo_trains_only_the_adapters_and_resumes_exactly(tmp_path):
    """A tiny LoRA PPO run with a KL term: the checkpoints hold the adapters, the deltas of tiny's
    modules_to_save (embedding, norms) and the critic's value head, and name their base; the base
    every model read is bit-identical after the steps; the adapters and deltas moved; a run resumed
    after step 2 ends at step 3 equal to an unbroken one. The resumed run's last step keeps its train
    state in host memory between programs (train.offload="state", as the 7B presets do; a change a
    resume may make): with LoRA that state is the adapters and the value head while the base stays
    on the devices, and the step gives the same models."""
    def lora_config(workdir, steps):
        config = small(ppo_nothink.get_config("tiny"), workdir, steps=steps)
        config.lora.rank, config.rl.kl_coef, config.train.eval_every = 4, 0.05, 0
        config.mesh.shape = (1, 2, 4)  # adapters split over fsdp and tensor like their kernels
        return config

    straight = run_lib.build_run(RunSpec.from_config(lora_config(tmp_path / "straight", 3)))
    base = jax.tree.map(np.array, straight.frozen)
    fresh = jax.tree.map(np.array, straight.state.actor)
    loop.train_run(straight, progress=False)
    jax.tree.map(np.testing.assert_array_equal, straight.frozen, base)

    manager = checkpoint.make_manager(tmp_path / "straight" / "checkpoints", save_every=1, keep=5)
    restored = manager.restore(manager.latest_step())
    manager.close()
    state, meta = restored["state"], restored["meta"]
    assert meta["lora_base"] == {"random_init": "tiny", "seed": 0, "base_dtype": "float32", "rank": 4, "alpha": 16.0,
                                 "targets": ["q", "k", "v", "o", "gate", "up", "down"],
                                 "modules_to_save": ["embed", "norms"]}
    assert set(state["actor"]) == {"layer_0", "layer_1", "embed", "final_norm"}  # no base kernel, no LM head
    assert set(state["critic"]) == {"layer_0", "layer_1", "embed", "final_norm", "value_kernel", "value_bias"}
    before = dict(jax.tree_util.tree_leaves_with_path(fresh))
    for path, after in jax.tree_util.tree_leaves_with_path(state["actor"]):
        if path[-1].key in ("lora_b", "delta"):  # every B and every delta left zero
            assert np.abs(np.asarray(after) - before[path]).max() > 0, jax.tree_util.keystr(path)

    resumed = lora_config(tmp_path / "resumed", 2)
    loop.train(RunSpec.from_config(resumed), progress=False)
    resumed.train.steps, resumed.train.offload = 3, "state"
    resumed.checkpoint.allow_changes = "train.steps"  # a change within a run: logged at the step
    loop.train(RunSpec.from_config(resumed), progress=False)
    assert read_jsonl(tmp_path / "resumed" / resume.CHANGES) == [{"step": 2, "field": "train.steps", "before": 2,
                                                                 "after": 3}]
    for model in ("actor", "critic"):
        a, b = _state(tmp_path / "straight")[model], _state(tmp_path / "resumed")[model]
        jax.tree.map(np.testing.assert_array_equal, a, b)

    other = lora_config(tmp_path / "resumed", 3)
    other.seed = 1  # another random base: the adapters in the checkpoint do not belong to it
    with pytest.raises(ValueError, match=r"seed: 0 in the checkpoint, 1 now.*seed defines what the run trains"):
        loop.train(RunSpec.from_config(other), progress=False)


# ----------------------------------------------------------------------------- faults (issue 44)

def _interrupt_in_update_of(step, signum=signal.SIGINT):
    """train_on_batch sending `signum` once the update of `step` is done (the state is donated)."""
    update = rl_program.train_on_batch

    def interrupted(*args):
        out = update(*args)
        if int(out[0].step) == step + 1:
            signal.raise_signal(signum)
        return out

    return interrupted


@pytest.mark.slow
def test_max_staleness_resumes_exactly(tmp_path, monkeypatch):
    """With max_staleness=2 (partial rollouts) the dialogues of batch i take their first turns from
    version i - 2 and their later turns from i - 1, after a resume too: the checkpoint holds the
    actors of those versions (before, the first batch after a resume was sampled with newer ones).
    max_staleness=1 (whole batches by version i - 1) is the schedule's other case
    (tests/versions_test.py, tests/buffer_test.py)."""
    def config(name):
        c = small(grpo_think.get_config("tiny"), tmp_path / name, steps=3)
        c.rollout.max_staleness, c.train.eval_every, c.checkpoint.stop_within_s = 2, 0, 600.0
        c.rollout.format_failure = "continue"  # raw replies reach the user: dialogues of two turns
        return c

    loop.train(RunSpec.from_config(config("straight")), progress=False)
    monkeypatch.setattr(rl_program, "train_on_batch", _interrupt_in_update_of(1))
    with pytest.raises(TrainingInterrupted, match="the checkpoint of step 2"):
        loop.train(RunSpec.from_config(config("resumed")), progress=False)
    monkeypatch.undo()
    assert checkpoint.read_record(tmp_path / "resumed" / "checkpoints", 2)["sampling_versions"] == [0, 1]
    loop.train(RunSpec.from_config(config("resumed")), progress=False)
    turn_versions = {}
    for name in ("straight", "resumed"):
        lags_seen = [m["policy_lag"] for m in read_jsonl(tmp_path / name / "metrics.jsonl")]
        assert lags_seen == [0.0, 1.0, 2.0], name  # batches 0 and 1 from version 0 (the oldest published)
        turn_versions[name] = [[t["policy_version"] for t in r["turns"]]
                               for r in read_jsonl(tmp_path / name / "transcripts" / "train_000002.jsonl")]
    assert turn_versions["resumed"] == turn_versions["straight"]
    assert all(v == [0, 1][:len(v)] for v in turn_versions["straight"])  # batch 2: two turns at most
    assert any(len(v) == 2 for v in turn_versions["straight"])
    for model in ("actor", "actor_opt"):
        jax.tree.map(np.testing.assert_array_equal, _state(tmp_path / "straight")[model],
                     _state(tmp_path / "resumed")[model])


@pytest.mark.slow
def test_a_diverging_update_or_a_failed_save_leaves_no_bad_checkpoint(tmp_path, monkeypatch):
    """A learning rate of 1e12 grows the parameter norm a trillion-fold in step 0: the run stops
    before that step is written (it used to checkpoint finite weights of 1e12, on which every rerun
    failed). Then, with a sane rate, the disk fills while checkpoint 2 is written: one error naming
    the step, the directory and the cause, and no further step."""
    workdir = tmp_path / "run"
    config = small(grpo_think.get_config("tiny"), workdir, steps=3)
    config.train.eval_every, config.checkpoint.save_every = 0, 1
    config.optim.actor.lr = 1e12
    with pytest.raises(alarms.DivergedError, match=r"^step 0: the update diverged: it grew the parameter norm the "
                                                 r"actor's from .* \(x.*e\+1\d\), more than "
                                                 r"config.train.max_param_norm_growth=2 allows; the step is not saved"):
        loop.train(RunSpec.from_config(config), progress=False)
    assert checkpoint.saved_steps(workdir / "checkpoints") == [] and not (workdir / "metrics.jsonl").exists()

    import orbax.checkpoint as ocp
    save = ocp.CheckpointManager.save

    def full_at_2(self, step, *args, **kw):
        if step == 2:
            raise ValueError(f'RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database at local file '
                             f'"{self.directory}/2.orbax-checkpoint-tmp/state/": Failed to write 1024 bytes to file 7: '
                             f"No space left on device [os_error_code='28']")
        return save(self, step, *args, **kw)

    config.optim.actor.lr = 2e-3  # no checkpoint yet: nothing to compare with
    monkeypatch.setattr(ocp.CheckpointManager, "save", full_at_2)
    with pytest.raises(checkpoint.CheckpointWriteError) as error:
        loop.train(RunSpec.from_config(config), progress=False)
    assert str(error.value).startswith(f"the checkpoint of step 2 could not be written to {workdir / 'checkpoints'}: "
                                       "No space left on device (errno 28). The run stopped there; kept: the "
                                       "checkpoint of step 1")
    assert checkpoint.saved_steps(workdir / "checkpoints") == [1] and _steps(workdir) == [0, 1]  # no step after it
    assert not (workdir / ".lock").exists()
