"""The screening surrogate: a GP with a squared-exponential kernel on the space's
encoding (:meth:`SearchSpace.encode`, columns scaled to [0, 1]; for one-hot encodings this is
an exponentiated Hamming kernel), a constant mean, the output scale profiled out and the
length-scale and noise chosen by marginal likelihood on a small grid. The worst ``floor_quantile``
of the observed values is clipped to that quantile before fitting: what matters is the good
region, and a few broken architectures (1 % accuracy) would otherwise dominate a stationary
kernel. ``warp`` may then map the observed values monotonically onto a Gaussian-like scale
(``"copula"``: normal scores of their ranks; ``"power"``: a Yeo-Johnson transform fitted by
maximum likelihood), so that the skewed top of the accuracies, where a front lies, is spread
out for the stationary kernel. Hyper-parameters are refitted whenever the number of
evaluations has grown by ``refit_growth``; in between, each new evaluation is added to the
Cholesky factor and to the pool's cross-covariances in O(n·N) (n evaluations, N candidates), so
a step stays in the tens of milliseconds at n = 1000, N = 15,625.

With ``ard=True`` each encoding column gets its own length-scale (automatic relevance
determination): after the grid search, the column weights and the noise are refined by L-BFGS on
the same marginal likelihood, with a log-normal prior that holds each weight near the grid's
isotropic value, so that a few dozen evaluations cannot make one column decide everything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.linalg import cho_solve, solve_triangular
from scipy.optimize import minimize
from scipy.special import ndtri
from scipy.stats import rankdata, yeojohnson

__all__ = ["PoolGP", "WARPS"]

#: output warps of :class:`PoolGP` (after the floor): none, normal scores of the ranks, Yeo-Johnson
WARPS = ("none", "copula", "power")


class PoolGP:
    """A GP regression of one objective over a fixed candidate pool, updated incrementally.

    ``pool`` holds the candidates' features (N x d). Training points are given as feature rows
    too (they need not be in the pool). Keeps the Cholesky factor ``L`` of the training kernel
    (unit output scale) and ``V = L^-1 K(train, pool)``, so that the posterior mean
    ``m + V^T L^-1 (y - m)`` and the variance ``s2 (1 - colsum(V^2))`` of every candidate cost
    O(n N), and adding one training point costs O(n N) as well.
    """

    def __init__(self, pool: np.ndarray, *, length_factors: Sequence[float],
                 noises: Sequence[float], floor_quantile: float, max_fit: int = 400,
                 trend: np.ndarray | None = None, ard: bool = False,
                 ard_prior_sd: float = 1.0, warp: str = "none") -> None:
        self.max_fit = int(max_fit)
        if warp not in WARPS:
            raise ValueError(f"warp {warp!r}; expected one of {WARPS}")
        self.warp = warp
        #: per-column length-scales (``ard``), a log-normal prior of this deviation around the
        #: isotropic grid value
        self.ard, self.ard_prior_sd = bool(ard), float(ard_prior_sd)
        #: the column weights of the kernel's distance (all 1 without ARD)
        self.weights = np.ones(pool.shape[1])
        self.length_factors = tuple(float(v) for v in length_factors)
        self.noises = tuple(float(v) for v in noises)
        self.floor_quantile = float(floor_quantile)
        self.X = np.zeros((0, pool.shape[1]))
        self.H = np.zeros((0, 0))  # trend features of the training points
        self.beta = np.zeros(0)
        self._cap = 0
        self._L = np.zeros((0, 0))
        self._V = np.zeros((0, len(pool)))
        self.set_pool(pool, trend)
        self.two_l2 = 1.0
        self.noise = self.noises[0]

    # -- kernel ----------------------------------------------------------------------------------
    @staticmethod
    def _d2(a: np.ndarray, b: np.ndarray, b_sq: np.ndarray | None = None) -> np.ndarray:
        if b_sq is None:
            b_sq = (b * b).sum(1)
        d2 = (a * a).sum(1)[:, None] + b_sq[None, :] - 2.0 * a @ b.T
        return np.maximum(d2, 0.0)

    def _k(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        w = np.sqrt(self.weights)
        return np.exp(-self._d2(a * w, b * w) / self.two_l2)

    def _k_pool(self, a: np.ndarray) -> np.ndarray:
        return np.exp(-self._d2(a * np.sqrt(self.weights), self._pool_w, self._pool_sq)
                      / self.two_l2)

    def _weigh_pool(self) -> None:
        """The pool's features scaled by the column weights, and their squared norms."""
        self._pool_w = self.pool * np.sqrt(self.weights)
        self._pool_sq = (self._pool_w * self._pool_w).sum(1)

    def set_pool(self, pool: np.ndarray, trend: np.ndarray | None = None) -> None:
        """Replace the candidates (the factor is rebuilt by the next :meth:`refit`);
        ``trend`` (N x k, optional) are the candidates' features of a linear mean."""
        self.pool = np.asarray(pool, dtype=np.float64)
        self.pool_trend = (np.zeros((len(self.pool), 0)) if trend is None
                           else np.asarray(trend, dtype=np.float64).reshape(len(self.pool), -1))
        self._weigh_pool()
        n = len(self.pool)
        sub = self.pool[:: max(1, n // 400)]
        d2 = self._d2(sub, sub)
        positive = d2[d2 > 0]
        #: typical squared distance between candidates: the unit of the length-scale grid
        self.d2_scale = float(np.median(positive)) if len(positive) else 1.0
        self._V = np.zeros((self._cap, n))
        self._var = np.ones(n)

    @property
    def n(self) -> int:
        return len(self.X)

    def transform(self, y: np.ndarray) -> np.ndarray:
        """The fitted targets: the worst ``floor_quantile`` clipped (values are maximised),
        then warped (``warp``; order kept, ties stay ties)."""
        y = np.asarray(y, float)
        if self.floor_quantile > 0 and len(y) >= 5:
            y = np.maximum(y, np.quantile(y, self.floor_quantile))
        if self.warp == "none" or len(y) < 3 or np.ptp(y) <= 0:
            return y
        if self.warp == "copula":
            return ndtri((rankdata(y) - 0.5) / len(y))
        z = (y - y.mean()) / y.std()
        return yeojohnson(z)[0]

    # -- fitting ---------------------------------------------------------------------------------
    def _trend_fit(self, t: np.ndarray, H: np.ndarray) -> np.ndarray:
        """Coefficients of the mean ``b0 + H b`` by ridge least squares (intercept free)."""
        A = np.hstack([np.ones((len(t), 1)), H])
        reg = 1e-3 * len(t) * np.eye(A.shape[1])
        reg[0, 0] = 0.0
        return np.linalg.solve(A.T @ A + reg, A.T @ t)

    def _mean(self, H: np.ndarray) -> np.ndarray:
        return self.beta[0] + H @ self.beta[1:]

    def refit(self, X: np.ndarray, y: np.ndarray, H: np.ndarray | None = None) -> None:
        """Choose length-scale and noise by marginal likelihood (output scale and constant mean
        profiled out) and rebuild the factor and the pool cross-covariances for ``X``; ``H``
        are the training points' trend features (the pool's were given to :meth:`set_pool`):
        the mean is then linear in them, fitted by least squares before the GP."""
        X = np.asarray(X, float)
        t = self.transform(y)
        n = len(t)
        k = self.pool_trend.shape[1]
        self.H = np.zeros((n, k)) if H is None else np.asarray(H, float).reshape(n, k)
        self.beta = self._trend_fit(t, self.H) if k and n > k + 2 else \
            np.concatenate([[0.0], np.zeros(k)])
        t = t - (self._mean(self.H) if k and n > k + 2 else 0.0)
        # the grid search looks at an evenly spread subset of at most ``max_fit`` points
        sub = np.linspace(0, n - 1, min(n, self.max_fit)).round().astype(int)
        d2 = self._d2(X[sub], X[sub])
        best: tuple[float, float, float] | None = None
        r = t[sub] - t[sub].mean()
        m = len(sub)
        eye = np.eye(m)
        for f in self.length_factors:
            K0 = np.exp(-d2 / (f * self.d2_scale))
            for lam in self.noises:
                try:
                    L = np.linalg.cholesky(K0 + lam * eye)
                except np.linalg.LinAlgError:
                    continue
                w = solve_triangular(L, r, lower=True, check_finite=False)
                s2 = max(float(w @ w) / m, 1e-300)
                ml = -0.5 * m * math.log(s2) - float(np.log(np.diag(L)).sum())
                if best is None or ml > best[0]:
                    best = (ml, f, lam)
        if best is None:  # pragma: no cover - the largest noise always factors
            best = (0.0, self.length_factors[-1], 1.0)
        self.two_l2, self.noise = best[1] * self.d2_scale, best[2]
        self.weights = np.ones(X.shape[1])
        if self.ard and m > 2:
            self.weights, self.noise = self._ard_fit(X[sub], r, self.noise)
        self._weigh_pool()
        self._cap = max(n + n // 4 + 16, 64)
        self.X = X.copy()
        L = np.linalg.cholesky(self._k(X, X) + self.noise * np.eye(n))
        self._L = np.zeros((self._cap, self._cap))
        self._L[:n, :n] = L
        V = solve_triangular(L, self._k_pool(X), lower=True, check_finite=False)
        self._V = np.zeros((self._cap, len(self.pool)))
        self._V[:n] = V
        self._var = 1.0 - np.einsum("ij,ij->j", V, V)

    def _ard_fit(self, X: np.ndarray, r: np.ndarray, noise: float) -> tuple[np.ndarray, float]:
        """Column weights and noise that maximise the profiled marginal likelihood of the
        centred targets ``r`` at ``X`` plus the log-normal prior of the weights (L-BFGS from
        the isotropic grid choice: weights 1, ``noise``); where it fails, that choice."""
        d = X.shape[1]
        live = np.flatnonzero(np.ptp(X, axis=0) > 0)  # a constant column has nothing to say
        D = (X[:, None, live] - X[None, :, live]) ** 2 / self.two_l2  # m x m x d'
        prior = self.ard_prior_sd ** 2

        def nll(theta: np.ndarray) -> tuple[float, np.ndarray]:
            return _ard_nll(theta, D, r, prior)
        theta0 = np.append(np.zeros(len(live)), math.log(noise))
        lo, hi = math.log(min(self.noises)), math.log(max(self.noises))
        bounds = [(-5.0, 5.0)] * len(live) + [(lo, hi)]
        try:
            res = minimize(nll, theta0, jac=True, method="L-BFGS-B", bounds=bounds,
                           options={"maxiter": 60})
            theta = res.x if np.all(np.isfinite(res.x)) and res.fun <= nll(theta0)[0] \
                else theta0
        except (ValueError, np.linalg.LinAlgError):  # pragma: no cover - keep the grid's
            theta = theta0
        w = np.ones(d)
        w[live] = np.exp(theta[:-1])
        return w, math.exp(theta[-1])

    def add(self, x: np.ndarray, h: np.ndarray | None = None) -> None:
        """Add one training point (``h``: its trend features) with the current
        hyper-parameters and trend coefficients (O(n N))."""
        x = np.asarray(x, float).reshape(1, -1)
        k = self.pool_trend.shape[1]
        self.H = np.vstack([self.H, np.zeros((1, k)) if h is None
                            else np.asarray(h, float).reshape(1, k)])
        n = self.n
        if n + 1 > self._cap:
            cap = n + 1 + (n + 1) // 4 + 16
            L = np.zeros((cap, cap))
            L[:n, :n] = self._L[:n, :n]
            V = np.zeros((cap, len(self.pool)))
            V[:n] = self._V[:n]
            self._L, self._V, self._cap = L, V, cap
        kp = self._k_pool(x)[0]
        if n:
            kt = self._k(x, self.X)[0]
            l = solve_triangular(self._L[:n, :n], kt, lower=True, check_finite=False)
            d = math.sqrt(max(1.0 + self.noise - float(l @ l), 1e-12))
            v = (kp - l @ self._V[:n]) / d
            self._L[n, :n] = l
        else:
            d = math.sqrt(1.0 + self.noise)
            v = kp / d
        self._L[n, n] = d
        self._V[n] = v
        self._var -= v * v
        self.X = np.vstack([self.X, x])

    def predict(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of every pool candidate, given the observed
        values ``y`` of the training points (in the order they were added)."""
        t = self.transform(y)
        n = self.n
        if self.pool_trend.shape[1] and np.any(self.beta[1:]):
            t = t - self._mean(self.H)
            base = self._mean(self.pool_trend)
        else:
            base = 0.0
        m = float(t.mean())
        w = solve_triangular(self._L[:n, :n], t - m, lower=True, check_finite=False)
        s2 = max(float(w @ w) / n, 1e-300)
        mu = base + m + w @ self._V[:n]
        sd = np.sqrt(np.maximum(self._var, 1e-12) * s2)
        return mu, sd


def _ard_nll(theta: np.ndarray, D: np.ndarray, r: np.ndarray,
             prior_var: float) -> tuple[float, np.ndarray]:
    """Negative profiled log marginal likelihood (output scale profiled out) of targets ``r``
    under the kernel ``exp(-D @ w) + lam I`` plus the prior ``|log w|^2 / (2 prior_var)``,
    and its gradient; ``theta = (log w, log lam)``, ``D`` the m x m x d squared column
    differences (divided by the isotropic ``2 l^2``)."""
    m = len(r)
    eye = np.eye(m)
    w, lam = np.exp(theta[:-1]), math.exp(theta[-1])
    K0 = np.exp(-D @ w)
    try:
        c = np.linalg.cholesky(K0 + lam * eye)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros_like(theta)
    alpha = cho_solve((c, True), r, check_finite=False)
    s2 = max(float(r @ alpha) / m, 1e-300)
    val = 0.5 * m * math.log(s2) + float(np.log(np.diag(c)).sum())
    # d val / d K = 0.5 (K^-1 - alpha alpha^T / s2)
    G = 0.5 * (cho_solve((c, True), eye, check_finite=False) - np.outer(alpha, alpha) / s2)
    grad_w = -np.einsum("ij,ijk->k", G * K0, D) * w
    grad_lam = float(np.trace(G)) * lam
    val += float(theta[:-1] @ theta[:-1]) / (2 * prior_var)
    grad_w = grad_w + theta[:-1] / prior_var
    return val, np.append(grad_w, grad_lam)
