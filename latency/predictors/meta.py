"""The meta-learned few-shot latency predictor (default).

As in HELP (Lee et al., NeurIPS 2021), a new device is described by its latencies on a few
reference architectures, and what was learned from many other devices turns them into a
predictor for the whole space. Here the learning is Bayesian regression with a *learned prior*
(a GP over architectures whose features are the meta-training devices' additive profiles, the
encoding, per-layer-kind sums and FLOPs), averaged over hyper-parameters and over the network a
device really runs (execution variants): exact, no gradient steps at adaptation, with an
uncertainty, and robust to wild measurements (Student-t noise). It keeps learning as
measurements grow through the evidence, which shifts the prior's blocks and noise with n. An
optional residual learner (``residual=``, off by default: on the family protocol it never paid)
is fitted from 20 measurements on to what the prior misses on each measurement left out. The
full method is written up in ``benchmarks/latency_fewshot.md`` ("Method"), with its figures.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from hwnas.latency.predictors.designed import (
    MAX_ADAPT_MEASUREMENTS,
    DesignedPredictor,
    fit_profiles,
    greedy_design,
    ridge_fit,
)
from hwnas.latency.predictors.features import (
    arch_strings,
    encoding_positions,
    executed,
    execution_prior,
    execution_variants,
    features,
    pair_products,
)

from hwnas.latency.predictors.residual import (
    DEFAULT_RESIDUAL,
    RESIDUAL_FOLDS,
    RESIDUAL_FOLDS_AGAINST,
    RESIDUAL_MIN,
    RESIDUALS,
    cell_features,
    fit_blend,
    residual_model,
)

from hwnas.core.errors import UserError

__all__ = ["MetaPredictor", "greedy_design"]

_BLOCKS = ("zl", "zm", "ql", "qm", "x", "o", "l", "f", "d", "c")
#: pair profiles need an encoding at most this wide (their columns grow with its square)
_MAX_PAIR_DIM = 64
_CONST = 3.0


#: new predictors screen members by Gaussian evidence beyond SCREEN_AFTER measurements
DEFAULT_SCREEN_MARGIN = 20.0
SCREEN_AFTER = 20

#: options chosen per space on the family protocol and checked on HELP's validation devices
#: (benchmarks/latency_lofo.md, "pairwise cell terms"); an argument to the constructor wins
SPACE_OPTIONS: dict[str, dict[str, float]] = {"nb201": {"pair_profiles": 0.1}}


class MetaPredictor(DesignedPredictor):
    """Meta-learned GP prior over devices + Bayesian model averaging over hyper-parameters and
    execution variants, with a robust (Student-t) likelihood (see module docstring)."""

    @property
    def max_adapt_measurements(self) -> int:
        """The most measurements one adaptation fits (:data:`MAX_ADAPT_MEASUREMENTS`; more
        are subsampled, seeded by the adaptation's seed)."""
        return MAX_ADAPT_MEASUREMENTS

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
        execution: Sequence[str] | None = None,
        disconnected_var: float = 1.0,
        design_delta: float = 1.0,
        design_delta_after: int = 5,
        robust_iterations: int = 10,
        robust_nu: float = 4.0,
        opcounts: Sequence[float] = (0.0,),
        pair_profiles: float | None = None,
        min_profile_r2: float = 0.0,
        residual: str | None = None,
        screen_margin: float | None = None,
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
        #: execution variants to consider (None: every variant of the space, at meta-training)
        self.execution = None if execution is None else tuple(str(v) for v in execution)
        self.disconnected_var = float(disconnected_var)
        self.design_delta = float(design_delta)
        self.design_delta_after = int(design_delta_after)
        self.robust_iterations = int(robust_iterations)
        self.robust_nu = float(robust_nu)
        #: prior variances of the operation-count block (0: no such block)
        self.opcounts = tuple(float(o) for o in opcounts)
        #: > 0: a second set of meta-training profiles with pair terms (what an operation costs
        #: beside another: products of two positions' choices, scaled by this before the ridge,
        #: so a smaller value shrinks them more), weighed against the additive profiles by each
        #: adaptation's evidence like the execution variants; 0: additive profiles only;
        #: None: the space's choice in SPACE_OPTIONS (off where it has none)
        if pair_profiles is None:
            pair_profiles = SPACE_OPTIONS.get(getattr(space, "name", ""), {}).get(
                "pair_profiles", 0.0)
        self.pair_profiles = float(pair_profiles)
        if not np.isfinite(self.pair_profiles) or self.pair_profiles < 0:
            raise UserError(f"pair_profiles must be 0 (off) or a positive scale, got "
                            f"{pair_profiles}")
        #: meta-train only on devices whose profile predicts held-out cells with R^2 >= this
        self.min_profile_r2 = float(min_profile_r2)
        #: the residual learner fitted on the prior's leave-one-out misses once there are
        #: RESIDUAL_MIN measurements (RESIDUALS; "off": none, as predictors written before it)
        self.residual = DEFAULT_RESIDUAL if residual is None else str(residual)
        if self.residual not in RESIDUALS:
            raise UserError(f"residual must be one of {list(RESIDUALS)}, got {residual!r}")
        #: > 0: beyond SCREEN_AFTER measurements, only the members whose Gaussian evidence is
        #: within this many nats of the best get the robust (Student-t) fit; 0: every member
        self.screen_margin = float(DEFAULT_SCREEN_MARGIN if screen_margin is None
                                   else screen_margin)
        if not np.isfinite(self.screen_margin) or self.screen_margin < 0:
            raise UserError(f"screen_margin must be a number >= 0, got {screen_margin}")
        if self.robust_iterations < 0 or self.robust_nu <= 0:
            raise UserError(f"robust_iterations must be >= 0 and robust_nu > 0, got "
                            f"{robust_iterations} and {robust_nu}")
        self.devices_: list[str] = []
        self.device_execution_: list[str] = []  # the variant each meta-training device runs
        self.execution_prior_: dict[str, float] = {}
        #: the execution variant the next adaptations assume (:meth:`pin_execution`); None:
        #: weighed by the measurements under the meta-trained prior
        self.pinned_execution: str | None = None
        self._ref: list[str] = []
        self._p: dict[str, np.ndarray] = {}  # meta-trained arrays
        self._post: dict[str, Any] = {}  # adapted posterior

    # -- meta-training -----------------------------------------------------------------------------

    @property
    def variants(self) -> tuple[str, ...]:
        """The execution variants the predictor weighs (``raw`` first)."""
        return tuple(self.execution_prior_) or ("raw",)

    def pin_execution(self, variant: str | None) -> MetaPredictor:
        """Assume the device runs ``variant`` (None: weigh the variants by the measurements, the
        default) in the adaptations that follow; returns ``self``. For when how the network
        was run is known, e.g. from ONNX files exported by hwnas, which hold no dead operations
        (:func:`hwnas.latency.predictors.features.export_execution`): ten random measurements
        often cannot tell the variants apart (benchmarks/latency_lofo.md)."""
        if variant is not None and variant not in self.variants:
            raise UserError(f"execution variant {variant!r} is not one the {self.space.name} "
                            f"meta predictor knows; expected one of {list(self.variants)}")
        self.pinned_execution = variant
        return self

    def _encoded(self, keys: list[str], variant: str) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Encoding of the executed architectures, their strings and constant-output flags."""
        ek, flag = executed(self.space, keys, variant)
        return features(self.space, ek, "encode"), ek, flag

    def meta_fit(self, space: Any, archs: Sequence[Any], table: Mapping[str, np.ndarray], *,
                 seed: int, groups: Mapping[str, str] | None = None) -> MetaPredictor:
        """Fit the device profiles, each device's execution variant, and choose the reference
        architectures (see module). A NaN in ``table`` is an architecture the device was not
        measured on: its profile is fitted on the ones it was (tables of different samples).
        ``groups`` (device -> group name) makes each group weigh the same in the prior over
        execution variants (:func:`execution_prior`)."""
        self.space = space
        table, keys, groups = self._meta_inputs(space, archs, table, groups)
        if len(keys) < 10:
            raise UserError(f"meta-training needs at least 10 architectures, got {len(keys)}")
        known = execution_variants(space)
        variants = known if self.execution is None else self.execution
        bad = [v for v in variants if v not in known]
        if bad or not variants or variants[0] != "raw":
            raise UserError(f"execution variants {list(variants)} for space {space.name}; "
                            f"expected 'raw' first, then some of {list(known)}")
        devices = list(table)
        Y = np.stack([table[d] for d in devices], 1)  # n x D
        enc = {v: self._encoded(keys, v) for v in variants}
        pf = self.pair_profiles
        if pf and enc["raw"][0].shape[1] > _MAX_PAIR_DIM:
            raise UserError(f"pair_profiles: the {space.name} encoding has "
                            f"{enc['raw'][0].shape[1]} columns; pairs need at most {_MAX_PAIR_DIM}")
        design_x = {v: np.hstack([enc[v][0], enc[v][2][:, None]]) for v in variants}
        half = np.arange(len(keys)) % 2 == 0
        p_dim = enc["raw"][0].shape[1]
        D = len(devices)
        grams: dict = {}  # centred Gram matrices, by (fit, variant, rows)
        r2 = np.ones(D)
        chosen: list[str] = []
        for j in range(D):
            has = ~np.isnan(Y[:, j])  # a device measured on a sample: its profile fits those
            rows = has.tobytes()
            y = Y[has, j]
            tr = half[has]
            err = {}  # two-fold (even/odd rows) cross-validated error of each variant's profile
            for v in variants if len(variants) > 1 else ():
                xv = design_x[v][has]
                c, b = ridge_fit(xv[tr], y[tr], self.surrogate_ridge, grams, ("half", v, rows))
                err[v] = float(np.mean((xv[~tr] @ c + b - y[~tr]) ** 2))
            chosen.append(min(err, key=err.get) if err else "raw")
            if self.min_profile_r2 > 0:  # how well the profile predicts the device's other half
                if chosen[j] not in err:
                    xv = design_x[chosen[j]][has]
                    c, b = ridge_fit(xv[tr], y[tr], self.surrogate_ridge, grams,
                                  ("half", chosen[j], rows))
                    err[chosen[j]] = float(np.mean((xv[~tr] @ c + b - y[~tr]) ** 2))
                r2[j] = 1.0 - err[chosen[j]] / max(float(np.var(y[~tr])), 1e-30)
        if self.min_profile_r2 > 0:  # leave out devices whose profile is mostly noise
            keep = np.flatnonzero(r2 >= self.min_profile_r2)
            if len(keep) < 2:
                keep = np.sort(np.argsort(-r2)[:2])
            devices = [devices[j] for j in keep]
            chosen = [chosen[j] for j in keep]
            Y = Y[:, keep]
        floor = 0.5 * np.nanmin(Y, 0)
        c, icpt, S = fit_profiles(design_x, Y, chosen, floor, self.surrogate_ridge, grams, "all")
        coef, coef_d = c[:, :p_dim], c[:, p_dim]
        X = enc["raw"][0]
        x_mean = X.mean(0)
        x_scale = float(np.sqrt(np.mean(np.sum((X - x_mean) ** 2, 1)))) or 1.0
        L = features(space, keys, "layers")
        l_std = L.std(0)
        l_cols = np.flatnonzero(l_std > 1e-9 * (np.abs(L).mean(0) + 1e-30))
        flops = np.maximum(features(space, keys, "flops")[:, 0], 1.0)
        Fl = np.stack([np.log(flops), flops], 1)
        self.devices_ = devices
        self.device_execution_ = chosen
        self.execution_prior_ = execution_prior(chosen, variants,
                                                [groups.get(d, d) for d in devices])
        self._p = {
            "coef": coef, "coef_d": coef_d, "icpt": icpt, "floor": floor,
            "zl_mean": np.log(S).mean(0), "zl_std": np.log(S).std(0) + 1e-12,
            "zm_mean": S.mean(0), "zm_std": S.std(0) + 1e-12,
            "x_mean": x_mean, "x_scale": np.array(x_scale),
            "l_cols": l_cols, "l_mean": L[:, l_cols].mean(0), "l_std": l_std[l_cols],
            "f_mean": Fl.mean(0), "f_std": Fl.std(0) + 1e-12,
        }
        if pf:
            self._p.update(self._pair_profiles(enc, Y, chosen, floor, grams))
        self._ref = self._design(keys, seed)
        self._keys = None
        self._post = {}
        return self

    def _design(self, keys: list[str], seed: int) -> list[str]:
        rng = np.random.default_rng(seed)
        pool = rng.choice(len(keys), size=min(self.pool_size, len(keys)), replace=False)
        pool_keys = [keys[i] for i in pool]
        a_s, b_s, lam_s = self.design
        s2 = {"zl": 0.5, "zm": 0.5, "ql": 0.0, "qm": 0.0, "x": a_s, "o": 0.0, "l": b_s, "f": 0.0,
              "d": 0.0, "c": 1.0}
        raw = self._blocks(pool_keys, "raw")
        F = self._scaled(raw, s2)
        others = [v for v in self.variants if v != "raw"]
        if not others or self.design_delta <= 0:
            return [pool_keys[i] for i in greedy_design(F, self.n_reference, lam_s)]
        first = greedy_design(F, min(self.design_delta_after, self.n_reference), lam_s)
        cols = []
        for v in others:  # latency (profile units) the meta-training devices lose under v
            delta = (raw["zm"] - self._blocks(pool_keys, v)["zm"]).mean(1)
            cols.append((delta - delta.mean()) / (delta.std() + 1e-12))
        F = np.hstack([F, np.sqrt(self.design_delta) * np.stack(cols, 1)])
        return [pool_keys[i] for i in greedy_design(F, self.n_reference, lam_s, first)]

    def _blocks(self, keys: list[str], variant: str = "raw") -> dict[str, np.ndarray]:
        """Unscaled prior feature blocks of canonical strings, executed under ``variant``."""
        p = self._p
        X, ek, flag = self._encoded(keys, variant)
        S = np.maximum(X @ p["coef"].T + np.outer(flag, p["coef_d"]) + p["icpt"], p["floor"])
        D = len(self.devices_)
        L = features(self.space, ek, "layers")[:, p["l_cols"]]
        q = max(len(p["l_cols"]), 1)
        flops = np.maximum(features(self.space, ek, "flops")[:, 0], 1.0)
        Fl = np.stack([np.log(flops), flops], 1)
        return {
            "zl": (np.log(S) - p["zl_mean"]) / p["zl_std"] / np.sqrt(D),
            "zm": (S - p["zm_mean"]) / p["zm_std"] / np.sqrt(D),
            **self._pair_profile_blocks(X, flag),
            "x": (X - p["x_mean"]) / float(p["x_scale"]),
            "o": self._op_block(X),
            "l": (L - p["l_mean"]) / p["l_std"] / np.sqrt(q),
            "f": (Fl - p["f_mean"]) / p["f_std"] / np.sqrt(2.0),
            "d": flag[:, None],
            "c": np.full((len(keys), 1), _CONST),
        }

    def _op_block(self, X: np.ndarray) -> np.ndarray:
        """Centred operation counts (the encoding summed over positions per choice), in the
        units of the ``x`` block; zero columns for a space without a one-hot encoding."""
        from hwnas.latency.predictors.opcount import op_groups

        groups = op_groups(self.space)
        if groups is None:
            return np.zeros((len(X), 0))
        return (X - self._p["x_mean"]) @ groups[0] / float(self._p["x_scale"])

    def _pairs(self, X: np.ndarray) -> np.ndarray:
        return pair_products(X, encoding_positions(self.space))

    def _pair_profiles(self, enc: dict, Y: np.ndarray, chosen: list[str], floor: np.ndarray,
                       grams: dict) -> dict[str, np.ndarray]:
        """The meta-training devices' profiles with pair terms (each device under the execution
        variant its additive profile chose), and their normalisation."""
        pf = self.pair_profiles
        design = {v: np.hstack([enc[v][0], enc[v][2][:, None], pf * self._pairs(enc[v][0])])
                  for v in set(chosen)}
        p_dim = enc["raw"][0].shape[1]
        coef, icpt, S = fit_profiles(design, Y, chosen, floor, self.surrogate_ridge, grams,
                                      "pairs")
        return {"q_coef": coef[:, :p_dim], "q_coef_d": coef[:, p_dim],
                "q_coef_p": pf * coef[:, p_dim + 1:], "q_icpt": icpt,
                "ql_mean": np.log(S).mean(0), "ql_std": np.log(S).std(0) + 1e-12,
                "qm_mean": S.mean(0), "qm_std": S.std(0) + 1e-12}

    def _pair_profile_blocks(self, X: np.ndarray, flag: np.ndarray) -> dict[str, np.ndarray]:
        """The ``ql`` / ``qm`` blocks (log and ms) of the pair profiles; zero columns without."""
        p = self._p
        if "q_coef" not in p:
            return {"ql": np.zeros((len(X), 0)), "qm": np.zeros((len(X), 0))}
        S = np.maximum(X @ p["q_coef"].T + np.outer(flag, p["q_coef_d"])
                       + self._pairs(X) @ p["q_coef_p"].T + p["q_icpt"], p["floor"])
        D = np.sqrt(len(self.devices_))
        return {"ql": (np.log(S) - p["ql_mean"]) / p["ql_std"] / D,
                "qm": (S - p["qm_mean"]) / p["qm_std"] / D}

    @staticmethod
    def _scaled(blocks: dict[str, np.ndarray], s2: dict[str, float]) -> np.ndarray:
        return np.hstack([np.sqrt(s2[b]) * blocks[b] for b in _BLOCKS])

    def _members(self, variant: str) -> list[tuple[dict[str, float], float]]:
        d = self.disconnected_var if variant != "raw" else 0.0
        # the additive profiles, and the pair profiles where meta-trained: the evidence weighs them
        profiles = [0.0, 1.0] if "q_coef" in self._p else [0.0]
        return [({"zl": 0.5 * (1 - q), "zm": 0.5 * (1 - q), "ql": 0.5 * q, "qm": 0.5 * q,
                  "x": a, "o": o, "l": b, "f": g, "d": d, "c": 1.0}, lam)
                for q, a, o, b, g, lam in itertools.product(profiles, self.alphas, self.opcounts,
                                                            self.betas, self.gammas, self.lams)]

    # -- adaptation --------------------------------------------------------------------------------
    def _fit_member(self, K0: np.ndarray, lam: float, y: np.ndarray,
                    iterations: int | None = None) -> tuple[float, np.ndarray, float, np.ndarray]:
        """Exact GP fit with noise ``lam``, made robust by EM for a Student-t likelihood (each
        measurement's noise variance is ``lam / weight``, ``weight = (nu + 1) / (nu + r**2 /
        (sigma**2 lam))`` from its residual ``r``; at most ``robust_iterations`` rounds, stopped
        once the weights settle). Returns (log marginal likelihood with the scale profiled out,
        dual weights, scale, Cholesky factor)."""
        from scipy.linalg import lapack  # Cholesky and its solve, without numpy's general LU

        n = len(y)
        weight = np.ones(n)
        diag = np.arange(n)
        rounds = self.robust_iterations if iterations is None else iterations
        for it in range(rounds + 1):
            A = K0.copy()
            A[diag, diag] += lam / weight
            chol, info = lapack.dpotrf(A, lower=1, clean=1)
            if info != 0:
                raise np.linalg.LinAlgError("the member's covariance is not positive definite")
            alpha, info = lapack.dpotrs(chol, y, lower=1)
            sig2 = max(float(y @ alpha) / n, 1e-12)
            if it == rounds:
                break
            resid = lam / weight * alpha  # y - posterior mean at the measured architectures
            new = (self.robust_nu + 1.0) / (self.robust_nu + resid ** 2 / (sig2 * lam))
            if np.max(np.abs(new - weight)) < 1e-3:
                break
            weight = new
        ml = -0.5 * n * np.log(sig2) - float(np.log(np.diag(chol)).sum())
        return ml, alpha, sig2, chol

    def _adapt(self, keys: list[str], latency_ms: np.ndarray, seed: int) -> None:
        if not self.is_meta_trained:
            raise UserError(
                f"the meta latency predictor for space {self.space.name} has not been "
                f"meta-trained; use latency.predictors.load_pretrained({self.space.name!r}) or "
                f"meta_fit() it on latency tables of several devices, or use the flops, lut or "
                f"mlp predictor"
            )
        if len(keys) > MAX_ADAPT_MEASUREMENTS:  # the fit is cubic in memory/time: subsample
            pick = np.sort(np.random.default_rng(seed).choice(
                len(keys), MAX_ADAPT_MEASUREMENTS, replace=False))
            keys, latency_ms = [keys[i] for i in pick], latency_ms[pick]
        scale = float(latency_ms.mean())
        y = latency_ms / scale - 1.0
        blocks: dict[str, dict[str, np.ndarray]] = {}
        members = []
        pin = self.pinned_execution
        screen = self.screen_margin > 0 and len(keys) > SCREEN_AFTER
        for variant, prior in self.execution_prior_.items():
            if prior <= 0 or (pin is not None and variant != pin):
                continue
            bl = blocks[variant] = self._blocks(keys, variant)
            grams = {b: bl[b] @ bl[b].T for b in _BLOCKS}
            for s2, lam in self._members(variant):
                K0 = sum(s2[b] * grams[b] for b in _BLOCKS)
                try:
                    ml, alpha, sig2, chol = self._fit_member(K0, lam, y, 0 if screen else None)
                except np.linalg.LinAlgError:
                    continue
                members.append((ml + np.log(prior), variant, s2, lam, alpha, sig2, chol))
        if screen and members:  # the robust fit for the members the Gaussian one keeps in play
            best = max(m[0] for m in members)
            robust = []
            for ml, v, s2, lam, *_rest in members:
                if ml < best - self.screen_margin:
                    continue
                bl = blocks[v]
                K0 = sum(s2[b] * (bl[b] @ bl[b].T) for b in _BLOCKS)
                try:
                    fit = self._fit_member(K0, lam, y)
                except np.linalg.LinAlgError:  # pragma: no cover - lam > 0 on the diagonal
                    continue
                robust.append((fit[0] + np.log(self.execution_prior_[v]), v, s2, lam, *fit[1:]))
            members = robust
        if not members:  # pragma: no cover - K always has lam > 0 on its diagonal
            raise UserError("the meta predictor could not fit these measurements")
        mls = np.array([m[0] for m in members])
        w = np.exp(mls - mls.max())
        w /= w.sum()
        keep = [i for i in np.argsort(-w) if w[i] > 1e-4]
        wk = w[keep] / w[keep].sum()
        kept = [members[i] for i in keep]
        # primal weights of the mixture mean, per variant and block: f = sum new[b] @ W[v][b]
        primal: dict[str, dict[str, np.ndarray]] = {}
        for wi, (_ml, v, s2, _lam, alpha, _sig2, _chol) in zip(wk, kept):
            for b in _BLOCKS:
                term = wi * s2[b] * (blocks[v][b].T @ alpha)
                primal.setdefault(v, {})[b] = primal.get(v, {}).get(b, 0.0) + term
        self._post = {"scale": scale, "blocks": blocks, "primal": primal,
                      "members": [(wi, v, s2, alpha, sig2, chol, lam) for wi, (
                          _ml, v, s2, lam, alpha, sig2, chol) in zip(wk, kept)],
                      "execution_posterior": {v: float(sum(wi for wi, m in zip(w, members)
                                                           if m[1] == v)) for v in blocks},
                      "floor": 0.01 * float(latency_ms.min())}
        if self.residual != "off" and len(keys) >= RESIDUAL_MIN:
            self._post["residual"] = self._fit_residual(keys, latency_ms, seed)

    def loo_predictions(self) -> np.ndarray:
        """Each measurement's leave-one-out prediction (ms) by the adapted prior: every
        member's exact GP leave-one-out mean (closed form from its factor), mixed with the
        members' weights from all measurements (not re-weighed per left-out point)."""
        self._require_adapted()
        post = self._post
        y = self._latency / post["scale"] - 1.0 if len(self._latency) == len(
            post["members"][0][3]) else None
        if y is None:  # subsampled beyond MAX_ADAPT_MEASUREMENTS: not the measurements' order
            raise UserError("leave-one-out predictions need the adaptation's own measurements")
        return self._loo(y)

    def _loo(self, y: np.ndarray) -> np.ndarray:
        from scipy.linalg import lapack

        post = self._post
        mu = np.zeros(len(y))
        for wi, _v, _s2, alpha, _sig2, chol, _lam in post["members"]:
            inv, _info = lapack.dpotri(chol, lower=1)
            mu += wi * (y - alpha / np.diag(inv))
        return np.maximum((1.0 + mu) * post["scale"], post["floor"])

    def _fit_residual(self, keys: list[str], latency_ms: np.ndarray,
                      seed: int) -> dict[str, Any]:
        """The residual learner: fitted on the log ratio of each measurement to the prior's
        leave-one-out prediction of it (what the prior misses on architectures it has not
        seen), weighed by its own cross-validation on those residuals (the least-squares
        weight of its out-of-fold predictions, clipped to [0, 1]): with few measurements or
        nothing the prior misses the weight is 0, and it grows as the measurements show a
        pattern the prior cannot follow."""
        y = latency_ms / self._post["scale"] - 1.0
        r = np.log(latency_ms) - np.log(self._loo(y))
        X = self._residual_features(keys)
        n = len(r)
        parts = np.array_split(np.random.default_rng(seed).permutation(n),
                               min(RESIDUAL_FOLDS, n))
        if self.residual == "blend":
            return fit_blend(X, np.log(latency_ms), r, parts, seed)
        cv = np.empty(n)
        for part in parts:
            fit = np.setdiff1d(np.arange(n), part)
            cv[part] = self._residual_model(X[fit], r[fit], seed).predict(X[part])
        weight = float(np.clip((r @ cv) / max(float(cv @ cv), 1e-12), 0.0, 1.0))
        # a gain that only some folds see is a few measurements' noise, not a pattern
        better = sum(float(np.sum(r[q] ** 2 - (r[q] - weight * cv[q]) ** 2)) > 0 for q in parts)
        if better < len(parts) - RESIDUAL_FOLDS_AGAINST:
            weight = 0.0
        cv_gain = float(np.mean(r ** 2) - np.mean((r - weight * cv) ** 2))
        model = self._residual_model(X, r, seed) if weight > 0 else None
        return {"weight": weight, "model": model, "cv_gain": cv_gain,
                "rms": float(np.sqrt(np.mean(r ** 2)))}

    def _residual_features(self, keys: list[str]) -> np.ndarray:
        X = features(self.space, keys, "encode")
        if self.residual == "kernel":
            return X
        if self.residual == "mixed":
            return np.hstack([X, cell_features(self.space, keys, self._p["l_cols"])])
        L = np.log1p(np.maximum(features(self.space, keys, "layers")[:, self._p["l_cols"]], 0))
        flops = np.log(np.maximum(features(self.space, keys, "flops")[:, :1], 1.0))
        return np.hstack([X, L, flops])

    def _residual_model(self, X: np.ndarray, r: np.ndarray, seed: int) -> Any:
        return residual_model(self.residual, self.space, X, r, seed)

    def _residual_factor(self, keys: list[str], prior: np.ndarray) -> np.ndarray:
        """exp(weight x the residual learner's prediction): what multiplies the prior's
        prediction ``prior`` (``blend``: (own / prior) ** weight)."""
        res = self._post.get("residual")
        if not res or res["model"] is None:
            return np.ones(len(keys))
        pred = res["model"].predict(self._residual_features(keys))
        if res.get("blend"):
            pred = pred - np.log(prior)
        return np.exp(res["weight"] * pred)

    def _mean(self, keys: list[str]) -> tuple[np.ndarray, dict[str, dict[str, np.ndarray]]]:
        post = self._post
        new = {v: self._blocks(keys, v) for v in post["primal"]}
        f = np.zeros(len(keys))
        for v, W in post["primal"].items():
            f += sum(new[v][b] @ W[b] for b in _BLOCKS)
        return f, new

    def settling_archs(self, candidates: Sequence[Any], n: int) -> list[str]:
        """The ``n`` candidates whose latency the adapted predictor expects to differ most
        between the execution variants still in play (each variant's own posterior mean,
        relative to the measured level): measuring them settles which network the device runs
        when the measurements so far leave it open (``fewshot.execution_note``). Empty when one
        variant holds all the posterior weight."""
        self._require_adapted()
        post = self._post
        mass: dict[str, float] = {}
        for wi, v, *_rest in post["members"]:
            mass[v] = mass.get(v, 0.0) + wi
        live = [v for v in mass if mass[v] > 1e-3]
        if len(live) < 2 or n <= 0:
            return []
        keys = list(dict.fromkeys(arch_strings(self.space, candidates)))
        own = np.stack([sum(self._blocks(keys, v)[b] @ post["primal"][v][b] for b in _BLOCKS)
                        / mass[v] for v in live])  # variant x candidate, in units of the level
        spread = own.max(0) - own.min(0)
        # greedy, each pick discounted by its likeness to the ones already picked (the share
        # of encoding choices they have in common), so the picks are not near neighbours
        X = features(self.space, keys, "encode")
        norm = np.maximum(np.einsum("ij,ij->i", X, X), 1e-12)
        like = np.zeros(len(keys))
        picked: list[int] = []
        while len(picked) < min(n, len(keys)):
            score = np.where(spread > 0, spread * (1.0 - like), -np.inf)
            score[picked] = -np.inf
            i = int(np.argmax(score))
            if not np.isfinite(score[i]):
                break
            picked.append(i)
            like = np.maximum(like, (X @ X[i]) / np.sqrt(norm * norm[i]))
        return [keys[i] for i in picked]

    def predict(self, archs: Sequence[Any]) -> np.ndarray:
        """Predicted latency (ms); faster than :meth:`predict_with_std` (no variance)."""
        self._require_adapted()
        keys = arch_strings(self.space, archs)
        f, _ = self._mean(keys)
        prior = np.maximum((1.0 + f) * self._post["scale"], self._post["floor"])
        return prior * self._residual_factor(keys, prior)

    def _predict(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        post = self._post
        f, new = self._mean(keys)
        cross = {v: {b: new[v][b] @ post["blocks"][v][b].T for b in _BLOCKS} for v in new}
        sq = {v: {b: np.sum(new[v][b] ** 2, 1) for b in _BLOCKS} for v in new}
        second = np.zeros(len(keys))
        for wi, v, s2, alpha, sig2, chol, lam in post["members"]:
            k = sum(s2[b] * cross[v][b] for b in _BLOCKS)  # N x n
            mu = k @ alpha
            u = np.linalg.solve(chol, k.T)  # n x N
            var = sum(s2[b] * sq[v][b] for b in _BLOCKS) - np.sum(u ** 2, 0)
            # + lam: the member's typical measurement noise (the scale of its Student-t), so
            # the deviation is that of a *measurement*, which is what a table or a user compares
            second += wi * (sig2 * (np.maximum(var, 0.0) + lam) + mu ** 2)
        var = np.maximum(second - f ** 2, 0.0)
        scale = post["scale"]
        prior = np.maximum((1.0 + f) * scale, post["floor"])
        factor = self._residual_factor(keys, prior)
        return prior * factor, np.sqrt(var) * scale * factor

    def explain(self) -> dict[str, Any]:
        """What the adaptation concluded: the posterior weight of each hyper-parameter setting
        (top 5), of each execution variant (does the device run the network as written, or
        without its dead operations?), and how much each meta-training device's profile
        contributes (relative weight of its log and ms profile in the mixture mean)."""
        if not self.is_adapted:
            raise UserError("the meta predictor has not been adapted; nothing to explain")
        post = self._post
        top = [{"weight": float(m[0]), "execution": m[1], "alpha": m[2]["x"],
                "beta": m[2]["l"], "gamma": m[2]["f"], "opcount": m[2]["o"],
                "profiles": "pairs" if m[2]["ql"] > 0 else "additive", "lambda": m[6]}
               for m in post["members"][:5]]
        total = np.zeros(len(self.devices_))
        for W in post["primal"].values():
            total += np.abs(W["zl"]) + np.abs(W["zm"])
            if W["ql"].size:
                total += np.abs(W["ql"]) + np.abs(W["qm"])
        total = total / (total.sum() or 1.0)
        return {"hyper_posterior": top,
                "execution_posterior": dict(post["execution_posterior"]),
                "pinned_execution": self.pinned_execution,
                "residual": ({k: post["residual"][k] for k in ("weight", "cv_gain", "rms")}
                             if post.get("residual") else None),
                "device_weights": {d: float(t) for d, t in zip(self.devices_, total)},
                "device_execution": dict(zip(self.devices_, self.device_execution_))}

    # -- files -------------------------------------------------------------------------------------
    def _state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta = {"alphas": list(self.alphas), "betas": list(self.betas),
                "gammas": list(self.gammas), "lams": list(self.lams),
                "design": list(self.design), "n_reference": self.n_reference,
                "pool_size": self.pool_size, "surrogate_ridge": self.surrogate_ridge,
                "execution": None if self.execution is None else list(self.execution),
                "disconnected_var": self.disconnected_var, "design_delta": self.design_delta,
                "design_delta_after": self.design_delta_after,
                "robust_iterations": self.robust_iterations, "robust_nu": self.robust_nu,
                "opcounts": list(self.opcounts), "pair_profiles": self.pair_profiles,
                "min_profile_r2": self.min_profile_r2, "residual": self.residual,
                "screen_margin": self.screen_margin,
                "devices": list(self.devices_), "device_execution": list(self.device_execution_),
                "execution_prior": dict(self.execution_prior_),
                "pinned_execution": self.pinned_execution,
                "reference_archs": list(self._ref)}
        return meta, dict(self._p)

    @classmethod
    def _from_state(cls, space: Any, meta: dict[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> MetaPredictor:
        hyper = {k: meta[k] for k in ("alphas", "betas", "gammas", "lams", "design", "n_reference",
                                      "pool_size", "surrogate_ridge", "execution",
                                      "disconnected_var", "design_delta", "design_delta_after",
                                      "robust_iterations", "robust_nu", "opcounts",
                                      "pair_profiles", "min_profile_r2", "residual",
                                      "screen_margin")
                 if k in meta}
        hyper.setdefault("pair_profiles", 0.0)  # files written before pair profiles existed
        hyper.setdefault("residual", "off")  # ... and before the residual learner
        hyper.setdefault("screen_margin", 0.0)
        obj = cls(space, **hyper)
        obj.devices_ = list(meta.get("devices", []))
        obj._ref = list(meta.get("reference_archs", []))
        obj._p = {k: np.asarray(v) for k, v in arrays.items()}
        if not obj.devices_:
            return obj
        needed = {"coef", "floor", "zl_mean", "zl_std", "zm_mean", "zm_std", "x_mean", "x_scale",
                  "l_cols", "l_mean", "l_std", "f_mean", "f_std", "icpt", "coef_d"}
        if not needed <= set(obj._p):
            raise UserError(f"meta predictor file lacks {sorted(needed - set(obj._p))}")
        if obj._p["coef"].shape[1] != space.feature_dim:
            raise UserError(
                f"meta predictor was trained on encodings of {obj._p['coef'].shape[1]} "
                f"features; space {space.name} has {space.feature_dim}"
            )
        obj.device_execution_ = list(meta.get("device_execution",
                                              ["raw"] * len(obj.devices_)))
        obj.execution_prior_ = {str(k): float(v)
                                for k, v in (meta.get("execution_prior") or
                                             {"raw": 1.0}).items()}
        bad = [v for v in obj.execution_prior_ if v not in execution_variants(space)]
        if bad:
            raise UserError(f"meta predictor file uses execution variant {bad[0]!r}, which "
                            f"space {space.name} does not have")
        pinned = meta.get("pinned_execution")
        return obj.pin_execution(None if pinned is None else str(pinned))
