"""An evaluation config as typed, frozen specs: the one reader of an evaluation ConfigDict below launch/.

`EvalSpec.from_config(config, given)` reads configs/eval.py (the Sentient benchmark,
rlver_jax.eval.benchmark) and `CapabilitiesSpec.from_config(config)` configs/capabilities.py (the
capability run, rlver_jax.eval.capabilities.runner); both share the policy section (`PolicySpec`,
resolved and built by rlver_jax.eval.policy_source). One ValueError names every bad field, as
RunSpec.from_config does for a training config (rlver_jax.train.spec). Each spec keeps the config as a
plain dict (`record`): what setup.json and the reports record of it. Imports no JAX: a served
policy is evaluated without it (eval.like_training reads a run's config.json, through
rlver_jax.eval.run_checkpoint).
"""

from __future__ import annotations

import copy
import dataclasses
import pathlib
from collections.abc import Collection
from typing import Any

import ml_collections

from rlver_jax.checks import build_all, check_ranges, named
from rlver_jax.engines.table import EngineSettings
from rlver_jax.eval import panel
from rlver_jax.eval.capabilities import data, sandbox
from rlver_jax.eval.probes import parse_probes
from rlver_jax.eval.run_checkpoint import locate_checkpoint
from rlver_jax.parallel.distributed import DistributedSettings
from rlver_jax.rollout.episodes import RolloutSettings
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.simulator.backends import TRANSPORT  # the fields of how answers are fetched, also the policy's
from rlver_jax.simulator.settings import SimulatorSettings
from rlver_jax.train.spec import MeshSpec


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """config.policy's fields of which policy is evaluated and how it is reached or loaded
    (rlver_jax.eval.policy_source); its sampling is SamplingSettings, its dialogue RolloutSettings."""

    backend: str  # a row of policy_source.POLICY_BACKENDS (checked by policy_source.resolve)
    checkpoint: str  # jax: a training WORKDIR or WORKDIR/checkpoints/STEP
    path: str  # jax: a Hugging Face directory
    fresh_tiny: bool  # jax: a randomly initialised tiny model
    dtype: str  # jax with path
    scan_layers: bool  # jax with path
    base_path: str  # jax: the run's base model if it moved
    think: bool | None  # None: the run's own (a checkpoint), else no-think
    base_url: str  # openai: the endpoint (llm_client.ClientSettings reads these fields)
    model: str
    api_key_env: str
    timeout_s: float
    max_retries: int
    backoff_initial_s: float
    backoff_max_s: float
    engine: EngineSettings  # jax: the rollout engine (engines.table; config.policy.engine and the fields it reads)

    @classmethod
    def from_config(cls, section: ml_collections.ConfigDict, given: Collection[str] = ()) -> PolicySpec:
        """`given`: the section's fields the command line set (an engine's field the chosen engine
        does not read is refused: engines.table.check_read)."""
        plain = {f.name: section[f.name] for f in dataclasses.fields(cls) if f.name != "engine"}
        return cls(**plain, engine=EngineSettings.from_config(section, "config.policy.", given))


def policy_system_prompt(policy: ml_collections.ConfigDict) -> str:
    """The system message config.policy gives the policy: `system_prompt`, the text of
    `system_prompt_file`, or "" (the project's own prompt)."""
    if policy.system_prompt and policy.system_prompt_file:
        raise ValueError("config.policy.system_prompt and config.policy.system_prompt_file are both set; "
                         "give one of them")
    if not policy.system_prompt_file:
        return policy.system_prompt
    path = pathlib.Path(policy.system_prompt_file).expanduser()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"config.policy.system_prompt_file={str(path)!r} cannot be read "
                         f"({type(e).__name__}: {e}); give a UTF-8 text file") from None
    if not text:
        raise ValueError(f"config.policy.system_prompt_file={str(path)!r} is empty; give the prompt's text, "
                         "or leave the field empty for the project's own prompt")
    return text


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    """How the benchmark plays: `config.eval`'s numbers, the policy's sampling and dialogue
    settings (`config.policy`; the think mode is the policy's, `PolicySource.think`) and the simulator."""

    max_dialogues: int  # in flight at once
    group_size: int  # dialogues per policy call
    max_profiles: int  # 0: every profile of config.eval.profiles
    probes: tuple[str, ...]  # robustness probes played beside the policy (eval/probes.py)
    panel: tuple[panel.Member, ...]  # simulators each playing every profile (eval/panel.py); () = config.simulator
    sampling: SamplingSettings
    rollout: RolloutSettings
    simulator: SimulatorSettings

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, given: Collection[str] = ()) -> BenchmarkSettings:
        """One ValueError names every bad field of the config. `given`: the dotted fields the command
        line set; a simulator field the chosen backend ignores is refused (simulator.settings.check_read)."""
        simulator_given = {f.split(".", 1)[1] for f in given if f.startswith("simulator.")}
        e, p = config.eval, config.policy
        _, probes, members, sampling, rollout, simulator = build_all(
            lambda: check_ranges(named(e, "config.eval.", ("max_dialogues", "group_size", "holdout", "max_profiles")),
                                 lowest={"max_dialogues": 1, "group_size": 1, "holdout": 0, "max_profiles": 0}),
            lambda: parse_probes(e.probes),
            lambda: panel.parse_panel(e.simulators),
            lambda: SamplingSettings.from_config(p, "config.policy."),
            lambda: RolloutSettings.from_config(p, "config.policy.", think=bool(p.think),
                                                system_prompt=policy_system_prompt(p)),
            lambda: SimulatorSettings.from_config(config.simulator, given=simulator_given))
        return cls(e.max_dialogues, e.group_size, e.max_profiles, probes, members, sampling, rollout, simulator)


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """Everything an evaluation config (configs/eval.py) says, typed (`from_config`)."""

    workdir: str  # "" is refused by run_benchmark, before anything is written
    seed: int
    compilation_cache_dir: str
    profiles: str  # config.eval.profiles: a JSONL file of profiles
    holdout: int  # only its last N (0: all)
    like_training: str  # the training run whose settings were applied ("": none)
    policy: PolicySpec
    settings: BenchmarkSettings
    mesh: MeshSpec
    distributed: DistributedSettings
    record: dict[str, Any]  # config.to_dict() (after `like_training`): what setup.json and the report record

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, given: Collection[str] = ()) -> EvalSpec:
        """The specs of `config`, under the settings of the training run config.eval.like_training
        names (`like_training`); one ValueError names every bad field. `given`: the dotted fields the
        command line set (BenchmarkSettings.from_config)."""
        config = like_training(config)
        given_policy = {f[len("policy."):] for f in given if f.startswith("policy.")}
        settings, distributed, policy = build_all(lambda: BenchmarkSettings.from_config(config, given),
                                                  lambda: DistributedSettings.from_config(config.mesh.distributed),
                                                  lambda: PolicySpec.from_config(config.policy, given_policy))
        e = config.eval
        return cls(workdir=config.workdir, seed=config.seed, compilation_cache_dir=config.compilation_cache_dir,
                   profiles=e.profiles, holdout=e.holdout, like_training=e.like_training,
                   policy=policy, settings=settings,
                   mesh=MeshSpec(tuple(config.mesh.shape), config.mesh.rules), distributed=distributed,
                   record=config.to_dict())

    def panel_member(self, index: int, member: panel.Member) -> EvalSpec:
        """The spec of the panel's `index`-th simulator, `member`: this evaluation (already under its
        training run's settings) in WORKDIR's directory of the member, with the member's backend, model
        and server."""
        config = ml_collections.ConfigDict(self.record)
        config.workdir = str(pathlib.Path(self.workdir) / member.directory(index))
        config.eval.simulators = config.eval.like_training = ""
        config.simulator.update(member.overrides())
        return EvalSpec.from_config(config)


def like_training(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` under the settings of the training run `config.eval.like_training` names (a copy;
    `config` itself when that is ""): the run's simulator section but for the fields of how it
    is reached (TRANSPORT), its sampling (temperature, top-p, top-k), turn and dialogue lengths
    and KV-cache slots, and its think mode unless config.policy.think is set. The policy played
    is still config.policy's; a think-mode reply without </think> is shown to the user
    (policy.format_failure), as the run's own in-loop evaluation does."""
    if not config.eval.like_training:
        return config
    run = locate_checkpoint(config.eval.like_training, "config.eval.like_training").config()
    out = copy.deepcopy(config)
    for key in ("temperature", "top_p", "top_k", "max_new_tokens", "max_total_tokens", "cache_slots"):
        out.policy[key] = run.rollout[key]
    if out.policy.think is None:
        out.policy.think = bool(run.rollout.think)
    for key, value in run.simulator.items():
        if key not in TRANSPORT:
            out.simulator[key] = value
    return out


@dataclasses.dataclass(frozen=True)
class CapabilitiesSpec:
    """Everything a capabilities config (configs/capabilities.py) says, typed (`from_config`)."""

    workdir: str  # "" is refused by runner.run
    seed: int
    compilation_cache_dir: str
    compare_to: str  # a finished run of the base model ("": none)
    data: dict[str, str]  # benchmark (data.BENCHMARKS) -> its local file or directory ("": skipped)
    max_examples: int  # per benchmark (0: all; a negative count is refused by runner.load_items)
    max_in_flight: int
    group_size: int
    think_instruction: str
    policy: PolicySpec
    sampling: SamplingSettings
    limits: sandbox.Limits  # how a generated program runs (config.code)
    code_workers: int  # programs run at once
    mesh: MeshSpec
    record: dict[str, Any]  # config.to_dict(): what setup.json records

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> CapabilitiesSpec:
        """The specs of `config`; one ValueError names every bad field."""
        c, e = config.code, config.eval
        sampling, limits = build_all(
            lambda: SamplingSettings.from_config(config.policy, "config.policy."),
            lambda: sandbox.Limits(test_timeout_s=c.test_timeout_s, memory_mb=c.memory_mb, file_mb=c.file_mb,
                                   max_processes=c.max_processes, scratch_root=c.scratch_dir))
        return cls(workdir=config.workdir, seed=config.seed, compilation_cache_dir=config.compilation_cache_dir,
                   compare_to=config.compare_to, data={b: config.data[b] for b in data.BENCHMARKS},
                   max_examples=e.max_examples, max_in_flight=e.max_in_flight, group_size=e.group_size,
                   think_instruction=e.think_instruction, policy=PolicySpec.from_config(config.policy),
                   sampling=sampling, limits=limits, code_workers=c.workers,
                   mesh=MeshSpec(tuple(config.mesh.shape), config.mesh.rules), record=config.to_dict())
