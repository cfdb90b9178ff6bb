"""The screening sampler's start-up on the cheap front: which candidates to evaluate before the
surrogate has anything to learn from.

Before the first accuracy is known, everything else is: every candidate's cheap objective
(latency predicted or estimated) and its size (FLOPs, from the space's layer list). Larger
networks are more accurate, so the candidates that are non-dominated in (low cost, high FLOPs)
- the *cheap front* - are the best guess of the accuracy front, and evaluating a spread of them
first both starts the hypervolume high and gives the surrogate its first points where the front
is. Deterministic: the start-up does not depend on the seed's luck.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from hwnas.search.pareto import front_layers

__all__ = ["cheap_front_plan", "size_prior"]

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
    member, signed to be minimised; empty when the space has no size to spread them by."""
    ok = np.flatnonzero(pool.feasible)
    size = size_prior(space, [pool.archs[i] for i in ok], [pool.keys[i] for i in ok])
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
