"""The update of a train step as the run does it: the training rows the batch holds (a dialogue
each, or one per policy turn with think_history "drop": rl.batch) padded to the batch's length, cut
into the configured mini-batches (one optimizer step each, per epoch, per model) and micro-batches
(gradient accumulation), as rl.batch.StepCollation and rl.update lay them out. No JAX.

`update_shapes` gives the shapes the planner compiles the update's programs at and what a step
runs of them: the batch's rows R and length T (the longest row, bucketed), the optimizer steps of
each model and the rows the model's passes run on (`prepare_rows`, `micro_rows`). Padded rows (the
default): prepare's passes run on the R rows, each micro-batch's on micro_batch_size rows. Packed
rows plug in here: their layouts give prepare's packed rows and a micro-batch's most packed rows
from the rows' lengths (`packed` below), everything else unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from rlver_jax.rl.batch import row_multiple
from rlver_jax.sampling.buckets import bucket
from rlver_jax.train.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class UpdateShapes:
    """A step's update: the batch's shape and what each model's program runs of it."""

    rows: int  # R: the batch's rows, every process's (a multiple of the mini-batch unit)
    length: int  # T: the longest row, bucketed (config.train.length_multiple)
    real_rows: int  # rows of dialogues; the others are padding
    tokens: int  # tokens in the real rows (what the update trains on and scores)
    optimizer_steps: int  # per model: ppo_epochs x mini-batches with real rows (a padding mini-batch is skipped)
    loop_steps: int  # per model: ppo_epochs x mini-batches, the model program's loop (padding ones included)
    micro_batches: int  # per optimizer step
    prepare_rows: int  # rows prepare's model passes run on (padded: R)
    micro_rows: int  # rows each micro-batch's passes run on (padded: micro_batch_size)
    layout: str = "padded"  # how rows are laid out: "padded" (each row from slot 0, padding after), or packed

    def describe(self, think_rows: bool) -> str:
        what = "turn rows (think_history \"drop\": a row per policy turn)" if think_rows else "dialogue rows"
        return (f"{self.real_rows} {what} of {self.tokens:,} tokens in a batch of {self.rows} x {self.length} "
                f"({self.layout}); {self.optimizer_steps} optimizer step(s) per model of {self.micro_batches} "
                f"micro-batch(es) of {self.micro_rows} rows; prepare over {self.prepare_rows} rows")


def _padded(lengths: Sequence[int], length: int, micro: int) -> tuple[int, int]:
    """Padded rows: prepare runs on every row, a micro-batch on its own rows."""
    return len(lengths), micro


# The rows the model passes run on, from the rows' lengths (0: padding), T and the micro-batch:
# (prepare's rows, a micro-batch's rows). Packed rows (rl.packing) give packed_rows(...) and
# micro_rows_bound(...) here, and their layouts' arrays join the abstract batch (setup.abstract_batch).
LAYOUTS: dict[str, Callable[[Sequence[int], int, int], tuple[int, int]]] = {"padded": _padded}


def update_shapes(spec: RunSpec, row_lengths: Sequence[Sequence[int]], hosts: int = 1,
                  length: int | None = None, layout: str = "padded") -> UpdateShapes:
    """The update of a step whose processes hold the training rows `row_lengths` (one list per
    process, every process the same count of dialogue slots), as rl.batch.StepCollation collates
    them: each process's rows a multiple of its share of a mini-batch (rows mode) or of its
    dialogue slots, T the longest row bucketed (`length`: a T to use instead, e.g. the config's
    bound)."""
    rl = spec.rl
    share = max(1, spec.loop.dialogues // hosts)
    multiple = row_multiple(rl.batch_size, rl.mini_batch_size, share, hosts)
    per_host = max(bucket(max(len(r), 1), multiple=multiple) for r in row_lengths)
    rows = per_host * hosts
    longest = max((max(r, default=0) for r in row_lengths), default=1)
    t = length or bucket(longest, multiple=spec.loop.length_multiple)
    real = sum(len(r) for r in row_lengths)
    minibatches = rl.minibatches(rows)
    per_mini = rows // minibatches
    # Real rows go first in each epoch's order (rl.update.minibatch_rows): the mini-batches they fill run.
    steps = rl.ppo_epochs * min(minibatches, -(-real // per_mini))
    padded = [n for r in row_lengths for n in r] + [0] * (rows - real)
    prepare_rows, micro_rows = LAYOUTS[layout](padded, t, rl.micro_batch_size)
    return UpdateShapes(rows, t, real, sum(sum(r) for r in row_lengths), steps, rl.ppo_epochs * minibatches,
                        per_mini // rl.micro_batch_size, prepare_rows, micro_rows, layout)
