"""The screening sampler's 2-D EHVI over the evaluated front, and its layered variant: a share
of the trials looks behind the front for cells that only points of predicted cost hide.

With a predicted cost (latency from a few-shot predictor) a cell predicted too fast dominates,
in the sampler's view, true-front cells predicted slightly slower than it; the EHVI over the
front sees no gain there and never returns (``benchmarks/search_nb201.md``, session 33). An
oracle under predicted latency avoids this by evaluating the front's later layers. A *layered*
trial does the same with the surrogate: its EHVI is over the evaluated points' second
non-dominated layer, and only the candidates that the first layer hides (mean at or below its
staircase at their cost) compete, so it spends the trial where the plain EHVI never looks.
The sampler takes layered trials only where the cost is predicted (``cheap_predicted``): with an
exact cost a hidden cell is truly dominated, and the trial is lost.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hwnas.search.acquisition import expected_hvi_2d
from hwnas.search.pareto import front_layers

__all__ = ["front_ehvi", "is_layered_trial", "layered_now", "reference_candidate", "staircase"]


def is_layered_trial(share: float, j: int) -> bool:
    """Whether the ``j``-th trial chosen by the surrogate (0-based) is a layered one: ``share``
    of them, evenly spaced (the first after ``1 / share`` plain ones); never for ``share`` 0."""
    return share > 0 and j >= 0 and math.floor((j + 1) * share) > math.floor(j * share)


def layered_now(config: Any, done: int, startup: int) -> bool:
    """Whether the next trial, after ``done`` completed ones of which ``startup`` start up, is
    layered under ``config`` (a :class:`ScreeningConfig`): ``early_layer_share`` (where > 0)
    while fewer than ``early_trials`` are complete, ``layer_share`` after; small budgets gain
    the most from looking behind a front that predicted costs distort."""
    early = config.early_layer_share > 0 and done < config.early_trials
    return is_layered_trial(config.early_layer_share if early else config.layer_share,
                            done - startup)


def reference_candidate(mu: np.ndarray, sd: np.ndarray, cost: np.ndarray, ok: np.ndarray,
                        plausible_sd: float = 0.0) -> int:
    """The candidate whose cost bounds :func:`front_ehvi`'s reference (candidates costlier than
    it gain nothing). Among those meeting the constraints (``ok``; all where none or all do):
    the most accurate predicted one (``plausible_sd`` 0), else the costliest of those whose
    ``mu + plausible_sd * sd`` reaches that one's mean, so that a slower cell that may well be
    the most accurate still has a gain."""
    rows = np.arange(len(mu)) if ok.all() or not ok.any() else np.flatnonzero(ok)
    best = int(rows[int(np.argmax(mu[rows]))])
    if plausible_sd <= 0:
        return best
    near = rows[mu[rows] + plausible_sd * sd[rows] >= mu[best]]
    return int(near[int(np.argmax(cost[near]))])


def staircase(front_cost: np.ndarray, front_gain: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """The front's gain at each of ``cost`` (the best gain of a front point no costlier;
    ``-inf`` before the first), the front sorted by cost as :func:`front_indices_2d` gives it."""
    levels = np.concatenate([[-np.inf], np.asarray(front_gain, float)])
    return levels[np.searchsorted(np.asarray(front_cost, float), cost, side="right")]


def front_ehvi(mu: np.ndarray, sd: np.ndarray, cost: np.ndarray, cost_sd: np.ndarray | None,
               obs_cost: np.ndarray, obs_gain: np.ndarray, best: int, layered: bool = False,
               taken: np.ndarray | None = None) -> np.ndarray:
    """EHVI of the candidates (gain ``N(mu, sd^2)`` maximised, cost ``cost`` minimised, with
    ``cost_sd`` or known) over the front of the evaluated points (``obs_cost``, ``obs_gain``).

    Reference: just beyond the slowest point that is (or is expected to be) on the front - the
    most accurate evaluated one and candidate ``best``, the most accurate predicted - and just
    below the front's least accurate point. ``layered``: over the second layer instead, for the
    candidates the first one hides (others score -1); the plain EHVI where no hidden candidate
    that is not ``taken`` (evaluated or running) is expected to improve the second layer."""
    layers = front_layers(obs_cost, obs_gain, 1)
    f = layers[0]
    span_c = float(np.ptp(cost)) or 1.0
    span_g = float(np.ptp(obs_gain)) or 1.0
    ref_cost = max(float(obs_cost[f].max()), float(cost[best])) + 0.01 * span_c
    ref_gain = float(obs_gain[f].min()) - 0.02 * span_g
    plain = expected_hvi_2d(mu, sd, cost, obs_cost[f], obs_gain[f], ref_cost, ref_gain, cost_sd)
    if not layered:
        return plain
    layers = front_layers(obs_cost, obs_gain, len(f) + 1)
    if len(layers) < 2:
        return plain
    g = layers[1]
    hidden = np.asarray(mu) <= staircase(obs_cost[f], obs_gain[f], cost)
    if taken is not None:
        hidden &= ~taken
    if not hidden.any():
        return plain
    second = expected_hvi_2d(mu, sd, cost, obs_cost[g], obs_gain[g], ref_cost,
                             min(ref_gain, float(obs_gain[g].min()) - 0.02 * span_g), cost_sd)
    if float(second[hidden].max()) <= 0:
        return plain
    return np.where(hidden, second, -1.0)
