"""A training run built from its spec, once: profiles, tokenizer, the abstract run with weights
loaded into it, the initial train state (`build_run` -> `Run`). Before the weights load, process 0
prints what the run runs (rlver_jax.train.banner).

Errors in the config surface in the spec (rlver_jax.train.spec), before any model is loaded or
compiled, each naming the config field and the fix. In a multi-host run every process builds the
same Run and finds the same errors before any collective, so a mismatch stops every process at
once instead of a hang.

Before anything is written to the work directory (`claim`): process 0 takes its lock
(rlver_jax.train.workdir.WorkDirLock), and the run in it, if any, is checked against the config:
`checkpoint.resume=False` is refused where a run is (it would mix two), `checkpoint.start_over`
moves that run aside, and a resume whose config changes a field of the newest checkpoint's record
that it may not change (rlver_jax.train.spec.resume_changes) is refused, config.json untouched.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlver_jax.checks import InputError
from rlver_jax.files import atomic_write_text
from rlver_jax.models import lora as lora_lib
from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.parallel import hosts, sharding
from rlver_jax.parallel.device_groups import split_devices
from rlver_jax.parallel.sampling_copy import SamplingLayout
from rlver_jax.rl import offload, train_state
from rlver_jax.rl import program as rl_program
from rlver_jax.rl.batch import StepCollation
from rlver_jax.rollout.openings import check_openings
from rlver_jax.simulator.factory import check_endpoint
from rlver_jax.simulator.profiles import Profile, load_profiles
from rlver_jax.text import chat
from rlver_jax.train import ablation, banner, checkpoint, model_loading
from rlver_jax.train.abstract_run import AbstractRun, abstract_run, frozen_architecture
from rlver_jax.train.spec import DataSpec, RunSpec, resume_changes
from rlver_jax.train.tracking import TrackingSettings
from rlver_jax.train.workdir import WorkDir, WorkDirBusyError, WorkDirLock, move_aside, run_files

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Run:
    """Everything a training run needs, built from its spec by `build_run`."""

    spec: RunSpec
    workdir: pathlib.Path  # where the run's files go: `storage.local`
    storage: WorkDir  # config.workdir: a path, or a gs:// URL mirrored from `workdir`
    tracking: TrackingSettings  # Weights & Biases (off unless config.train.wandb_project)
    chat: chat.ChatTokens
    train_profiles: list[Profile]
    eval_profiles: list[Profile]
    mesh: Mesh
    # The step's dialogues (profiles_for_step x n, dialogue d of profile d // n): the process
    # holding row d of a batch of one row per dialogue runs it (`collation.dialogue_process[d]`)
    # and puts its training rows in its own rows of the global batch; this process runs `own_dialogues`.
    own_dialogues: np.ndarray
    collation: StepCollation  # how a step's dialogues become this process's rows of the train batch
    sampling_layout: SamplingLayout  # each process's sampling copy of the actor
    update: rl_program.UpdateProgram  # models, optimizers, the state's shardings, the jitted train step
    state: train_state.TrainState  # before step 0; the first update donates it
    frozen: Any | None  # the frozen weights the programs may read: a KL term's reference, or LoRA's base
    lora_base: dict | None = None  # LoRA: the base its checkpoints need (`lora_base`), in their records
    lock: WorkDirLock | None = None  # process 0's lock of the work directory, released when training ends


def split_profiles(data: DataSpec) -> tuple[list[Profile], list[Profile]]:
    """(training, held-out) profiles: `data.eval_profiles`, or the last `data.eval_holdout` of training's."""
    if not data.train_profiles:
        raise ValueError("config.data.train_profiles is empty: set it to a JSONL profile file, e.g. "
                         "--config.data.train_profiles=../shared/data/rlver/train_profile.jsonl")
    train = load_profiles(data.train_profiles)
    if data.eval_profiles:
        return train, load_profiles(data.eval_profiles)
    k = data.eval_holdout
    if k >= len(train):
        raise ValueError(f"config.data.eval_holdout={k} leaves no training profiles out of {len(train)}")
    return (train[:-k], train[-k:]) if k else (train, [])


def dialogue_processes(profiles_per_step: int, n: int, mesh: Mesh) -> np.ndarray:
    """The process of each dialogue of a step (the process holding its row of the batch), checked
    so that a GRPO group never spans two processes. Local arithmetic on the mesh, no collective."""
    k = profiles_per_step
    owner = sharding.row_processes(mesh, k * n)
    split = [g for g, row in enumerate(owner.reshape(k, n)) if len(set(row.tolist())) > 1]
    if split:
        count = jax.process_count()
        raise ValueError(
            f"config.rollout.profiles_per_step={k} profiles x n={n} dialogues do not split into whole GRPO "
            f"groups over the {count} processes (group {split[0]} would span processes "
            f"{sorted(set(owner.reshape(k, n)[split[0]].tolist()))}): make config.rollout.profiles_per_step a "
            f"multiple of {count}")
    return owner


def _tokenizer(model: model_loading.ModelSource, workdir: pathlib.Path) -> chat.ChatTokens:
    """The run's tokenizer. A tiny run builds one (deterministically) in WORKDIR/tokenizer on
    process 0; the other processes build theirs in a temporary directory, so no two write one file."""
    if jax.process_index() == 0:
        return model_loading.tokenizer_for(model, workdir)
    with tempfile.TemporaryDirectory(prefix="rlver_tokenizer_") as tmp:
        return model_loading.tokenizer_for(model, pathlib.Path(tmp))


def lora_base(spec: RunSpec) -> dict | None:
    """The record a LoRA run's checkpoints carry (they hold the adapters, not the base): the base
    (a Hugging Face directory, or the preset and seed of a random init) and the adapters' settings.
    None in full fine-tuning."""
    lora = spec.lora
    if not lora.enabled:
        return None
    base = ({"model_path": spec.model.path} if spec.model.path
            else {"random_init": spec.model.preset, "seed": spec.loop.seed})
    return {**base, "base_dtype": lora.base_dtype, "rank": lora.rank, "alpha": lora.alpha,
            "targets": list(lora.targets), "modules_to_save": list(lora.modules_to_save)}


def _init_adapters(static: tuple[lora_lib.LoraSettings, Qwen2Config], key: jax.Array) -> Any:
    """Fresh adapters of model `cfg` (its own tree: a critic has no LM head to adapt)."""
    lora, cfg = static
    return lora_lib.init_adapters(lora, qwen2.abstract_params(cfg), key)


def initial_models(spec: RunSpec, prog: rl_program.UpdateProgram) -> tuple[Any, Any | None, Any | None]:
    """(actor, critic, frozen weights) before step 0, in the program's shardings. Full fine-tuning:
    the policy, the critic from it and a copy of the policy (a KL term). LoRA: the frozen weights are
    the base (config.lora.base_dtype), the actor fresh adapters, the critic fresh adapters and a value
    head: the adapters' B is zero, so both models start as the base does."""
    actor_cfg, lora = prog.actor_cfg, spec.lora
    init_key = train_state.seed_keys(spec.loop.seed).init
    if not lora.enabled:
        actor = model_loading.load_policy(spec.model, actor_cfg, prog.shardings.actor, init_key)
        ref_params = jax.tree.map(jnp.copy, actor) if prog.rl.uses_reference else None
        critic = None
        if prog.rl.uses_critic:
            critic = model_loading.load_critic(spec.critic, prog.critic_cfg, actor, prog.shardings.critic)
        return actor, critic, ref_params
    base = model_loading.load_policy(spec.model, frozen_architecture(actor_cfg, lora), prog.ref_shardings, init_key)

    def adapters(cfg: Qwen2Config, key: jax.Array, shardings: Any) -> Any:
        return sharding.init_in_shards(_init_adapters, (lora, cfg), key,
                                       {k: v for k, v in shardings.items() if not k.startswith("value_")})

    actor = adapters(actor_cfg, jax.random.fold_in(init_key, 1), prog.shardings.actor)
    critic = None
    if prog.rl.uses_critic:
        head = model_loading.value_head(prog.critic_cfg, spec.critic.value_head_init,
                                        model_loading.value_head_key(spec.critic.seed))
        critic = {**adapters(prog.critic_cfg, jax.random.fold_in(init_key, 2), prog.shardings.critic),
                  **jax.device_put(head, {k: prog.shardings.critic[k] for k in head})}
    return actor, critic, base


class WorkDirError(RuntimeError):
    """Process 0 refused the work directory (its error, as every other process reports it)."""


def claim(spec: RunSpec, storage: WorkDir) -> WorkDirLock | None:
    """Process 0's lock of the work directory, once the run found there (if any) may be resumed or
    started by `spec` (`_check_workdir`); every process raises process 0's refusal. Nothing else
    is written before it returns."""
    lock, error = None, None
    if jax.process_index() == 0:
        try:
            lock = WorkDirLock(storage.location, "training").acquire()
            _check_workdir(spec, storage)
        except (WorkDirBusyError, ValueError, OSError) as e:
            error = e
            if lock is not None:
                lock.release()
    refusal = hosts.allgather_json(str(error) if error is not None else None)[0]
    if error is not None:
        raise error
    if refusal is not None:
        raise WorkDirError(refusal)
    return lock


def _check_workdir(spec: RunSpec, storage: WorkDir) -> None:
    """Refuse `checkpoint.resume=False` where a run is, move it aside with `checkpoint.start_over`,
    and refuse a resume that changes what it may not (spec.resume_changes) against the newest
    checkpoint's record."""
    loop, where = spec.loop, storage.location
    found = run_files(where)
    if loop.start_over:
        if found:
            aside = move_aside(where)
            log.warning("config.checkpoint.start_over: moved the run in %s (%s) to %s; starting from step 0", where,
                        ", ".join(found), aside)
        return
    if not loop.resume:
        if found:
            raise InputError(f"{where} holds a run ({', '.join(found)}): config.checkpoint.resume=False would mix a "
                             "new run into it. Use a new config.workdir, or --config.checkpoint.start_over=True to "
                             f"move this one to {where}.previous-N and start from step 0")
        return
    newest = checkpoint.newest_record(storage.checkpoints)
    if newest is None:
        return
    step, record = newest
    if "run" not in record:
        log.warning("the checkpoint of step %d in %s predates run records: its config is not checked against this "
                    "one (its config.json is %s)", step, storage.checkpoints, storage.local / "config.json")
        return
    resume_changes(record["run"], spec, f"the checkpoint of step {step} in {storage.checkpoints}")


# What `_build` writes in the work directory before training: the tiny tokenizer, config.json.
_BUILD_WRITES = ("tokenizer", "config.json", "ablation.json")


def build_run(spec: RunSpec) -> Run:
    """Build the run of `spec` (rlver_jax.train.spec): claims the work directory (`claim`: the lock
    and the checks of the run found there, before anything is written), then (process 0) writes
    its config.json once the profiles load, the simulator answers and the tokenizer is found. The
    lock is released by training (rlver_jax.train.loop.train_run), or here when building fails; a
    work directory this start made goes again then (WorkDir.remove_if_new), with what it wrote."""
    storage = WorkDir(spec.loop.workdir)
    try:
        lock = claim(spec, storage)
    except BaseException:
        storage.remove_if_new()  # a new directory, still empty
        raise
    try:
        return _build(spec, storage, lock)
    except BaseException:
        if lock is not None:  # what this start wrote in a directory it made (nothing trained yet), while it is ours
            storage.remove_if_new(_BUILD_WRITES)
            lock.release()
        storage.remove_if_new()
        raise


def _build(spec: RunSpec, storage: WorkDir, lock: WorkDirLock | None) -> Run:
    workdir = storage.local
    train_profiles, eval_profiles = split_profiles(spec.data)
    tracking_settings = dataclasses.replace(spec.tracking, run_dir=str(workdir))
    # A rerun of a run (after its simulator stayed down past the budget, say) waits for it as the run did.
    check_endpoint(spec.simulator, wait=spec.loop.resume and bool(run_files(storage.location)))
    chat_tokens = _tokenizer(spec.model, workdir)
    if jax.process_index() == 0:  # once the profiles, the simulator and the tokenizer were found
        atomic_write_text(workdir / "config.json", spec.config_json)
    # A profile whose opening fills the policy's budget would give dialogues without a policy turn.
    language = spec.simulator.language
    check_openings(chat_tokens, spec.rollout, train_profiles, "config.data.train_profiles", language)
    held_out = eval_profiles[:spec.loop.eval_max_profiles or None] if spec.loop.eval_every else []
    check_openings(chat_tokens, spec.eval.rollout, held_out, "the held-out profiles of the in-loop evaluation "
                   f"({spec.data.eval_profiles or 'config.data.eval_holdout'})", language)
    actor_cfg = model_loading.policy_architecture(spec.model)
    if actor_cfg.vocab_size < len(chat_tokens.tokenizer):
        raise ValueError(f"tokenizer has {len(chat_tokens.tokenizer)} tokens but the model's vocab_size is "
                         f"{actor_cfg.vocab_size}: config.model.tokenizer_path does not match the model")
    abstract: AbstractRun = abstract_run(spec, actor_cfg=actor_cfg)
    mesh, prog = abstract.mesh, abstract.update
    owner = dialogue_processes(spec.loop.profiles_per_step, spec.loop.n, mesh)
    own = np.flatnonzero(owner == jax.process_index())
    (log.info if jax.process_count() > 1 else log.debug)(  # one process: nothing a user needs to read
        "process %d of %d: %d local devices (%s), dialogues %s of the %d per step", jax.process_index(),
        jax.process_count(), jax.local_device_count(), jax.local_devices()[0].platform, _ranges(own), len(owner))
    if jax.process_index() == 0:  # what the run runs and changes, before the weights load
        changed = ablation.changed_fields(spec.record, spec.preset) if spec.preset is not None else {}
        noop = ablation.no_ops(spec, changed)
        print("\n".join(banner.describe(spec, params=actor_cfg.num_params(), train_profiles=train_profiles,
                                        eval_profiles=eval_profiles, mesh_shape=dict(mesh.shape),
                                        platform=jax.devices()[0].platform)
                        + ablation.banner_lines(changed, noop)), flush=True)
        atomic_write_text(workdir / "ablation.json", json.dumps(
            {"changed": {k: {"preset": p, "run": v} for k, (p, v) in changed.items()}, "no_ops": noop}, indent=2))
    actor, critic, frozen = initial_models(spec, prog)
    critic_tx = prog.critic_opt.tx if prog.rl.uses_critic else None
    state = train_state.init_train_state(actor, prog.actor_opt.tx, critic, critic_tx, spec.loop.seed,
                                         shardings=prog.shardings)
    state = offload.place(state, "rest", prog.offload, prog.shardings)  # where it waits between steps
    return Run(spec=spec, workdir=workdir, storage=storage, tracking=tracking_settings, chat=chat_tokens,
               train_profiles=train_profiles, eval_profiles=eval_profiles, mesh=mesh, own_dialogues=own,
               collation=StepCollation(spec.rl.batch_size, spec.rl.mini_batch_size,
                                       spec.loop.length_multiple, chat_tokens.end_of_text, owner,
                                       jax.process_index(), jax.process_count(), spec.rl.pack_rows),
               sampling_layout=SamplingLayout.create(actor_cfg, mesh, spec.mesh.rules,
                                                     split_devices(jax.devices(), spec.mesh.sampler_devices)[1]),
               update=prog, state=state, frozen=frozen, lora_base=lora_base(spec), lock=lock)


def _ranges(rows: np.ndarray) -> str:
    """Sorted indices as compact ranges, e.g. "0-3, 8-11"."""
    out, start = [], None
    for i, r in enumerate(rows):
        if start is None:
            start = r
        if i + 1 == len(rows) or rows[i + 1] != r + 1:
            out.append(f"{start}-{r}" if r > start else f"{start}")
            start = None
    return ", ".join(out) or "none"
