"""Every field of a config with the comment its config file gives it (`--print_config`).

The comments are read from the source of the config file and of the config modules it imports
(configs/base.py, mesh.py, simulator.py): a field's comment is the comment at the end of the
line that sets it, after the comment lines right above that line. A field set inside a function
of an imported module (`c.max_turns = ...` in configs/simulator.py) is found by the end of its
path (`simulator.max_turns`): in the config file itself first, then in a module the path names
(`simulator.temperature` in configs/simulator.py, not in eval.py's policy sampling). A comment
on a value set inside an `if` (one preset's own value) follows the field's own comment after a
semicolon. A field whose value names a row of a table (rlver_jax.cli.tables: `rl.algo`,
`simulator.backend`, ...) ends with the table's names, read from the table itself.
"""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize
from collections.abc import Iterator, Mapping
from typing import Any

import ml_collections

from rlver_jax.cli import tables


def _comment_lines(source: str) -> tuple[dict[int, str], dict[int, str]]:
    """(trailing, alone): comments by line number, at the end of a code line or on a line of their own."""
    trailing, alone, code_lines = {}, {}, set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            (trailing if tok.start[0] in code_lines else alone)[tok.start[0]] = text
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    return trailing, alone


def _dotted(node: ast.AST) -> list[str] | None:
    """["model", "preset"] for `c.model.preset` (the root variable dropped); None for other targets."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return parts[::-1] if isinstance(node, ast.Name) and parts else None


def _entries(value: ast.AST) -> Iterator[tuple[str, ast.AST, ast.AST]]:
    """(key, node where its line starts, value) of the fields a call sets: `ConfigDict(dict(k=v))`,
    `ConfigDict({"k": v})` and keyword arguments of a section's function (`get_mesh_config(shape=...)`)."""
    if not isinstance(value, ast.Call):
        return
    for kw in value.keywords:
        if kw.arg:
            yield kw.arg, kw, kw.value
    inner = value.args[0] if value.args else None
    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "dict":
        yield from _entries(inner)
    elif isinstance(inner, ast.Dict):
        for key, val in zip(inner.keys, inner.values):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                yield key.value, key, val


def module_comments(source: str) -> tuple[dict[str, str], dict[str, str]]:
    """(fields, preset notes) of one config module: dotted path (root variable dropped) -> comment.

    A field without a comment of its own shares the comment of the field right above it when
    the two are set in one call (`ConfigDict({...})` under one comment block) or are named
    alike (band_a, band_b, band_c)."""
    trailing, alone = _comment_lines(source)

    def comment(first: int, last: int) -> str:
        above, line = [], first - 1
        while line in alone:
            above.insert(0, alone[line])
            line -= 1
        ends = [trailing[n] for n in range(first, last + 1) if n in trailing]
        return " ".join(above + ends[:1])

    found: list[tuple[str, int, int, int, bool]] = []  # (path, first line, last line, statement, in an if)

    def visit(node: ast.AST, in_if: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Assign) and len(child.targets) == 1 and (path := _dotted(child.targets[0])):
                entries = list(_entries(child.value))
                found.extend((".".join(path + [key]), start.lineno, val.end_lineno, id(child), in_if)
                             for key, start, val in entries)
                if not entries:
                    found.append((".".join(path), child.lineno, child.end_lineno, id(child), in_if))
            visit(child, in_if or isinstance(child, ast.If))

    def stem(path: str) -> str:
        return path.rsplit("_", 1)[0] if "_" in path.rsplit(".", 1)[-1] else path

    visit(ast.parse(source), False)
    fields: dict[str, str] = {}
    notes: dict[str, str] = {}
    previous = ("", -1, 0, "")  # path, last line, statement, comment
    for path, first, last, statement, in_if in found:
        grouped = first == previous[1] + 1 and (statement == previous[2] or stem(path) == stem(previous[0]))
        text = comment(first, last) or (previous[3] if grouped else "")
        if text:
            (notes if in_if else fields)[path] = text
        previous = (path, last, statement, text)
    return fields, notes


def _config_modules(config_file: pathlib.Path) -> list[pathlib.Path]:
    """The config file, then the config modules it imports (`configs.X`), breadth first."""
    root = config_file.resolve().parent.parent
    order, queue = [], [config_file.resolve()]
    while queue:
        path = queue.pop(0)
        if path in order or not path.exists():
            continue
        order.append(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            parts = node.module.split(".") if isinstance(node, ast.ImportFrom) and node.module else []
            if parts[:1] == ["configs"]:  # from configs.mesh import ... / from configs import mesh
                names = parts[1:2] or [a.name for a in node.names]
                queue += [root / "configs" / f"{n}.py" for n in names]
    return order


def leaves(config: ml_collections.ConfigDict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every field that is not itself a section, in the config's order."""
    for key in config._fields:  # the order the config file sets them (items() sorts)
        value = config[key]
        if isinstance(value, ml_collections.ConfigDict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def field_comments(config: ml_collections.ConfigDict, config_file: str | pathlib.Path) -> dict[str, str]:
    """Dotted path -> comment ("" when the config files give none) of every field of `config`."""
    files = _config_modules(pathlib.Path(config_file))
    parsed = {p.stem: module_comments(p.read_text(encoding="utf-8")) for p in files}
    out = {}
    for path, _ in leaves(config):
        parts = path.split(".")
        suffixes = [".".join(parts[k:]) for k in range(len(parts))]
        modules = [parsed[p.stem] for p in sorted(files, key=lambda p: (p != files[0], p.stem not in parts[:-1]))]
        own = next((fields[s] for s in suffixes for fields, _ in modules if s in fields), "")
        note = next((notes[s] for s in suffixes for _, notes in modules if s in notes), "")
        out[path] = "; ".join(t for t in (own, note) if t)
    return out


def describe(config: ml_collections.ConfigDict, config_file: str | pathlib.Path,
             overrides: Mapping[str, Any] = (), flag: str = "config") -> str:
    """One line per field, `path = value  # comment`; fields set on the command line are marked, and
    a field bound to a table ends with its rows' names ("one of: ppo | grpo | ...")."""
    comments = field_comments(config, config_file)
    bound = tables.by_field()
    lines = []
    for path, value in leaves(config):
        mark = f"  (--{flag}.{path})" if path in overrides else ""
        text = " ".join(t for t in (comments[path], f"(one of: {bound[path].words()})" if path in bound else "") if t)
        lines.append(f"{path} = {value!r}{mark}" + (f"  # {text}" if text else ""))
    return "\n".join(lines)
