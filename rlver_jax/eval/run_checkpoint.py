"""A training run's checkpoint as evaluation names it (`config.policy.checkpoint`,
`config.eval.like_training`, launch/export_hf.py's --checkpoint): WORKDIR, WORKDIR/checkpoints or
WORKDIR/checkpoints/STEP. Found and read without JAX (the run's config.json through
rlver_jax.train.spec.saved_config), so an evaluation config is checked before JAX is imported;
rlver_jax.eval.policy_loading loads its actor.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import ml_collections

from rlver_jax.train.spec import saved_config


@dataclasses.dataclass(frozen=True)
class RunCheckpoint:
    """Where a training run's checkpoint lies; `step` None = the latest."""

    run_dir: pathlib.Path
    checkpoints: pathlib.Path
    step: int | None

    def config(self) -> ml_collections.ConfigDict:
        """The run's config.json, brought up to the fields read today (rlver_jax.train.spec.saved_config)."""
        return saved_config(self.run_dir)

    def trained_profile_ids(self) -> set[str]:
        """The ids of the profiles the run trained on: its data.train_profiles, less the last
        data.eval_holdout when it held those out (an empty set when the file is gone)."""
        data = self.config().data
        path = pathlib.Path(data.train_profiles)
        if not path.is_file():
            return set()
        ids = [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not data.eval_profiles and data.eval_holdout:
            ids = ids[:-data.eval_holdout]
        return set(ids)

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
