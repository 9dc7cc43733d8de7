"""The policy of config.policy (the section configs/eval.py defines, shared by
configs/capabilities.py) as a rollout Policy that answers one-turn chats: an OpenAI-compatible
endpoint through rlver_jax.llm_client, or a JAX checkpoint, Hugging Face directory or fresh
tiny model (rlver_jax.eval.policy_loading) through our sampler. Resolved without loading
weights first (`resolve`), for setup.json and the report; JAX is imported only by `build` of a
JAX policy."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import ml_collections

from rlver_jax.llm_client import ClientSettings

BACKENDS = ("jax", "openai")


@dataclasses.dataclass(frozen=True)
class PolicySource:
    backend: str
    source: str  # what is evaluated: the resolved checkpoint step, directory or served model
    label: str  # a short name for reports
    think: bool
    client: ClientSettings | None = None  # openai
    checkpoint: Any = None  # jax: policy_loading.RunCheckpoint


def resolve(config: ml_collections.ConfigDict) -> PolicySource:
    p = config.policy
    if p.backend not in BACKENDS:
        raise ValueError(f"config.policy.backend={p.backend!r}: use one of {BACKENDS}")
    think = p.think
    if p.backend == "openai":
        client = ClientSettings(
            name="policy endpoint", flag_prefix="--config.policy.", base_url=p.base_url, model=p.model,
            api_key_env=p.api_key_env, timeout_s=p.timeout_s, max_concurrency=config.eval.max_in_flight,
            max_retries=p.max_retries, backoff_initial_s=p.backoff_initial_s, backoff_max_s=p.backoff_max_s)
        return PolicySource("openai", p.model, p.model, bool(think), client=client)
    if p.checkpoint and p.path:
        raise ValueError("set one of config.policy.checkpoint (a training run) and config.policy.path "
                         "(a Hugging Face directory), not both")
    if p.checkpoint:
        from rlver_jax.eval import policy_loading  # JAX policies only: transformers, Flax

        ckpt = policy_loading.locate_checkpoint(p.checkpoint, "config.policy.checkpoint")
        step = ckpt.resolved_step()
        think = think if think is not None else bool(ckpt.config().rollout.think)
        return PolicySource("jax", str((ckpt.checkpoints / str(step)).resolve()),
                            f"{ckpt.run_dir.resolve().name} step {step}", bool(think), checkpoint=ckpt)
    if p.path:
        if not pathlib.Path(p.path, "config.json").exists():
            raise FileNotFoundError(f"config.policy.path={p.path!r}: no config.json there; it must be a Hugging "
                                    "Face Qwen2 directory (e.g. one written by launch/export_hf.py)")
        source = str(pathlib.Path(p.path).resolve())
        return PolicySource("jax", source, pathlib.Path(source).name, bool(think))
    if p.fresh_tiny:
        label = f"fresh tiny model (seed {config.seed})"
        return PolicySource("jax", label, label, bool(think))
    raise ValueError("no policy to evaluate: set --config.policy.checkpoint=TRAIN_WORKDIR, "
                     "--config.policy.path=HF_DIR, or --config.policy.backend=openai with "
                     "--config.policy.base_url and --config.policy.model")


def build(config: ml_collections.ConfigDict, spec: PolicySource, workdir: pathlib.Path) -> tuple[Any, Any]:
    """(policy, chat tokens or None for a text policy)."""
    p = config.policy
    if spec.client is not None:
        from rlver_jax.rollout.policy import OpenAIPolicy

        return OpenAIPolicy(spec.client, temperature=p.temperature, max_tokens=p.max_new_tokens), None
    import jax

    from rlver_jax.eval import policy_loading
    from rlver_jax.parallel import sharding
    from rlver_jax.rollout.jax_policy import JaxPolicy
    from rlver_jax.sampling.settings import SamplingSettings

    mesh = sharding.make_mesh(config.mesh.shape)
    if spec.checkpoint is not None:
        loaded = policy_loading.load_checkpoint_policy(spec.checkpoint, mesh, config.mesh.rules, p.base_path)
    elif p.path:
        loaded = policy_loading.load_hf_policy(p.path, mesh, config.mesh.rules, p.dtype)
    else:
        loaded = policy_loading.fresh_tiny_policy(workdir / "tokenizer", config.seed, mesh, config.mesh.rules)
    # One-turn chats: nothing to keep between turns (cache_slots 0).
    settings = SamplingSettings(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                                max_new_tokens=p.max_new_tokens, cache_slots=0)
    params = sharding.SamplingLayout.create(loaded.model, mesh, config.mesh.rules).copy(loaded.params)
    return JaxPolicy(loaded.model, loaded.chat, settings, params, jax.random.PRNGKey(config.seed)), loaded.chat
