"""A training run built from its config, once: settings, profiles, tokenizer, models, optimizers,
shardings, the initial train state and the jitted update (`build_run` -> `Run`).

Errors in the config surface here, before any model is loaded or compiled, each naming the
config field and the fix. In a multi-host run every process builds the same Run and finds the
same errors before any collective, so a mismatch stops every process at once instead of a hang.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

from rlver_jax.checks import build_all, check_ranges
from rlver_jax.models import loading
from rlver_jax.text import chat
from rlver_jax.parallel import sharding
from rlver_jax.train import tracking
from rlver_jax.models import qwen2
from rlver_jax.models.config import Qwen2Config
from rlver_jax.models import lora as lora_lib
from rlver_jax.models.lora import LoraSettings
from rlver_jax.rl import offload, trainer
from rlver_jax.rollout.episodes import RolloutSettings
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.simulator.factory import check_endpoint
from rlver_jax.simulator.settings import SimulatorSettings
from rlver_jax.simulator.state import EmotionRules
from rlver_jax.simulator.profiles import Profile, load_profiles
from rlver_jax.train.workdir import WorkDir

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """What the training loop reads of the config: step count and batch, staleness, evaluation,
    transcript and checkpoint cadence, the seed."""

    steps: int  # config.train.steps
    profiles_per_step: int  # config.rollout: k profiles a step, n dialogues each
    n: int
    max_staleness: int  # config.rollout: policy versions a batch may lag
    length_multiple: int  # config.train: the training sequence length bucket
    eval_every: int  # config.train: in-loop evaluation every N steps (0: off), on at most
    eval_max_profiles: int  # this many held-out profiles (0: all)
    transcripts: bool  # config.train: write every batch's dialogues
    save_every: int  # config.checkpoint
    keep: int
    async_save: bool
    resume: bool
    seed: int  # config.seed
    workdir: str  # config.workdir as given (a path or a gs:// URL): for messages and the plot's title

    def __post_init__(self):
        check_ranges({"config.train.steps": self.steps, "config.train.eval_every": self.eval_every,
                      "config.train.eval_max_profiles": self.eval_max_profiles,
                      "config.train.length_multiple": self.length_multiple, "config.rollout.n": self.n,
                      "config.rollout.profiles_per_step": self.profiles_per_step,
                      "config.rollout.max_staleness": self.max_staleness,
                      "config.checkpoint.save_every": self.save_every, "config.checkpoint.keep": self.keep},
                     lowest={"steps": 0, "eval_every": 0, "eval_max_profiles": 0, "length_multiple": 1, "n": 1,
                             "profiles_per_step": 1, "max_staleness": 0, "save_every": 1, "keep": 1})

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> LoopSettings:
        t, r, c = config.train, config.rollout, config.checkpoint
        return cls(steps=t.steps, profiles_per_step=r.profiles_per_step, n=r.n, max_staleness=r.max_staleness,
                   length_multiple=t.length_multiple, eval_every=t.eval_every, eval_max_profiles=t.eval_max_profiles,
                   transcripts=t.transcripts, save_every=c.save_every, keep=c.keep, async_save=c.async_save,
                   resume=c.resume, seed=config.seed, workdir=config.workdir)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """The in-loop evaluation (`config.train.eval_*`): the training simulator's backend under SAGE's
    rules, the benchmark's policy sampling (configs/eval.py)."""

    simulator: SimulatorSettings
    rollout: RolloutSettings
    sampling: SamplingSettings

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, simulator: SimulatorSettings) -> EvalSettings:
        p, where = config.train.eval_policy, "config.train.eval_policy."
        rules, rollout, sampling = build_all(
            lambda: EmotionRules.from_config(config.train.eval_rules),
            lambda: RolloutSettings.from_config(p, where, think=config.rollout.think),
            lambda: SamplingSettings.from_config(p, where))
        return cls(dataclasses.replace(simulator, rules=rules), rollout, sampling)


@dataclasses.dataclass(frozen=True)
class Run:
    """Everything a training run needs, built from its config by `build_run`."""

    loop: LoopSettings
    config_record: dict[str, Any]  # config.to_dict(), which W&B records
    workdir: pathlib.Path  # where the run's files go: `storage.local`
    storage: WorkDir  # config.workdir: a path, or a gs:// URL mirrored from `workdir`
    rl: trainer.RLSettings
    rollout: RolloutSettings
    sampling: SamplingSettings
    simulator: SimulatorSettings
    eval: EvalSettings  # the in-loop evaluation
    tracking: tracking.TrackingSettings  # Weights & Biases (off unless config.train.wandb_project)
    chat: chat.ChatTokens
    train_profiles: list[Profile]
    eval_profiles: list[Profile]
    mesh: Mesh
    # The step's dialogues (profiles_for_step x n, dialogue d of profile d // n): the process
    # holding row d of a batch of one row per dialogue runs it (`dialogue_process[d]`) and puts
    # its training rows in its own rows of the global batch; this process runs `own_dialogues`.
    dialogue_process: np.ndarray
    own_dialogues: np.ndarray
    sampling_layout: sharding.SamplingLayout  # each process's sampling copy of the actor
    update: trainer.UpdateProgram  # models, optimizers, the state's shardings, the jitted train step
    state: trainer.TrainState  # before step 0; the first update donates it
    ref_params: Any | None  # the frozen reference policy (a KL term), or LoRA's base (every program's)
    lora_base: dict | None = None  # LoRA: the base its checkpoints need (`lora_base`), in their records


def rl_settings(config: ml_collections.ConfigDict) -> trainer.RLSettings:
    dialogues = config.rollout.profiles_per_step * config.rollout.n
    fields = config.rl.to_dict()
    whole = not fields["mini_batch_size"]
    fields["mini_batch_size"] = fields["mini_batch_size"] or dialogues
    fields["micro_batch_size"] = min(fields["micro_batch_size"], fields["mini_batch_size"])
    # 0: the whole batch, one optimizer step per epoch, cut in dialogues whatever their rows; else
    # mini-batches of mini_batch_size train-batch rows (the reference's ppo_mini_batch_size)
    fields["batch_size"] = dialogues if whole else 0
    rl = trainer.RLSettings(**fields)
    if rl.algo == "grpo" and config.rollout.n < 2:
        raise ValueError(f"config.rl.algo='grpo' needs config.rollout.n >= 2 dialogues per profile "
                         f"(got {config.rollout.n}); e.g. --config.rollout.n=4")
    return rl


def split_profiles(config: ml_collections.ConfigDict) -> tuple[list[Profile], list[Profile]]:
    """(training, held-out) profiles: `data.eval_profiles`, or the last `data.eval_holdout` of training's."""
    if not config.data.train_profiles:
        raise ValueError("config.data.train_profiles is empty: set it to a JSONL profile file, e.g. "
                         "--config.data.train_profiles=../shared/data/rlver/train_profile.jsonl")
    train = load_profiles(config.data.train_profiles)
    if config.data.eval_profiles:
        return train, load_profiles(config.data.eval_profiles)
    k = config.data.eval_holdout
    if k >= len(train):
        raise ValueError(f"config.data.eval_holdout={k} leaves no training profiles out of {len(train)}")
    return (train[:-k], train[-k:]) if k else (train, [])


def check_mesh(rl: trainer.RLSettings, mesh: Mesh, config: ml_collections.ConfigDict) -> None:
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    unit = "dialogues" if rl.batch_size else "rows"
    if rl.mini_batch_size % shards:
        raise ValueError(
            f"mini-batches of {rl.mini_batch_size} {unit} must split over the {shards} data x fsdp shards of "
            f"config.mesh.shape={tuple(config.mesh.shape)}: change config.rollout.profiles_per_step or "
            "config.rl.mini_batch_size, or move devices to the tensor axis")
    if not rl.batch_size and rl.mini_batch_size % jax.process_count():
        raise ValueError(f"config.rl.mini_batch_size={rl.mini_batch_size} rows must split over the "
                         f"{jax.process_count()} processes (each pads its rows to a multiple of its share): "
                         "make it a multiple of the process count")


def dialogue_processes(config: ml_collections.ConfigDict, mesh: Mesh) -> np.ndarray:
    """The process of each dialogue of a step (the process holding its row of the batch), checked
    so that a GRPO group never spans two processes. Local arithmetic on the mesh, no collective."""
    k, n = config.rollout.profiles_per_step, config.rollout.n
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


def _tokenizer(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> chat.ChatTokens:
    """The run's tokenizer. A tiny run builds one (deterministically) in WORKDIR/tokenizer on
    process 0; the other processes build theirs in a temporary directory, so no two write one file."""
    if jax.process_index() == 0:
        return loading.tokenizer_for(config, workdir)
    with tempfile.TemporaryDirectory(prefix="rlver_tokenizer_") as tmp:
        return loading.tokenizer_for(config, pathlib.Path(tmp))


def make_optimizers(config: ml_collections.ConfigDict, rl: trainer.RLSettings
                    ) -> tuple[trainer.Optimizer, trainer.Optimizer | None]:
    """The actor's and (PPO) the critic's optimizer; their schedules count the run's train steps. With
    LoRA the adapters' learning rates are config.optim's x config.lora.lr_multiplier, the other
    trainable leaves' (modules_to_save, a value head) config.optim's (lora.full_rank_rate)."""
    lora = _lora_settings(config)

    def make(fields: ml_collections.ConfigDict) -> trainer.Optimizer:
        settings = trainer.OptimSettings(**fields)
        if not lora.enabled:
            return trainer.make_optimizer(settings, config.train.steps)
        opt = trainer.make_optimizer(dataclasses.replace(settings, lr=settings.lr * lora.lr_multiplier),
                                     config.train.steps)
        return dataclasses.replace(opt, tx=optax.chain(opt.tx, lora_lib.full_rank_rate(lora)))

    return make(config.optim.actor), make(config.optim.critic) if rl.uses_critic else None


def base_architecture(actor_cfg: Qwen2Config, lora: LoraSettings) -> Qwen2Config:
    """The frozen base of a LoRA run: the actor's architecture stored in config.lora.base_dtype."""
    return actor_cfg.replace(param_dtype=lora.base_dtype)


def trainable_shapes(lora: LoraSettings, cfg: Qwen2Config, mesh: Mesh, rules) -> tuple[Any, Any]:
    """(ShapeDtypeStructs, NamedShardings) of what model `cfg` (the actor, or the critic with its value
    head) trains: every parameter in full fine-tuning; with LoRA its adapters (fp32, sharded by their
    logical axes) and a critic's value head."""
    full, full_sh = qwen2.abstract_params(cfg), sharding.param_shardings(cfg, mesh, rules)
    if not lora.enabled:
        return full, full_sh
    adapters = jax.eval_shape(lambda k: lora_lib.init_adapters(lora, full, k), jax.random.key(0))
    adapters_sh = sharding.tree_shardings(lora_lib.adapter_axes(lora, qwen2.logical_axes(cfg)), adapters, mesh, rules)
    head = [k for k in full if k.startswith("value_")]
    return {**adapters, **{k: full[k] for k in head}}, {**adapters_sh, **{k: full_sh[k] for k in head}}


def update_program(config: ml_collections.ConfigDict, rl: trainer.RLSettings, mesh: Mesh,
                   actor_cfg: Qwen2Config) -> trainer.UpdateProgram:
    """Everything of the update that follows from the config and the actor's architecture, before
    any weight exists: build_run loads weights into it; launch/plan.py compiles it from shapes.
    With LoRA the state's models are their trainable leaves (`trainable_shapes`) and the reference
    slot holds the frozen base (trainer.model_params)."""
    lora, rules = _lora_settings(config), config.mesh.rules
    actor, actor_sh = trainable_shapes(lora, actor_cfg, mesh, rules)
    actor_opt, critic_opt = make_optimizers(config, rl)
    critic_cfg = critic_sh = critic = critic_tx = None
    if rl.uses_critic:
        critic_cfg = loading.critic_config(actor_cfg)
        critic, critic_sh = trainable_shapes(lora, critic_cfg, mesh, rules)
        critic_tx = critic_opt.tx
    state_sh = trainer.state_shardings(actor_opt.tx, actor, actor_sh, critic_tx, critic, critic_sh)
    ref_sh = sharding.param_shardings(actor_cfg, mesh, rules) if rl.uses_reference or lora.enabled else None
    return trainer.make_update_program(rl, actor_cfg, critic_cfg, actor_opt, critic_opt, mesh, state_sh, ref_sh,
                                       rules, offload=config.train.offload, lora=lora)


def lora_base(config: ml_collections.ConfigDict, lora: LoraSettings) -> dict | None:
    """The record a LoRA run's checkpoints carry (they hold the adapters, not the base): the base
    (a Hugging Face directory, or the preset and seed of a random init) and the adapters' settings.
    None in full fine-tuning."""
    if not lora.enabled:
        return None
    base = ({"model_path": config.model.path} if config.model.path
            else {"random_init": config.model.preset, "seed": config.seed})
    return {**base, "base_dtype": lora.base_dtype, "rank": lora.rank, "alpha": lora.alpha,
            "targets": list(lora.targets), "modules_to_save": list(lora.modules_to_save)}


def initial_models(config: ml_collections.ConfigDict, prog: trainer.UpdateProgram, actor_cfg: Qwen2Config
                   ) -> tuple[Any, Any | None, Any | None]:
    """(actor, critic, reference or base) before step 0, in the program's shardings. Full fine-tuning:
    the policy, the critic from it (PPO) and a copy of the policy (a KL term). LoRA: the policy is
    the frozen base (config.lora.base_dtype), the actor fresh adapters, the critic fresh adapters and
    a value head (PPO): the adapters' B is zero, so both models start as the base does."""
    init_key = trainer.seed_keys(config.seed).init
    if not prog.lora.enabled:
        actor = loading.load_policy(config, actor_cfg, prog.shardings.actor, init_key)
        ref_params = jax.tree.map(jnp.copy, actor) if prog.rl.uses_reference else None
        critic = None
        if prog.rl.uses_critic:
            critic = loading.load_critic(config, prog.critic_cfg, actor, prog.shardings.critic)
        return actor, critic, ref_params
    base_cfg = base_architecture(actor_cfg, prog.lora)
    base = loading.load_policy(config, base_cfg, prog.ref_shardings, init_key)

    def adapters(cfg: Qwen2Config, key: jax.Array, shardings: Any) -> Any:
        abstract = qwen2.abstract_params(cfg)  # the model's own tree: a critic has no LM head to adapt
        init = jax.jit(lambda k: lora_lib.init_adapters(prog.lora, abstract, k),
                       out_shardings={k: v for k, v in shardings.items() if not k.startswith("value_")})
        return init(key)

    actor = adapters(actor_cfg, jax.random.fold_in(init_key, 1), prog.shardings.actor)
    critic = None
    if prog.rl.uses_critic:
        head = loading.value_head(prog.critic_cfg, config.critic.value_head_init, loading.value_head_key(config.seed))
        critic = {**adapters(prog.critic_cfg, jax.random.fold_in(init_key, 2), prog.shardings.critic),
                  **jax.device_put(head, {k: prog.shardings.critic[k] for k in head})}
    return actor, critic, base


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """Every settings type of a training config, each built and checked by its own constructor."""

    loop: LoopSettings
    sampling: SamplingSettings
    rollout: RolloutSettings
    simulator: SimulatorSettings
    eval: EvalSettings
    rl: trainer.RLSettings
    tracking: tracking.TrackingSettings
    lora: LoraSettings = LoraSettings()


def training_settings(config: ml_collections.ConfigDict) -> TrainingSettings:
    """The settings of a training config, before anything is touched: one ValueError names every
    bad field."""
    r = config.rollout
    loop, sampling, rollout, simulator = build_all(
        lambda: LoopSettings.from_config(config),
        lambda: SamplingSettings.from_config(r, "config.rollout."),
        lambda: RolloutSettings.from_config(r, "config.rollout.", think=r.think, pipeline_groups=r.pipeline_groups),
        lambda: SimulatorSettings.from_config(config.simulator))
    # Then what builds on those (the in-loop evaluation varies the simulator's settings; rl_settings
    # divides by the batch sizes checked above).
    eval_settings, rl, tracking_settings, lora_settings = build_all(
        lambda: EvalSettings.from_config(config, simulator), lambda: rl_settings(config),
        lambda: tracking.TrackingSettings.from_config(config), lambda: _lora_settings(config))
    return TrainingSettings(loop, sampling, rollout, simulator, eval_settings, rl, tracking_settings, lora_settings)


def _lora_settings(config: ml_collections.ConfigDict) -> LoraSettings:
    """config.lora, typed. A LoRA critic is the actor's base plus its own adapters and value head,
    so a separate critic checkpoint (config.critic.path) has no place in it."""
    lora = LoraSettings.from_config(config.lora) if "lora" in config else LoraSettings()
    if lora.enabled and config.critic.path:
        raise ValueError(f"config.critic.path={config.critic.path!r} with config.lora.rank={lora.rank}: the LoRA "
                         "critic shares the policy's frozen base (its own adapters and value head on it); "
                         "set --config.critic.path= or config.lora.rank=0")
    return lora


def build_run(config: ml_collections.ConfigDict) -> Run:
    """Build the run of `config` (configs/base.py); creates the work directory and (process 0)
    writes its config.json. Every settings type checks its fields before anything is touched."""
    s = training_settings(config)
    loop, sampling, rollout, simulator, eval_settings, rl, tracking_settings = (
        s.loop, s.sampling, s.rollout, s.simulator, s.eval, s.rl, s.tracking)
    storage = WorkDir(config.workdir)
    workdir = storage.local
    if jax.process_index() == 0:
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    train_profiles, eval_profiles = split_profiles(config)
    tracking_settings = dataclasses.replace(tracking_settings, run_dir=str(workdir))
    check_endpoint(simulator)
    chat_tokens = _tokenizer(config, workdir)

    mesh = sharding.make_mesh(config.mesh.shape)
    check_mesh(rl, mesh, config)
    owner = dialogue_processes(config, mesh)
    own = np.flatnonzero(owner == jax.process_index())
    log.info("process %d of %d: %d local devices (%s), dialogues %s of the %d per step", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.local_devices()[0].platform, _ranges(own), len(owner))
    actor_cfg = loading.policy_architecture(config)
    if actor_cfg.vocab_size < len(chat_tokens.tokenizer):
        raise ValueError(f"tokenizer has {len(chat_tokens.tokenizer)} tokens but the model's vocab_size is "
                         f"{actor_cfg.vocab_size}: config.model.tokenizer_path does not match the model")
    prog = update_program(config, rl, mesh, actor_cfg)
    actor, critic, ref_params = initial_models(config, prog, actor_cfg)
    critic_tx = prog.critic_opt.tx if rl.uses_critic else None
    state = trainer.init_train_state(actor, prog.actor_opt.tx, critic, critic_tx, config.seed, shardings=prog.shardings)
    state = offload.place(state, "rest", prog.offload, prog.shardings)  # where it waits between steps
    return Run(loop=loop, config_record=config.to_dict(), workdir=workdir, storage=storage, rl=rl, rollout=rollout,
               sampling=sampling, simulator=simulator, eval=eval_settings, tracking=tracking_settings,
               chat=chat_tokens, train_profiles=train_profiles, eval_profiles=eval_profiles, mesh=mesh,
               dialogue_process=owner, own_dialogues=own,
               sampling_layout=sharding.SamplingLayout.create(actor_cfg, mesh, config.mesh.rules), update=prog,
               state=state, ref_params=ref_params, lora_base=lora_base(config, s.lora))


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
