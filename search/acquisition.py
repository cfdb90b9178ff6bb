"""Closed-form acquisition functions over Gaussian predictions: expected improvement (one
objective) and the exact 2-D expected hypervolume improvement, where the cost may be known or
Gaussian too."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

__all__ = ["expected_hvi_2d", "expected_improvement"]

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """``E[max(0, G - best)]`` for ``G ~ N(mu, sd^2)`` (maximised)."""
    sd = np.maximum(sd, 1e-12)
    d = mu - best
    z = d / sd
    return sd * _INV_SQRT_2PI * np.exp(-0.5 * z * z) + d * ndtr(z)


def _lower_partial(b: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """``E[max(0, b - X)]`` for ``X ~ N(mu, sd^2)`` (``sd`` may be 0; ``b`` may be -inf)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = b - mu
        z = d / sd
        out = sd * _INV_SQRT_2PI * np.exp(-0.5 * z * z) + d * ndtr(z)
        exact = np.maximum(d, 0.0)
    out = np.where(sd > 0, out, exact)
    return np.where(np.isneginf(b), 0.0, out)


def expected_hvi_2d(mu: np.ndarray, sd: np.ndarray, cost: np.ndarray, front_cost: np.ndarray,
                    front_gain: np.ndarray, ref_cost: float, ref_gain: float,
                    cost_sd: np.ndarray | None = None) -> np.ndarray:
    """Exact expected hypervolume improvement of candidates whose gain is ``N(mu, sd^2)``
    (maximised) and whose cost is ``N(cost, cost_sd^2)`` (minimised; known exactly when
    ``cost_sd`` is ``None``), independent, over a front given by :func:`front_indices_2d`
    (cost ascending) and a reference point.

    The front's staircase stands at level ``y_k`` on the cost interval ``[b_{k-1}, b_k)``; a
    candidate ``(G, C)`` adds ``max(0, b_k - max(b_{k-1}, C)) * max(0, G - y_k)`` there. With G
    and C independent the expectation factorizes per interval:
    ``(P(b_k) - P(b_{k-1})) * E[max(0, G - y_k)]`` with ``P(b) = E[max(0, b - C)]``, and both
    factors have the closed form ``s phi(z) + d Phi(z)``.
    """
    mu, sd, cost = (np.asarray(v, float) for v in (mu, sd, cost))
    sd = np.maximum(sd, 1e-12)
    csd = np.zeros(len(cost)) if cost_sd is None else np.maximum(np.asarray(cost_sd, float), 0)
    fc = np.asarray(front_cost, float)
    fg = np.asarray(front_gain, float)
    keep = (fc < ref_cost) & (fg > ref_gain)
    fc, fg = fc[keep], fg[keep]
    bounds = np.concatenate([[-np.inf], fc, [ref_cost]])  # interval k: [bounds_k, bounds_k+1)
    lev = np.concatenate([[ref_gain], fg])
    out = np.zeros(len(mu))
    # only candidates that can beat the staircase where they may stand can improve anything
    optimistic_cost = cost - 6.0 * csd
    level_here = lev[np.searchsorted(fc, optimistic_cost, side="right")]
    live = np.flatnonzero((optimistic_cost < ref_cost) & (mu + 6.0 * sd > level_here))
    if len(live) == 0:
        return out
    m, s = mu[live, None], sd[live, None]
    P = _lower_partial(bounds[None, :], cost[live, None], csd[live, None])  # live x (K + 2)
    width = np.maximum(np.diff(P, axis=1), 0.0)  # expected width of each interval
    d = m - lev[None, :]
    z = d / s
    out[live] = np.sum(width * (s * _INV_SQRT_2PI * np.exp(-0.5 * z * z) + d * ndtr(z)), 1)
    return out
