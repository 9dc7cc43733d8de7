"""A function named by its import path and imported at its first call: how a row of the RL tables
(rlver_jax.rl.algorithms.ESTIMATORS, rlver_jax.rl.loss_modes' POLICY_LOSSES, CORRECTIONS,
AGG_MODES, KL_ESTIMATORS) holds its JAX function while the table itself imports no JAX.

The config checks (rlver_jax.rl.settings, read by rlver_jax.train.spec before JAX is imported)
need each table's names and what each row admits; the train step needs each row's function. One
row holds both, so a new estimator, policy loss or correction is its function and one row, with
no second table to keep equal to the first.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from rlver_jax.table import imported


@dataclasses.dataclass(frozen=True)
class FunctionPath:
    """`path`: "package.module.function"; calling it calls that function (its module is imported
    at the first call, and then found in sys.modules)."""

    path: str

    def load(self) -> Callable[..., Any]:
        return imported(self.path)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)
