"""Every extension-point table (rlver_jax.table.Table) of the package, found in the modules that
hold them, and the config fields bound to each: what `--print_config` adds to a field's comment
(`config_doc`), and the listing the docs show:

    .venv/bin/python -m rlver_jax.cli.tables

None of these modules imports JAX when imported, so `--print_config` stays quick (a table in a
module that does is left out: its lookup still gives the one error naming its field).
"""

from __future__ import annotations

import importlib

from rlver_jax.table import Table

# The modules that hold the tables, in the order the docs list them.
TABLE_MODULES = ("rlver_jax.rl.algorithms", "rlver_jax.rl.loss_modes", "rlver_jax.rollout.rewards",
                 "rlver_jax.rl.offload_modes", "rlver_jax.engines.table", "rlver_jax.simulator.backends",
                 "rlver_jax.eval.policy_source", "rlver_jax.eval.probes", "rlver_jax.models.lora_settings")


def tables() -> list[Table]:
    """Every Table of TABLE_MODULES, each once, in order."""
    found: dict[int, Table] = {}
    for name in TABLE_MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, Table):
                found.setdefault(id(value), value)
    return list(found.values())


def by_field() -> dict[str, Table]:
    """Dotted config field below `config.` ("rl.algo") -> the table its value names rows of."""
    return {field.removeprefix("config."): t for t in tables() for field in t.fields}


def listing() -> str:
    """Per table, its config fields and its rows' names, then each row with words of its own (the
    docs' list)."""
    lines = []
    for t in tables():
        lines.append(f"{', '.join(t.fields)}: {t.words()}")
        lines += [f"  {line}" for line in t.describe() if ": " in line]
    return "\n".join(lines)


if __name__ == "__main__":
    print(listing())
