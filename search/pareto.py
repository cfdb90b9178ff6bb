"""Two-objective Pareto fronts and hypervolume (cost minimised, gain maximised): what the
screening sampler improves and what the run's outputs and plots report."""

from __future__ import annotations

import numpy as np

__all__ = ["front_indices_2d", "hypervolume_2d"]


def front_indices_2d(cost: np.ndarray, gain: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points (min ``cost``, max ``gain``), sorted by cost
    ascending (so gain ascends too). Of identical points the first is kept."""
    cost, gain = np.asarray(cost, float), np.asarray(gain, float)
    if len(cost) == 0:
        return np.zeros(0, dtype=int)
    order = np.lexsort((-gain, cost))  # by cost, then best gain first
    g = gain[order]
    prev_best = np.concatenate([[-np.inf], np.maximum.accumulate(g)[:-1]])
    return order[g > prev_best]


def front_layers(cost: np.ndarray, gain: np.ndarray, limit: int) -> list[np.ndarray]:
    """Successive non-dominated layers (min ``cost``, max ``gain``; each as
    :func:`front_indices_2d`), until they hold at least ``limit`` points or none is left."""
    cost, gain = np.asarray(cost, float), np.asarray(gain, float)
    left = np.arange(len(cost))
    out: list[np.ndarray] = []
    n = 0
    while n < limit and len(left):
        f = left[front_indices_2d(cost[left], gain[left])]
        out.append(f)
        n += len(f)
        left = np.setdiff1d(left, f, assume_unique=True)
    return out


def hypervolume_2d(cost: np.ndarray, gain: np.ndarray, ref_cost: float,
                   ref_gain: float) -> float:
    """Area dominated by the points (min ``cost``, max ``gain``) and bounded by the reference
    point ``(ref_cost, ref_gain)``; points not strictly better than the reference in both
    objectives add nothing."""
    cost, gain = np.asarray(cost, float), np.asarray(gain, float)
    keep = (cost < ref_cost) & (gain > ref_gain)
    cost, gain = cost[keep], gain[keep]
    if len(cost) == 0:
        return 0.0
    idx = front_indices_2d(cost, gain)
    c, g = cost[idx], gain[idx]
    widths = np.diff(np.concatenate([c, [ref_cost]]))
    return float(np.sum(widths * (g - ref_gain)))
