"""The residual learners of the meta predictor (:class:`hwnas.latency.predictors.meta.MetaPredictor`,
``residual=``): Gaussian processes fitted to what the meta-prior leaves unexplained on a
device's own measurements, so that the prediction converges towards the device as
measurements accumulate. ``kernel``: a Hamming kernel over the architecture's choices;
``mixed``: that kernel plus op-pair and whole-network terms. Chosen, and switched off by
default, on leave-one-family-out folds (benchmarks/latency_lofo.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from hwnas.latency.predictors.features import encoding_positions, features

__all__ = ["BLEND_GRID", "BLEND_N0", "DEFAULT_RESIDUAL", "RESIDUALS", "RESIDUAL_FOLDS",
           "RESIDUAL_FOLDS_AGAINST", "RESIDUAL_MIN", "blend_weight", "HammingGP", "MixedGP", "cell_features", "evidence",
           "fit_blend", "own_trees", "residual_model"]

#: residual learners (``MetaPredictor(residual=)``): ``kernel``, a GP on the architectures'
#: encodings whose covariance falls with the number of positions that differ (every order of
#: interaction between positions); ``mixed``, a GP whose covariance adds to that kernel pairs of
#: positions and whole-network terms (op counts and their products, layer sums: compute and
#: memory traffic), each chosen by marginal likelihood; ``gbm``, gradient-boosted trees
#: (scikit-learn) on the encoding, per-layer-kind sums and FLOPs; ``blend``, not a residual but
#: the device's own model (trees on those features, fitted to log latency) blended in log space
#: with the prior, at a weight that grows with n (:func:`blend_weight`); ``off``, none
RESIDUALS = ("off", "kernel", "gbm", "mixed", "blend")
#: what a new predictor uses: none. Chosen on the family protocol (38 leave-one-family-out
#: folds of NB-201 and FBNet and the two new CPU runtime families, 20-100 measurements): every
#: residual learner lost to the prior alone on some family (up to 0.10 Spearman on a runtime
#: unlike the training families) and gained at most 0.001 on the mean (latency_lofo.md, "The
#: residual learner chosen on the families")
DEFAULT_RESIDUAL = "off"
#: the residual learner is fitted from this many measurements on (below, its own
#: cross-validation has too little to weigh it by, and the prior alone is better)
RESIDUAL_MIN = 20
#: folds of the residual learner's cross-validation, which sets its weight
RESIDUAL_FOLDS = 5
#: the residual learner gets no weight when more than this many folds lose by it (a gain that
#: only some folds see is a few measurements' noise; 1 halved the worst family's loss of both
#: kernels on the family protocol against no such check)
RESIDUAL_FOLDS_AGAINST = 1
#: ``blend``: the prior's weight on n measurements is shrunk by n / (n + BLEND_N0) towards the
#: prior alone (a Bayesian-style schedule: the device's own model earns weight as its
#: measurements grow); 100 was chosen on the 21 NB-201 families (50-200 within 0.0003 on the
#: means; latency_lofo.md, session 37)
BLEND_N0 = 100
#: ``blend``: the weights tried by the device's own cross-validation, and the grid the shrunk
#: weight is rounded to
BLEND_GRID = np.round(np.arange(0.0, 1.001, 0.05), 2)


def blend_weight(loo_log: np.ndarray, oof_log: np.ndarray, y_log: np.ndarray) -> float:
    """``blend``'s weight on the device's own model: the weight of ``BLEND_GRID`` whose blend of
    the prior's leave-one-out and the own model's out-of-fold log predictions ranks the
    measurements best (Spearman: ranking is what a search uses), shrunk by n / (n +
    BLEND_N0) and rounded to the grid. A log-error choice over-trusted the own model on the
    families (session 30); the shrinkage keeps the prior where 20-50 measurements say little."""
    from hwnas.core.maths import spearman

    rank = [spearman((1 - w) * loo_log + w * oof_log, y_log) for w in BLEND_GRID]
    n = len(y_log)
    w = float(BLEND_GRID[int(np.argmax(rank))]) * n / (n + BLEND_N0)
    return float(BLEND_GRID[int(np.argmin(np.abs(BLEND_GRID - w)))])


def evidence(K: np.ndarray, noise: float, rc: np.ndarray) -> tuple[float, np.ndarray]:
    """Log marginal likelihood (the scale profiled out) and dual weights of a GP with
    covariance ``K + noise I`` on the centred targets ``rc``."""
    n = len(rc)
    chol = np.linalg.cholesky(K + noise * np.eye(n))
    a = np.linalg.solve(chol.T, np.linalg.solve(chol, rc))
    ml = -0.5 * n * np.log(max(float(rc @ a) / n, 1e-30)) - float(np.log(np.diag(chol)).sum())
    return ml, a


class HammingGP:
    """GP regression on one-hot encodings with covariance ``exp(-d / ell)``, ``d`` the number
    of positions whose choice differs (a kernel over every order of interaction between
    positions), a free mean; the length ``ell`` (a share of the positions) and the noise
    chosen by marginal likelihood. Small and exact: the residual learner's default."""

    ELLS = (1 / 6, 1 / 3, 2 / 3)
    NOISES = (0.1, 0.3, 1.0, 3.0)

    def __init__(self, positions: Sequence[np.ndarray]) -> None:
        self.positions = len(positions)

    def _k(self, A: np.ndarray, B: np.ndarray, ell: float) -> np.ndarray:
        return np.exp(-(self.positions - A @ B.T) / (ell * self.positions))

    def fit(self, X: np.ndarray, r: np.ndarray) -> HammingGP:
        self.mean = float(r.mean())
        rc = r - self.mean
        best = None
        for ell in self.ELLS:
            K = self._k(X, X, ell)
            for noise in self.NOISES:
                ml, a = evidence(K, noise, rc)
                if best is None or ml > best[0]:
                    best = (ml, ell, a)
        _, self.ell, self.alpha = best
        self.X = X
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.mean + self._k(X, self.X, self.ell) @ self.alpha


def cell_features(space: Any, keys: list[str], l_cols: np.ndarray) -> np.ndarray:
    """Whole-network terms of the ``mixed`` residual learner: operation counts and their
    pairwise products (cell-level interactions: what an operation costs depends on how many
    others of each kind the network holds) and log per-layer-kind sums (layer counts, MACs,
    input and output activations, parameters: compute and memory traffic)."""
    from hwnas.latency.predictors.opcount import op_groups

    X = features(space, keys, "encode")
    groups = op_groups(space)
    C = X @ groups[0] if groups is not None else np.zeros((len(X), 0))
    i, j = np.triu_indices(C.shape[1])
    L = np.log1p(np.maximum(features(space, keys, "layers")[:, l_cols], 0))
    return np.hstack([C, C[:, i] * C[:, j], L])


class MixedGP(HammingGP):
    """GP regression whose covariance is a sum of up to three kernels on an architecture, each
    on or off and the length and noise chosen by marginal likelihood: the Hamming kernel of
    :class:`HammingGP` (every order of interaction), the pairs kernel (the share of pairs of
    positions whose two choices both agree: a linear kernel on the products of every two
    positions' one-hot choices, computed from the number of agreeing positions) and a linear
    kernel on standardized whole-network terms (:func:`cell_features`). ``X`` holds the
    encoding's ``dim`` columns, then those terms."""

    SUBSETS = ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1))

    def __init__(self, dim: int, positions: int) -> None:
        self.dim = dim
        self.positions = positions

    def _parts(self, A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        P = self.positions
        m = A[:, :self.dim] @ B[:, :self.dim].T  # agreeing positions
        pairs = m * (m - 1) / max(P * (P - 1), 1)
        ca = (A[:, self.dim:] - self.c_mean) / self.c_std
        cb = (B[:, self.dim:] - self.c_mean) / self.c_std
        return m, pairs, ca @ cb.T / max(ca.shape[1], 1)

    def _kernel(self, parts: tuple, ell: float, on: tuple[int, int, int]) -> np.ndarray:
        m, pairs, lin = parts
        K = on[1] * pairs + on[2] * lin
        if on[0]:
            K = K + np.exp(-(self.positions - m) / (ell * self.positions))
        return K

    def fit(self, X: np.ndarray, r: np.ndarray) -> MixedGP:
        self.mean = float(r.mean())
        rc = r - self.mean
        self.c_mean = X[:, self.dim:].mean(0)
        self.c_std = X[:, self.dim:].std(0) + 1e-9
        parts = self._parts(X, X)
        best = None
        for on in self.SUBSETS:
            for ell in self.ELLS if on[0] else (1.0,):
                K = self._kernel(parts, ell, on)
                for noise in self.NOISES:
                    ml, a = evidence(K, noise, rc)
                    if best is None or ml > best[0]:
                        best = (ml, ell, on, a)
        _, self.ell, self.on, self.alpha = best
        self.X = X
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.mean + self._kernel(self._parts(X, self.X), self.ell, self.on) @ self.alpha


def residual_model(kind: str, space: Any, X: np.ndarray, r: np.ndarray, seed: int) -> Any:
    """The residual learner ``kind`` (``kernel``, ``mixed`` or ``gbm``) fitted to the log misses
    ``r`` of the architectures' residual features ``X``."""
    if kind == "kernel":
        return HammingGP(encoding_positions(space)).fit(X, r)
    if kind == "mixed":
        return MixedGP(space.feature_dim, len(encoding_positions(space))).fit(X, r)
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        max_iter=100, learning_rate=0.1, max_leaf_nodes=8,
        min_samples_leaf=max(3, min(20, len(r) // 8)), random_state=seed).fit(X, r)


def own_trees(X: np.ndarray, ly: np.ndarray, seed: int) -> Any:
    """``blend``'s own model of the device: gradient-boosted trees on log latency ``ly``."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        max_iter=200, learning_rate=0.1, max_leaf_nodes=15,
        min_samples_leaf=max(2, min(20, len(ly) // 10)), random_state=seed).fit(X, ly)


def fit_blend(X: np.ndarray, ly: np.ndarray, r: np.ndarray, parts: list,
              seed: int) -> dict[str, Any]:
    """``blend``: the device's own trees on log latency, their weight in a log-space blend
    with the prior set by :func:`blend_weight` from the prior's leave-one-out (``ly - r``) and
    the trees' out-of-fold predictions of the measurements (folds ``parts``)."""
    oof = np.empty(len(ly))
    for part in parts:
        fit = np.setdiff1d(np.arange(len(ly)), part)
        oof[part] = own_trees(X[fit], ly[fit], seed).predict(X[part])
    weight = blend_weight(ly - r, oof, ly)
    model = own_trees(X, ly, seed) if weight > 0 else None
    return {"weight": weight, "model": model, "blend": True,
            "cv_gain": float(np.mean(r ** 2) - np.mean(
                ((1 - weight) * (ly - r) + weight * oof - ly) ** 2)),
            "rms": float(np.sqrt(np.mean(r ** 2)))}
