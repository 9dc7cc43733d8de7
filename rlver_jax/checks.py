"""Range checks of settings fields, for the settings types' own constructors: one ValueError naming
every field out of its range ("config.rollout.top_k=-1 must be >= 0"), and `build_all`, which builds
several settings and names the bad fields of all of them at once. No imports beyond the standard
library: an evaluation of served models checks its config without JAX."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any


class InputError(ValueError):
    """Bad input a user gave: a config field, a path it names or a file's contents (profiles, a
    checkpoint of another run, results of another protocol). The launch/ scripts exit with status 2
    for it (rlver_jax/cli/program.py), as for a bad flag: rerunning the same command cannot help."""


def check_ranges(values: Mapping[str, Any], *, lowest: Mapping[str, float] | None = None,
                 positive: Collection[str] = (), fraction: Collection[str] = ()) -> None:
    """One ValueError naming every value of `values` (its key: the field's name, e.g.
    "config.train.steps") that is below its `lowest` value, not > 0 (`positive`) or outside (0, 1]
    (`fraction`); the bounds name fields by their last part ("steps", "timeout_s")."""
    problems = []
    for check in ("lowest", "positive", "fraction"):
        for name, value in values.items():
            field = name.rsplit(".", 1)[-1].lstrip("-")  # "config.train.steps", "--timeout_s": the field
            if check == "lowest" and lowest and field in lowest and value < lowest[field]:
                problems.append(f"{name}={value} must be >= {lowest[field]}")
            elif check == "positive" and field in positive and not value > 0:
                problems.append(f"{name}={value} must be > 0")
            elif check == "fraction" and field in fraction and not 0 < value <= 1:
                problems.append(f"{name}={value} must be in (0, 1] (1 is off)")
    if problems:
        raise ValueError("; ".join(problems))


def named(obj: Any, prefix: str, fields: Collection[str]) -> dict[str, Any]:
    """{prefix + field: obj.field} for `fields`, the input of check_ranges."""
    return {f"{prefix}{f}": getattr(obj, f) for f in fields}


def build_all(*builders: Callable[[], Any]) -> list[Any]:
    """Every builder's result; when some raise ValueError, one ValueError joining their messages in
    order, so that a config's bad fields are named together before anything starts."""
    built, problems = [], []
    for build in builders:
        try:
            built.append(build())
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise ValueError("; ".join(problems))
    return built
