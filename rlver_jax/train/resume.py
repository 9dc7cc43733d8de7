"""What a run's checkpoints record besides the state, and a resume reading it back.

A checkpoint's JSON record (`checkpoint_meta`) holds its step, the run's record (`run_record`: seed,
LoRA base, the config fields a resume compares), the parameter norms of its models (checked when
it is read back: `restore` skips a checkpoint whose weights are not finite or differ from them) and
the actor versions of its `sampling` item (with max_staleness, the parameters the next batches are
sampled with after a resume). `log_changes` records what a resume changes in changes.jsonl.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import jax
import optax

from rlver_jax.files import atomic_write_jsonl, read_jsonl
from rlver_jax.parallel import sharding
from rlver_jax.rl import offload, train_state
from rlver_jax.train import checkpoint
from rlver_jax.train.finished import finished_line
from rlver_jax.train.spec import LoopSettings, RunSpec, resume_changes
from rlver_jax.train.workdir import WorkDir

log = logging.getLogger(__name__)


def restore(manager, initial: train_state.TrainState, s: LoopSettings, lora_base: dict | None
            ) -> tuple[train_state.TrainState, int, dict | None, dict[int, Any]]:
    """(state, its step, its checkpoint's record or None, the actor versions the checkpoint holds
    for sampling): the newest usable checkpoint (`s.resume`; `s.read_attempts` reads each, weights
    that are not finite or differ from the record's norms are not usable), or the run's `initial`
    state at step 0. A LoRA checkpoint must hold adapters of the run's `lora_base`."""
    restored = (checkpoint.restore_newest_readable(manager, initial, attempts=s.read_attempts, verify=_verify)
                if s.resume else None)
    if restored is None:
        return initial, 0, None, {}
    state, meta = restored
    if meta.get("lora_base") != lora_base:
        raise ValueError(f"{manager.directory} holds LoRA adapters of the base {meta.get('lora_base')}, but the "
                         f"config names {lora_base} (config.model.path, config.model.preset, config.seed, "
                         "config.lora): train with the checkpoint's, or start a new config.workdir")
    step = int(meta["step"])
    versions: dict[int, Any] = {}
    if s.max_staleness and meta.get("sampling_versions"):
        names = {int(v): f"version_{v}" for v in meta["sampling_versions"]}
        item = checkpoint.restore_item(manager, step, "sampling", {n: initial.actor for n in names.values()})
        versions = {v: item[n] for v, n in names.items()} if item is not None else {}
    log.info("resumed from %s at step %d", manager.directory, step)
    return state, step, meta, versions


def sampling_versions(max_staleness: int, start: int, previous: dict[int, Any]) -> dict[int, Any]:
    """The actor versions (version -> actor in the train state's layout) the first max_staleness
    batches from `start` on are sampled with besides the state's own: versions start - max_staleness
    .. start - 1, from the checkpoint (`previous`). A checkpoint without them (written with
    max_staleness 0, or by an older version) resumes with the newest version: warned, not exact."""
    wanted = [v for v in range(start - max_staleness, start) if v >= 0]
    if wanted and not all(v in previous for v in wanted):
        log.warning("the checkpoint of step %d holds no actor of versions %s: the next %d batch(es) are sampled "
                    "with the newest parameters, not as the uninterrupted run sampled them", start, wanted,
                    len(wanted))
        return {}
    return {v: previous[v] for v in wanted}


def sampling_item(versions: dict[int, Any]) -> dict[str, Any] | None:
    """The checkpoint item holding `versions` (None when there are none)."""
    return {f"version_{v}": actor for v, actor in versions.items()} or None


def run_record(seed: int, lora_base: dict | None, fields: dict | None = None) -> dict:
    """What a checkpoint's JSON record holds besides its step: the seed, (LoRA) the base its
    adapters belong to, and the config fields a resume compares (`fields`: spec.resume_record)."""
    return {"seed": seed, **({"lora_base": lora_base} if lora_base else {}), **({"run": fields} if fields else {})}


def checkpoint_meta(step: int, record: dict, norms: dict[str, float], versions: dict[int, Any]) -> dict:
    """The record of the checkpoint of `step`: `record`, the parameter norms of its models (checked
    when it is read back) and the actor versions of its `sampling` item."""
    return {"step": step, **record, "param_norms": norms,
            **({"sampling_versions": sorted(versions)} if versions else {})}


_global_norm = jax.jit(optax.global_norm)


def param_norms(state: train_state.TrainState) -> dict[str, float]:
    """The global norm of each model's trainable parameters ("actor", "critic"), for those in
    device memory (offloaded parts are left out: nothing is computed in host memory)."""
    out = {}
    for name in ("actor", "critic"):
        tree = getattr(state, name)
        leaves = jax.tree.leaves(tree) if tree is not None else []
        if not leaves or any(getattr(x.sharding, "memory_kind", None) == offload.HOST_MEMORY for x in leaves):
            continue
        out[name] = float(sharding.replicated_value(_global_norm(tree)))
    return out


def _verify(state: train_state.TrainState, meta: dict) -> str | None:
    """Why a restored checkpoint is not usable (its weights are not finite, or their norms are not
    those its record holds), else None."""
    norms = param_norms(state)
    bad = {k: v for k, v in norms.items() if not math.isfinite(v)}
    if bad:
        return f"its weights are not finite (parameter norms {bad})"
    recorded = meta.get("param_norms") or {}
    off = {k: (recorded[k], v) for k, v in norms.items()
           if k in recorded and not math.isclose(recorded[k], v, rel_tol=1e-3, abs_tol=1e-6)}
    if off:
        return "its weights differ from its record (" + ", ".join(f"{k} norm {a:.6g} recorded, {b:.6g} read"
                                                                  for k, (a, b) in off.items()) + ")"
    return None


def log_changes(spec: RunSpec, storage: WorkDir, meta: dict, start: int) -> None:
    """Log the config fields this resume of `spec` changes (allowed by config.checkpoint.allow_changes;
    a change it may not make was refused before anything was written, rlver_jax.train.run.claim) and
    (process 0) record them in WORKDIR/changes.jsonl at step `start`, each step's changes once."""
    if "run" not in meta:
        return
    changes = resume_changes(meta["run"], spec, f"the checkpoint of step {start} in {storage.checkpoints}")
    for field, before, after in changes:
        log.warning("step %d: %s changed from %r to %r (config.checkpoint.allow_changes)", start, field, before, after)
    if jax.process_index() == 0:
        path = storage.local / CHANGES
        before = read_jsonl(path) if path.exists() else []
        kept = [r for r in before if r.get("step", 0) < start]  # a run resumed again at `start`: once
        if changes or len(kept) != len(before):
            atomic_write_jsonl(path, kept + [{"step": start, "field": f, "before": b, "after": a}
                                             for f, b, a in changes])


CHANGES = "changes.jsonl"


def say_finished(directory: Any, start: int, steps: int) -> None:
    """A rerun of a finished run, said on stdout (process 0): not an error, and not chatter."""
    if jax.process_index() == 0:
        print(finished_line(directory, start, steps), flush=True)
