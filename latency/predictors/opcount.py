"""Operation counts: latency as a non-negative sum of per-operation costs plus a constant.

The simplest model that knows what a network is made of: count how often each candidate
operation (NB-201: ``none, skip_connect, nor_conv_1x1, nor_conv_3x3, avg_pool_3x3``; FBNet: its
9 blocks) appears, and fit one cost per operation and a constant to the measurements by
non-negative least squares (``scipy.optimize.nnls``; a cost cannot be negative). On NB-201 that is
6 parameters, position-blind, so 10 measurements determine it well; it is the baseline issue 23
holds the meta predictor against on runtimes that no meta-training device resembles. Counts come
from the space's one-hot encoding (feature names ``position=choice``), so any space whose
encoding is one-hot per position works.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from hwnas.latency.predictors.base import LatencyPredictor
from hwnas.latency.predictors.features import features

from hwnas.core.errors import UserError

__all__ = ["OpCountPredictor", "op_count_matrix", "op_groups"]


def op_groups(space: Any) -> tuple[np.ndarray, list[str]] | None:
    """The matrix that sums the one-hot encoding (feature names ``position=choice``) into
    counts per choice, and the choice names; ``None`` for a space without such an encoding."""
    names = list(space.feature_names)
    if not names or any("=" not in n for n in names):
        return None
    choices = list(dict.fromkeys(n.split("=", 1)[1] for n in names))
    group = np.zeros((len(names), len(choices)))
    for i, n in enumerate(names):
        group[i, choices.index(n.split("=", 1)[1])] = 1.0
    return group, choices


def op_count_matrix(space: Any, keys: list[str]) -> tuple[np.ndarray, list[str]]:
    """(count of each choice per architecture, the choice names)."""
    groups = op_groups(space)
    if groups is None:
        raise UserError(f"space {space.name!r} has no one-hot 'position=choice' encoding; "
                        f"operation counts need one")
    group, choices = groups
    return features(space, keys, "encode") @ group, choices


class OpCountPredictor(LatencyPredictor):
    """``latency = c + sum_op cost[op] * count[op]``, all coefficients >= 0, fitted by NNLS."""

    name = "opcount"
    min_samples = 2

    def __init__(self, space: Any) -> None:
        super().__init__(space)
        self.coef_: np.ndarray | None = None
        self.resid_std_: float | None = None

    def _design(self, keys: list[str]) -> np.ndarray:
        counts, _ = op_count_matrix(self.space, keys)
        return np.hstack([counts, np.ones((len(keys), 1))])

    def _adapt(self, keys: list[str], latency_ms: np.ndarray, seed: int) -> None:
        from scipy.optimize import nnls

        A = self._design(keys)
        scale = float(np.mean(latency_ms))
        coef, _ = nnls(A, latency_ms / scale, maxiter=50 * A.shape[1])
        self.coef_ = coef * scale
        resid = latency_ms - A @ self.coef_
        dof = len(keys) - int(np.sum(self.coef_ > 0))
        self.resid_std_ = float(np.sqrt(np.sum(resid ** 2) / dof)) if dof > 0 else None

    def _predict(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        mean = self._design(keys) @ self.coef_
        std = None if self.resid_std_ is None else np.full(len(keys), self.resid_std_)
        return mean, std

    def _state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {}, {}

    @classmethod
    def _from_state(cls, space: Any, meta: dict[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> OpCountPredictor:
        return cls(space)
