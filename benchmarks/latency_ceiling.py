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
  :func:`sessions_ceiling_per_arch` counts each architecture's own sessions (a table whose
  later sessions re-measured only part of it averages fewer for the rest).
* richer models for ``most`` (:func:`rich_most_fit`, ``latency_ceiling_models.py``): a Gaussian
  process (a Hamming kernel on both execution variants' one-hot encodings plus a linear kernel on
  NB-201 cell-graph and layer terms) and gradient-boosted trees on the encoding, its pair
  products and those terms: is the 5-fold figure the table's or the three models'?
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

#: gradient-boosted trees of :func:`rich_most_fit` (slower and more regularised than ``trees``)
RICH_TREES = {"max_iter": 600, "learning_rate": 0.03, "max_leaf_nodes": 15,
              "min_samples_leaf": 5, "l2_regularization": 1.0}
#: :func:`gp_predict` fits its kernel's parameters on at most this many training rows
GP_OPTIMIZE_MAX = 400
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


def path_features(space, keys: list[str]) -> np.ndarray:
    """NAS-Bench-201 cell-graph terms (zero columns for other spaces): the number of live
    input-output paths and the longest one's edges, the most convolutions (and 3x3 ones) on a
    live path, and per inner node the number of live inputs, of convolution inputs, and of
    convolutions beyond the first among its parallel inputs (sum minus max)."""
    if space.name != "nb201":
        return np.zeros((len(keys), 0))
    from hwnas.supernet.spaces.nb201 import NB201_EDGES

    X = features(space, keys, "encode")
    names = space.feature_names
    col = {n: k for k, n in enumerate(names)}

    def ind(e, op):
        t, f = NB201_EDGES[e]
        return X[:, col[f"edge{t}<-{f}={op}"]]

    live = np.stack([1.0 - ind(e, "none") for e in range(6)], 1)
    c3 = np.stack([ind(e, "nor_conv_3x3") for e in range(6)], 1)
    conv = c3 + np.stack([ind(e, "nor_conv_1x1") for e in range(6)], 1)
    eidx = {edge: k for k, edge in enumerate(NB201_EDGES)}
    paths = [[(3, 0)], [(1, 0), (3, 1)], [(2, 0), (3, 2)], [(1, 0), (2, 1), (3, 2)]]
    out = []
    alive = np.stack([np.prod([live[:, eidx[e]] for e in p], 0) for p in paths], 1)
    out.append(alive.sum(1))
    out.append(np.max(alive * np.array([len(p) for p in paths]), 1))
    out.append(np.max(alive * np.stack([sum(conv[:, eidx[e]] for e in p) for p in paths], 1), 1))
    out.append(np.max(alive * np.stack([sum(c3[:, eidx[e]] for e in p) for p in paths], 1), 1))
    for node in (1, 2, 3):
        es = [eidx[e] for e in NB201_EDGES if e[0] == node]
        out.append(live[:, es].sum(1))
        out.append(conv[:, es].sum(1))
        out.append(conv[:, es].sum(1) - conv[:, es].max(1))
    return np.stack(out, 1)


def rich_features(space: Any, archs: list[str]) -> dict[str, np.ndarray]:
    """The richer models' features (rows = ``archs``): ``onehot``, both execution variants'
    encodings and the constant-output flag; ``terms``, the cell-graph terms of each variant
    (:func:`path_features`) and log per-layer-kind sums; ``pairs``, each variant's pair
    products of the encoding (positions of at most 8, else none)."""
    keys = arch_strings(space, archs)
    positions = encoding_positions(space)
    onehot, pairs, paths = [], [], []
    for v in execution_variants(space):
        ek, flag = executed(space, keys, v)
        E = features(space, ek, "encode")
        onehot.append(np.hstack([E, flag[:, None]]))
        if len(positions) <= 8:
            pairs.append(pair_products(E, positions))
        paths.append(path_features(space, ek))
    L = np.log1p(np.maximum(features(space, keys, "layers"), 0.0))
    L = L[:, L.std(0) > 0]
    return {"onehot": np.hstack(onehot), "terms": np.hstack(paths + [L]),
            "pairs": np.hstack(pairs) if pairs else np.zeros((len(keys), 0))}


def gp_predict(rich: dict[str, np.ndarray], t: np.ndarray, train: np.ndarray,
               test: np.ndarray, seed: int = 0) -> np.ndarray:
    """A Gaussian process on :func:`rich_features` fitted to ``t[train]``, predicted at
    ``test``: ``c1 exp(-|x - x'|^2 / 2 l^2)`` on the one-hot encodings (a squared distance of
    twice the positions that differ: every order of interaction, the Hamming kernel) plus a
    linear kernel on the standardized terms, white noise; scales, length and noise by marginal
    likelihood (scikit-learn; on a seeded subsample of :data:`GP_OPTIMIZE_MAX` rows of a larger
    ``train``, then the posterior on every row)."""
    import warnings

    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, DotProduct, WhiteKernel
    from sklearn.gaussian_process.kernels import ConstantKernel as C

    T = rich["terms"]
    mu, sd = T[train].mean(0), T[train].std(0) + 1e-9
    Z = np.hstack([rich["onehot"], (T - mu) / sd / np.sqrt(max(T.shape[1], 1))])
    kernel = C(1.0) * RBF(length_scale=3.0) + C(1.0) * DotProduct(sigma_0=1.0) + WhiteKernel(0.01)
    gp = GaussianProcessRegressor(kernel, normalize_y=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bounds reached by a scale: the fit is still usable
        if len(train) > GP_OPTIMIZE_MAX:  # the kernel from a subsample, then every row
            sub = np.random.default_rng(seed).permutation(train)[:GP_OPTIMIZE_MAX]
            kernel = gp.fit(Z[sub], t[sub]).kernel_
            gp = GaussianProcessRegressor(kernel, normalize_y=True, optimizer=None)
        gp.fit(Z[train], t[train])
    return gp.predict(Z[test])


def trees_predict(rich: dict[str, np.ndarray], t: np.ndarray, train: np.ndarray,
                  test: np.ndarray, seed: int = 0) -> np.ndarray:
    """Gradient-boosted trees (:data:`RICH_TREES`) on every column of :func:`rich_features`."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    X = np.hstack([rich["onehot"], rich["pairs"], rich["terms"]])
    model = HistGradientBoostingRegressor(random_state=seed, **RICH_TREES)
    return model.fit(X[train], t[train]).predict(X[test])


def rich_most_fit(space: Any, archs: list[str], y: np.ndarray, folds: int = 5, seed: int = 0,
                  models: tuple[str, ...] = ("gp", "trees+"),
                  with_base: bool = True) -> dict[str, np.ndarray]:
    """Out-of-fold log-latency predictions (``folds``-fold as :func:`most_fit`, the same
    folds) of the richer models: ``gp`` (:func:`gp_predict`), ``trees+`` (:func:`trees_predict`),
    and ``ens``, the mean of their standardized predictions with those of the ``pairwise`` and
    ``trees`` models of :func:`ceiling_features` where the space has them (``with_base``)."""
    rng = np.random.default_rng(seed)
    parts = np.array_split(rng.permutation(len(y)), folds)
    t = np.log(y)
    rich = rich_features(space, archs)
    base = ceiling_features(space, archs)
    fits = {"gp": lambda tr, te: gp_predict(rich, t, tr, te, seed),
            "trees+": lambda tr, te: trees_predict(rich, t, tr, te, seed)}
    for name in ("pairwise", "trees") if with_base else ():
        if name in base:
            fits[name] = (lambda X, name: lambda tr, te: _model(name, seed).fit(
                X[tr], t[tr]).predict(X[te]))(base[name], name)
    out = {}
    for name in [m for m in models if m in fits] + [m for m in ("pairwise", "trees")
                                                    if m in fits and m not in models]:
        pred = np.empty(len(y))
        for k, test in enumerate(parts):
            train = np.concatenate([q for j, q in enumerate(parts) if j != k])[:MAX_TRAIN_MOST]
            pred[test] = fits[name](train, test)
        out[name] = pred
    z = [(p - p.mean()) / (p.std() + 1e-12) for p in out.values()]
    out["ens"] = np.mean(z, 0)
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


def sessions_ceiling_per_arch(counts: np.ndarray, rho: float) -> float:
    """:func:`sessions_ceiling` for a column whose architectures average different numbers of
    sessions (``counts``, one per architecture; one session's reliability ``rho``): the
    correlation with the true latency when a cell of ``k`` sessions keeps ``1 / k`` of one
    session's noise, ``sqrt(1 / (1 + mean(1 / k) (1 - rho) / rho))``; equal to
    :func:`sessions_ceiling` when every architecture has the same count."""
    counts = np.asarray(counts, float)
    if rho <= 0:
        return 0.0
    return float(np.sqrt(1.0 / (1.0 + np.mean(1.0 / counts) * (1.0 - rho) / rho)))


def repeat_ceiling(y: np.ndarray, cv: np.ndarray, draws: int = 20, seed: int = 0) -> float:
    """Mean Spearman between ``y`` and ``y * exp(cv * z)`` (``z`` standard normal; cells
    without a finite cv get the column's median cv)."""
    cv = np.where(np.isfinite(cv) & (cv >= 0), cv, np.nan)
    cv = np.where(np.isnan(cv), np.nanmedian(cv) if np.isfinite(cv).any() else 0.0, cv)
    rng = np.random.default_rng(seed)
    return float(np.mean([_spearman(y, y * np.exp(cv * rng.standard_normal(len(y))))
                          for _ in range(draws)]))
