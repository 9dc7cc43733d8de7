"""The policy of `config.policy` (the section configs/eval.py defines; configs/capabilities.py
shares it; rlver_jax.eval.spec.PolicySpec reads it), for the Sentient benchmark and the capability
evaluation alike: resolved without loading weights (`resolve`: what is evaluated, for setup.json
and reports, and its think mode), then built (`build`) as an OpenAI-compatible endpoint through
rlver_jax.llm_client, or a JAX checkpoint, Hugging Face directory or fresh tiny model
(rlver_jax.eval.policy_loading) on our sampler; which of them, and whether it needs JAX, is the
row of config.policy.backend in `POLICY_BACKENDS`. JAX is imported only by `build` of a JAX policy."""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile
from typing import Any, Callable

from rlver_jax.eval.run_checkpoint import RunCheckpoint, locate_checkpoint
from rlver_jax.eval.spec import PolicySpec
from rlver_jax.llm_client import ClientSettings
from rlver_jax.models import smollm2
from rlver_jax.sampling.settings import SamplingSettings
from rlver_jax.table import Table
from rlver_jax.train.spec import MeshSpec


@dataclasses.dataclass(frozen=True)
class PolicySource:
    backend: str  # a row of POLICY_BACKENDS
    source: str  # what is evaluated: the resolved checkpoint step, directory or served model
    label: str  # a short name for reports
    think: bool  # config.policy.think, or (None there) the training run's own think mode
    client: ClientSettings | None = None  # a served policy's endpoint
    checkpoint: RunCheckpoint | None = None  # a training run's checkpoint


def _resolve_served(p: PolicySpec, seed: int, max_in_flight: int) -> PolicySource:
    del seed
    client = ClientSettings.from_config(p, name="policy endpoint", flag_prefix="--config.policy.",
                                        max_concurrency=max_in_flight)
    return PolicySource(p.backend, p.model, p.model, bool(p.think), client=client)


def _build_served(p: PolicySpec, spec: PolicySource, mesh_spec: MeshSpec, seed: int, workdir: pathlib.Path,
                  sampling: SamplingSettings, first_process: bool) -> tuple[Any, None]:
    del p, mesh_spec, seed, workdir, first_process
    from rlver_jax.rollout.served_policy import OpenAIPolicy

    return OpenAIPolicy(spec.client, temperature=sampling.temperature, max_tokens=sampling.max_new_tokens), None


def _resolve_ours(p: PolicySpec, seed: int, max_in_flight: int) -> PolicySource:
    del max_in_flight
    if p.checkpoint and p.path:
        raise ValueError("set one of config.policy.checkpoint (a training run) and config.policy.path "
                         "(a Hugging Face directory), not both")
    if p.checkpoint:
        ckpt = locate_checkpoint(p.checkpoint, "config.policy.checkpoint")
        step = ckpt.resolved_step()
        think = p.think if p.think is not None else bool(ckpt.config().rollout.think)
        return PolicySource(p.backend, str((ckpt.checkpoints / str(step)).resolve()),
                            f"{ckpt.run_dir.resolve().name} step {step}", bool(think), checkpoint=ckpt)
    if p.path:
        if not pathlib.Path(p.path, "config.json").exists():
            raise FileNotFoundError(f"config.policy.path={p.path!r}: no config.json there; it must be a Hugging "
                                    "Face Qwen2/Llama directory (e.g. one written by launch/export_hf.py)"
                                    + smollm2.missing_hint(p.path))
        source = str(pathlib.Path(p.path).resolve())
        return PolicySource(p.backend, source, pathlib.Path(source).name, bool(p.think))
    if p.fresh_tiny:
        label = f"fresh tiny model (seed {seed})"
        return PolicySource(p.backend, label, label, bool(p.think))
    raise ValueError("no policy to evaluate: set --config.policy.checkpoint=TRAIN_WORKDIR (a run of "
                     "launch/train.py), --config.policy.path=HF_DIR, or --config.policy.backend=openai "
                     "with --config.policy.base_url and --config.policy.model")


def _build_ours(p: PolicySpec, spec: PolicySource, mesh_spec: MeshSpec, seed: int, workdir: pathlib.Path,
                sampling: SamplingSettings, first_process: bool) -> tuple[Any, Any]:
    import jax

    from rlver_jax.eval import policy_loading  # transformers, Flax
    from rlver_jax.parallel import sharding
    from rlver_jax.parallel.sampling_copy import SamplingLayout

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
    sampler = p.engine.build(loaded.model, loaded.chat, sampling, jax.random.PRNGKey(seed))
    sampler.publish(0, params)  # the turns of an evaluation ask for version 0
    return sampler, loaded.chat


@dataclasses.dataclass(frozen=True)
class Backend:
    """A value of config.policy.backend: where its policy runs, and how it is resolved and built."""

    needs_jax: bool  # it samples on our JAX sampler, in this process
    # (p, seed, max_in_flight) -> the PolicySource, without loading weights (`resolve`)
    resolve: Callable[[PolicySpec, int, int], PolicySource]
    # (p, source, mesh_spec, seed, workdir, sampling, first_process) -> (policy, chat tokens or None) (`build`)
    build: Callable[..., tuple[Any, Any]]


POLICY_BACKENDS: Table[Backend] = Table("config.policy.backend", {
    "jax": Backend(needs_jax=True, resolve=_resolve_ours, build=_build_ours),  # a checkpoint, HF directory, tiny model
    "openai": Backend(needs_jax=False, resolve=_resolve_served, build=_build_served),  # an OpenAI-compatible endpoint
})


def resolve(p: PolicySpec, seed: int, max_in_flight: int) -> PolicySource:
    """The policy `p` (config.policy) names; an endpoint's client allows `max_in_flight` requests at
    once; `seed` (config.seed) is a fresh tiny model's."""
    return POLICY_BACKENDS.row(p.backend).resolve(p, seed, max_in_flight)


def build(p: PolicySpec, spec: PolicySource, mesh_spec: MeshSpec, seed: int, workdir: pathlib.Path,
          sampling: SamplingSettings, *, first_process: bool = True) -> tuple[Any, Any]:
    """(policy, chat tokens or None for a text policy) ready to play, sampling by `sampling`, a JAX
    policy on the mesh of `mesh_spec` (config.mesh) with the sampling key of `seed` (config.seed). A
    fresh tiny model's tokenizer is built in WORKDIR/tokenizer by the first process, elsewhere in a
    temporary directory (the same tokenizer: no two processes write one file)."""
    return POLICY_BACKENDS.row(spec.backend).build(p, spec, mesh_spec, seed, workdir, sampling, first_process)
