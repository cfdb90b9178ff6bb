"""A small MLP trained from scratch on the few measurements (no meta-training).

The input is the space's encoding (:meth:`SearchSpace.encode`), the target the standardized log
latency. An ensemble of ``members`` networks (scikit-learn ``MLPRegressor``, L-BFGS, L2 penalty
``alpha``), each from its own seed, gives the mean and, from their spread, a standard deviation.
With ten samples this is the "no prior knowledge" baseline: it shows how much the meta-learned
predictor owes to the other devices' tables. scikit-learn is imported only to fit; prediction is
plain numpy on the saved weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from hwnas.latency.predictors.base import LatencyPredictor
from hwnas.latency.predictors.features import features

__all__ = ["MLPPredictor"]


class MLPPredictor(LatencyPredictor):
    """Ensemble of one-hidden-layer ReLU MLPs on the encoding, fitted to log latency."""

    name = "mlp"
    min_samples = 3

    def __init__(self, space: Any, *, hidden: int = 16, alpha: float = 1e-2, members: int = 5,
                 max_iter: int = 200) -> None:
        super().__init__(space)
        self.hidden, self.alpha = int(hidden), float(alpha)
        self.members, self.max_iter = int(members), int(max_iter)
        self.weights_: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.y_mean_, self.y_std_ = 0.0, 1.0

    def _adapt(self, keys: list[str], latency_ms: np.ndarray, seed: int) -> None:
        import warnings

        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPRegressor
        from threadpoolctl import threadpool_limits

        X = features(self.space, keys, "encode")
        y = np.log(latency_ms)
        self.y_mean_ = float(y.mean())
        self.y_std_ = float(y.std()) or 1.0
        z = (y - self.y_mean_) / self.y_std_
        self.weights_ = []
        for m in range(self.members):
            net = MLPRegressor(hidden_layer_sizes=(self.hidden,), activation="relu",
                               solver="lbfgs", alpha=self.alpha, max_iter=self.max_iter,
                               random_state=seed * 1000 + m)
            # a few samples: one BLAS thread is several times faster than many
            with warnings.catch_warnings(), threadpool_limits(1):
                warnings.simplefilter("ignore", ConvergenceWarning)
                net.fit(X, z)
            (w1, w2), (b1, b2) = net.coefs_, net.intercepts_
            self.weights_.append((w1, b1, w2[:, 0], b2))

    def _forward(self, X: np.ndarray) -> np.ndarray:
        return np.stack([np.maximum(X @ w1 + b1, 0.0) @ w2 + b2[0]
                         for w1, b1, w2, b2 in self.weights_])

    def _predict(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        logs = self._forward(features(self.space, keys, "encode")) * self.y_std_ + self.y_mean_
        lat = np.exp(logs)
        return lat.mean(0), (lat.std(0) if len(lat) > 1 else None)

    def _state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"hidden": self.hidden, "alpha": self.alpha, "members": self.members,
                "max_iter": self.max_iter}, {}

    @classmethod
    def _from_state(cls, space: Any, meta: dict[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> MLPPredictor:
        return cls(space, **meta)

    def _adapted_arrays(self) -> dict[str, np.ndarray]:
        out = {"y": np.array([self.y_mean_, self.y_std_])}
        for m, (w1, b1, w2, b2) in enumerate(self.weights_):
            out.update({f"w1_{m}": w1, f"b1_{m}": b1, f"w2_{m}": w2, f"b2_{m}": b2})
        return out

    def _restore_adapted(self, keys: list[str], latency_ms: np.ndarray, seed: int,
                         arrays: Mapping[str, np.ndarray]) -> None:
        self.y_mean_, self.y_std_ = (float(v) for v in arrays["y"])
        self.weights_ = [(arrays[f"w1_{m}"], arrays[f"b1_{m}"], arrays[f"w2_{m}"],
                          arrays[f"b2_{m}"]) for m in range(self.members)]
