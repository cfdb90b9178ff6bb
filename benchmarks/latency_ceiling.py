"""Noise ceilings of latency tables: how well could any predictor rank a device's table?

A table's measurements carry noise, so even a predictor that knew the true latencies could not
rank the measured column perfectly. Two estimates per device column:

* ``fit`` (split-half): models fitted on one half of the table's architectures and scored
  (Spearman) on the other half, two folds, the best of an additive model (ridge on the
  encoding of each execution variant), a non-additive one (ridge on the encoding, products of
  the encodings of every pair of positions and the per-layer-kind sums; spaces of at most 8
  positions, e.g. NB-201's 6 edges) and gradient-boosted trees (encoding and layer sums).
  With hundreds to thousands of training architectures the model error is small, so this is
  close to the noise ceiling, and never above what a predictor can reach (a model did reach it):
  where it is >= 0.95 the data leave room and the predictor is the limit.
* ``cv`` (within-run repeats): the expected Spearman between the column and the column with its
  own repeat noise added again (each cell times ``exp(cv * z)``, ``cv`` the coefficient of
  variation of the cell's repeated timings, from the ``*_cv.csv.gz`` tables). To first order
  that is the correlation between the true and the measured latency if the repeats' noise were
  the only noise; noise between sessions is larger, so this is an upper bound. HELP's tables
  carry no repeats.
* ``most`` (5-fold, the many-measurement model): the same three models fitted on four fifths of
  the table (at most ``MAX_TRAIN_MOST`` architectures per fold, a seeded subsample of more) and
  scored on the whole table from their out-of-fold predictions: what a model with hundreds
  (measured tables: 365-1,600) to thousands (HELP's: 3,000) of measurements of the device
  reaches, a tighter lower bound than ``fit`` on the small tables.
* ``sessions`` (measured tables of several sessions): ``sqrt`` of the Spearman-Brown
  reliability of the averaged column (:func:`hwnas.latency.devices.reliability`, from the
  median Spearman between two sessions): the expected Spearman between the column and the
  latency it would converge to over many sessions, i.e. what a predictor that knew the device's
  true latencies would score against the column. Noise shared by every session (the same
  machine, build and library versions) is not in it, so it is an upper bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hwnas.latency.predictors.features import (
    arch_strings,
    encoding_positions,
    executed,
    execution_variants,
    features,
    pair_products,
)

#: training / scoring architectures per fold at most (a seeded subsample of larger halves)
MAX_TRAIN = 2000
MAX_SCORE = 5000
#: training architectures per fold of the ``most`` estimate at most
MAX_TRAIN_MOST = 3000


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    return float(spearmanr(a, b)[0])


def ceiling_features(space: Any, archs: list[str]) -> dict[str, np.ndarray]:
    """The three feature sets of the ``fit`` estimate (rows = ``archs``)."""
    keys = arch_strings(space, archs)
    enc = []
    for v in execution_variants(space):
        ek, flag = executed(space, keys, v)
        enc.append(np.hstack([features(space, ek, "encode"), flag[:, None]]))
    E = features(space, keys, "encode")
    L = np.log1p(features(space, keys, "layers"))
    L = L[:, L.std(0) > 0]
    out = {"additive": np.hstack(enc), "trees": np.hstack(enc + [L])}
    positions = encoding_positions(space)
    if len(positions) <= 8:  # FBNet's 22 layers would give thousands of pair columns
        out["pairwise"] = np.hstack(enc + [pair_products(E, positions, False), L])
    return out


def split_half(feats: dict[str, np.ndarray], y: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Two-fold split-half Spearman of each model (log latency target) and their best."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import RidgeCV

    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    halves = (perm[: len(y) // 2], perm[len(y) // 2:])
    t = np.log(y)
    out: dict[str, list[float]] = {k: [] for k in feats}
    for a, b in (halves, halves[::-1]):
        tr, te = a[:MAX_TRAIN], b[:MAX_SCORE]
        for name, X in feats.items():
            if name == "trees":
                model = HistGradientBoostingRegressor(max_iter=200, learning_rate=0.08,
                                                      random_state=seed)
            else:
                mu, sd = X[tr].mean(0), X[tr].std(0) + 1e-12
                X = (X - mu) / sd
                model = RidgeCV(alphas=np.logspace(-3, 4, 15))
            model.fit(X[tr], t[tr])
            out[name].append(_spearman(model.predict(X[te]), y[te]))
    res = {k: float(np.mean(v)) for k, v in out.items()}
    res["best"] = max(res.values())
    return res


def _model(name: str, seed: int) -> Any:
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if name == "trees":
        return HistGradientBoostingRegressor(max_iter=200, learning_rate=0.08, random_state=seed)
    return make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-3, 4, 15)))


def most_fit(feats: dict[str, np.ndarray], y: np.ndarray, folds: int = 5,
             seed: int = 0) -> dict[str, float]:
    """Spearman of each model's out-of-fold predictions (``folds``-fold, log latency target,
    at most :data:`MAX_TRAIN_MOST` training architectures per fold) over the whole table, and
    their best."""
    rng = np.random.default_rng(seed)
    parts = np.array_split(rng.permutation(len(y)), folds)
    t = np.log(y)
    out = {}
    for name, X in feats.items():
        pred = np.empty(len(y))
        for k, test in enumerate(parts):
            train = np.concatenate([q for j, q in enumerate(parts) if j != k])[:MAX_TRAIN_MOST]
            pred[test] = _model(name, seed).fit(X[train], t[train]).predict(X[test])
        out[name] = _spearman(pred, y)
    out["best"] = max(out.values())
    return out


def sessions_ceiling(sessions: int, rho: float) -> float:
    """``sqrt`` of the Spearman-Brown reliability of ``sessions`` averaged sessions whose pairs
    correlate at ``rho``: the Spearman a predictor of the true latency would reach."""
    from hwnas.latency.devices import reliability

    return float(np.sqrt(reliability(sessions, rho)))


def repeat_ceiling(y: np.ndarray, cv: np.ndarray, draws: int = 20, seed: int = 0) -> float:
    """Mean Spearman between ``y`` and ``y * exp(cv * z)`` (``z`` standard normal; cells
    without a finite cv get the column's median cv)."""
    cv = np.where(np.isfinite(cv) & (cv >= 0), cv, np.nan)
    cv = np.where(np.isnan(cv), np.nanmedian(cv) if np.isfinite(cv).any() else 0.0, cv)
    rng = np.random.default_rng(seed)
    return float(np.mean([_spearman(y, y * np.exp(cv * rng.standard_normal(len(y))))
                          for _ in range(draws)]))
