"""A rerun of a finished run (config.train.steps reached), answered before JAX is imported.

launch/train.py asks `finished_run(spec)` once the spec is checked: where the work directory's
newest checkpoint already holds config.train.steps, it prints the answer and exits 0 within a
second or two, without loading a model, restoring a checkpoint or compiling (the same answer the
loop gives after restoring took about 20 s on a 2-core CPU for the tiny preset). A resume that
changes what it may not is refused here as the loop would refuse it (spec.resume_changes, exit 2). A
work directory on a bucket (gs://) takes the loop's path. The newest checkpoint's weights are
checked when a run resumes from it (rlver_jax.train.resume), not by this answer.
"""

from __future__ import annotations

import os

from rlver_jax.train.checkpoint_files import newest_record
from rlver_jax.train.spec import RunSpec, resume_changes
from rlver_jax.train.workdir import is_url


def finished_line(directory: str | os.PathLike, step: int, steps: int) -> str:
    """What a rerun of a finished run says (on stdout: not an error, and not chatter)."""
    return (f"nothing left to train: {directory} holds step {step} of config.train.steps={steps}; to train further "
            f"rerun with a larger --config.train.steps (e.g. {2 * steps}): it extends this run")


def finished_run(spec: RunSpec) -> str | None:
    """`finished_line` when `spec`'s local work directory holds a checkpoint of step >= its
    config.train.steps that it resumes (checkpoint.resume, not start_over); else None."""
    loop = spec.loop
    if not loop.resume or loop.start_over or is_url(loop.workdir):
        return None
    checkpoints = os.path.join(os.path.abspath(loop.workdir), "checkpoints")
    newest = newest_record(checkpoints)
    if newest is None or newest[0] < loop.steps:
        return None
    step, record = newest
    if "run" in record:
        resume_changes(record["run"], spec, f"the checkpoint of step {step} in {checkpoints}")
    return finished_line(checkpoints, step, loop.steps)
