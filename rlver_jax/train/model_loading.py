"""The models and tokenizer a run names (`ModelSource`, `CriticSource`: typed from its config by
rlver_jax.train.spec), built for training (rlver_jax.train.run) and evaluation
(rlver_jax.eval.policy_loading) alike.

The policy is a Hugging Face directory (`path`), or with `random_init` (the tiny presets) random
weights of the preset's architecture and a tokenizer built locally. The critic is the actor's
weights without the LM head and with a fresh value head, or the Hugging Face directory
`CriticSource.path` (a critic exported as Qwen2ForTokenClassification, or a causal LM).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp

from rlver_jax.files import atomic_directory
from rlver_jax.models import hf_io, qwen2, smollm2
from rlver_jax.models.config import Qwen2Config, get_preset
from rlver_jax.parallel import sharding
from rlver_jax.text import chat
from rlver_jax.text.tiny_tokenizer import build_tiny_tokenizer
from rlver_jax.train.model_source import VALUE_HEAD_INITS, CriticSource, ModelSource

Params = Any


# The files build_tiny_tokenizer writes (text.tokenizer_files.save_tokenizer): a directory holding them all is whole.
TINY_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")


def tiny_tokenizer(directory: pathlib.Path) -> chat.ChatTokens:
    """The locally built tiny tokenizer in `directory`, built there when missing or incomplete. It is
    written whole or not at all (files.atomic_directory: built beside it, renamed into place), so a
    run killed while writing it leaves the previous directory or none, and a directory an older
    version left half-written is built again (deterministically: the same files)."""
    if not all((directory / name).is_file() for name in TINY_TOKENIZER_FILES):
        with atomic_directory(directory) as staging:
            build_tiny_tokenizer(staging, vocab_size=get_preset("tiny").vocab_size)
    return chat.ChatTokens.from_tokenizer(chat.load_tokenizer(directory))


def tokenizer_for(model: ModelSource, workdir: pathlib.Path, *, build: bool = True) -> chat.ChatTokens:
    """The tokenizer of `model`: its tokenizer_path's, or its path's; a random-init run's without a
    path is WORKDIR/tokenizer, built there when missing (`build`: training; evaluation reads the one
    its run trained with)."""
    path = model.tokenizer_path or model.path
    if not path:
        if not model.random_init:
            raise ValueError("config.model.path is empty: set --config.model.path=/path/to/Qwen2.5-7B-Instruct "
                             "(a local Hugging Face directory), or use a :tiny config for a random CPU model")
        if build:
            return tiny_tokenizer(workdir / "tokenizer")
        path = workdir / "tokenizer"
    return chat.ChatTokens.from_tokenizer(chat.load_tokenizer(path))


def policy_architecture(model: ModelSource, any_preset: bool = False) -> Qwen2Config:
    """The actor's architecture: the Hugging Face config.json at `model.path`, or the preset's
    (`model.random_init`, or `any_preset`: the memory planner, which reads no weights)."""
    overrides = model.overrides()
    if model.path:
        cfg_file = pathlib.Path(model.path) / "config.json"
        if not cfg_file.exists():
            raise FileNotFoundError(f"{cfg_file}: not found; config.model.path must be a Hugging Face model directory"
                                    + smollm2.missing_hint(model.path))
        return hf_io.config_from_hf(json.loads(cfg_file.read_text()), str(cfg_file), **overrides)
    if not model.random_init and not any_preset:
        raise ValueError(f"config.model.path is empty for preset {model.preset!r}: set "
                         "--config.model.path to a local Hugging Face directory (config.model.random_init is for "
                         "tiny models)")
    return get_preset(model.preset, **overrides)


def load_policy(model: ModelSource, cfg: Qwen2Config, shardings: Params, init_key: jax.Array) -> Params:
    """The actor of architecture `cfg` (from `policy_architecture`) in `shardings`: a Hugging Face
    checkpoint placed shard by shard, or random tiny weights drawn from `init_key`."""
    if model.path:
        _, params = hf_io.load_pretrained(model.path, dtype=cfg.param_dtype, shardings=shardings,
                                          compute_dtype=cfg.dtype, scan_layers=cfg.scan_layers, remat=cfg.remat)
        return params
    return sharding.init_sharded_params(cfg, init_key, shardings=shardings)


def critic_config(actor_cfg: Qwen2Config) -> Qwen2Config:
    """The PPO critic's architecture: the actor's, with a value head in place of the LM head."""
    return actor_cfg.replace(value_head=True)


def critic_from_actor(actor_cfg: Qwen2Config, actor: Params, value_head_init: str = "zero",
                      rng: jax.Array | None = None) -> tuple[Qwen2Config, Params]:
    """A critic initialised from the actor's weights (a copy of all but the LM head), with a value
    head of zeros, or ("normal") a kernel drawn from N(0, initializer_range^2) with `rng` and a zero
    bias, as transformers initialises the reference's token-classification head."""
    critic_cfg = critic_config(actor_cfg)
    head = value_head(critic_cfg, value_head_init, rng)
    body = {k: jax.tree.map(jnp.array, v) for k, v in actor.items() if k != "lm_head"}
    return critic_cfg, {**body, **head}


def value_head_key(seed: int) -> jax.Array:
    """The random stream of a fresh critic's value head (its `normal` init), apart from the model's."""
    return jax.random.fold_in(jax.random.key(seed), 1)


def value_head(critic_cfg: Qwen2Config, value_head_init: str = "zero", rng: jax.Array | None = None) -> Params:
    """The critic's fresh value head ({"value_kernel", "value_bias"}): see `critic_from_actor`."""
    if value_head_init not in VALUE_HEAD_INITS:
        raise ValueError(f"config.critic.value_head_init={value_head_init!r}; use one of {VALUE_HEAD_INITS}")
    abstract = qwen2.abstract_params(critic_cfg.replace(num_layers=0))
    head = {k: jnp.zeros(v.shape, v.dtype) for k, v in abstract.items() if k.startswith("value_")}
    if value_head_init == "normal":
        kernel = head["value_kernel"]
        head["value_kernel"] = (critic_cfg.initializer_range
                                * jax.random.normal(rng, kernel.shape, jnp.float32)).astype(kernel.dtype)
    return head


def load_critic(critic: CriticSource, critic_cfg: Qwen2Config, actor: Params, shardings: Params) -> Params:
    """The critic (`critic_cfg`: the actor's architecture with a value head) in `shardings`: the
    Hugging Face directory `critic.path`, or the actor's weights."""
    if critic.path:
        _, params = hf_io.load_pretrained(
            critic.path, dtype=critic_cfg.param_dtype, compute_dtype=critic_cfg.dtype,
            scan_layers=critic_cfg.scan_layers, remat=critic_cfg.remat, attention=critic_cfg.attention,
            value_head=True, shardings=shardings)
        return params
    _, params = critic_from_actor(critic_cfg, actor, critic.value_head_init, value_head_key(critic.seed))
    return jax.device_put(params, shardings)
