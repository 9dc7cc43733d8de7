"""The one-line messages of flag errors (rlver_jax/cli/program.py parses the flags): a value a config
field's type does not take, an override without its config file, a field the config lacks, a
config file that cannot be read, absl's own messages without their prefix or embedded traceback."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Sequence

from absl import flags

FLAGS = flags.FLAGS
_REPO = pathlib.Path(__file__).resolve().parents[2]

# What a config field's parser (ml_collections picks it by the field's type) reads, in words.
_FIELD_TYPES = {flags.IntegerParser: "an integer", flags.FloatParser: "a number", flags.BooleanParser: "True or False"}


def override_message(e: flags.Error, config_names: Sequence[str]) -> str | None:
    """The config's own words for an override that failed: a value of the wrong type (the field, its
    type and an example: the config's value), or an override without its config file; None for
    other flag errors."""
    if isinstance(e, flags.UnrecognizedFlagError):
        name = e.flagname.split(".", 1)[0]
        if "." in e.flagname and name in config_names and FLAGS[name].value is None:
            example = re.search(r"e\.g\. (\S+?)[.,]?(?:\s|$)", FLAGS[name].help or "")
            given = e.flagvalue if str(e.flagvalue).startswith("-") else f"--{e.flagname}"
            return (f"{given}: overrides a field of --{name}, which is not given: add "
                    f"--{name}={example.group(1) if example else 'FILE[:PRESET]'} or another config file "
                    "(--help shows examples)")
        return None
    given = re.match(r"flag --([\w.]+)=(.*?): ", str(e), re.S)
    if not given or "." not in given.group(1) or given.group(1).split(".", 1)[0] not in config_names:
        return None
    field = FLAGS[given.group(1)] if given.group(1) in FLAGS else None
    if field is None:
        return None
    if isinstance(field.parser, flags.ArgumentParser) and type(field.parser) in _FIELD_TYPES:
        kind, example = _FIELD_TYPES[type(field.parser)], f"--{field.name}={field.default}"
    elif isinstance(field.default, tuple):
        kind, example = "a tuple", f"--{field.name}='{field.default}'"
    else:
        return None
    return (f"--{field.name}={given.group(2)}: config.{field.name.split('.', 1)[1]} takes {kind}, e.g. {example} "
            "(the config's value)")


def flag_message(text: str) -> str:
    """absl's message without its `flag ` prefix and without a config file's embedded traceback."""
    text = re.sub(r"^flag ", "", text.strip())
    if required := re.match(r"(--[\w.]+)=None: Flag --[\w.]+ must have a value other than None", text):
        return f"{required.group(1)} is required"
    if "Traceback (most recent call last)" in text:
        where = re.match(r"(--\S+?): Error whilst parsing", text)
        where = where.group(1) if where else ""
        lines = text.splitlines()
        last = max(i for i, line in enumerate(lines) if re.match(r"\s*[\w.]+(Error|Exception)\b", line))
        error = "\n".join(lines[last:]).strip()
        error = re.sub(r"^[\w.]+(Error|Exception): ", "", error)
        text = f"{where}: {error}" if where else error
    return text


def unknown_field_message(e: BaseException, argv: Sequence[str]) -> str:
    """The override naming a field the config lacks, with ml_collections' "did you mean"."""
    detail = str(e.args[0] if e.args else e).strip("'\"").replace("\\'", "'").replace("\\n", " ").replace("\n", " ")
    key = re.match(r"'?([^'\s]+)'?", detail)
    key = key.group(1) if key else ""
    flagged = [a for a in argv[1:] if a.startswith("--") and "." in a.split("=", 1)[0]
               and key in a.split("=", 1)[0].split(".")[1:]]
    where = flagged[0].split("=", 1)[0] if flagged else "an override"
    hint = re.search(r"Did you mean (.*?)\??$", detail)
    return (f"{where}: the config has no field {key!r}" + (f" (did you mean {hint.group(1)}?)" if hint else "")
            + "; the config is locked: --print_config lists every field")


def config_file_message(argv: Sequence[str], e: OSError, config_names: Sequence[str]) -> str:
    """A config file that cannot be read: where relative paths start, where the config files are."""
    for name in config_names:
        given = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
        if given:
            path = given[0].split(":", 1)[0]
            if not pathlib.Path(path).exists():
                return (f"--{name}={given[0]}: no such config file {path!r} (relative paths start at "
                        f"{pathlib.Path.cwd()}; the config files are in {_REPO / 'configs'})")
    return str(e).splitlines()[-1].strip()
