"""FLOPs proxy: latency as a power law of FLOPs, fitted to the measurements.

``log(latency) = a + b * log(FLOPs)`` by least squares on the measured architectures. The slope is
kept positive (at least ``min_slope``), so the predicted ranking is always the FLOPs ranking: the
measurements only set the scale. This is the baseline every hardware-aware NAS paper compares to
(HELP reports a mean Spearman of 0.787 for it on NAS-Bench-201).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from hwnas.latency.predictors.base import LatencyPredictor
from hwnas.latency.predictors.features import features

__all__ = ["FlopsPredictor"]


class FlopsPredictor(LatencyPredictor):
    """``latency = exp(a) * FLOPs**b`` (``b >= min_slope``); std from the log-space residuals."""

    name = "flops"
    min_samples = 2

    def __init__(self, space: Any, *, min_slope: float = 1e-3) -> None:
        super().__init__(space)
        self.min_slope = float(min_slope)
        self.coef_: tuple[float, float] | None = None
        self.resid_std_: float | None = None

    def _log_flops(self, keys: list[str]) -> np.ndarray:
        return np.log(np.maximum(features(self.space, keys, "flops")[:, 0], 1.0))

    def _adapt(self, keys: list[str], latency_ms: np.ndarray, seed: int) -> None:
        x, y = self._log_flops(keys), np.log(latency_ms)
        if np.ptp(x) > 0:
            b = float(np.cov(x, y, bias=True)[0, 1] / np.var(x))
        else:  # every measured architecture has the same FLOPs: assume proportionality
            b = 1.0
        b = max(b, self.min_slope)
        a = float(np.mean(y - b * x))
        self.coef_ = (a, b)
        n = len(y)
        self.resid_std_ = float(np.sqrt(np.sum((y - a - b * x) ** 2) / (n - 2))) if n > 2 else None

    def _predict(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        a, b = self.coef_
        mean = np.exp(a + b * self._log_flops(keys))
        if self.resid_std_ is None:
            return mean, None
        return mean, mean * np.sqrt(np.expm1(self.resid_std_ ** 2))

    def _state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"min_slope": self.min_slope}, {}

    @classmethod
    def _from_state(cls, space: Any, meta: dict[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> FlopsPredictor:
        return cls(space, **meta)
