"""The meta-learned few-shot latency predictor (default).

In the spirit of HELP (Lee et al., NeurIPS 2021) a new device is described by its measured
latencies on a few reference architectures, and what was learned from many other devices turns
those few numbers into a predictor for the whole space. HELP meta-learns an MLP with MAML and a
hardware embedding; this predictor instead treats the problem as Bayesian regression with a
*learned prior*, which is exact, needs no gradient steps at adaptation (milliseconds on a CPU),
gives an uncertainty, and ranks better than HELP's published numbers on HELP's own protocol
(see ``benchmarks/latency_fewshot.md``).

**Meta-training** (:meth:`MetaPredictor.meta_fit`, from the full tables of the meta-training
devices):

* For every meta-training device ``d`` a *device profile* ``g_d(arch)``: an additive model in
  milliseconds on the space's encoding (ridge regression of the device's latency on
  :meth:`SearchSpace.encode`, i.e. a per-edge / per-layer latency table fitted to the whole
  table). It predicts any architecture of the space, including the ones no table holds (the
  FBNet tables cover 5,000 of 9**22), and smooths measurement noise (integer-ms phones).
* Which architectures to measure: a greedy I-optimal design under the prior below, from a seeded
  pool of meta-training architectures - each next reference architecture is the one whose
  measurement most reduces the prior's average predictive variance over the pool. These are
  :attr:`reference_archs`; with ``n`` measurements, measure the first ``n``.

**Prior** (a Gaussian process over architectures, written as explicit feature blocks):

    f(arch) = c + w_log·z_log(arch) + w_ms·z_ms(arch) + v·x(arch) + u·l(arch) + t·φ(arch)

* ``z_log``, ``z_ms``: the device profiles, per device standardized in log space and in ms
  (``w ~ N(0, 1/2D)`` each): the new device is a combination of the devices seen in
  meta-training - which captures batch size, compute vs launch bound, CPU vs GPU vs phone;
* ``x``: the centred encoding (``v ~ N(0, alpha)``): per-edge / per-layer costs that no
  meta-training device has;
* ``l``: standardized per-layer-kind sums of the layer list (MACs, activations, parameters,
  layer counts by kind; ``u ~ N(0, beta)``): the physics of a new device (a compute-bound
  accelerator, a memory-bound one), which the meta-training devices may not span;
* ``φ``: standardized log-FLOPs and FLOPs (``t ~ N(0, gamma)``): the FLOPs proxy as one more
  hypothesis, which wins for accelerators whose latency follows compute (simulated FPGA/ASIC);
* ``c``: a free constant.

**Adaptation** (:meth:`adapt`): the target is the measured latency in ms divided by its mean
(scale-free, additive). For every ``(alpha, beta, gamma, lambda)`` of a small grid (``lambda``
= noise variance relative to the prior) the exact GP posterior is computed and weighted by its
marginal likelihood (the overall scale profiled out): Bayesian model averaging, i.e. an
ensemble whose weights say how much the new device looks like the meta-training devices and
how noisy it is. The mixture mean is the prediction; the mixture variance its uncertainty.

Everything is numpy; a meta-trained predictor file is a few kB.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from latency.predictors.base import LatencyPredictor, check_table, register_predictor_class
from latency.predictors.features import arch_strings, features
from supernet.errors import UserError

__all__ = ["MetaPredictor"]

_BLOCKS = ("zl", "zm", "x", "l", "f", "c")
_CONST = 3.0


def greedy_design(F: np.ndarray, n: int, lam: float) -> list[int]:
    """Greedy I-optimal design: indices of ``n`` rows of ``F`` (features of a candidate pool;
    prior ``f = F w``, ``w ~ N(0, I)``, noise ``lam``) that minimise the average posterior
    variance over the pool, chosen one at a time."""
    m = F.shape[1]
    M = F.T @ F / len(F)
    S = np.eye(m)
    chosen: list[int] = []
    for _ in range(min(n, len(F))):
        A = F @ S
        gain = np.einsum("ij,jk,ik->i", A, M, A) / (lam + np.einsum("ij,ij->i", A, F))
        gain[chosen] = -np.inf
        j = int(np.argmax(gain))
        chosen.append(j)
        s = S @ F[j]
        S = S - np.outer(s, s) / (lam + F[j] @ s)
    return chosen


@register_predictor_class
class MetaPredictor(LatencyPredictor):
    """Meta-learned GP prior over devices + Bayesian model averaging (see module docstring)."""

    name = "meta"
    min_samples = 2

    def __init__(
        self,
        space: Any,
        *,
        alphas: Sequence[float] = (0.0, 0.03, 0.1, 0.3),
        betas: Sequence[float] = (0.0, 0.1, 0.3, 1.0),
        gammas: Sequence[float] = (0.0, 1.0),
        lams: Sequence[float] = (0.01, 0.03, 0.1, 0.3),
        design: Sequence[float] = (0.03, 0.0, 0.03),
        n_reference: int = 20,
        pool_size: int = 2000,
        surrogate_ridge: float = 1e-2,
    ) -> None:
        super().__init__(space)
        self.alphas = tuple(float(a) for a in alphas)
        self.betas = tuple(float(b) for b in betas)
        self.gammas = tuple(float(g) for g in gammas)
        self.lams = tuple(float(v) for v in lams)
        self.design = tuple(float(v) for v in design)  # (alpha, beta, lambda) of the design
        self.n_reference = int(n_reference)
        self.pool_size = int(pool_size)
        self.surrogate_ridge = float(surrogate_ridge)
        self.devices_: list[str] = []
        self._ref: list[str] = []
        self._p: dict[str, np.ndarray] = {}  # meta-trained arrays
        self._post: dict[str, Any] = {}  # adapted posterior

    # -- meta-training -----------------------------------------------------------------------------
    @property
    def is_meta_trained(self) -> bool:
        return bool(self.devices_)

    @property
    def reference_archs(self) -> list[str] | None:
        return list(self._ref) if self.is_meta_trained else None

    def meta_fit(self, space: Any, archs: Sequence[Any], table: Mapping[str, np.ndarray], *,
                 seed: int) -> MetaPredictor:
        """Fit the device profiles and choose the reference architectures (see module)."""
        self.space = space
        table = check_table(archs, table)
        if len(table) < 2:
            raise UserError(f"meta-training needs the latency tables of at least 2 devices, got "
                            f"{len(table)}")
        keys = arch_strings(space, archs)
        if len(set(keys)) != len(keys):
            raise UserError("meta-training architectures repeat; expected each once")
        if len(keys) < 10:
            raise UserError(f"meta-training needs at least 10 architectures, got {len(keys)}")
        devices = list(table)
        Y = np.stack([table[d] for d in devices], 1)  # n x D
        X = features(space, keys, "encode")
        x_mean = X.mean(0)
        Xc = X - x_mean
        x_scale = float(np.sqrt(np.mean(np.sum(Xc ** 2, 1)))) or 1.0
        ybar = Y.mean(0)
        gram = Xc.T @ Xc + self.surrogate_ridge * np.eye(X.shape[1])
        coef = np.linalg.solve(gram, Xc.T @ (Y - ybar)).T  # D x p
        floor = 0.5 * Y.min(0)
        S = np.maximum(Xc @ coef.T + ybar, floor)
        L = features(space, keys, "layers")
        l_std = L.std(0)
        l_cols = np.flatnonzero(l_std > 1e-9 * (np.abs(L).mean(0) + 1e-30))
        flops = np.maximum(features(space, keys, "flops")[:, 0], 1.0)
        Fl = np.stack([np.log(flops), flops], 1)
        self.devices_ = devices
        self._p = {
            "coef": coef, "ybar": ybar, "floor": floor,
            "zl_mean": np.log(S).mean(0), "zl_std": np.log(S).std(0) + 1e-12,
            "zm_mean": S.mean(0), "zm_std": S.std(0) + 1e-12,
            "x_mean": x_mean, "x_scale": np.array(x_scale),
            "l_cols": l_cols, "l_mean": L[:, l_cols].mean(0), "l_std": l_std[l_cols],
            "f_mean": Fl.mean(0), "f_std": Fl.std(0) + 1e-12,
        }
        rng = np.random.default_rng(seed)
        pool = rng.choice(len(keys), size=min(self.pool_size, len(keys)), replace=False)
        pool_keys = [keys[i] for i in pool]
        a_s, b_s, lam_s = self.design
        F = self._scaled(self._blocks(pool_keys), {"zl": 0.5, "zm": 0.5, "x": a_s, "l": b_s,
                                                   "f": 0.0, "c": 1.0})
        self._ref = [pool_keys[i] for i in greedy_design(F, self.n_reference, lam_s)]
        self._keys = None
        self._post = {}
        return self

    def _blocks(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Unscaled prior feature blocks of canonical strings."""
        p = self._p
        X = features(self.space, keys, "encode")
        Xc = X - p["x_mean"]
        S = np.maximum(Xc @ p["coef"].T + p["ybar"], p["floor"])
        D = len(self.devices_)
        L = features(self.space, keys, "layers")[:, p["l_cols"]]
        q = max(len(p["l_cols"]), 1)
        flops = np.maximum(features(self.space, keys, "flops")[:, 0], 1.0)
        Fl = np.stack([np.log(flops), flops], 1)
        return {
            "zl": (np.log(S) - p["zl_mean"]) / p["zl_std"] / np.sqrt(D),
            "zm": (S - p["zm_mean"]) / p["zm_std"] / np.sqrt(D),
            "x": Xc / float(p["x_scale"]),
            "l": (L - p["l_mean"]) / p["l_std"] / np.sqrt(q),
            "f": (Fl - p["f_mean"]) / p["f_std"] / np.sqrt(2.0),
            "c": np.full((len(keys), 1), _CONST),
        }

    @staticmethod
    def _scaled(blocks: dict[str, np.ndarray], s2: dict[str, float]) -> np.ndarray:
        return np.hstack([np.sqrt(s2[b]) * blocks[b] for b in _BLOCKS])

    def _members(self) -> list[tuple[dict[str, float], float]]:
        return [({"zl": 0.5, "zm": 0.5, "x": a, "l": b, "f": g, "c": 1.0}, lam)
                for a, b, g, lam in itertools.product(self.alphas, self.betas, self.gammas,
                                                      self.lams)]

    # -- adaptation --------------------------------------------------------------------------------
    def _adapt(self, keys: list[str], latency_ms: np.ndarray, seed: int) -> None:
        if not self.is_meta_trained:
            raise UserError(
                f"the meta latency predictor for space {self.space.name} has not been "
                f"meta-trained; use latency.predictors.load_pretrained({self.space.name!r}) or "
                f"meta_fit() it on latency tables of several devices, or use the flops, lut or "
                f"mlp predictor"
            )
        scale = float(latency_ms.mean())
        y = latency_ms / scale - 1.0
        n = len(y)
        blocks = self._blocks(keys)
        grams = {b: blocks[b] @ blocks[b].T for b in _BLOCKS}
        members = []
        for s2, lam in self._members():
            K = sum(s2[b] * grams[b] for b in _BLOCKS) + lam * np.eye(n)
            try:
                chol = np.linalg.cholesky(K)
            except np.linalg.LinAlgError:
                continue
            alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
            sig2 = max(float(y @ alpha) / n, 1e-12)
            ml = -0.5 * n * np.log(sig2) - float(np.log(np.diag(chol)).sum())
            members.append((ml, s2, lam, alpha, sig2, chol))
        if not members:  # pragma: no cover - K always has lam > 0 on its diagonal
            raise UserError("the meta predictor could not fit these measurements")
        mls = np.array([m[0] for m in members])
        w = np.exp(mls - mls.max())
        w /= w.sum()
        keep = [i for i in np.argsort(-w) if w[i] > 1e-4]
        wk = w[keep] / w[keep].sum()
        kept = [members[i] for i in keep]
        # combined dual weights per block for the mixture mean
        combo = {b: sum(wi * m[1][b] * m[3] for wi, m in zip(wk, kept)) for b in _BLOCKS}
        self._post = {"scale": scale, "blocks": blocks, "combo": combo,
                      "members": [(wi, m[1], m[3], m[4], m[5], m[2]) for wi, m in zip(wk, kept)],
                      "floor": 0.01 * float(latency_ms.min())}

    def _mean(self, new: dict[str, np.ndarray]) -> np.ndarray:
        post = self._post
        cross = {b: new[b] @ post["blocks"][b].T for b in _BLOCKS}
        f = sum(cross[b] @ post["combo"][b] for b in _BLOCKS)
        return f, cross

    def predict(self, archs: Sequence[Any]) -> np.ndarray:
        """Predicted latency (ms); faster than :meth:`predict_with_std` (no variance)."""
        if not self.is_adapted:
            return super().predict(archs)  # raises the not-adapted error
        keys = arch_strings(self.space, archs)
        f, _ = self._mean(self._blocks(keys))
        return np.maximum((1.0 + f) * self._post["scale"], self._post["floor"])

    def _predict(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        post = self._post
        new = self._blocks(keys)
        f, cross = self._mean(new)
        sq = {b: np.sum(new[b] ** 2, 1) for b in _BLOCKS}
        second = np.zeros(len(keys))
        for wi, s2, alpha, sig2, chol, _lam in post["members"]:
            k = sum(s2[b] * cross[b] for b in _BLOCKS)  # N x n
            mu = k @ alpha
            v = np.linalg.solve(chol, k.T)  # n x N
            var = sum(s2[b] * sq[b] for b in _BLOCKS) - np.sum(v ** 2, 0)
            second += wi * (sig2 * np.maximum(var, 0.0) + mu ** 2)
        var = np.maximum(second - f ** 2, 0.0)
        scale = post["scale"]
        return np.maximum((1.0 + f) * scale, post["floor"]), np.sqrt(var) * scale

    def explain(self) -> dict[str, Any]:
        """What the adaptation concluded: the posterior weight of each hyper-parameter setting
        (top 5) and how much each meta-training device's profile contributes (relative weight
        of its log and ms profile in the mixture mean)."""
        if not self.is_adapted:
            raise UserError("the meta predictor has not been adapted; nothing to explain")
        post = self._post
        top = [{"weight": float(m[0]), "alpha": m[1]["x"], "beta": m[1]["l"],
                "gamma": m[1]["f"], "lambda": m[5]} for m in post["members"][:5]]
        dev = {}
        for b in ("zl", "zm"):
            dev[b] = post["blocks"][b].T @ post["combo"][b]
        total = np.abs(dev["zl"]) + np.abs(dev["zm"])
        total = total / (total.sum() or 1.0)
        return {"hyper_posterior": top,
                "device_weights": {d: float(t) for d, t in zip(self.devices_, total)}}

    # -- files -------------------------------------------------------------------------------------
    def _state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta = {"alphas": list(self.alphas), "betas": list(self.betas),
                "gammas": list(self.gammas), "lams": list(self.lams),
                "design": list(self.design), "n_reference": self.n_reference,
                "pool_size": self.pool_size, "surrogate_ridge": self.surrogate_ridge,
                "devices": list(self.devices_), "reference_archs": list(self._ref)}
        return meta, dict(self._p)

    @classmethod
    def _from_state(cls, space: Any, meta: dict[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> MetaPredictor:
        hyper = {k: meta[k] for k in ("alphas", "betas", "gammas", "lams", "design", "n_reference",
                                      "pool_size", "surrogate_ridge") if k in meta}
        obj = cls(space, **hyper)
        obj.devices_ = list(meta.get("devices", []))
        obj._ref = list(meta.get("reference_archs", []))
        obj._p = {k: np.asarray(v) for k, v in arrays.items()}
        if obj.devices_:
            needed = {"coef", "ybar", "floor", "zl_mean", "zl_std", "zm_mean", "zm_std",
                      "x_mean", "x_scale", "l_cols", "l_mean", "l_std", "f_mean", "f_std"}
            if not needed <= set(obj._p):
                raise UserError(f"meta predictor file lacks {sorted(needed - set(obj._p))}")
            if obj._p["coef"].shape[1] != space.feature_dim:
                raise UserError(
                    f"meta predictor was trained on encodings of {obj._p['coef'].shape[1]} "
                    f"features; space {space.name} has {space.feature_dim}"
                )
        return obj
