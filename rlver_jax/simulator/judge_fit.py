"""Fitting the calibrated judge (judge.py) on SAGE's released results, and its leave-one-model-out
agreement: launch/fit_judge.py.

Two ridge regressions of the recorded change (sage_results.py) on the replies: first on the named
features of judge_features.py (each clipped to CLIP_PERCENTILES of its values in SAGE's replies
and standardised by them; the model every language gets), then on what that one
leaves, over the Chinese character n-grams of the reply (the NGRAM_VOCAB in most fitted replies,
present or not, scaled to unit length with at least NgramModel.min_count of them), in its dual
form, on SAGE's replies alone.

Faults are one-sided: a feature of the reply's text (not its length or layout, the user or the
mood) that a first fit weighs negatively is clipped from below at its mean in SAGE's replies
before the second, so a reply with fewer faults than the average is paid nothing for it; what
SAGE's tested models hardly varied beyond their average (AT_MOST_AVERAGE: exclamation marks,
copying a little of the user's line) is clipped from above at its mean, so more of it pays nothing.

Adversarial turns (`adversarial`): replies of templates and probes that a search found the judge
overpaid (eval/attack.py), each fitted as the lowest change SAGE's simulator recorded, with the
mood neutralised (no emotion trajectory before them: what they are, not how the dialogue went), all
of them together weighing `adversarial_share` of SAGE's replies. They refit only the features of the
reply's text: what they share with honest replies in this setting and not with SAGE's (length, the
user, the turn, how many of the profile's keys it names: KEPT) keeps SAGE's weights, and the
intercept, clipping and standardisation stay SAGE's. Deterministic: the same files give the same weights, to
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
from rlver_jax.text import degeneration

DENSE_PENALTY = 10.0  # ridge penalty of the named features' model (standardised features)
NGRAM_PENALTY = 3.0  # ridge penalty of the n-gram model (unit-length rows)
NGRAM_VOCAB = 20000
CLIP_PERCENTILES = (1.0, 99.5)
NGRAM_MIN_PERCENTILE = 2.0  # NgramModel.min_count: this percentile of the fitted replies' n-gram counts
# Features that are not faults of the reply's text: its length and layout, the user, the mood, the turn.
TWO_SIDED = ("log_words", "words_per_sentence", "paragraphs", "turn", "mood", "previous_change", "negative_user",
             "passive_user", "goal_")
# Features the adversarial turns do not refit: the two-sided ones, and counts of the profile's keys,
# whose scale is the profile's (SAGE's long Chinese scenes, this project's short English ones), so
# a template and an honest reply to a short profile are alike in them.
KEPT = TWO_SIDED + ("background_keys", "situation", "theme_fit", "off_target_keys", "topic_share", "off_topic")
# What SAGE's tested models hardly varied beyond their average (exclamation marks, copying a little of
# the user's line): clipped from above at its mean in SAGE's replies, so more of it pays nothing.
AT_MOST_AVERAGE = ("exclamations", "copied_from_user")


@dataclasses.dataclass(frozen=True)
class Rows:
    """The fitting data: per judged reply its file, features, n-grams and recorded change."""

    files: tuple[str, ...]
    names: tuple[str, ...]
    x: np.ndarray  # (replies, features)
    grams: tuple[frozenset[str], ...]
    y: np.ndarray  # recorded changes
    adversarial: np.ndarray | None = None  # (replies,) bool: an adversarial turn, not one of SAGE's

    @property
    def sage(self) -> np.ndarray:
        return np.ones(len(self.y), bool) if self.adversarial is None else ~self.adversarial

    def subset(self, keep: np.ndarray) -> Rows:
        idx = np.flatnonzero(keep)
        return Rows(tuple(self.files[i] for i in idx), self.names, self.x[idx],
                    tuple(self.grams[i] for i in idx), self.y[idx], ~self.sage[idx])

    def joined(self, other: Rows) -> Rows:
        """These rows, then `other`'s marked adversarial."""
        return Rows(self.files + other.files, self.names, np.concatenate([self.x, other.x]), self.grams + other.grams,
                    np.concatenate([self.y, other.y]), np.concatenate([~self.sage, np.ones(len(other.y), bool)]))


def adversarial_rows(results: Mapping[str, Sequence[JudgedReply]], profiles: Mapping[str, Profile],
                     lowest: int) -> Rows:
    """Adversarial turns as fitting rows: each reply's change the `lowest`, its mood neutralised;
    the replies the judge gives an outright verdict (degenerate ones) left out."""
    neutral = {name: [dataclasses.replace(r, emotions=r.emotions[:1], change=lowest) for r in replies
                      if not set(degeneration.reasons(r.reply, profiles[r.dialogue].language)) & set(judge.OUTRIGHT)]
               for name, replies in results.items()}
    return rows(neutral, profiles)


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


def _ridge(data: Rows, low: np.ndarray, high: np.ndarray, frozen: DenseModel | None = None,
           adversarial_share: float = 0.0) -> DenseModel:
    """The named features' ridge model, clipped at `low`..`high` and standardised by SAGE's rows;
    the adversarial rows weigh `adversarial_share` of those together. `frozen`: a model whose
    weights of the KEPT features are kept, the others fitted."""
    sage = data.sage
    x = np.clip(data.x, low, high)
    mean, scale = x[sage].mean(0), x[sage].std(0)
    scale = np.where(scale > 0, scale, 1.0)
    z = (x - mean) / scale
    intercept = float(data.y[sage].mean())
    adversarial = (~sage).sum()
    w = np.where(sage, 1.0, adversarial_share * sage.sum() / adversarial if adversarial else 0.0)
    kept = np.array([frozen is not None and n.startswith(KEPT) for n in data.names])
    weight = np.array(frozen.weight) * kept if frozen is not None else np.zeros(len(data.names))
    free = ~kept
    zf = z[:, free]
    weight[free] = np.linalg.solve((zf * w[:, None]).T @ zf + DENSE_PENALTY * np.eye(zf.shape[1]),
                                   (zf * w[:, None]).T @ (data.y - intercept - z[:, kept] @ weight[kept]))
    as_tuple = lambda a: tuple(float(v) for v in a)  # noqa: E731
    return DenseModel(data.names, as_tuple(low), as_tuple(high), as_tuple(mean), as_tuple(scale), as_tuple(weight),
                      intercept)


def _dense(data: Rows, adversarial_share: float) -> DenseModel:
    """The ridge model with faults one-sided, fitted on SAGE's rows; with adversarial rows, the
    features of the reply's text fitted again on both, the others (KEPT) as SAGE's rows alone fit
    them (see the module docstring)."""
    sage = data.subset(data.sage)
    low, high = np.percentile(sage.x, CLIP_PERCENTILES, axis=0)
    first = _ridge(sage, low, high)
    faults = np.array([w < 0 and not n.startswith(TWO_SIDED) for n, w in zip(data.names, first.weight)])
    low = np.where(faults, np.maximum(low, first.mean), low)
    high = np.where([n in AT_MOST_AVERAGE for n in data.names], np.minimum(high, first.mean), high)
    model = _ridge(sage, low, high)
    return model if data.sage.all() else _ridge(data, low, high, frozen=model, adversarial_share=adversarial_share)


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


def fit(data: Rows, adversarial_share: float = 0.0) -> JudgeWeights:
    """Both models fitted on every row of `data` (the n-gram model on SAGE's rows; its adversarial
    rows, if any, weighing `adversarial_share` of SAGE's together)."""
    dense = _dense(data, adversarial_share)
    sage = data.subset(data.sage)
    ngrams = _ngram(sage, sage.y - dense_predictions(dense, sage.x))
    return JudgeWeights(dense, ngrams, tuple(sorted(set(sage.files))))


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
                        data: Rows, rules: EmotionRules, adversarial_share: float = 0.0) -> dict[str, dict]:
    """agreement.summary of the judge fitted on all files but one (and every adversarial row),
    judging that one, for every file of `results`: {"judge": the whole judge, "named features
    only": without the n-gram model}."""
    changes: dict[str, dict] = {"judge": {}, "named features only": {}}
    files = np.array(data.files)
    for name, replies in results.items():
        weights = fit(data.subset((files != name) | ~data.sage), adversarial_share)
        recorded = [r.change for r in replies]
        changes["judge"][name] = (recorded, applied_changes(replies, profiles, weights, rules))
        changes["named features only"][name] = (recorded, applied_changes(replies, profiles, without_ngrams(weights),
                                                                           rules))
    return {variant: agreement.summary(per_file) for variant, per_file in changes.items()}
