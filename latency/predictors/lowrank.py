"""A low-rank prior over per-operation costs, learned from other devices; Bayesian regression.

Each meta-training device's latency is fitted (ridge) as a constant plus a cost per encoding
feature (NB-201: per edge and operation; FBNet: per layer and block), in units of the device's
mean latency. Those cost vectors, one per device, give a Gaussian prior for a new device's cost
vector: their mean, their top principal directions (a low-rank covariance, the ways devices
differ from each other) and a small isotropic remainder (a device unlike any seen). Adapting to
a new device is Bayesian linear regression of its measurements under that prior
(:class:`LowRankPredictor`): exact, no gradient steps, milliseconds for ten measurements.

Devices can be grouped (``meta_fit(..., groups=)``): each group weighs the same in the prior,
so fifteen GPU columns do not outvote one phone.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from hwnas.latency.predictors.features import (
    encoding_positions,
    executed,
    execution_prior,
    execution_variants,
    features,
    pair_products,
)
from hwnas.latency.predictors.designed import DesignedPredictor, greedy_design, ridge_fit

from hwnas.core.errors import UserError

__all__ = ["LowRankPredictor"]

TARGETS = ("linear", "log")
PAIRS = ("none", "all", "adjacent")
OBJECTIVES = ("ls", "rank")
_BLOCKS = ("m", "p", "i", "l", "c")


def _positive_grid(name: str, values: Sequence[float], *, allow_zero: bool) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    ok = out and all(np.isfinite(v) and (v >= 0 if allow_zero else v > 0) for v in out)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise UserError(f"{name} must be a non-empty list of numbers {bound}, got {list(values)}")
    return out


#: members of the hyper-parameter average refitted with the ranking objective (the heaviest)
_RANK_MEMBERS = 8


def _rank_fit(K: np.ndarray, y: np.ndarray, alpha0: np.ndarray, lam: float,
              sig2: float) -> tuple[np.ndarray, float]:
    """Refit one member with a pairwise ranking likelihood: the latent values ``f = K beta`` at
    the measured architectures minimise ``sum over ordered pairs softplus(-(f_i - f_j) / s)``
    plus the Gaussian prior ``beta' K beta / (2 sig2)`` (``s``: the member's noise of a
    difference); then ``a f + b`` is matched to ``y`` by least squares so that predictions are
    latencies again. Returns the weights (``a beta``) and the offset ``b``."""
    from scipy.optimize import minimize

    i, j = np.nonzero(y[:, None] > y[None, :])
    s = np.sqrt(2.0 * lam * sig2)

    def loss(beta: np.ndarray) -> tuple[float, np.ndarray]:
        f = K @ beta
        d = (f[i] - f[j]) / s
        g_pair = -0.5 * (1.0 - np.tanh(0.5 * d)) / s  # d softplus(-d) / d(f_i - f_j)
        g = np.zeros_like(f)
        np.add.at(g, i, g_pair)
        np.add.at(g, j, -g_pair)
        val = float(np.sum(np.logaddexp(0.0, -d))) + 0.5 * float(beta @ f) / sig2
        return val, K @ g + f / sig2

    beta = minimize(loss, alpha0, jac=True, method="L-BFGS-B",
                    options={"maxiter": 200}).x
    f = K @ beta
    A = np.c_[f, np.ones_like(f)]
    a, b = np.linalg.lstsq(A, y, rcond=None)[0]
    if not np.isfinite(a) or a <= 0:  # the ranking fit lost the order: keep least squares
        return alpha0, 0.0
    return a * beta, float(b)


class LowRankPredictor(DesignedPredictor):
    """Per-operation cost vector with a low-rank Gaussian prior from meta-training devices,
    fitted by Bayesian linear regression averaged over hyper-parameters (see module).

    Adaptation regresses a device's measurements under the prior, plus a block of per-layer-kind
    compute, memory-traffic and parameter sums (:func:`features`, ``layers``) for costs the
    training devices do not span. Hyper-parameters (prior scales, noise), the execution variant
    (does the runtime drop dead operations?) and the target (latency, or log latency for
    devices whose costs multiply) are averaged by their marginal likelihood. With 10
    measurements the fit solves a few hundred 10 x 10 systems: milliseconds (7-14 ms in
    ``benchmarks/latency_fewshot.md``).
    """

    name = "lowrank"
    min_samples = 2

    def __init__(
        self,
        space: Any,
        *,
        rank: int = 8,
        pc_vars: Sequence[float] = (0.3, 1.0, 3.0),
        iso_vars: Sequence[float] = (0.0, 0.1, 1.0),
        layer_vars: Sequence[float] = (0.0, 0.1, 1.0),
        lams: Sequence[float] = (0.003, 0.01, 0.03, 0.1),
        targets: Sequence[str] = ("linear",),
        surrogate_ridge: float = 1e-2,
        n_reference: int = 20,
        pool_size: int = 2000,
        pairs: str = "none",
        pair_scale: float = 1.0,
        temperature: float = 1.0,
        objective: str = "ls",
    ) -> None:
        super().__init__(space)
        if int(rank) < 1 or int(n_reference) < 1 or int(pool_size) < 2:
            raise UserError(f"rank and n_reference must be >= 1 and pool_size >= 2, got "
                            f"{rank}, {n_reference} and {pool_size}")
        bad = [t for t in targets if t not in TARGETS]
        if bad or not targets:
            raise UserError(f"targets {list(targets)}; expected some of {list(TARGETS)}")
        if not (np.isfinite(surrogate_ridge) and surrogate_ridge > 0):
            raise UserError(f"surrogate_ridge must be > 0, got {surrogate_ridge}")
        self.rank = int(rank)
        self.pc_vars = _positive_grid("pc_vars", pc_vars, allow_zero=True)
        self.iso_vars = _positive_grid("iso_vars", iso_vars, allow_zero=True)
        self.layer_vars = _positive_grid("layer_vars", layer_vars, allow_zero=True)
        self.lams = _positive_grid("lams", lams, allow_zero=False)
        self.targets = tuple(dict.fromkeys(str(t) for t in targets))
        self.surrogate_ridge = float(surrogate_ridge)
        if pairs not in PAIRS or objective not in OBJECTIVES:
            raise UserError(f"pairs {pairs!r} / objective {objective!r}; expected one of "
                            f"{list(PAIRS)} / {list(OBJECTIVES)}")
        if not (np.isfinite(pair_scale) and pair_scale > 0):
            raise UserError(f"pair_scale must be a number > 0, got {pair_scale}")
        if not (np.isfinite(temperature) and temperature >= 1):
            raise UserError(f"temperature must be a number >= 1, got {temperature}")
        self.n_reference = int(n_reference)
        self.pool_size = int(pool_size)
        self.pairs = str(pairs)
        self.pair_scale = float(pair_scale)
        self.temperature = float(temperature)
        self.objective = str(objective)
        self.devices_: list[str] = []
        self.execution_prior_: dict[str, float] = {}
        self._ref: list[str] = []
        self._p: dict[str, np.ndarray] = {}
        self._post: dict[str, Any] = {}

    # -- meta-training -----------------------------------------------------------------------------
    def _design_matrix(self, keys: list[str], variant: str) -> tuple[np.ndarray, np.ndarray]:
        """Encoding of the executed networks plus their constant-output flag, and their
        per-layer-kind sums (all columns; standardised later)."""
        ek, flag = executed(self.space, keys, variant)
        E = features(self.space, ek, "encode")
        X = np.hstack([E, flag[:, None]])
        if self.pairs != "none":
            # pair_scale < 1: pair costs shrink more (ridge) and vary less under the prior
            X = np.hstack([X, self.pair_scale * pair_products(
                E, encoding_positions(self.space), self.pairs == "adjacent")])
        return X, features(self.space, ek, "layers")

    def _width(self) -> int:
        """Columns of the cost vector (encoding, constant-output flag, pair products)."""
        return self._design_matrix([self.space.to_string(self.space.smallest())], "raw")[0].shape[1]

    def meta_fit(self, space: Any, archs: Sequence[Any], table: Mapping[str, np.ndarray], *,
                 seed: int, groups: Mapping[str, str] | None = None) -> LowRankPredictor:
        """Fit each device's cost vector, the prior over them and the reference architectures.
        NaN in ``table`` = not measured (a device measured on a sample is fitted on it).
        ``groups`` (device -> group name) makes each group weigh the same in the prior."""
        self.space = space
        table, keys, groups = self._meta_inputs(space, archs, table, groups)
        variants = execution_variants(space)
        mats = {v: self._design_matrix(keys, v) for v in variants}
        Lraw = mats["raw"][1]
        l_cols = np.flatnonzero(Lraw.std(0) > 1e-9 * (np.abs(Lraw).mean(0) + 1e-30))
        devices = list(table)
        half = np.arange(len(keys)) % 2 == 0
        chosen, W = [], {t: [] for t in self.targets}
        for d in devices:
            has = ~np.isnan(table[d])
            y = table[d][has] / float(np.mean(table[d][has]))
            err = {}  # two-fold (even/odd rows) error of each variant's linear cost model
            for v in variants:
                X = mats[v][0][has]
                tr = half[has]
                c, b = ridge_fit(X[tr], y[tr], self.surrogate_ridge)
                err[v] = float(np.mean((X[~tr] @ c + b - y[~tr]) ** 2))
            v = min(err, key=err.get)
            chosen.append(v)
            for t in self.targets:
                yt = np.log(y) if t == "log" else y
                c, b = ridge_fit(mats[v][0][has], yt, self.surrogate_ridge)
                level = float(np.mean(mats[v][0] @ c + b))  # over every architecture given
                if t == "log":
                    W[t].append(np.append(c, b - level))
                else:
                    W[t].append(np.append(c, b) / max(level, 1e-12))
        names = [groups.get(d, d) for d in devices]
        weight = np.array([1.0 / names.count(g) for g in names])
        weight /= weight.sum()
        p: dict[str, np.ndarray] = {"l_cols": l_cols, "l_mean": Lraw[:, l_cols].mean(0),
                                    "l_std": Lraw[:, l_cols].std(0)}
        for t in self.targets:
            Wt = np.array(W[t])
            mu = weight @ Wt
            _, s, vt = np.linalg.svd((Wt - mu) * np.sqrt(weight)[:, None], full_matrices=False)
            k = max(1, min(self.rank, int(np.sum(s > 1e-6 * max(s[0], 1e-30)))))
            p[f"{t}.mu"] = mu
            p[f"{t}.pcs"] = vt[:k].T * s[:k]  # columns scaled by the root of their variance
            # variance per cost not spanned by the principal directions (and a floor)
            p[f"{t}.iso"] = np.array(float(np.sum(s[k:] ** 2) + 1e-3 * np.sum(s ** 2))
                                     / Wt.shape[1])
        self.devices_ = devices
        self.execution_prior_ = execution_prior(chosen, variants)
        self._p = p
        self._ref = self._design(keys, seed)
        self._keys = None
        self._post = {}
        return self

    def _design(self, keys: list[str], seed: int) -> list[str]:
        """Greedy I-optimal design under the prior of the first target (mid-grid scales); the
        layer block is left out of the design (with it, the references chosen ranked the
        held-out families of the leave-one-family-out protocol worse)."""
        rng = np.random.default_rng(seed)
        pool = rng.choice(len(keys), size=min(self.pool_size, len(keys)), replace=False)
        pool_keys = [keys[i] for i in pool]
        B = self._blocks(pool_keys, "raw", self.targets[0])
        F = np.hstack([B["m"], B["p"], np.sqrt(0.1) * B["i"], B["c"]])
        return [pool_keys[i] for i in greedy_design(F, self.n_reference, 0.03)]

    def _blocks(self, keys: list[str], variant: str, target: str) -> dict[str, np.ndarray]:
        """Prior feature blocks: mean cost (m), principal directions (p), isotropic (i),
        standardised per-layer-kind sums (l), constant (c)."""
        p = self._p
        X, L = self._design_matrix(keys, variant)
        Xb = np.hstack([X, np.ones((len(keys), 1))])
        L = L[:, p["l_cols"]]
        q = max(len(p["l_cols"]), 1)
        return {"m": (Xb @ p[f"{target}.mu"])[:, None], "p": Xb @ p[f"{target}.pcs"],
                "i": X * np.sqrt(float(p[f"{target}.iso"])),
                "l": (L - p["l_mean"]) / (p["l_std"] + 1e-12) / np.sqrt(q),
                "c": np.ones((len(keys), 1))}

    def _members(self) -> list[tuple[dict[str, float], float]]:
        return [({"m": 1.0, "p": a, "i": b, "l": g, "c": 1.0}, lam)
                for a, b, g, lam in itertools.product(self.pc_vars, self.iso_vars,
                                                      self.layer_vars, self.lams)]

    # -- adaptation --------------------------------------------------------------------------------
    def _adapt(self, keys: list[str], latency_ms: np.ndarray, seed: int) -> None:
        if not self.is_meta_trained:
            raise UserError(
                f"the lowrank latency predictor for space {self.space.name} has not been "
                f"meta-trained; meta_fit() it on latency tables of several devices first")
        scale = float(latency_ms.mean())
        rel = latency_ms / scale
        n = len(keys)
        members, blocks = [], {}
        for target in self.targets:
            y = np.log(rel) if target == "log" else rel
            # the log model's likelihood is of log latency: the Jacobian puts both on one scale
            jac = -float(np.sum(np.log(rel))) if target == "log" else 0.0
            for variant, prior in self.execution_prior_.items():
                B = blocks[target, variant] = self._blocks(keys, variant, target)
                grams = {b: B[b] @ B[b].T for b in _BLOCKS}
                for s2, lam in self._members():
                    K = sum(s2[b] * grams[b] for b in _BLOCKS)
                    try:
                        chol = np.linalg.cholesky(K + lam * np.eye(n))
                    except np.linalg.LinAlgError:  # pragma: no cover - lam > 0 on the diagonal
                        continue
                    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
                    sig2 = max(float(y @ alpha) / n, 1e-12)
                    ml = (-0.5 * n * np.log(sig2) - float(np.log(np.diag(chol)).sum())
                          + np.log(prior) + jac)
                    members.append((ml, target, variant, s2, lam, alpha, sig2, chol))
        mls = np.array([m[0] for m in members])
        # temperature > 1 flattens the average over hyper-parameters (more members, so more
        # of the prior's smaller scales: shrinks towards the prior)
        w = np.exp((mls - mls.max()) / self.temperature)
        w /= w.sum()
        keep = [i for i in np.argsort(-w) if w[i] > 1e-4]
        if self.objective == "rank":
            keep = keep[:_RANK_MEMBERS]
        wk = w[keep] / w[keep].sum()
        post = []
        for wi, i in zip(wk, keep):
            ml, target, variant, s2, lam, alpha, sig2, chol = members[i]
            offset = 0.0
            if self.objective == "rank":
                y = np.log(rel) if target == "log" else rel
                alpha, offset = _rank_fit(chol @ chol.T - lam * np.eye(n), y, alpha, lam, sig2)
            post.append((wi, target, variant, s2, lam, alpha, sig2, chol, offset))
        self._post = {"scale": scale, "blocks": blocks, "members": post,
                      "floor": 0.01 * float(latency_ms.min())}

    def _predict(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
        post = self._post
        new: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        first = np.zeros(len(keys))
        second = np.zeros(len(keys))
        for wi, target, variant, s2, lam, alpha, sig2, chol, offset in post["members"]:
            if (target, variant) not in new:
                new[target, variant] = self._blocks(keys, variant, target)
            B, Bt = new[target, variant], post["blocks"][target, variant]
            k = sum(s2[b] * (B[b] @ Bt[b].T) for b in _BLOCKS)  # N x n
            mu = k @ alpha + offset
            u = np.linalg.solve(chol, k.T)
            # + lam: the deviation is that of a *measurement* (what a table or a user compares)
            var = (np.maximum(sum(s2[b] * np.sum(B[b] ** 2, 1) for b in _BLOCKS)
                              - np.sum(u ** 2, 0), 0.0) + lam) * sig2
            if target == "log":  # moments of a log-normal
                m1 = np.exp(mu + 0.5 * var)
                m2 = np.exp(2 * mu + 2 * var)
            else:
                m1, m2 = mu, var + mu ** 2
            first += wi * m1
            second += wi * m2
        std = np.sqrt(np.maximum(second - first ** 2, 0.0)) * post["scale"]
        return np.maximum(first * post["scale"], post["floor"]), std

    # -- files -------------------------------------------------------------------------------------
    def _state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta = {"rank": self.rank, "pc_vars": list(self.pc_vars),
                "iso_vars": list(self.iso_vars), "layer_vars": list(self.layer_vars),
                "lams": list(self.lams), "targets": list(self.targets),
                "surrogate_ridge": self.surrogate_ridge, "n_reference": self.n_reference,
                "pool_size": self.pool_size, "pairs": self.pairs, "pair_scale": self.pair_scale,
                "temperature": self.temperature, "objective": self.objective,
                "devices": list(self.devices_),
                "execution_prior": dict(self.execution_prior_),
                "reference_archs": list(self._ref)}
        return meta, dict(self._p)

    @classmethod
    def _from_state(cls, space: Any, meta: dict[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> LowRankPredictor:
        hyper = {k: meta[k] for k in ("rank", "pc_vars", "iso_vars", "layer_vars", "lams",
                                      "targets", "surrogate_ridge", "n_reference", "pool_size",
                                      "pairs", "pair_scale", "temperature", "objective")
                 if k in meta}
        obj = cls(space, **hyper)
        obj.devices_ = list(meta.get("devices", []))
        obj._ref = list(meta.get("reference_archs", []))
        obj._p = {k: np.asarray(v) for k, v in arrays.items()}
        if not obj.devices_:
            return obj
        needed = {"l_cols", "l_mean", "l_std"} | {f"{t}.{a}" for t in obj.targets
                                                  for a in ("mu", "pcs", "iso")}
        if not needed <= set(obj._p):
            raise UserError(f"lowrank predictor file lacks {sorted(needed - set(obj._p))}")
        if obj._p[f"{obj.targets[0]}.mu"].shape[0] != obj._width() + 1:
            raise UserError(f"lowrank predictor was trained on cost vectors of "
                            f"{obj._p[f'{obj.targets[0]}.mu'].shape[0] - 1} features; space "
                            f"{space.name} with pairs={obj.pairs!r} has {obj._width()}")
        obj.execution_prior_ = {str(k): float(v) for k, v in
                                (meta.get("execution_prior") or {"raw": 1.0}).items()}
        bad = [v for v in obj.execution_prior_ if v not in execution_variants(space)]
        if bad:
            raise UserError(f"lowrank predictor file uses execution variant {bad[0]!r}, which "
                            f"space {space.name} does not have")
        return obj
