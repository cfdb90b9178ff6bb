"""An accuracy predictor trained on supernet evaluations, as a cheap accuracy objective.

Evaluating a candidate on the supernet (extract, recalibrate BN, quantize, score the validation
split) costs from a fraction of a second (digits) to minutes (CIFAR-10 on a CPU). With
``accuracy="predictor"`` a search first evaluates ``samples`` random candidates on the supernet,
fits this predictor on them — an ensemble of extremely randomized trees (scikit-learn) on the
space's architecture encoding plus the bit-width of every layer group — and reports its
Spearman rank correlation on a held-out quarter; then the study scores accuracy with the
predictor, and the models of the final fronts are re-scored on the real supernet (their
validation and test accuracy in ``pareto_<device>.csv`` are measured, not predicted).

The ensemble's spread across trees is the uncertainty (``predict_with_std``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hwnas.quant.policy import FLOAT_BITS, QuantPolicy
from hwnas.search.bits import layer_group
from hwnas.supernet.space import SearchSpace
from scipy.stats import spearmanr
from sklearn.ensemble import ExtraTreesRegressor

from hwnas.core.errors import UserError


def candidate_features(space: SearchSpace, arch: Any, policy: QuantPolicy | None,
                       groups: Sequence[str]) -> np.ndarray:
    """The architecture encoding followed by log2(weight bits)/5 per group (float = 1.0;
    a group the architecture lacks counts as float)."""
    bits = {g: FLOAT_BITS for g in groups}
    if policy is not None:
        for name, (w, _) in policy.bits.items():
            bits[layer_group(name)] = min(bits.get(layer_group(name), FLOAT_BITS), w)
    tail = np.array([np.log2(bits[g]) / 5.0 for g in groups], dtype=np.float32)
    return np.concatenate([np.asarray(space.encode(arch), dtype=np.float32), tail])


@dataclass
class PredictorReport:
    """How well the predictor ranks held-out candidates (fractions)."""

    n_train: int
    n_test: int
    spearman: float
    mae: float

    def as_dict(self) -> dict[str, float]:
        return {"n_train": self.n_train, "n_test": self.n_test, "spearman": self.spearman,
                "mae_points": self.mae}


class AccuracyPredictor:
    """Extra-trees ensemble from candidate features to accuracy (%); seeded."""

    def __init__(self, *, n_estimators: int = 200, seed: int = 0) -> None:
        self.model = ExtraTreesRegressor(n_estimators=n_estimators, min_samples_leaf=2,
                                         max_features=0.5, random_state=seed, n_jobs=1)
        self.fitted = False

    def fit(self, features: np.ndarray, accuracy: np.ndarray) -> AccuracyPredictor:
        x, y = np.asarray(features, dtype=np.float32), np.asarray(accuracy, dtype=np.float64)
        if len(x) < 4 or len(x) != len(y) or not np.isfinite(y).all():
            raise UserError(f"accuracy predictor: need >= 4 finite training accuracies, got {len(y)}")
        self.model.fit(x, y)
        self.fitted = True
        return self

    def predict_with_std(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.fitted:
            raise UserError("accuracy predictor used before it was fitted")
        x = np.asarray(features, dtype=np.float32)
        per_tree = np.stack([t.predict(x) for t in self.model.estimators_])
        return per_tree.mean(axis=0), per_tree.std(axis=0)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.predict_with_std(features)[0]


def fit_and_report(features: np.ndarray, accuracy: np.ndarray, *, holdout: float = 0.25,
                   seed: int = 0) -> tuple[AccuracyPredictor, PredictorReport]:
    """Fit on ``1 - holdout`` of the samples, report Spearman/MAE on the rest, then refit on
    all of them (the returned predictor uses every sample)."""
    n = len(accuracy)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    n_test = max(2, int(round(holdout * n)))
    test, train = order[:n_test], order[n_test:]
    probe = AccuracyPredictor(seed=seed).fit(features[train], accuracy[train])
    pred = probe.predict(features[test])
    rho = float(spearmanr(pred, accuracy[test]).statistic) if np.ptp(accuracy[test]) > 0 else float("nan")
    report = PredictorReport(len(train), len(test), rho,
                             float(np.mean(np.abs(pred - accuracy[test]))))
    return AccuracyPredictor(seed=seed).fit(features, accuracy), report


def sample_candidates(space: SearchSpace, groups: Sequence[str], choices: Sequence[int],
                      n: int, seed: int) -> list[tuple[Any, Mapping[str, int]]]:
    """``n`` random (architecture, group bits) pairs, seeded; bits empty when not searched."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        arch = space.sample(rng)
        bits = {g: int(rng.choice(list(choices))) for g in groups} if groups else {}
        out.append((arch, bits))
    return out
