"""The screening sampler's start-up on the cheap front: which candidates to evaluate before the
surrogate has anything to learn from.

Before the first accuracy is known, everything else is: every candidate's cheap objective
(latency predicted or estimated) and its size (FLOPs, from the space's layer list). Larger
networks are more accurate, so the candidates that are non-dominated in (low cost, high FLOPs)
- the *cheap front* - are the best guess of the accuracy front, and evaluating a spread of them
first both starts the hypervolume high and gives the surrogate its first points where the front
is. Deterministic: the start-up does not depend on the seed's luck. The surrogate's trend reads
the same guess (:func:`accuracy_guess`), or the caller's accuracy prior where one is given.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from hwnas.search.pareto import front_layers

from hwnas.core.errors import UserError

__all__ = ["PriorResidual", "accuracy_guess", "cheap_front_plan", "size_prior"]

#: FLOPs of candidates by space and canonical string: a sampler per seed need not recount them
_SIZES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def size_prior(space: Any, cands: Sequence[Any], keys: Sequence[str]) -> np.ndarray | None:
    """FLOPs of each candidate (``keys``: their canonical strings), or ``None`` when ``space``
    counts none (no ``flops`` method, e.g. architecture x bit-width candidates)."""
    flops = getattr(space, "flops", None)
    if not callable(flops):
        return None
    try:
        cache = _SIZES.setdefault(space, {})
    except TypeError:  # not weak-referenceable: count without a cache
        cache = {}
    out = np.empty(len(cands))
    for i, (c, k) in enumerate(zip(cands, keys)):
        v = cache.get(k)
        if v is None:
            try:
                v = cache[k] = float(flops(c))
            except NotImplementedError:  # a space without a layer list
                return None
        out[i] = v
    return out


def accuracy_guess(space: Any, cands: Sequence[Any], keys: Sequence[str],
                   prior: Any = None) -> np.ndarray | None:
    """What the sampler guesses of each candidate's accuracy before evaluating it (higher:
    more accurate): ``prior(cands)`` where the caller gives an accuracy prior, else the FLOPs
    (at least 1; ``None`` where the space counts none)."""
    if prior is None:
        size = size_prior(space, cands, keys)
        return None if size is None else np.maximum(size, 1.0)
    out = np.asarray(prior(list(cands)), dtype=float).reshape(-1)
    if out.shape != (len(cands),) or not np.all(np.isfinite(out)):
        raise UserError(f"the accuracy prior returned {out.shape[0]} values (finite: "
                        f"{bool(np.all(np.isfinite(out)))}) for {len(cands)} candidates; "
                        "expected one finite value per candidate")
    return out


class PriorResidual:
    """The part of an accuracy prior that the first cheap objective does not explain: the prior
    less its least-squares fit on a quadratic in that objective (log where the first pool's are
    all positive, standardized), fitted on the first call (the first pool) and kept.

    Why: a zero-cost prior such as NASWOT grows with the network, so on a device whose latency
    also does (NASWOT vs latency Spearman 0.89 on titanx_1) most of it says "slow is accurate",
    which the front's fast end contradicts; what the surrogate lacks is the ranking of cells of
    one latency level (``benchmarks/search_nb201.md``, session 55)."""

    def __init__(self) -> None:
        self._fit: tuple[bool, float, float, np.ndarray] | None = None

    def __call__(self, prior: np.ndarray, cheap: np.ndarray) -> np.ndarray:
        if cheap.shape[1] == 0:
            return prior
        x = np.asarray(cheap[:, 0], float)
        if self._fit is None:
            log = bool(np.all(x > 0))
            v = np.log(x) if log else x
            sd = float(v.std()) or 1.0
            self._fit = (log, float(v.mean()), sd, np.zeros(3))
            coef = np.linalg.lstsq(self._design(x), prior, rcond=None)[0]
            self._fit = (*self._fit[:3], coef)
        return prior - self._design(x) @ self._fit[3]

    def _design(self, x: np.ndarray) -> np.ndarray:
        log, mean, sd, _ = self._fit
        z = ((np.log(np.where(x > 0, x, 1e-300)) if log else x) - mean) / sd
        return np.stack([np.ones_like(z), z, z * z], axis=1)


def cheap_front_plan(cost: np.ndarray, size: np.ndarray, k: int) -> np.ndarray:
    """``k`` indices spread along the layered front of (min ``cost``, max ``size``).

    Successive non-dominated layers are taken until they hold at least ``k`` points; of those,
    sorted by cost, ``k`` are chosen at evenly spaced ranks (both ends included), so the plan
    spans the cheap objective's range. Fewer than ``k`` points in all: all of them.
    """
    cost, size = np.asarray(cost, float), np.asarray(size, float)
    chosen = front_layers(cost, size, k)
    if not chosen:
        return np.zeros(0, dtype=int)
    cand = np.concatenate(chosen)
    cand = cand[np.lexsort((-size[cand], cost[cand]))]
    if len(cand) <= k:
        return cand
    ranks = np.unique(np.round(np.linspace(0, len(cand) - 1, k)).astype(int))
    return cand[ranks]


def startup_plan(space: Any, pool: Any, cost: np.ndarray, k: int) -> list[str]:
    """Keys of the ``k`` cheap-front start-up candidates among ``pool``'s members that meet
    the cheap constraints (``pool.feasible``), ``cost`` the first cheap objective of every
    member, signed to be minimised, against their FLOPs; empty when the space has no size to
    spread them by."""
    ok = np.flatnonzero(pool.feasible)
    size = accuracy_guess(space, [pool.archs[i] for i in ok], [pool.keys[i] for i in ok])
    if size is None or np.ptp(size) == 0:
        return []
    return [pool.keys[i] for i in ok[cheap_front_plan(np.asarray(cost)[ok], size, k)]]


def stratified_choice(rng: np.random.Generator, free: np.ndarray, cheap: np.ndarray,
                      slot: int, k: int) -> int:
    """A random one of ``free`` from quantile bin ``slot`` of ``k`` by ``cheap`` (the first
    cheap objective of every pool member): start-up trial ``slot`` stands for that bin."""
    order = free[np.argsort(cheap[free], kind="stable")]
    lo, hi = (len(order) * slot) // k, (len(order) * (slot + 1)) // k
    return int(order[lo + int(rng.integers(max(hi - lo, 1)))])
