"""The policy to sample from: a training run's checkpoint, a Hugging Face directory, or a fresh
tiny model. Shared by launch/eval.py and launch/export_hf.py.

A run's checkpoint holds the whole TrainState; only the actor is read (checkpoint.restore_actor).
A LoRA run's actor is its adapters: they are merged into the run's base (its config.model.path, or
the random init of its preset and seed), and the policy is that plain model.
Its architecture and parameter layout (scan_layers, dtypes) come from the run's config.json: the
model preset, or the Hugging Face config.json at the run's config.model.path; its tokenizer from
config.model.tokenizer_path, config.model.path, or WORKDIR/tokenizer (tiny runs). When the base
model has moved since training, `base_path` names its new place.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import ml_collections
from jax.sharding import Mesh

from rlver_jax.text import chat
from rlver_jax.rl import train_state
from rlver_jax.train import checkpoint, spec
from rlver_jax.train.abstract_run import frozen_architecture, trainable_shapes
from rlver_jax.parallel import sharding
from rlver_jax.train.model_loading import load_policy, tiny_tokenizer
from rlver_jax.models import hf_io, lora
from rlver_jax.models.config import Qwen2Config, get_preset


@dataclasses.dataclass(frozen=True)
class Adapter:
    """A LoRA run's actor as trained: adapters on the base at `base_path` ("": a random init)."""

    settings: lora.LoraSettings
    params: Any
    base_path: str


@dataclasses.dataclass(frozen=True)
class LoadedPolicy:
    model: Qwen2Config
    params: Any
    chat: chat.ChatTokens
    source: str  # what was loaded, for reports
    adapter: Adapter | None = None  # a LoRA run's: `params` are these adapters merged into its base


# Fields added to the training config since the first runs, with the values those runs trained with
# (the Qwen2Config defaults of the time), by config section.
_ADDED_FIELDS = {"model": {"attention": "auto", "mlp_chunk": 0},
                 "lora": {"rank": 0, "alpha": 16.0, "targets": ",".join(lora.TARGETS), "base_dtype": "float32",
                          "lr_multiplier": 10.0, "modules_to_save": ""}}


def migrate_run_config(fields: dict[str, Any]) -> dict[str, Any]:
    """A run's config.json (parsed) with the fields added since it was written filled in, so that
    the code reading it reads every field directly."""
    out = {**fields}
    for section, added in _ADDED_FIELDS.items():
        out[section] = {**added, **out.get(section, {})}
    return out


@dataclasses.dataclass(frozen=True)
class RunCheckpoint:
    """Where a training run's checkpoint lies; `step` None = the latest."""

    run_dir: pathlib.Path
    checkpoints: pathlib.Path
    step: int | None

    def config(self) -> ml_collections.ConfigDict:
        """The run's config.json, brought up to the fields read today (`migrate_run_config`)."""
        return ml_collections.ConfigDict(migrate_run_config(json.loads((self.run_dir / "config.json").read_text())))

    def resolved_step(self) -> int:
        """The step to load (the latest one when none was named); lists the directory only."""
        steps = sorted(int(p.name) for p in self.checkpoints.iterdir() if p.name.isdigit())
        if self.step is not None:
            if self.step not in steps:
                raise FileNotFoundError(f"{self.checkpoints}: no step {self.step}; available: {steps}")
            return self.step
        if not steps:
            raise FileNotFoundError(f"{self.checkpoints}: no finished checkpoint yet")
        return steps[-1]


def locate_checkpoint(path: str | pathlib.Path, field: str) -> RunCheckpoint:
    """A run's checkpoint from WORKDIR, WORKDIR/checkpoints or WORKDIR/checkpoints/STEP; errors
    name `field` (the flag that gave the path)."""
    p = pathlib.Path(path).expanduser()
    step = None
    if p.name.isdigit() and p.parent.name == "checkpoints":
        p, step = p.parent, int(p.name)
    if p.name == "checkpoints":
        p = p.parent
    hint = (f"{field} must be a training run's work directory (holding config.json and checkpoints/) "
            "or one of its steps, WORKDIR/checkpoints/STEP")
    if not p.is_dir():
        raise FileNotFoundError(f"{field}={str(path)!r}: no such directory. {hint}")
    for needed in ("config.json", "checkpoints"):
        if not (p / needed).exists():
            raise FileNotFoundError(f"{field}={str(path)!r}: {p / needed} is missing. {hint}")
    return RunCheckpoint(p, p / "checkpoints", step)


_MOVED = ("If the base model named by config.model.path in {run} has moved, give its new Hugging Face "
          "directory as base_path (--config.policy.base_path in launch/eval.py, --base_path in "
          "launch/export_hf.py).")


def load_checkpoint_policy(ckpt: RunCheckpoint, mesh: Mesh, rules: sharding.RulesLike,
                           base_path: str = "") -> LoadedPolicy:
    """The actor of a run's checkpoint, placed on `mesh`, with the run's tokenizer."""
    run = ckpt.config()
    model = spec.model_source(run)
    base = base_path or model.path  # the run's Hugging Face base model, if it had one
    overrides = model.overrides()
    if base:
        cfg_file = pathlib.Path(base) / "config.json"
        if not cfg_file.exists():
            raise FileNotFoundError(f"{cfg_file}: not found; the run's architecture comes from its base model. "
                                    + _MOVED.format(run=ckpt.run_dir / "config.json"))
        cfg = hf_io.config_from_hf(json.loads(cfg_file.read_text()), str(cfg_file), **overrides)
    else:
        cfg = get_preset(model.preset, **overrides)
    tokenizer_dir = base_path or model.tokenizer_path or model.path or ckpt.run_dir / "tokenizer"
    try:
        chat_tokens = chat.ChatTokens.from_tokenizer(chat.load_tokenizer(tokenizer_dir))
    except FileNotFoundError as e:
        hint = _MOVED.format(run=ckpt.run_dir / "config.json")
        raise FileNotFoundError(f"the run's tokenizer: {e}\n{hint}") from None
    settings = spec.lora_settings(run)
    abstract = sharding.with_shardings(*trainable_shapes(settings, cfg, mesh, rules))
    params, step = checkpoint.restore_actor(ckpt.checkpoints, ckpt.resolved_step(), abstract)
    source = str(ckpt.checkpoints / str(step))
    if not settings.enabled:
        return LoadedPolicy(cfg, params, chat_tokens, source)
    model = dataclasses.replace(model, path=base)
    base_params = load_policy(model, frozen_architecture(cfg, settings), sharding.param_shardings(cfg, mesh, rules),
                              train_state.seed_keys(run.seed).init)
    return LoadedPolicy(cfg, lora.merge(settings, base_params, params), chat_tokens, source,
                        Adapter(settings, params, model.path))


def load_hf_policy(path: str, mesh: Mesh, rules: sharding.RulesLike, dtype: str = "float32",
                   scan_layers: bool = False) -> LoadedPolicy:
    """A Hugging Face Qwen2 or Llama directory (weights and tokenizer), placed on `mesh`; its layers
    stacked for one scanned layer with `scan_layers` (a sampling program then compiles one layer)."""
    cfg, params = hf_io.load_pretrained(path, dtype=dtype, scan_layers=scan_layers,
                                        shardings=lambda c: sharding.param_shardings(c, mesh, rules))
    return LoadedPolicy(cfg, params, chat.ChatTokens.from_tokenizer(chat.load_tokenizer(path)), str(path))


def fresh_tiny_policy(tokenizer_dir: pathlib.Path, seed: int, mesh: Mesh,
                      rules: sharding.RulesLike) -> LoadedPolicy:
    """A randomly initialised tiny model with the locally built tiny tokenizer (built into
    `tokenizer_dir` when missing): the baseline an untrained policy scores."""
    chat_tokens = tiny_tokenizer(tokenizer_dir)
    cfg = get_preset("tiny")
    params = sharding.init_sharded_params(cfg, jax.random.PRNGKey(seed), mesh, rules)
    return LoadedPolicy(cfg, params, chat_tokens, f"fresh tiny model (seed {seed})")
