"""Predictors adapted by an optimal design (:class:`DesignedPredictor`): the few
architectures a new device measures first are chosen greedily (:func:`greedy_design`) to pin
down what the predictor's prior leaves open, and fitted by ridge regression. The meta predictor
(:mod:`hwnas.latency.predictors.meta`) and the low-rank one (:mod:`.lowrank`) build on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from hwnas.latency.predictors.base import LatencyPredictor, check_table
from hwnas.latency.predictors.features import arch_strings

from hwnas.core.errors import UserError

__all__ = ["DesignedPredictor", "MAX_ADAPT_MEASUREMENTS", "fit_profiles", "greedy_design",
           "ridge_fit"]


def greedy_design(F: np.ndarray, n: int, lam: float,
                  chosen: Sequence[int] = ()) -> list[int]:
    """Greedy I-optimal design: indices of ``n`` rows of ``F`` (features of a candidate pool;
    prior ``f = F w``, ``w ~ N(0, I)``, noise ``lam``) that minimise the average posterior
    variance over the pool, chosen one at a time, continuing after the rows ``chosen``
    (which are returned first)."""
    m = F.shape[1]
    M = F.T @ F / len(F)
    S = np.eye(m)
    out = [int(j) for j in chosen]
    for j in out:
        s = S @ F[j]
        S = S - np.outer(s, s) / (lam + F[j] @ s)
    while len(out) < min(n, len(F)):
        A = F @ S
        gain = np.sum((A @ M) * A, 1) / (lam + np.sum(A * F, 1))
        gain[out] = -np.inf
        j = int(np.argmax(gain))
        out.append(j)
        s = S @ F[j]
        S = S - np.outer(s, s) / (lam + F[j] @ s)
    return out


def ridge_fit(X: np.ndarray, y: np.ndarray, ridge: float,
           cache: dict | None = None, key: Any = None) -> tuple[np.ndarray, float]:
    """Ridge regression with a free intercept: ``(coef, intercept)``. With ``cache`` and
    ``key`` (naming ``X``), the centred Gram matrix is computed once per key: the devices of
    one table share their architectures, and the Gram is the fit's cost."""
    if cache is not None and key in cache:
        m, G = cache[key]
    else:
        m = X.mean(0)
        G = (X - m).T @ (X - m)
        if cache is not None:
            cache[key] = (m, G)
    coef = np.linalg.solve(G + ridge * np.eye(X.shape[1]), (X - m).T @ (y - y.mean()))
    return coef, float(y.mean() - m @ coef)


def fit_profiles(design: Mapping[str, np.ndarray], Y: np.ndarray, chosen: list[str],
                  floor: np.ndarray, ridge: float, grams: dict,
                  tag: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each meta-training device's profile: a ridge fit of its measured cells (not NaN) on the
    ``design`` of the execution variant it runs (``chosen``). Returns the coefficients
    (devices x columns), intercepts and the profiles' latencies (architectures x devices, at
    least ``floor``); Gram matrices shared through ``grams`` under ``tag``."""
    coef, icpt = np.zeros((Y.shape[1], design[chosen[0]].shape[1])), np.zeros(Y.shape[1])
    for j, v in enumerate(chosen):
        has = ~np.isnan(Y[:, j])
        coef[j], icpt[j] = ridge_fit(design[v][has], Y[has, j], ridge, grams,
                                  (tag, v, has.tobytes()))
    S = np.stack([np.maximum(design[v] @ coef[j] + icpt[j], floor[j])
                  for j, v in enumerate(chosen)], 1)
    return coef, icpt, S


#: measurements one adaptation fits at most (a seeded subsample of more): the Gaussian-process
#: fit is cubic in them over some 128 members (500 took 21 s on mbv3-tiny and 85 s on nb201 on a
#: loaded 2-core machine; 2000 ran past 15 minutes), and a few hundred already settle it
MAX_ADAPT_MEASUREMENTS = 300


class DesignedPredictor(LatencyPredictor):
    """A meta-trained predictor that chooses its own reference architectures (``_ref``, by
    ``_design(keys, seed)``) from the devices it learned from (``devices_``)."""

    devices_: list
    _ref: list[str]

    @staticmethod
    def _meta_inputs(space: Any, archs: Sequence[Any], table: Mapping[str, np.ndarray],
                     groups: Mapping[str, str] | None = None
                     ) -> tuple[dict[str, np.ndarray], list[str], dict[str, str]]:
        """The checked meta-training table (NaN = not measured), the architectures' keys and
        the device groups: UserError for fewer than 2 devices, a repeated architecture or a
        group naming a device the table lacks."""
        table = check_table(archs, table, allow_missing=True)
        if len(table) < 2:
            raise UserError(f"meta-training needs the latency tables of at least 2 devices, got "
                            f"{len(table)}")
        keys = arch_strings(space, archs)
        if len(set(keys)) != len(keys):
            raise UserError("meta-training architectures repeat; expected each once")
        groups = dict(groups or {})
        unknown = sorted(set(groups) - set(table))
        if unknown:
            raise UserError(f"groups names device {unknown[0]!r}, which the table does not have")
        return table, keys, groups

    @property
    def is_meta_trained(self) -> bool:
        return bool(self.devices_)

    @property
    def reference_archs(self) -> list[str] | None:
        return list(self._ref) if self.is_meta_trained else None

    def redesign(self, archs: Sequence[Any], seed: int) -> list[str]:
        """Choose the reference architectures again, among ``archs`` only (e.g. the ones a
        latency table holds, or the models a user can run); returns and keeps them."""
        if not self.is_meta_trained:
            raise UserError(f"the {self.name} predictor has not been meta-trained; nothing to "
                            f"redesign")
        keys = list(dict.fromkeys(arch_strings(self.space, archs)))
        if len(keys) < 2:
            raise UserError(f"redesign needs at least 2 architectures, got {len(keys)}")
        self._ref = self._design(keys, seed)
        return list(self._ref)

    def _design(self, keys: list[str], seed: int) -> list[str]:
        raise NotImplementedError
