"""The three benchmarks from local files in their published formats (JSON Lines, or Parquet with
pyarrow), as `Item`s: what to ask and what grades the answer.

- MATH500 (HuggingFaceH4/MATH-500, test.jsonl): problem, answer, subject, level, unique_id.
- IFEval (google/IFEval, ifeval_input_data.jsonl): key, prompt, instruction_id_list, kwargs.
- LiveCodeBench (livecodebench/code_generation_lite, test.jsonl ... test6.jsonl for release_v6):
  question_id, question_title, question_content, starter_code, platform, difficulty,
  contest_date, public_test_cases (JSON), private_test_cases (JSON, or the published compressed
  form: base64 of zlib of a pickled JSON string), metadata (JSON; func_name for functional tests).
  A directory stands for every *.jsonl / *.parquet file in it, in name order.

The compressed private tests are unpickled with an unpickler that refuses every global, so the
file can hold a string and nothing that runs code.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import pathlib
import pickle
import zlib
from typing import Any

from rlver_jax.checks import InputError

BENCHMARKS = ("math500", "ifeval", "livecodebench")
_SUFFIXES = (".jsonl", ".parquet")


@dataclasses.dataclass(frozen=True)
class Item:
    benchmark: str
    id: str  # unique within the benchmark
    question: dict[str, Any]  # what the prompt is built from (prompts.messages)
    reference: dict[str, Any]  # what grades the answer

    @property
    def key(self) -> str:
        return f"{self.benchmark}/{self.id}"


class DataError(InputError):
    """A data file that is missing or not in its benchmark's published format."""


def files(path: str, field: str) -> list[pathlib.Path]:
    p = pathlib.Path(path).expanduser()
    if p.is_dir():
        found = sorted(f for f in p.iterdir() if f.suffix in _SUFFIXES)
        if not found:
            raise DataError(f"{field}={path!r}: no *.jsonl or *.parquet file in that directory")
        return found
    if not p.is_file():
        raise DataError(f"{field}={path!r}: no such file or directory (fetch the data with "
                        "`python launch/capabilities.py --fetch_data=DIR`, docs/capabilities.md)")
    return [p]


def read_rows(path: pathlib.Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        from rlver_jax.eval.capabilities import extra

        return extra.require("pyarrow.parquet", "pyarrow").read_table(path).to_pylist()
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise DataError(f"{path}:{n}: not JSON ({e})") from None
    return rows


def sha256(paths: list[pathlib.Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


def _need(row: dict[str, Any], keys: tuple[str, ...], where: str, benchmark: str) -> None:
    if missing := [k for k in keys if k not in row]:
        raise DataError(f"{where}: a {benchmark} row lacks {missing} (has {sorted(row)}); give the published "
                        "format (docs/capabilities.md)")


def math500(path: str, field: str = "config.data.math500") -> list[Item]:
    items = []
    for f in files(path, field):
        for n, row in enumerate(read_rows(f)):
            _need(row, ("problem", "answer"), f"{f} row {n}", "MATH500")
            items.append(Item("math500", str(row.get("unique_id") or f"{f.name}:{n}"), {"problem": row["problem"]},
                              {"answer": row["answer"], "subject": row.get("subject", ""),
                               "level": row.get("level", "")}))
    return items


def ifeval(path: str, field: str = "config.data.ifeval") -> list[Item]:
    items = []
    for f in files(path, field):
        for n, row in enumerate(read_rows(f)):
            _need(row, ("key", "prompt", "instruction_id_list", "kwargs"), f"{f} row {n}", "IFEval")
            doc = {k: row[k] for k in ("key", "prompt", "instruction_id_list", "kwargs")}
            items.append(Item("ifeval", str(row["key"]), {"prompt": row["prompt"]}, {"doc": doc}))
    return items


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refused: the private tests may hold only a string, not {module}.{name}")


def private_tests(field: str) -> list[dict[str, Any]]:
    """LiveCodeBench's private_test_cases: plain JSON, or base64(zlib(pickle(JSON string)))."""
    try:
        return json.loads(field)
    except ValueError:
        pass
    text = _NoGlobals(io.BytesIO(zlib.decompress(base64.b64decode(field.encode("utf-8"))))).load()
    if not isinstance(text, str):
        raise DataError(f"compressed private tests hold a {type(text).__name__}, not a JSON string")
    return json.loads(text)


def livecodebench(path: str, field: str = "config.data.livecodebench") -> list[Item]:
    items = []
    for f in files(path, field):
        for n, row in enumerate(read_rows(f)):
            where = f"{f} row {n}"
            _need(row, ("question_id", "question_content", "starter_code", "public_test_cases",
                        "private_test_cases", "metadata"), where, "LiveCodeBench")
            try:
                tests = json.loads(row["public_test_cases"]) + private_tests(row["private_test_cases"])
                metadata = json.loads(row["metadata"]) if isinstance(row["metadata"], str) else row["metadata"]
            except (ValueError, zlib.error, pickle.UnpicklingError) as e:
                raise DataError(f"{where}: unreadable test cases ({e})") from None
            # livecodebench.benchmarks.code_generation.CodeGenerationProblem.get_evaluation_sample
            input_output = json.dumps({"inputs": [t["input"] for t in tests],
                                       "outputs": [t["output"] for t in tests],
                                       "fn_name": metadata.get("func_name", None)})
            items.append(Item(
                "livecodebench", str(row["question_id"]),
                {"question_content": row["question_content"], "starter_code": row["starter_code"] or ""},
                {"input_output": input_output, "tests": len(tests), "difficulty": row.get("difficulty", ""),
                 "platform": row.get("platform", ""), "title": row.get("question_title", "")}))
    return items


READERS = {"math500": math500, "ifeval": ifeval, "livecodebench": livecodebench}
