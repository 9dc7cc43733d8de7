"""A run is one identity in one directory (issue 44): what a resume may change (spec.change_kind),
the refusal of a change it may not make, in one line naming each field with both values and the
fix, before anything is written; config.checkpoint.allow_changes; checkpoint.resume=False and
start_over on a used directory; a second trainer refused by the lock. Each case stops before any
model is built, so these take seconds (the checkpoint is its record alone: a run's checkpoint folder
as orbax names it, holding meta/metadata)."""

import json
import os
import subprocess
import sys

import pytest

from configs import grpo_nothink, grpo_think, ppo_think
from rlver_jax.train import checkpoint, loop
from rlver_jax.train import run as run_lib
from rlver_jax.train.finished import finished_run
from rlver_jax.train.spec import RunChangedError, RunSpec, change_kind, resume_changes
from rlver_jax.train.workdir import LOCK, WorkDir, WorkDirBusyError
from tests.training_test import small


def _spec(workdir, module=grpo_think, **fields):
    return RunSpec.from_config(small(module.get_config("tiny"), workdir, steps=4)).override(**fields)


def _trained(workdir, step=2, **fields):
    """A work directory as a run of `_spec(workdir, **fields)` leaves it after `step` steps: its
    config.json, a metrics line per step and the record of its checkpoint of `step`."""
    spec = _spec(workdir, **fields)
    meta = workdir / "checkpoints" / str(step) / "meta"
    meta.mkdir(parents=True)
    (meta / "metadata").write_text(json.dumps({"step": step, "seed": spec.loop.seed, "run": spec.resume_record}))
    (workdir / "config.json").write_text(spec.config_json)
    (workdir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(step)))
    return spec


def _listing(workdir):
    return sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))


def test_what_a_resume_may_change():
    assert [change_kind(f) for f in ("rl.algo", "rollout.think", "seed", "model.param_dtype", "lora.rank",
                                     "rollout.profiles_per_step")] == ["identity"] * 6
    assert [change_kind(f) for f in ("optim.actor.lr", "train.steps", "rl.clip_eps_low", "simulator.max_turns",
                                     "lora.lr_multiplier")] == ["may change"] * 5
    assert [change_kind(f) for f in ("workdir", "mesh.shape", "checkpoint.keep", "simulator.base_url",
                                     "train.eval_every")] == ["free"] * 5


@pytest.mark.parametrize("case", ["lr", "seed", "think", "algorithm", "param_dtype"])
def test_a_resume_with_another_identity_or_rate_is_refused_and_nothing_is_written(tmp_path, case):
    workdir = tmp_path / "run"
    _trained(workdir)
    before = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
    module, fields, named = {
        "lr": (grpo_think, {"optim.actor.lr": 1e-3}, "optim.actor.lr: 0.002 in the checkpoint, 0.001 now"),
        "seed": (grpo_think, {"seed": 1}, "seed: 0 in the checkpoint, 1 now"),
        "think": (grpo_nothink, {}, "rollout.think: True in the checkpoint, False now"),
        "algorithm": (ppo_think, {"rollout.n": 4}, "rl.algo: 'grpo' in the checkpoint, 'ppo' now"),
        "param_dtype": (grpo_think, {"model.param_dtype": "bfloat16"},
                        "model.param_dtype: 'float32' in the checkpoint, 'bfloat16' now")}[case]
    with pytest.raises(RunChangedError) as error:
        loop.train(_spec(workdir, module, **fields), progress=False)
    message = str(error.value)
    assert "\n" not in message and message.startswith(
        f"the checkpoint of step 2 in {workdir / 'checkpoints'} was trained with another config (")
    assert named in message and "nothing was written" in message
    if case == "lr":
        assert message.endswith("to change optim.actor.lr within this run add "
                                "--config.checkpoint.allow_changes=optim.actor.lr")
    else:
        assert "defines what the run trains: train this config in a new config.workdir" in message
    # config.json, no lock, no tokenizer
    assert {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()} == before


def test_allowed_changes_are_returned_to_be_logged_and_others_still_refused(tmp_path):
    saved = _spec(tmp_path).resume_record
    spec = _spec(tmp_path, **{"optim.actor.lr": 1e-3, "train.steps": 6, "mesh.shape": (1, 2, 4),
                              "checkpoint.allow_changes": "optim.actor,train.steps"})
    assert resume_changes(saved, spec, "here") == [("optim.actor.lr", 0.002, 0.001), ("train.steps", 4, 6)]
    spec = _spec(tmp_path, **{"optim.actor.lr": 1e-3, "seed": 3, "checkpoint.allow_changes": "*"})
    with pytest.raises(RunChangedError, match=r"\(seed: 0 in the checkpoint, 3 now\).*seed defines"):
        resume_changes(saved, spec, "here")
    assert resume_changes({**saved, "gone.field": 1}, _spec(tmp_path), "here") == []  # a field of an older version


def test_more_steps_extend_a_run_without_allow_changes_unless_a_warmup_moves(tmp_path):
    """grpo_think tiny trains 4 steps here (the actor's warm-up, int(0.02 x steps) at least 1: 1 step
    up to 99 steps). Growing train.steps alone extends the run; shrinking it, or growing it past where
    the warm-up moves, is refused with the warm-up named (by hand: int(0.02 x 1000) = 20)."""
    saved = _spec(tmp_path).resume_record
    assert resume_changes(saved, _spec(tmp_path, **{"train.steps": 40}), "here") == [("train.steps", 4, 40)]
    with pytest.raises(RunChangedError, match=r"train.steps: 4 in the checkpoint, 2 now\); nothing"):
        resume_changes(saved, _spec(tmp_path, **{"train.steps": 2}), "here")
    with pytest.raises(RunChangedError, match=r"1000 now; train.steps also sets the actor's warm-up: 1 -> 20 steps\).*"
                                              r"allow_changes=train.steps"):
        resume_changes(saved, _spec(tmp_path, **{"train.steps": 1000}), "here")


def test_allow_changes_names_fields_that_may_change():
    with pytest.raises(ValueError, match="config.checkpoint.allow_changes names 'seed', part of the run's identity"):
        _spec("x", **{"checkpoint.allow_changes": "seed,optim.actor.lr"})
    with pytest.raises(ValueError, match="names 'mesh.shape', which changes freely"):
        _spec("x", **{"checkpoint.allow_changes": "mesh.shape"})
    with pytest.raises(ValueError, match="names 'optim.actor.lrr': not a field of the config"):
        _spec("x", **{"checkpoint.allow_changes": "optim.actor.lrr"})


def test_resume_false_on_a_used_directory_is_refused_start_over_moves_the_run_aside(tmp_path):
    workdir = tmp_path / "run"
    _trained(workdir)
    before = _listing(workdir)
    with pytest.raises(ValueError, match=r"holds a run \(checkpoints, metrics.jsonl\): config.checkpoint.resume=False "
                                         r"would mix a new run into it.*--config.checkpoint.start_over=True"):
        loop.train(_spec(workdir, **{"checkpoint.resume": False}), progress=False)
    assert _listing(workdir) == before
    lock = run_lib.claim(_spec(workdir, **{"checkpoint.start_over": True, "seed": 5}), WorkDir(workdir))
    assert _listing(workdir) == [LOCK]  # the new run starts empty: nothing of the old one is mixed in
    assert _listing(tmp_path / "run.previous-1") == before
    lock.release()
    assert checkpoint.newest_record(tmp_path / "run.previous-1" / "checkpoints")[0] == 2


def test_a_second_trainer_on_a_directory_is_refused(tmp_path):
    workdir = tmp_path / "run"
    _trained(workdir)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (workdir / LOCK).write_text(json.dumps({"host": os.uname().nodename, "pid": holder.pid, "what": "training",
                                                "started": "2026-12-04T10:00:00", "command": "launch/train.py"}))
        with pytest.raises(WorkDirBusyError, match=rf"^{workdir} is in use by training \(pid {holder.pid} on this "
                                                   r"host"):
            loop.train(_spec(workdir), progress=False)
    finally:
        holder.kill()
        holder.wait()
    assert not (workdir / "tokenizer").exists()


def test_rl_fields_are_compared_as_the_algorithm_row_resolves_them(tmp_path):
    """A config that leaves a knob to the algorithm's row ("" or None) and one that spells out the
    row's value train the same: no change (a newer version of the config files did just that)."""
    implicit = _spec(tmp_path)
    explicit = _spec(tmp_path, **{"rl.loss_agg_mode": implicit.rl.loss_agg_mode,
                                  "rl.clip_eps_high": implicit.rl.clip_eps_high, "rl.kl_mode": implicit.rl.kl_mode})
    assert implicit.record["rl"]["loss_agg_mode"] != explicit.record["rl"]["loss_agg_mode"] or \
        implicit.record["rl"]["clip_eps_high"] != explicit.record["rl"]["clip_eps_high"]
    assert resume_changes(implicit.resume_record, explicit, "here") == []


def test_a_finished_run_is_answered_from_its_files_before_jax(tmp_path):
    """A rerun whose newest checkpoint holds train.steps gets the loop's answer from the checkpoint's
    folder and record alone (launch/train.py asks before it imports JAX); a resume the loop would
    refuse is refused the same way; more steps, resume off, start over, no checkpoint or a bucket
    take the loop's path (None)."""
    workdir = tmp_path / "run"
    _trained(workdir, step=4)
    assert finished_run(_spec(workdir)) == (
        f"nothing left to train: {workdir / 'checkpoints'} holds step 4 of config.train.steps=4; to train further "
        "rerun with a larger --config.train.steps (e.g. 8): it extends this run")
    with pytest.raises(RunChangedError, match=r"seed: 0 in the checkpoint, 1 now"):
        finished_run(_spec(workdir, seed=1))
    for fields in ({"train.steps": 6}, {"checkpoint.resume": False}, {"checkpoint.start_over": True}):
        assert finished_run(_spec(workdir, **fields)) is None, fields
    assert finished_run(_spec(tmp_path / "new")) is None and not (tmp_path / "new").exists()
    assert finished_run(_spec("gs://bucket/run")) is None  # not listed: the loop reads the bucket
