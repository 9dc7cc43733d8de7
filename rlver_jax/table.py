"""One form for the extension-point tables (engines, simulator backends, policy backends, reward
sources, algorithms, estimators, policy losses, aggregations, KL estimators, off-policy
corrections, probes): rows by name, one lookup whose error names the config field and lists the
known names, and the words `--help`, `--print_config` and the docs show.

A `Table` is a read-only mapping from a name to its row (any frozen dataclass or function). What a
config check needs of an extension point (which names exist, what a row admits, which fields it
reads) is read off its rows, so no list is kept by hand beside a table. Standard library only: the
config checks read the tables before JAX is imported.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from rlver_jax.checks import InputError

Row = TypeVar("Row")


def imported(path: str) -> Any:
    """What `path` names ("package.module.name"), its module imported now: how a row names the class
    or function it builds or runs while its table imports nothing heavy (no JAX)."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"{path}: no such function or class ({e}); a table row names what it builds or runs "
                          "by its module's dotted path and the name in it") from None


def first_clause(doc: str | None) -> str:
    """A function row's words for `summary`: its docstring up to the first ';' or '. '."""
    return (doc or "").split(";")[0].split(". ")[0].strip().rstrip(".")


class UnknownNameError(InputError):
    """A config field names no row of its table (exit 2 in the launch/ scripts, as any bad field)."""


class Table(Mapping[str, Row], Generic[Row]):
    """The rows of the extension point that config field `field` (e.g. "config.rollout.engine")
    chooses from; `also`: other fields that choose from the same rows (config.rl.value_loss_agg_mode
    beside config.rl.loss_agg_mode), for --print_config. `renamed`: old names a field once took -> the
    row they are now, refused with a line naming the new one. `summary`: a row's words for --help and
    the docs ("" where a row has none)."""

    def __init__(self, field: str, rows: Mapping[str, Row], *, also: tuple[str, ...] = (),
                 renamed: Mapping[str, str] | None = None, summary: Callable[[Row], str] | None = None):
        self.field = field
        self.fields = (field, *also)  # every config field whose value names a row
        self._rows = dict(rows)
        self._renamed = dict(renamed or {})
        self._summary = summary
        if bad := [old for old, new in self._renamed.items() if new not in self._rows or old in self._rows]:
            raise ValueError(f"{field}: renamed names {bad} must map an old name to a row")

    def __getitem__(self, name: str) -> Row:
        return self.row(name)

    def __contains__(self, name: object) -> bool:  # Mapping's would call row(): an error, not False
        return name in self._rows

    def get(self, name: str, default: Row | None = None) -> Row | None:
        return self._rows.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"Table({self.field}: {' | '.join(self._rows)})"

    def row(self, name: str, field: str | None = None) -> Row:
        """The row `name`; else one UnknownNameError naming `field` (default: the table's) and the
        known names, or the row an old name became."""
        if name in self._rows:
            return self._rows[name]
        where = field or self.field
        if name in self._renamed:
            raise UnknownNameError(f"{where}={name!r} is now called {self._renamed[name]!r}: "
                                   f"use --{where}={self._renamed[name]}")
        raise UnknownNameError(f"{where}={name!r}: use one of {self.words()}")

    def check(self, name: str, field: str | None = None) -> str:
        """`name` when it names a row (else `row`'s error): for settings that keep the name."""
        self.row(name, field)
        return name

    def words(self) -> str:
        """The known names as --help shows them: "a | b | c"."""
        return " | ".join(self._rows)

    def describe(self) -> list[str]:
        """One line per row for the docs and --help: "name: its summary"."""
        if self._summary is None:
            return list(self._rows)
        return [f"{name}: {self._summary(row)}" if self._summary(row) else name for name, row in self._rows.items()]

    def where(self, test: Callable[[Row], bool]) -> tuple[str, ...]:
        """The names of the rows for which `test(row)` holds (the engines that read a field, say)."""
        return tuple(name for name, row in self._rows.items() if test(row))

    @contextlib.contextmanager
    def added(self, name: str, row: Row) -> Iterator[Row]:
        """`row` under `name` while the block runs (a test's toy row: everything that reads the table
        sees it, and nothing else is edited)."""
        if name in self._rows:
            raise ValueError(f"{self.field}: {name!r} is a row already")
        self._rows[name] = row
        try:
            yield row
        finally:
            del self._rows[name]
