"""The policy of `config.policy` (the section configs/eval.py defines; configs/capabilities.py
shares it; rlver_jax.eval.spec.PolicySpec reads it), for the Sentient benchmark and the capability
evaluation alike: resolved without loading weights (`resolve`: what is evaluated, for setup.json
and reports, and its think mode), then built (`build`) as an OpenAI-compatible endpoint through
rlver_jax.llm_client, or a JAX checkpoint, Hugging Face directory or fresh tiny model
(rlver_jax.eval.policy_loading) on our sampler. JAX is imported only by `build` of a JAX policy."""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile
from typing import Any

from rlver_jax.eval.spec import PolicySpec
from rlver_jax.llm_client import ClientSettings
from rlver_jax.models import smollm2
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.train.spec import MeshSpec

BACKENDS = ("jax", "openai")


@dataclasses.dataclass(frozen=True)
class PolicySource:
    backend: str  # one of BACKENDS
    source: str  # what is evaluated: the resolved checkpoint step, directory or served model
    label: str  # a short name for reports
    think: bool  # config.policy.think, or (None there) the training run's own think mode
    client: ClientSettings | None = None  # openai
    checkpoint: Any = None  # a training run's checkpoint: policy_loading.RunCheckpoint


def resolve(p: PolicySpec, seed: int, max_in_flight: int) -> PolicySource:
    """The policy `p` (config.policy) names; an endpoint's client allows `max_in_flight` requests at
    once; `seed` (config.seed) is a fresh tiny model's."""
    if p.backend not in BACKENDS:
        raise ValueError(f"config.policy.backend={p.backend!r}: use one of {BACKENDS}")
    if p.backend == "openai":
        client = ClientSettings.from_config(p, name="policy endpoint", flag_prefix="--config.policy.",
                                            max_concurrency=max_in_flight)
        return PolicySource("openai", p.model, p.model, bool(p.think), client=client)
    if p.checkpoint and p.path:
        raise ValueError("set one of config.policy.checkpoint (a training run) and config.policy.path "
                         "(a Hugging Face directory), not both")
    if p.checkpoint:
        from rlver_jax.eval import policy_loading  # JAX policies only: transformers, Flax

        ckpt = policy_loading.locate_checkpoint(p.checkpoint, "config.policy.checkpoint")
        step = ckpt.resolved_step()
        think = p.think if p.think is not None else bool(ckpt.config().rollout.think)
        return PolicySource("jax", str((ckpt.checkpoints / str(step)).resolve()),
                            f"{ckpt.run_dir.resolve().name} step {step}", bool(think), checkpoint=ckpt)
    if p.path:
        if not pathlib.Path(p.path, "config.json").exists():
            raise FileNotFoundError(f"config.policy.path={p.path!r}: no config.json there; it must be a Hugging "
                                    "Face Qwen2/Llama directory (e.g. one written by launch/export_hf.py)"
                                    + smollm2.missing_hint(p.path))
        source = str(pathlib.Path(p.path).resolve())
        return PolicySource("jax", source, pathlib.Path(source).name, bool(p.think))
    if p.fresh_tiny:
        label = f"fresh tiny model (seed {seed})"
        return PolicySource("jax", label, label, bool(p.think))
    raise ValueError("no policy to evaluate: set --config.policy.checkpoint=TRAIN_WORKDIR (a run of "
                     "launch/train.py), --config.policy.path=HF_DIR, or --config.policy.backend=openai "
                     "with --config.policy.base_url and --config.policy.model")


def build(p: PolicySpec, spec: PolicySource, mesh_spec: MeshSpec, seed: int, workdir: pathlib.Path,
          sampling: SamplingSettings, *, first_process: bool = True) -> tuple[Any, Any]:
    """(policy, chat tokens or None for a text policy) ready to play, sampling by `sampling`, a JAX
    policy on the mesh of `mesh_spec` (config.mesh) with the sampling key of `seed` (config.seed). A
    fresh tiny model's tokenizer is built in WORKDIR/tokenizer by the first process, elsewhere in a
    temporary directory (the same tokenizer: no two processes write one file)."""
    if spec.client is not None:
        from rlver_jax.rollout.policy import OpenAIPolicy

        return OpenAIPolicy(spec.client, temperature=sampling.temperature, max_tokens=sampling.max_new_tokens), None
    import jax

    from rlver_jax.eval import policy_loading
    from rlver_jax.parallel import sharding
    from rlver_jax.parallel.sampling_copy import SamplingLayout
    from rlver_jax.rollout.jax_policy import JaxPolicy

    rules = mesh_spec.rules
    mesh = sharding.make_mesh(mesh_spec.shape)
    if spec.checkpoint is not None:
        loaded = policy_loading.load_checkpoint_policy(spec.checkpoint, mesh, rules, p.base_path)
    elif p.path:
        loaded = policy_loading.load_hf_policy(p.path, mesh, rules, p.dtype, p.scan_layers)
    elif first_process:
        loaded = policy_loading.fresh_tiny_policy(workdir / "tokenizer", seed, mesh, rules)
    else:
        with tempfile.TemporaryDirectory(prefix="rlver_tokenizer_") as tmp:
            loaded = policy_loading.fresh_tiny_policy(pathlib.Path(tmp), seed, mesh, rules)
    params = SamplingLayout.create(loaded.model, mesh, rules).copy(loaded.params)
    return JaxPolicy(loaded.model, loaded.chat, sampling, params, jax.random.PRNGKey(seed)), loaded.chat
