"""What the screening sampler works on (:mod:`hwnas.search.screening`): the interface of its
candidates (:class:`CandidateSpace`), its settings (:class:`ScreeningConfig`), the candidate
pool with the candidates' cheap values and constraint violations, and the trials it has seen."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hwnas.core.errors import UserError
from hwnas.search.features import FEATURE_SETS
from hwnas.search.gp import WARPS

__all__ = ["CandidatePool", "CandidateSpace", "CheapConstraints", "CheapObjectives",
           "ScreeningConfig", "STARTUPS", "TrialHistory"]


#: ``cheap(archs) -> array (len(archs), k)`` (or ``(len(archs),)`` when k = 1): the values of
#: the cheap objectives, in the order of ``cheap_indices``; or a pair ``(values, std)`` where a
#: predictor knows its uncertainty (``std`` of the same shape, or ``None``).
CheapObjectives = Callable[[Sequence[Any]], np.ndarray]
#: ``constraints(archs) -> array (len(archs), m)``: the values of the cheap constraints, in the
#: order of ``constraint_names``, in Optuna's convention (<= 0 feasible)
CheapConstraints = Callable[[Sequence[Any]], np.ndarray]


class CandidateSpace(Protocol):
    """What the sampler reads of a space of candidates (every :class:`SearchSpace` has it;
    ``all_architectures()`` is optional: a space that enumerates itself)."""

    def sample(self, rng: np.random.Generator) -> Any: ...
    def to_string(self, cand: Any) -> str: ...
    def from_string(self, text: str) -> Any: ...
    def encode(self, cand: Any) -> np.ndarray: ...
    def to_params(self, cand: Any) -> dict[str, Any]: ...
    def suggest(self, trial: Any) -> Any: ...






# ------------------------------------------------------------------------------------------------
# the sampler
# ------------------------------------------------------------------------------------------------


STARTUPS = ("random", "stratified", "cheap_front", "mixed")


@dataclass(frozen=True)
class ScreeningConfig:
    """Settings of :class:`ScreeningSampler` (defaults chosen on NAS-Bench-201 development
    devices - HELP's validation devices and four of its meta-training devices - see
    ``benchmarks/search_nb201.md``)."""

    #: completed trials before the surrogate is used (random candidates until then)
    n_startup_trials: int = 10
    #: the whole space is the pool when the space enumerates itself and has at most this many
    max_pool: int = 20_000
    #: size of the random pool otherwise (refreshed at every refit)
    pool_size: int = 5_000
    #: fraction of a refreshed random pool made of mutations of the current front
    mutation_fraction: float = 0.5
    #: refit the GP hyper-parameters when the evaluations have grown by this factor
    refit_growth: float = 1.1
    #: the worst fraction of observed values is clipped to that quantile before fitting
    floor_quantile: float = 0.2
    #: length-scale grid: 2 l^2 = factor x the median squared distance between candidates
    length_factors: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
    #: noise grid (variance relative to the output scale)
    noises: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 0.3)
    #: confidence multiplier of the optimistic scalarization (3+ objectives)
    ucb_beta: float = 1.0
    #: multiplier of the cheap objectives' standard deviations, when the callable gives them.
    #: 0 (default) trusts the predicted values: on the NAS-Bench-201 benchmark the few-shot
    #: latency predictor's own standard deviation (scale 1) made the search worse
    cheap_std_scale: float = 0.0
    #: how the start-up candidates are drawn: "random" (uniform over the pool), "stratified"
    #: (one from each of ``n_startup_trials`` quantile bins of the first cheap objective, so
    #: that the first evaluations span the cheap objective's range), "cheap_front" (spread
    #: along the front of the first cheap objective vs FLOPs, :mod:`hwnas.search.startup`;
    #: random where the space counts no FLOPs or no objective is cheap) or "mixed" (the
    #: default: ``cheap_front_trials`` of the cheap front, then ``n_startup_trials`` random
    #: candidates). "mixed" beat "random" on both development blocks of
    #: ``benchmarks/search_nb201.md``; "cheap_front" alone lost on HELP's test devices
    startup: str = "mixed"
    #: how many candidates of the cheap front the "cheap_front" and "mixed" start-ups evaluate
    #: first (with "cheap_front", at least ``n_startup_trials`` trials start up in any case;
    #: with "mixed", ``n_startup_trials`` random ones follow)
    cheap_front_trials: int = 5
    #: the surrogate's mean is linear in the (standardized, log where positive) cheap
    #: objectives instead of constant: what the cheap objectives say of accuracy is learned
    #: from the first evaluations and extrapolated to the whole pool
    cheap_trend: bool = False
    #: completed evaluations up to which ``cheap_trend`` applies (0: throughout); the trend
    #: helps while few evaluations are known and cost 0.008 at 300 on the unseen-phone proxy
    #: (``benchmarks/search_nb201.md``, session 36), so a warm start may keep only its help
    trend_trials: int = 0
    #: the surrogate's mean is linear in the candidate's log FLOPs as well (where the space
    #: counts them, :func:`hwnas.search.startup.size_prior`): larger networks are more accurate
    size_trend: bool = False
    #: multiplier of the surrogate's standard deviation in the acquisition (1: as fitted)
    explore: float = 1.0
    #: one length-scale per encoding column (automatic relevance determination), refined by
    #: L-BFGS on the marginal likelihood after the grid (:class:`hwnas.search.gp.PoolGP`)
    ard: bool = False
    #: monotone warp of the observed values after the floor, before the GP: "none", "copula"
    #: (normal scores of the ranks; the default) or "power" (Yeo-Johnson by maximum
    #: likelihood); the EHVI then compares on the warped scale (:class:`hwnas.search.gp.PoolGP`).
    #: Used only where it was measured: two objectives, one learned and one cheap, no learned
    #: constraint (the 2-D EHVI). The copula spreads out the crowded top of skewed accuracies,
    #: where the front is: +0.014 at 100 evaluations on the integer-millisecond phones of
    #: ``benchmarks/search_nb201.md`` (session 32), level on the validation devices; on the
    #: three objectives of ``benchmarks/search_joint.py`` (ParEGO) it cost 0.08 at 100
    output_warp: str = "copula"
    #: relative slack on the observed front's cheap cost in the 2-D EHVI (0: off): an evaluated
    #: point is taken to dominate only from ``cost x (1 + slack)`` on, so a predicted-fast cell
    #: does not hide the slightly slower candidates that the predictor's error may put before it
    #: (``benchmarks/search_nb201.md``, session 33: +0.010 at 100 on the unseen-phone proxy
    #: with 0.15, but -0.008 on the validation devices, whose predictor errs by 1-3 %)
    front_cost_slack: float = 0.0
    #: the same slack as a multiple of the cheap cost's standard deviation at the evaluated
    #: point (the latency predictor's own uncertainty; 0 where the callable gives none, so a
    #: measured or exact cost is unaffected); 1 cost 0.016 at 300 on the unseen-phone proxy
    front_slack_sd: float = 0.0
    #: share of the surrogate's trials (after the start-up) that are *layered* in the 2-D EHVI
    #: with a cheap cost (0: off): evenly spaced, each evaluates the candidate with the best EHVI
    #: over the evaluated points' second layer among those the front hides, where a cell
    #: predicted too fast may hide true-front cells (:mod:`hwnas.search.layered`). Only where
    #: the cost is a prediction (the sampler's ``cheap_predicted``; an exact cost hides only
    #: truly dominated cells, and the layers cost 0.004-0.02 at 300 there). 0.25 (the
    #: default) gained +0.011 / +0.008 at 100 / 300 on the unseen-phone proxy of
    #: ``benchmarks/search_nb201.md`` (session 34), level on the validation devices
    layer_share: float = 0.25
    #: the share of layered trials while fewer than ``early_trials`` evaluations are complete
    #: (0, the default: ``layer_share`` throughout); a higher one spends more of a small
    #: budget behind the front (``benchmarks/search_nb201.md``, session 34)
    early_layer_share: float = 0.0
    #: completed evaluations up to which ``early_layer_share`` applies
    early_trials: int = 100
    #: what the surrogate's kernel sees of a candidate (:mod:`hwnas.search.features`):
    #: "encoding" (the space's), "executed" (the default: the encoding of the architecture
    #: without its dead code, so cells that compute the same are one point; the encoding
    #: itself on spaces without dead code), "counts" (the encoding and how often each
    #: parameter value occurs) or "executed_counts". "executed" ranked NAS-Bench-201 cells of
    #: one latency level better and gained +0.013 at 100 on the unseen-phone proxy
    #: (``benchmarks/search_nb201.md``, session 35)
    surrogate_features: str = "executed"
    #: how far the 2-D EHVI's reference reaches along the cheap cost: to the slowest candidate
    #: whose mean plus this many deviations reaches the most accurate predicted mean (0: to
    #: that one; :func:`hwnas.search.layered.reference_candidate`), so a slow cell that may be
    #: the most accurate keeps a gain. 2 (the default) gained +0.008 / +0.005 at 100 / 300 on
    #: hwnas's estimator devices, level elsewhere (``benchmarks/search_nb201.md``, session 56)
    reference_sd: float = 2.0

    def __post_init__(self) -> None:
        if self.n_startup_trials < 1 or self.cheap_front_trials < 1:
            raise UserError(f"n_startup_trials = {self.n_startup_trials}, cheap_front_trials = "
                            f"{self.cheap_front_trials}; expected >= 1")
        if self.max_pool < 1 or self.pool_size < 2:
            raise UserError("max_pool and pool_size must be positive (pool_size >= 2)")
        if not 0.0 <= self.mutation_fraction <= 1.0:
            raise UserError(f"mutation_fraction = {self.mutation_fraction}; expected 0..1")
        if self.refit_growth <= 1.0:
            raise UserError(f"refit_growth = {self.refit_growth}; expected > 1")
        if not 0.0 <= self.floor_quantile < 1.0:
            raise UserError(f"floor_quantile = {self.floor_quantile}; expected in [0, 1)")
        if self.cheap_std_scale < 0:
            raise UserError(f"cheap_std_scale = {self.cheap_std_scale}; expected >= 0")
        if self.startup not in STARTUPS:
            raise UserError(f"startup = {self.startup!r}; expected one of {list(STARTUPS)}")
        if self.output_warp not in WARPS:
            raise UserError(f"output_warp = {self.output_warp!r}; expected one of {list(WARPS)}")
        if not 0.0 <= self.front_cost_slack < 1.0:
            raise UserError(f"front_cost_slack = {self.front_cost_slack}; expected in [0, 1)")
        if not 0.0 <= self.front_slack_sd < 10.0:
            raise UserError(f"front_slack_sd = {self.front_slack_sd}; expected in [0, 10)")
        if not 0.0 <= self.layer_share < 1.0:
            raise UserError(f"layer_share = {self.layer_share}; expected in [0, 1)")
        if not 0.0 <= self.early_layer_share < 1.0 or self.early_trials < 0:
            raise UserError(f"early_layer_share = {self.early_layer_share}, early_trials = "
                            f"{self.early_trials}; expected a share in [0, 1), trials >= 0")
        if self.trend_trials < 0:
            raise UserError(f"trend_trials = {self.trend_trials}; expected >= 0")
        if not 0.0 <= self.reference_sd < 10.0:
            raise UserError(f"reference_sd = {self.reference_sd}; expected in [0, 10)")
        if not self.explore > 0:
            raise UserError(f"explore = {self.explore}; expected > 0")
        if self.surrogate_features not in FEATURE_SETS:
            raise UserError(f"surrogate_features = {self.surrogate_features!r}; expected one "
                            f"of {list(FEATURE_SETS)}")
        if not self.length_factors or not self.noises:
            raise UserError("length_factors and noises must not be empty")


@dataclass
class CandidatePool:
    archs: list[Any]
    keys: list[str]
    index: dict[str, int]
    features: np.ndarray
    cheap: np.ndarray  # N x k (k may be 0)
    cheap_sd: np.ndarray  # N x k, zeros where the callable gives no uncertainty
    enumerated: bool = False
    #: N x m values of the cheap constraints (<= 0 feasible); m may be 0
    violation: np.ndarray | None = None
    #: N x k trend features of the surrogate's mean (the cheap objectives, standardized)
    trend: np.ndarray | None = None

    @property
    def feasible(self) -> np.ndarray:
        if self.violation is None or self.violation.shape[1] == 0:
            return np.ones(len(self.keys), dtype=bool)
        return np.all(self.violation <= 0, axis=1)

    @property
    def excess(self) -> np.ndarray:
        """Total violation, each constraint in units of its spread over the pool."""
        if self.violation is None or self.violation.shape[1] == 0:
            return np.zeros(len(self.keys))
        v = self.violation
        span = np.where(np.ptp(v, axis=0) > 0, np.ptp(v, axis=0), 1.0)
        return np.sum(np.maximum(v, 0.0) / span, axis=1)


def front_slack(config: ScreeningConfig, pool: CandidatePool, keys: Sequence[str],
                keep: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """How much slower than its cheap cost ``cost`` each kept evaluated point (``keys`` where
    ``keep``) is taken to dominate from in the 2-D EHVI: ``front_cost_slack`` x |cost| +
    ``front_slack_sd`` x the cost's standard deviation there (0 for a point not in the pool)."""
    shift = config.front_cost_slack * np.abs(cost)
    if config.front_slack_sd > 0 and pool.cheap_sd.shape[1]:
        rows = [pool.index.get(k) for k, ok in zip(keys, keep) if ok]
        shift = shift + config.front_slack_sd * np.array(
            [0.0 if i is None else float(pool.cheap_sd[i, 0]) for i in rows])
    return shift


@dataclass
class TrialHistory:
    numbers: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    values: list[list[float]] = field(default_factory=list)
    constraints: list[dict[str, float]] = field(default_factory=list)
