"""A training config as typed, frozen specs: the one reader of a training ConfigDict below launch/.

`RunSpec.from_config(config)` reads every section (model, critic, LoRA, mesh, RL, optimizers,
loop, rollout, sampling, simulator, the in-loop evaluation, data, tracking) into the settings types
of the packages that use them, each checked by its own constructor; one ValueError names every bad
field. Nothing below this module takes the config: the run (rlver_jax.train.run), the abstract run
(rlver_jax.train.abstract_run), the planner and the evaluation's checkpoint loading take these specs.
A run's config.json is read back (`saved_config`) through `model_source` and `lora_settings` (rlver_jax.eval).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import ml_collections

from rlver_jax.checks import InputError, build_all, check_ranges
from rlver_jax.engines.table import EngineSettings, check_read, engine_fields
from rlver_jax.models import smollm2
from rlver_jax.models.lora_settings import LoraSettings
from rlver_jax.rl.batch import minibatch_unit
from rlver_jax.rl.offload_modes import OFFLOAD
from rlver_jax.rl.settings import OptimSettings, RLSettings
from rlver_jax.rollout.episodes import RolloutSettings
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.simulator.backends import TRANSPORT
from rlver_jax.simulator.settings import SimulatorSettings
from rlver_jax.simulator.state import EmotionRules
from rlver_jax.train.model_source import CriticSource, ModelSource
from rlver_jax.train.tracking import TrackingSettings

if TYPE_CHECKING:  # the spec imports no JAX: launch/train.py checks a config before importing it
    from rlver_jax.parallel.sharding import RulesLike


DEGENERATE_ACTIONS = ("warn", "stop")  # config.train.degenerate_alarm_action and template_alarm_action


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
    start_over: bool = False  # config.checkpoint: move a run found in the work directory aside
    allow_changes: tuple[str, ...] = ()  # fields a resume may change (`RunSpec.identity`)
    stop_within_s: float = 20.0  # after SIGTERM / Ctrl-C, the time to save in (rlver_jax.train.interrupts)
    read_attempts: int = 3  # reads of a checkpoint before it is unreadable
    max_param_norm_growth: float = 2.0  # config.train: the most a step may grow a parameter norm by (0: off)
    degenerate_alarm: float = 0.0  # config.train: a rise of degenerate_rate over the run's lowest that alarms (0: off)
    degenerate_alarm_action: str = "warn"  # config.train: one of DEGENERATE_ACTIONS
    template_alarm: float = 0.0  # config.train: a template_rate that alarms (0: off)
    template_alarm_action: str = "warn"  # config.train: one of DEGENERATE_ACTIONS
    partial_rollouts: bool = True  # config.rollout: in-flight dialogues move to newer versions (rollout.versions)

    def __post_init__(self):
        check_ranges({"config.train.steps": self.steps, "config.train.eval_every": self.eval_every,
                      "config.train.eval_max_profiles": self.eval_max_profiles,
                      "config.train.length_multiple": self.length_multiple, "config.rollout.n": self.n,
                      "config.rollout.profiles_per_step": self.profiles_per_step,
                      "config.rollout.max_staleness": self.max_staleness,
                      "config.checkpoint.save_every": self.save_every, "config.checkpoint.keep": self.keep,
                      "config.checkpoint.stop_within_s": self.stop_within_s,
                      "config.checkpoint.read_attempts": self.read_attempts,
                      "config.train.max_param_norm_growth": self.max_param_norm_growth,
                      "config.train.degenerate_alarm": self.degenerate_alarm,
                      "config.train.template_alarm": self.template_alarm},
                     lowest={"steps": 0, "degenerate_alarm": 0, "template_alarm": 0, "eval_every": 0,
                             "eval_max_profiles": 0, "length_multiple": 1, "n": 1, "profiles_per_step": 1,
                             "max_staleness": 0,
                             "save_every": 1, "keep": 1, "read_attempts": 1, "max_param_norm_growth": 0},
                     positive=("stop_within_s",))
        if self.degenerate_alarm >= 1:
            raise ValueError(f"config.train.degenerate_alarm={self.degenerate_alarm} is a rise of a rate: use 0 (off) "
                             "or a number below 1, e.g. 0.3")
        if self.template_alarm > 1:
            raise ValueError(f"config.train.template_alarm={self.template_alarm} is a share of replies: use 0 (off) "
                             "or a number up to 1, e.g. 0.5")
        for name in ("degenerate_alarm_action", "template_alarm_action"):
            if getattr(self, name) not in DEGENERATE_ACTIONS:
                raise ValueError(f"config.train.{name}={getattr(self, name)!r}: use one of {DEGENERATE_ACTIONS}")
        growth = self.max_param_norm_growth
        if growth and not (1 < growth < math.inf):
            raise ValueError(f"config.train.max_param_norm_growth={growth} must be 0 (off) or a finite number > 1")
        if not math.isfinite(self.stop_within_s):
            raise ValueError(f"config.checkpoint.stop_within_s={self.stop_within_s} must be finite")
        if fixed := [f for f in self.allow_changes if f != "*" and change_kind(f) != "may change"]:
            raise ValueError("; ".join(f"config.checkpoint.allow_changes names {f!r}, " + (
                "part of the run's identity: it cannot change within a run (use a new config.workdir)"
                if change_kind(f) == "identity" else "which changes freely: leave it out") for f in fixed))

    @property
    def dialogues(self) -> int:
        """Dialogues per train step: profiles_per_step x n."""
        return self.profiles_per_step * self.n

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> LoopSettings:
        t, r, c = config.train, config.rollout, config.checkpoint
        return cls(steps=t.steps, profiles_per_step=r.profiles_per_step, n=r.n, max_staleness=r.max_staleness,
                   length_multiple=t.length_multiple, eval_every=t.eval_every, eval_max_profiles=t.eval_max_profiles,
                   transcripts=t.transcripts, save_every=c.save_every, keep=c.keep, async_save=c.async_save,
                   resume=c.resume, seed=config.seed, workdir=config.workdir, start_over=c.start_over,
                   allow_changes=tuple(f.strip() for f in c.allow_changes.split(",") if f.strip()),
                   stop_within_s=c.stop_within_s, read_attempts=c.read_attempts,
                   max_param_norm_growth=t.max_param_norm_growth, degenerate_alarm=t.degenerate_alarm,
                   degenerate_alarm_action=t.degenerate_alarm_action, template_alarm=t.template_alarm,
                   template_alarm_action=t.template_alarm_action, partial_rollouts=r.partial_rollouts)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """The in-loop evaluation (`config.train.eval_*`): the training simulator's backend under SAGE's
    rules, the benchmark's policy sampling (configs/eval.py) on the rollout's engine."""

    simulator: SimulatorSettings
    rollout: RolloutSettings
    sampling: SamplingSettings

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, simulator: SimulatorSettings, engine: EngineSettings,
                    given: Collection[str] = ()) -> EvalSettings:
        """`given`: the fields of config.train.eval_policy the command line set, refused where the
        rollout's engine does not read them (engines.table.check_read)."""
        p, where = config.train.eval_policy, "config.train.eval_policy."
        _, rules, rollout, sampling = build_all(
            lambda: check_read(engine.engine, given, where, engine_flag=f"{engine.where}engine"),
            lambda: EmotionRules.from_config(config.train.eval_rules),
            lambda: RolloutSettings.from_config(p, where, think=config.rollout.think,
                                                continuous=engine.row.continuous),
            lambda: SamplingSettings.from_config(p, where))
        return cls(dataclasses.replace(simulator, rules=rules), rollout, sampling)


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """The profile files (`config.data`): training, and held-out ones or a held-out tail of training's."""

    train_profiles: str
    eval_profiles: str = ""
    eval_holdout: int = 0


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """`config.mesh`: the (data, fsdp, tensor) device counts, the logical-axis rules and the devices
    of each process set aside for sampling (parallel.device_groups)."""

    shape: tuple[int, ...]
    rules: RulesLike
    sampler_devices: int = 0

    def __post_init__(self):
        check_ranges({"config.mesh.sampler_devices": self.sampler_devices}, lowest={"sampler_devices": 0})


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything a training config says, typed (`from_config`)."""

    model: ModelSource
    critic: CriticSource
    lora: LoraSettings
    mesh: MeshSpec
    rl: RLSettings
    actor_optim: OptimSettings
    critic_optim: OptimSettings  # read only when the algorithm has a critic
    loop: LoopSettings
    rollout: RolloutSettings
    sampling: SamplingSettings
    engine: EngineSettings  # the engine of the rollouts and the in-loop evaluation (engines.table)
    simulator: SimulatorSettings
    eval: EvalSettings
    tracking: TrackingSettings
    data: DataSpec
    offload: str  # a row of rlver_jax.rl.offload_modes.OFFLOAD (config.train.offload)
    record: dict[str, Any]  # config.to_dict(): what W&B records and `override` rebuilds from
    config_json: str  # the run's config.json
    preset: dict[str, Any] | None = None  # the config file's preset alone, to_dict() (what an ablation changes)

    @property
    def resume_record(self) -> dict[str, Any]:
        """The fields a resume compares (every one but those that change freely, `change_kind`), by
        dotted name, as JSON reads them back: stored in every checkpoint's record (rlver_jax.train.loop).
        config.rl's fields are compared as RLSettings resolves them ("" or None: the algorithm row's
        value), so a row default spelled out, or a config file that leaves it to the row, is no change."""
        fields = flat_fields(self.record)
        resolved = flat_fields({"rl": dataclasses.asdict(self.rl)})
        fields.update({k: v for k, v in resolved.items() if k in fields})
        return {k: v for k, v in fields.items() if change_kind(k) != "free"}

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, given: Collection[str] = (),
                    preset: ml_collections.ConfigDict | None = None) -> RunSpec:
        """The specs of `config` (configs/base.py), before anything is touched: one ValueError names
        every bad field. `given`: the dotted fields the command line set (e.g. "simulator.base_url"),
        refused where what the config chose ignores them (a served simulator's URL given to the
        embedded one, the static engine's pipeline_groups to the continuous one). `preset`: the
        config file's own config, without the overrides (the banner says what the run changes,
        rlver_jax.train.ablation). Imports no JAX, so launch/train.py checks a config before
        importing it."""
        r = config.rollout

        def given_in(section: str) -> set[str]:
            return {f[len(section):] for f in given if f.startswith(section)}

        loop, sampling, engine, rollout, simulator, model, critic, lora, actor_optim, critic_optim = build_all(
            lambda: LoopSettings.from_config(config),
            lambda: SamplingSettings.from_config(r, "config.rollout."),
            lambda: EngineSettings.from_config(r, "config.rollout.", given_in("rollout.")),
            lambda: RolloutSettings.from_config(r, "config.rollout.", think=r.think, pipeline_groups=r.pipeline_groups,
                                                batch_wait_s=r.batch_wait_s),
            lambda: SimulatorSettings.from_config(config.simulator, given=given_in("simulator.")),
            lambda: model_source(config),
            lambda: CriticSource(config.critic.path, config.critic.value_head_init, config.seed),
            lambda: lora_settings(config),
            lambda: optim_settings(config.optim.actor, "config.optim.actor."),
            lambda: optim_settings(config.optim.critic, "config.optim.critic."))
        # Then what builds on those (the engine says how turns reach it; the in-loop evaluation varies
        # the simulator's settings; the RL settings divide by the batch sizes checked above).
        rollout = dataclasses.replace(rollout, continuous=engine.row.continuous)
        eval_settings, rl, tracking, offload = build_all(
            lambda: EvalSettings.from_config(config, simulator, engine, given_in("train.eval_policy.")),
            lambda: rl_settings(config), lambda: TrackingSettings.from_config(config),
            lambda: OFFLOAD.check(config.train.offload))
        if lora.enabled and critic.path:
            raise ValueError(f"config.critic.path={critic.path!r} with config.lora.rank={lora.rank}: the LoRA "
                             "critic shares the policy's frozen base (its own adapters and value head on it); "
                             "set --config.critic.path= or config.lora.rank=0")
        fields = flat_fields(config.to_dict())
        unknown = [f for f in loop.allow_changes if f != "*" and not _names_a_field(f, fields)]
        if unknown:
            raise ValueError(f"config.checkpoint.allow_changes names {', '.join(map(repr, unknown))}: not a field "
                             "of the config (--print_config lists them)")
        d = config.data
        return cls(model=model, critic=critic, lora=lora, mesh=MeshSpec(tuple(config.mesh.shape), config.mesh.rules,
                                                                config.mesh.sampler_devices),
                   rl=rl, actor_optim=actor_optim, critic_optim=critic_optim, loop=loop, rollout=rollout,
                   sampling=sampling, engine=engine, simulator=simulator, eval=eval_settings, tracking=tracking,
                   data=DataSpec(d.train_profiles, d.eval_profiles, d.eval_holdout), offload=offload,
                   record=config.to_dict(), config_json=config.to_json_best_effort(indent=2),
                   preset=preset.to_dict() if preset is not None else None)

    def check_paths(self) -> None:
        """The local paths training reads (model, tokenizer, critic, profiles) exist, or one
        ValueError naming every missing one by its config field, before anything is written or
        imported. The planner, which reads no weights, does not call it."""
        problems = []
        if not self.model.path:
            if not self.model.random_init:
                problems.append(f"config.model.path is empty for preset {self.model.preset!r}: set "
                                "--config.model.path to a local Hugging Face directory (docs/training.md, \"Real "
                                "weights and data\"), or use a :tiny config")
        elif not (pathlib.Path(self.model.path) / "config.json").is_file():
            what = "holds no config.json" if pathlib.Path(self.model.path).is_dir() else "does not exist"
            problems.append(f"config.model.path={self.model.path!r} {what}: point it at a Hugging Face model directory"
                            + (smollm2.missing_hint(self.model.path)
                               or " (docs/training.md, \"Real weights and data\": "
                               "`hf download Qwen/Qwen2.5-7B-Instruct --local-dir DIR`)"))
        for field, path in (("config.model.tokenizer_path", self.model.tokenizer_path),
                            ("config.critic.path", self.critic.path)):
            if path and not pathlib.Path(path).is_dir():
                problems.append(f"{field}={path!r}: no such directory")
        if not self.data.train_profiles:
            problems.append("config.data.train_profiles is empty: set it to a JSONL profile file, e.g. "
                            "--config.data.train_profiles=../shared/data/rlver/train_profile.jsonl")
        for field, path in (("config.data.train_profiles", self.data.train_profiles),
                            ("config.data.eval_profiles", self.data.eval_profiles)):
            if path and pathlib.Path(path).is_dir():
                problems.append(f"{field}={path!r} is a directory: give a JSON Lines profile file")
            elif path and not pathlib.Path(path).is_file():
                problems.append(f"{field}={path!r}: no such file (the reference profiles: docs/training.md, "
                                "\"Real weights and data\")")
        if problems:
            raise ValueError("; ".join(problems))

    def override(self, **fields: Any) -> RunSpec:
        """The spec of this config with dotted fields set, e.g. override(**{"rl.micro_batch_size": 4})."""
        config = ml_collections.ConfigDict(self.record)
        for path, value in fields.items():
            *parents, leaf = path.split(".")
            node = config
            for name in parents:
                node = node[name]
            node[leaf] = value
        return RunSpec.from_config(config)


def rl_settings(config: ml_collections.ConfigDict) -> RLSettings:
    """config.rl with its mini-batch unit (rlver_jax.rl.batch.minibatch_unit) for the step's dialogues,
    a turn's token budget and the turns of a dialogue (the rollout's and the simulator's); RLSettings
    resolves the fields left to the algorithm's row. A grouped estimator needs at least two
    dialogues per profile."""
    fields = config.rl.to_dict()
    fields["mini_batch_size"], fields["micro_batch_size"], fields["batch_size"] = minibatch_unit(
        fields["mini_batch_size"], fields["micro_batch_size"], config.rollout.profiles_per_step * config.rollout.n)
    fields["max_new_tokens"], fields["max_turns"] = config.rollout.max_new_tokens, config.simulator.max_turns
    rl = RLSettings(**fields)
    if config.rollout.n < rl.min_n:
        raise ValueError(f"config.rl.algo={rl.algo!r} (config.rl.estimator={rl.estimator!r}) compares dialogues within "
                         f"a group: it needs config.rollout.n >= {rl.min_n} dialogues per profile (got "
                         f"{config.rollout.n}); e.g. --config.rollout.n={max(rl.algorithm.default_n, rl.min_n)}")
    return rl


def optim_settings(section: ml_collections.ConfigDict, where: str) -> OptimSettings:
    """An optimizer section (`where`: its flag prefix, e.g. "config.optim.actor."), range-checked by
    OptimSettings itself; its errors name the field with the prefix."""
    try:
        return OptimSettings(**section)
    except ValueError as e:
        raise ValueError("; ".join(where + problem for problem in str(e).split("; "))) from None


def model_source(config: ml_collections.ConfigDict) -> ModelSource:
    """config.model (of a training config, or a run's config.json)."""
    m = config.model
    return ModelSource(preset=m.preset, path=m.path, random_init=m.random_init, tokenizer_path=m.tokenizer_path,
                       param_dtype=m.param_dtype, dtype=m.dtype, scan_layers=m.scan_layers, remat=m.remat,
                       attention=m.attention, mlp_chunk=m.mlp_chunk)


def lora_settings(config: ml_collections.ConfigDict) -> LoraSettings:
    """config.lora, typed (full fine-tuning where a config has no such section)."""
    return LoraSettings.from_config(config.lora) if "lora" in config else LoraSettings()


# Fields added to the training config since the first runs, with the values those runs trained with
# (the Qwen2Config defaults of the time), by config section; runs before LoRA trained without
# adapters, LoraSettings() (rank 0: full fine-tuning).
_ADDED_FIELDS = {"model": {"attention": "auto", "mlp_chunk": 0},
                 # the rollout engine's: runs before it sampled with static calls
                 "rollout": {"engine": "static", "engine_rows": 0, "decode_chunk": 8, "prefill_chunk": 256},
                 "lora": dataclasses.asdict(LoraSettings()),
                 "simulator": {"latency_s": 15.0}}


def saved_config(run_dir: pathlib.Path) -> ml_collections.ConfigDict:
    """The config.json a run wrote in `run_dir` (rlver_jax.train.run), with the fields added since it
    was written filled in, so that its readers (`model_source`, `lora_settings`) read every field."""
    fields = json.loads((run_dir / "config.json").read_text())
    for section, added in _ADDED_FIELDS.items():
        fields[section] = {**added, **fields.get(section, {})}
    return ml_collections.ConfigDict(fields)


# ----------------------------------------------------------------------------- a run's identity

# What a resume may change, by dotted config field ("lora." covers the section); the first list
# that names a field decides (`change_kind`). IDENTITY: what is trained (the checkpoint's arrays,
# their layout and meaning, the data order and every random key): never within a run. FREE: where
# and how the run is kept, laid out, served and watched: any time. Everything else (learning
# rates, loss knobs, sampling, the simulator's rules, the step count, ...) may change when
# config.checkpoint.allow_changes names it, and is then logged as a change at that step.
# Every LoRA field but the adapters' learning-rate factor shapes or scales what is trained.
_LORA_IDENTITY = tuple(f"lora.{f.name}" for f in dataclasses.fields(LoraSettings) if f.name != "lr_multiplier")
IDENTITY = ("model.preset", "model.path", "model.random_init", "model.tokenizer_path", "model.param_dtype",
            "model.scan_layers", *_LORA_IDENTITY, "critic.path", "critic.value_head_init", "rl.algo", "rollout.think",
            "rollout.think_history", "rollout.n", "rollout.profiles_per_step", "seed")
FREE = ("workdir", "compilation_cache_dir", "mesh.", "checkpoint.", "train.eval_every", "train.eval_max_profiles",
        "train.eval_rules.", "train.eval_policy.", "train.transcripts", "train.wandb_project", "train.wandb_mode",
        "train.offload", "train.length_multiple", "train.max_param_norm_growth", "train.degenerate_alarm",
        "train.degenerate_alarm_action", "train.template_alarm", "train.template_alarm_action", "model.remat",
        "model.attention", "model.mlp_chunk", "rl.micro_batch_size", "rl.logprob_chunk", "rl.pack_rows",
        # the engine and every field an engine reads: how sampling is laid out, not what is trained
        *(f"rollout.{f}" for f in sorted(engine_fields())), *(f"simulator.{f}" for f in sorted(TRANSPORT)))


def _matches(field: str, names: tuple[str, ...]) -> bool:
    return any(field == n or (n.endswith(".") and field.startswith(n)) for n in names)


def change_kind(field: str) -> str:
    """"identity", "free" or "may change": what a resume may do to the dotted config `field`."""
    if _matches(field, IDENTITY):
        return "identity"
    return "free" if _matches(field, FREE) else "may change"


def flat_fields(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's fields (`config.to_dict()`) by dotted name, each value as JSON reads it back."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(flat_fields(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.loads(json.dumps(value, default=str))
    return out


def _names_a_field(name: str, fields: dict[str, Any]) -> bool:
    """Whether `name` is a field of `fields` (flat_fields) or a section holding some."""
    return name in fields or any(k.startswith(name.rstrip(".") + ".") for k in fields)


class RunChangedError(InputError):
    """A resume whose config differs from its checkpoint's in fields it may not change."""


def resume_changes(saved: dict[str, Any], spec: RunSpec, where: str) -> list[tuple[str, Any, Any]]:
    """(field, in the checkpoint, now) of every field of `spec.resume_record` that differs from the
    checkpoint's record `saved` (`where`: which checkpoint, for the message); fields one side lacks
    (added or removed by a newer version) are not changes. Raises RunChangedError, one line naming
    each field with both values and the fix, when a changed field is part of the identity or may
    change but config.checkpoint.allow_changes does not name it."""
    now = spec.resume_record
    changes = [(k, saved[k], now[k]) for k in sorted(saved.keys() & now.keys()) if saved[k] != now[k]]
    allowed = spec.loop.allow_changes
    fixed = [c for c in changes if change_kind(c[0]) == "identity"]
    refused = [c for c in changes if change_kind(c[0]) == "may change" and "*" not in allowed
               and not any(c[0] == a or c[0].startswith(a.rstrip(".") + ".") for a in allowed)]
    warmups = _warmups_moved(spec, *next(((a, b) for k, a, b in changes if k == "train.steps"), (0, 0)))
    if not warmups:  # more steps, and nothing else the step count drives: extending a finished run
        refused = [c for c in refused if not (c[0] == "train.steps" and c[2] > c[1])]
    if not fixed and not refused:
        return changes
    shown = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, a, b in fixed + refused)
    if warmups and any(k == "train.steps" for k, _, _ in refused):
        shown += f"; train.steps also sets {warmups}"
    fixes = []
    if fixed:
        fixes.append(f"{', '.join(k for k, _, _ in fixed)} define{'s' if len(fixed) == 1 else ''} what the run trains: "
                     "train this config in a new config.workdir (or give these fields the checkpoint's values)")
    if refused:
        names = ",".join(k for k, _, _ in refused)
        fixes.append(f"to change {names.replace(',', ', ')} within this run add "
                     f"--config.checkpoint.allow_changes={names}")
    raise RunChangedError(f"{where} was trained with another config ({shown}); nothing was written: "
                          + "; ".join(fixes))


def _warmups_moved(spec: RunSpec, before: int, after: int) -> str:
    """What a change of train.steps from `before` to `after` moves besides the step count: the
    optimizers' warm-ups (the critic's when one trains), in words; "" when nothing."""
    optims = {"the actor's": spec.actor_optim}
    if spec.rl.uses_critic:
        optims["the critic's"] = spec.critic_optim
    moved = [f"{who} warm-up: {opt.warmup_steps(before)} -> {opt.warmup_steps(after)} steps"
             for who, opt in optims.items() if before != after and opt.warmup_steps(before) != opt.warmup_steps(after)]
    return "; ".join(moved)
