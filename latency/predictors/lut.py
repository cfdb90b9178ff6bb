"""Layer-wise lookup table, with the table's entries fitted instead of measured.

OFA and FBNet predict a network's latency as the sum of its layers' latencies, read from a lookup
table measured layer by layer on the device. A user with ten whole-network measurements has no
per-layer measurements, so this predictor (:class:`LayerTablePredictor`) *fits* the table: each
layer's latency is a non-negative cost per layer kind times its MACs, input and output elements
and parameters (plus a count cost), fitted to the whole-network measurements by non-negative
least squares with a small ridge penalty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from hwnas.latency.predictors.base import LatencyPredictor
from hwnas.latency.predictors.features import features

__all__ = ["LayerTablePredictor"]


class LayerTablePredictor(LatencyPredictor):
    """Sum of per-layer costs; per-kind cost coefficients fitted by ridge-NNLS (see module).

    Each layer's latency is modelled as ::

        count_cost[kind] + macs_cost[kind] * MACs + in_cost[kind] * input elements
                         + out_cost[kind] * output elements + param_cost[kind] * parameters

    for each layer kind of :data:`hwnas.latency.predictors.features.LAYER_KINDS` (dense k×k conv,
    1×1 conv, grouped conv, depthwise conv, linear, pooling, add, ...), plus a constant per network.
    Summed over the layer list this is linear in the per-kind sums of
    :func:`~latency.predictors.features.layer_features`, and the costs are fitted to the
    whole-network measurements by non-negative least squares (a cost cannot be negative), with a
    small ridge penalty so that ten measurements of ~30 unknowns give a stable, sparse table.
    Columns are scaled by their mean over the measured architectures first, so the penalty treats
    them alike.
    """

    name = "lut"
    min_samples = 2

    def __init__(self, space: Any, *, ridge: float = 1e-3) -> None:
        super().__init__(space)
        self.ridge = float(ridge)
        self.columns_: np.ndarray | None = None
        self.scale_: np.ndarray | None = None
        self.coef_: np.ndarray | None = None
        self.intercept_: float = 0.0
        self.resid_std_: float | None = None

    def _adapt(self, keys: list[str], latency_ms: np.ndarray, seed: int) -> None:
        from scipy.optimize import nnls

        F = features(self.space, keys, "layers")
        cols = np.flatnonzero(np.abs(F).sum(0) > 0)
        scale = np.abs(F[:, cols]).mean(0)
        A = np.hstack([F[:, cols] / scale, np.ones((len(F), 1))])
        # ridge rows: sqrt(ridge * n) * I on the costs (not on the constant)
        k = A.shape[1]
        pen = np.sqrt(self.ridge * len(F)) * np.eye(k)[:-1]
        y_scale = float(np.mean(latency_ms))
        coef, _ = nnls(np.vstack([A, pen]), np.r_[latency_ms / y_scale, np.zeros(k - 1)],
                       maxiter=50 * k)
        self.columns_, self.scale_ = cols, scale
        self.coef_, self.intercept_ = coef[:-1] * y_scale, float(coef[-1] * y_scale)
        resid = latency_ms - A @ coef * y_scale
        dof = len(F) - int(np.count_nonzero(coef))
        self.resid_std_ = float(np.sqrt(np.sum(resid ** 2) / dof)) if dof > 0 else None

    def _predict(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        F = features(self.space, keys, "layers")[:, self.columns_] / self.scale_
        mean = F @ self.coef_ + self.intercept_
        mean = np.maximum(mean, 1e-6)
        std = None if self.resid_std_ is None else np.full(len(keys), self.resid_std_)
        return mean, std

    def table(self) -> dict[str, float]:
        """The fitted cost coefficients (``kind.quantity -> ms per unit``) that are non-zero."""
        from hwnas.latency.predictors.features import layer_feature_names

        names = layer_feature_names()
        out = {names[c]: float(v / s) for c, v, s in zip(self.columns_, self.coef_, self.scale_)
               if v > 0}
        out["network"] = self.intercept_
        return out

    def _state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"ridge": self.ridge}, {}

    @classmethod
    def _from_state(cls, space: Any, meta: dict[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> LayerTablePredictor:
        return cls(space, **meta)
