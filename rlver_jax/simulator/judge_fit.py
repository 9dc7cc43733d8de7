"""Fitting the calibrated judge (judge.py) on SAGE's released results, and its leave-one-model-out
agreement: launch/fit_judge.py.

Two ridge regressions of the recorded change (sage_results.py) on the replies: first on the named
features of judge_features.py (each clipped to CLIP_PERCENTILES of its values and standardised;
the model every language gets), then on what that one leaves, over the Chinese character n-grams
of the reply (the NGRAM_VOCAB in most fitted replies, present or not, scaled to unit length with
at least NgramModel.min_count of them), in its dual form. Deterministic: the same files give the same weights, to
judge_weights.DIGITS digits.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from rlver_jax.simulator import agreement, judge, judge_features
from rlver_jax.simulator.judge_weights import DenseModel, JudgeWeights, NgramModel
from rlver_jax.simulator.profiles import Profile
from rlver_jax.simulator.sage_results import JudgedReply
from rlver_jax.simulator.state import EmotionRules

DENSE_PENALTY = 10.0  # ridge penalty of the named features' model (standardised features)
NGRAM_PENALTY = 3.0  # ridge penalty of the n-gram model (unit-length rows)
NGRAM_VOCAB = 20000
CLIP_PERCENTILES = (1.0, 99.5)
NGRAM_MIN_PERCENTILE = 2.0  # NgramModel.min_count: this percentile of the fitted replies' n-gram counts


@dataclasses.dataclass(frozen=True)
class Rows:
    """The fitting data: per judged reply its file, features, n-grams and recorded change."""

    files: tuple[str, ...]
    names: tuple[str, ...]
    x: np.ndarray  # (replies, features)
    grams: tuple[frozenset[str], ...]
    y: np.ndarray  # recorded changes

    def subset(self, keep: np.ndarray) -> Rows:
        idx = np.flatnonzero(keep)
        return Rows(tuple(self.files[i] for i in idx), self.names, self.x[idx],
                    tuple(self.grams[i] for i in idx), self.y[idx])


def rows(results: Mapping[str, Sequence[JudgedReply]], profiles: Mapping[str, Profile]) -> Rows:
    """The features of every judged reply of `results` (file stem -> its replies)."""
    files, feats, grams, y = [], [], [], []
    for name, replies in results.items():
        for r in replies:
            profile = profiles[r.dialogue]
            feats.append(judge_features.features(r.reply, history=r.history, profile=profile,
                                                 language=profile.language, emotions=r.emotions))
            grams.append(frozenset(judge_features.ngrams(judge_features.normalise(r.reply))))
            files.append(name)
            y.append(r.change)
    names = tuple(feats[0])
    return Rows(tuple(files), names, np.array([[f[n] for n in names] for f in feats], float), tuple(grams),
                np.array(y, float))


def _dense(data: Rows) -> DenseModel:
    low, high = np.percentile(data.x, CLIP_PERCENTILES, axis=0)
    x = np.clip(data.x, low, high)
    mean, scale = x.mean(0), x.std(0)
    scale = np.where(scale > 0, scale, 1.0)
    z = (x - mean) / scale
    weight = np.linalg.solve(z.T @ z + DENSE_PENALTY * np.eye(z.shape[1]), z.T @ (data.y - data.y.mean()))
    as_tuple = lambda a: tuple(float(v) for v in a)  # noqa: E731
    return DenseModel(data.names, as_tuple(low), as_tuple(high), as_tuple(mean), as_tuple(scale), as_tuple(weight),
                      float(data.y.mean()))


def dense_predictions(model: DenseModel, x: np.ndarray) -> np.ndarray:
    low, high, mean, scale, weight = (np.array(v) for v in (model.low, model.high, model.mean, model.scale,
                                                              model.weight))
    return model.intercept + ((np.clip(x, low, high) - mean) / scale) @ weight


def _vocabulary(grams: Sequence[frozenset[str]]) -> list[str]:
    """The NGRAM_VOCAB n-grams in most replies (ties by the n-gram itself: deterministic)."""
    counts = collections.Counter(g for doc in grams for g in doc)
    return sorted(counts, key=lambda g: (-counts[g], g))[:NGRAM_VOCAB]


def _unit_rows(grams: Sequence[frozenset[str]], index: Mapping[str, int], min_count: int):
    """Rows of present vocabulary n-grams, each 1 / sqrt(max(n, min_count)) (a scipy sparse matrix)."""
    from scipy import sparse  # jax's own dependency; only fitting needs it

    rows_, cols, vals = [], [], []
    for i, doc in enumerate(grams):
        found = sorted(index[g] for g in doc if g in index)
        rows_ += [i] * len(found)
        cols += found
        vals += [1.0 / max(len(found), min_count) ** 0.5] * len(found)
    return sparse.csr_matrix((vals, (rows_, cols)), shape=(len(grams), len(index)))


def _ngram(data: Rows, residual: np.ndarray) -> NgramModel:
    vocabulary = _vocabulary(data.grams)
    index = {g: j for j, g in enumerate(vocabulary)}
    min_count = max(int(np.percentile([sum(g in index for g in doc) for doc in data.grams], NGRAM_MIN_PERCENTILE)), 1)
    m = _unit_rows(data.grams, index, min_count)
    kernel = (m @ m.T).toarray() + 1.0  # + 1: the intercept, penalised like the weights
    shift = float(residual.mean())
    dual = np.linalg.solve(kernel + NGRAM_PENALTY * np.eye(len(residual)), residual - shift)
    weight = m.T @ dual
    return NgramModel({g: float(w) for g, w in zip(vocabulary, weight)}, shift + float(dual.sum()), min_count)


def ngram_predictions(model: NgramModel, grams: Sequence[frozenset[str]]) -> np.ndarray:
    return np.array([model.contribution(set(g)) for g in grams])


def fit(data: Rows) -> JudgeWeights:
    """Both models fitted on every row of `data`."""
    dense = _dense(data)
    ngrams = _ngram(data, data.y - dense_predictions(dense, data.x))
    return JudgeWeights(dense, ngrams, tuple(sorted(set(data.files))))


def without_ngrams(weights: JudgeWeights) -> JudgeWeights:
    """The judge an English reply gets: the named features' model alone."""
    return dataclasses.replace(weights, ngrams=NgramModel({}, 0.0, 1))


def applied_changes(replies: Sequence[JudgedReply], profiles: Mapping[str, Profile], weights: JudgeWeights,
                    rules: EmotionRules) -> list[int]:
    """The judge's change of each reply as the emotion machine applies it (clipped, capped)."""
    out = []
    for r in replies:
        profile = profiles[r.dialogue]
        score = judge.score_reply(r.reply, profile=profile, language=profile.language, difficulty="vanilla",
                                  history=r.history, emotions=r.emotions, weights=weights)
        out.append(min(r.emotions[-1] + rules.clip(score.change), rules.ceiling) - r.emotions[-1])
    return out


def leave_one_model_out(results: Mapping[str, Sequence[JudgedReply]], profiles: Mapping[str, Profile],
                        data: Rows, rules: EmotionRules) -> dict[str, dict]:
    """agreement.summary of the judge fitted on all files but one, judging that one, for every
    file: {"judge": the whole judge, "named features only": without the n-gram model}."""
    changes: dict[str, dict] = {"judge": {}, "named features only": {}}
    files = np.array(data.files)
    for name, replies in results.items():
        weights = fit(data.subset(files != name))
        recorded = [r.change for r in replies]
        changes["judge"][name] = (recorded, applied_changes(replies, profiles, weights, rules))
        changes["named features only"][name] = (recorded, applied_changes(replies, profiles, without_ngrams(weights),
                                                                           rules))
    return {variant: agreement.summary(per_file) for variant, per_file in changes.items()}
