"""The policy to sample from: a training run's checkpoint, a Hugging Face directory, or a fresh
tiny model. Shared by launch/eval.py and launch/export_hf.py.

A run's checkpoint (rlver_jax.eval.run_checkpoint) holds the whole TrainState; only the actor is
read (checkpoint.restore_actor), into the shapes the run trains (abstract_run.trainable_shapes). A
LoRA run's actor is its adapters: they are merged into the run's base (its config.model.path, or the
random init of its preset and seed), and the policy is that plain model. The run's config.json
(train.spec.saved_config, model_source, lora_settings) names its models, read as training reads
them (rlver_jax.train.model_loading: architecture and parameter layout, tokenizer, base weights).
When the base model has moved since training, `base_path` names its new place.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax
from jax.sharding import Mesh

from rlver_jax.eval.run_checkpoint import RunCheckpoint
from rlver_jax.models import hf_io, lora
from rlver_jax.models.config import Qwen2Config, get_preset
from rlver_jax.parallel import sharding
from rlver_jax.rl import train_state
from rlver_jax.text import chat
from rlver_jax.train import checkpoint, model_loading, spec
from rlver_jax.train.abstract_run import frozen_architecture, trainable_shapes


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


_MOVED = ("If the base model named by config.model.path in {run} has moved, give its new Hugging Face "
          "directory as base_path (--config.policy.base_path in launch/eval.py, --base_path in "
          "launch/export_hf.py).")


def load_checkpoint_policy(ckpt: RunCheckpoint, mesh: Mesh, rules: sharding.RulesLike,
                           base_path: str = "") -> LoadedPolicy:
    """The actor of a run's checkpoint, placed on `mesh`, with the run's tokenizer; `base_path`: the
    new place of the run's base model (weights, architecture and tokenizer are read there)."""
    run = ckpt.config()
    model = spec.model_source(run)
    if base_path:
        model = dataclasses.replace(model, path=base_path, tokenizer_path="")
    moved = _MOVED.format(run=ckpt.run_dir / "config.json")
    try:
        cfg = model_loading.policy_architecture(model)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}. {moved}") from None
    try:
        chat_tokens = model_loading.tokenizer_for(model, ckpt.run_dir, build=False)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"the run's tokenizer: {e}\n{moved}") from None
    settings = spec.lora_settings(run)
    abstract = sharding.with_shardings(*trainable_shapes(settings, cfg, mesh, rules))
    params, step = checkpoint.restore_actor(ckpt.checkpoints, ckpt.resolved_step(), abstract)
    source = str(ckpt.checkpoints / str(step))
    if not settings.enabled:
        return LoadedPolicy(cfg, params, chat_tokens, source)
    base_params = model_loading.load_policy(model, frozen_architecture(cfg, settings),
                                            sharding.param_shardings(cfg, mesh, rules),
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
    chat_tokens = model_loading.tiny_tokenizer(tokenizer_dir)
    cfg = get_preset("tiny")
    params = sharding.init_sharded_params(cfg, jax.random.PRNGKey(seed), mesh, rules)
    return LoadedPolicy(cfg, params, chat_tokens, f"fresh tiny model (seed {seed})")
