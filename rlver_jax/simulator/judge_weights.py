"""The calibrated judge's fitted numbers (judge_fit.py writes them, judge.py reads them): a ridge
model over the named features of judge_features.py, and one over the residual left by it, on
Chinese character n-grams. Shipped as data/judge_weights.json; plain JSON, read once."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

DEFAULT_WEIGHTS = pathlib.Path(__file__).parent / "data" / "judge_weights.json"
DIGITS = 6  # significant digits written: a refit on another machine's BLAS gives the same file


@dataclasses.dataclass(frozen=True)
class DenseModel:
    """change ~ intercept + sum_j weight_j * (clip(x_j, low_j, high_j) - mean_j) / scale_j"""

    names: tuple[str, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weight: tuple[float, ...]
    intercept: float

    def contributions(self, x: Mapping[str, float]) -> dict[str, float]:
        """Each feature's share of the change (the intercept not included)."""
        return {n: w * (min(max(x[n], lo), hi) - m) / s
                for n, lo, hi, m, s, w in zip(self.names, self.low, self.high, self.mean, self.scale, self.weight)}


@dataclasses.dataclass(frozen=True)
class NgramModel:
    """residual ~ intercept + sum over the reply's distinct n-grams g of weight[g] / sqrt(max(n,
    min_count)) (n: how many of the reply's n-grams have a weight; min_count keeps a short reply's
    few n-grams, rare in the fitted data, from counting as much as a long one's many)."""

    weight: Mapping[str, float]
    intercept: float
    min_count: int

    def contribution(self, grams: set[str]) -> float:
        found = [self.weight[g] for g in grams if g in self.weight]
        return self.intercept + sum(found) / max(len(found), self.min_count) ** 0.5


@dataclasses.dataclass(frozen=True)
class JudgeWeights:
    dense: DenseModel
    ngrams: NgramModel
    fitted_on: tuple[str, ...]  # the result files' stems

    def to_json(self) -> str:
        def rounded(value: Any) -> Any:
            if isinstance(value, float):
                return float(f"{value:.{DIGITS}g}")
            if isinstance(value, (list, tuple)):
                return [rounded(v) for v in value]
            if isinstance(value, dict):
                return {k: rounded(v) for k, v in sorted(value.items())}
            return value
        return json.dumps(rounded(dataclasses.asdict(self)), ensure_ascii=False, indent=0) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JudgeWeights:
        d = json.loads(text)
        dense = {k: tuple(v) if isinstance(v, list) else v for k, v in d["dense"].items()}
        return cls(DenseModel(**dense), NgramModel(**d["ngrams"]), tuple(d["fitted_on"]))


WEIGHTS_ENV = "RLVER_JUDGE_WEIGHTS"  # a refit to try (launch/fit_judge.py --out) instead of the shipped weights


@functools.lru_cache(maxsize=4)
def load(path: str | os.PathLike[str] | None = None) -> JudgeWeights:
    """The weights at `path`; by default $RLVER_JUDGE_WEIGHTS if set, else the shipped ones."""
    path = path or os.environ.get(WEIGHTS_ENV) or DEFAULT_WEIGHTS
    return JudgeWeights.from_json(pathlib.Path(path).read_text(encoding="utf-8"))
