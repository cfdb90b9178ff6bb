"""Surrogate screening: spend expensive evaluations only where a model says they pay.

In hardware-aware NAS one objective is expensive (accuracy: a supernet evaluation, a training
run, a benchmark look-up that is counted) and the others are cheap (latency from a few-shot
predictor, FLOPs, size: free per query). A plain Optuna sampler learns the cheap ones from the
trials, as slowly as the expensive one. :class:`ScreeningSampler` uses what is cheap: it keeps
a *candidate pool* of architectures whose cheap objectives are known before anything is
evaluated, screens it with a Gaussian-process surrogate of the expensive objective(s) trained
on the evaluations so far, and evaluates the candidate with the best acquisition value (its
class docstring says which acquisition, how constraints and the start-up work, and why it is
deterministic). The Pareto maths is in :mod:`hwnas.search.pareto`, the acquisition functions
in :mod:`hwnas.search.acquisition`, the surrogate in :mod:`hwnas.search.gp`, the cheap-front
start-up in :mod:`hwnas.search.startup`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from hwnas.search.acquisition import expected_improvement
from hwnas.search.candidates import (
    CandidatePool,
    CandidateSpace,
    CheapConstraints,
    CheapObjectives,
    ScreeningConfig,
    TrialHistory,
    front_slack,
)
from hwnas.search.features import SurrogateEncoder
from hwnas.search.gp import PoolGP
from hwnas.search.layered import front_ehvi, layered_now, reference_candidate
from hwnas.search.startup import size_prior, startup_plan, stratified_choice
from hwnas.supernet.space import SearchSpace
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import StudyDirection
from optuna.trial import FixedTrial, FrozenTrial, TrialState
from scipy.special import ndtr

from hwnas.core.errors import UserError

__all__ = [
    "CandidateSpace",
    "CheapConstraints",
    "CheapObjectives",
    "ScreeningConfig",
    "ScreeningSampler",
]

class ScreeningSampler(BaseSampler):
    """Optuna sampler that screens a candidate pool with a GP surrogate.

    ``space`` is the search space the objective suggests from (``space.suggest(trial)``);
    ``cheap`` gives the cheap objectives of any architectures of it, and ``cheap_indices`` says
    which of the study's objectives they are (in ``cheap``'s column order); every other
    objective is expensive and learned by a surrogate. ``directions`` (optional) is checked
    against the study's. For evaluated architectures the values the trials reported are used,
    for candidates the cheap values. ``constraints`` gives the values of the constraints named
    ``constraint_names`` (as the trials name them in ``trial.set_constraint``) for any
    candidates; candidates that violate them are screened out. Other constraints the trials
    report are learned (below).

    The pool is the whole space when the space can enumerate itself and is small, else a seeded
    random pool refreshed with mutations of the current front. Each trial evaluates the
    candidate with the best acquisition value:

    * one expensive + one cheap objective (accuracy vs latency): the exact **expected hypervolume
      improvement** (EHVI) in 2-D; with the cheap objective known, the expectation is a sum of
      closed-form Gaussian terms over the current front's staircase. Two expensive objectives
      (accuracy vs a latency measured here) get the same exact EHVI with the second one's GP
      mean and deviation as an uncertain cost (independent of the first: separate GPs). With a
      predicted cheap cost (``cheap_predicted``), ``layer_share`` of the trials look behind the
      front (:mod:`hwnas.search.layered`); the reference reaches every candidate that may be
      the most accurate (``reference_sd``), so a slow accurate end keeps a gain;
    * one objective: expected improvement;
    * three or more objectives, where the exact 2-D EHVI does not apply: an optimistic random
      augmented Chebyshev scalarization — ParEGO's rule (Knowles 2006) with a confidence bound
      (Paria et al. 2019): each trial draws its own weights, so successive trials spread over the
      front, and the cheap objectives enter with their known values.

    Before the surrogate chooses, the start-up evaluates random candidates or, with
    ``startup="cheap_front"``, candidates spread along the *cheap front* - non-dominated in (first
    cheap objective, FLOPs), the best guess of the accuracy front before any accuracy is known
    (:mod:`hwnas.search.startup`; deterministic, so no seed's luck decides the first
    evaluations); ``startup="mixed"`` (the default) evaluates ``cheap_front_trials`` of the cheap
    front and then ``n_startup_trials`` random candidates, so the seeds keep their variety.

    Constraints (Optuna's ``trial.set_constraint``; <= 0 is feasible): those the caller can compute
    for every candidate (``constraints``, e.g. a latency predicted for free) *screen the pool* —
    a candidate that violates one is never proposed while a free one meets them all (else the
    least violating is). Every other constraint the trials report is learned like an expensive
    objective, by a GP of its value, and multiplies the acquisition by the probability of
    feasibility (Gardner et al. 2014). The front the acquisition improves is that of the feasible
    trials.

    Candidates need not be bare architectures: ``space`` is anything with the part of the
    :class:`SearchSpace` interface the sampler reads (:class:`CandidateSpace`), e.g.
    :class:`hwnas.search.bits.ArchBitsSpace` for architecture x bit-width candidates.

    It is an Optuna sampler (:class:`ScreeningSampler`), sequential and free of batches: each trial
    is chosen after the previous ones are told. Architectures of trials still running are not
    chosen again (several workers may share a study). Seeded and deterministic: in one process,
    the choice of a trial depends only on the seed, the trial number and the completed (and
    running) trials. The sampler keeps no state of its own that a study needs: a new process
    (a resumed run, another worker) rebuilds everything from the study's trials (its pool and
    surrogate refits then start from the current trials, so its later choices may differ from
    those an uninterrupted process would have made).
    """

    def __init__(self, space: SearchSpace | CandidateSpace, cheap: CheapObjectives | None = None,
                 cheap_indices: Sequence[int] = (), *, seed: int,
                 directions: Sequence[str | StudyDirection] | None = None,
                 config: ScreeningConfig | None = None,
                 constraints: CheapConstraints | None = None, constraint_names: Sequence[str] = (),
                 cheap_predicted: Sequence[bool] = ()) -> None:
        self.space = space
        self.constraints = constraints
        self.constraint_names = tuple(str(n) for n in constraint_names)
        if len(set(self.constraint_names)) != len(self.constraint_names):
            raise UserError(f"constraint_names {list(self.constraint_names)} repeat a name")
        if (constraints is None) != (not self.constraint_names):
            raise UserError("a cheap-constraints callable and constraint_names (the names of "
                            "its columns) go together")
        self.cheap = cheap
        self.cheap_indices = tuple(int(i) for i in cheap_indices)
        if len(set(self.cheap_indices)) != len(self.cheap_indices):
            raise UserError(f"cheap_indices {list(self.cheap_indices)} repeat an objective")
        if self.cheap_indices and cheap is None:
            raise UserError("cheap_indices given without a cheap-objectives callable")
        if cheap is not None and not self.cheap_indices:
            raise UserError("a cheap-objectives callable needs cheap_indices (which of the "
                            "study's objectives it computes)")
        self.cheap_predicted = tuple(bool(p) for p in cheap_predicted)
        if self.cheap_predicted and len(self.cheap_predicted) != len(self.cheap_indices):
            raise UserError(f"cheap_predicted has {len(self.cheap_predicted)} flags for "
                            f"{len(self.cheap_indices)} cheap objectives")
        self.seed = int(seed)
        self.directions = None if directions is None else [_direction(d) for d in directions]
        self.config = config or ScreeningConfig()
        self._random = RandomSampler(seed=self.seed)
        self._pool: CandidatePool | None = None
        self._gps: list[PoolGP] = []
        self._gp_targets: list[tuple[str, Any]] = []  # what each GP models
        self._hist = TrialHistory()
        self._gp_keys: list[str] = []
        self._last_refit = 0
        self._pending: dict[int, dict[str, Any]] = {}
        self._arch_cache: dict[tuple, tuple[Any, str] | None] = {}
        self._by_key: dict[str, Any] = {}  # canonical string -> architecture (evaluated ones)
        self._choices: dict[str, BaseDistribution] = {}
        self._encoder = SurrogateEncoder(space, self.config.surrogate_features)
        self._trend_scale: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._plan: list[str] | None = None  # the cheap-front start-up's candidates
        self._size_col: bool | None = None  # whether the trend features end with FLOPs
        self._cheap_trend = self.config.cheap_trend  # whether the GPs' mean uses it now

    # -- Optuna interface -----------------------------------------------------------------------
    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs:  # enqueued: its parameters are given
            return
        arch = self.choose(study, trial.number)
        self._pending[trial.number] = dict(self.space.to_params(arch))

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        params = self._pending.get(trial.number, {})
        if param_name in params:
            value = params[param_name]
            try:
                if param_distribution._contains(param_distribution.to_internal_repr(value)):
                    return value
            except (ValueError, TypeError):
                pass
        # a parameter the chosen architecture does not set (or outside its distribution)
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._pending.pop(trial.number, None)

    # -- the choice -------------------------------------------------------------------------------
    def choose(self, study: optuna.Study, number: int) -> Any:
        """The architecture trial ``number`` of ``study`` evaluates next."""
        directions = list(study.directions)
        self._check_directions(directions)
        rng = np.random.default_rng([self.seed, int(number)])
        trials = study.get_trials(deepcopy=False)
        complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values is not None]
        busy = {self._arch_of(t)[1] for t in trials
                if t.state in (TrialState.RUNNING, TrialState.WAITING) and t.number != number
                and self._arch_of(t) is not None}
        self._update_history(complete)
        self._ensure_pool(rng)
        planned = self._plan_next(directions, set(self._hist.keys) | busy)
        if planned is not None:  # the cheap-front start-up comes first, whole
            return self._pool.archs[planned]
        startup = len(self._hist.keys) < self._startup_trials()
        score = None if startup else self._acquisition(directions, rng)  # may renew the pool
        pool = self._pool
        taken = set(self._hist.keys) | busy
        mask = np.ones(len(pool.keys), dtype=bool)
        for k in taken:
            i = pool.index.get(k)
            if i is not None:
                mask[i] = False
        free = np.flatnonzero(mask)
        if len(free) == 0:
            return self._fallback(rng, taken)
        feasible = pool.feasible
        if not feasible[free].any():  # no free candidate meets the cheap constraints
            return pool.archs[int(free[int(np.argmin(pool.excess[free]))])]
        free = free[feasible[free]]
        if score is None:
            return pool.archs[int(self._startup_choice(rng, free))]
        return pool.archs[int(free[int(np.argmax(score[free]))])]

    def _startup_trials(self) -> int:
        """Completed trials before the surrogate chooses: ``n_startup_trials``, after the
        cheap-front plan's candidates where ``startup = "mixed"``."""
        n = self.config.n_startup_trials
        return n + len(self._plan or ()) if self.config.startup == "mixed" else n

    def _startup_choice(self, rng: np.random.Generator, free: np.ndarray) -> int:
        """A start-up candidate of ``free``: uniform, or from the quantile bin of the first
        cheap objective that this start-up trial stands for (``startup = "stratified"``)."""
        pool = self._pool
        k = self.config.n_startup_trials
        if self.config.startup != "stratified" or pool.cheap.shape[1] == 0 or len(free) < k:
            return int(free[rng.integers(len(free))])
        return stratified_choice(rng, free, pool.cheap[:, 0], len(self._hist.keys) % k, k)

    def _plan_next(self, directions: list[StudyDirection], taken: set[str]) -> int | None:
        """Pool index of the next cheap-front start-up candidate not evaluated or running
        (``startup = "cheap_front"`` or ``"mixed"``); ``None`` when none is left or there is
        no plan.

        The plan is made once, from the first pool's candidates that meet the cheap
        constraints, whatever was evaluated: a resumed process makes the same plan."""
        pool = self._pool
        if self.config.startup not in ("cheap_front", "mixed") or pool.cheap.shape[1] == 0:
            return None
        if self._plan is None:
            cost = -self._signed(directions)[self.cheap_indices[0]] * pool.cheap[:, 0]
            self._plan = startup_plan(self.space, pool, cost, self.config.cheap_front_trials)
        for k in self._plan:
            i = pool.index.get(k)
            if k not in taken and i is not None:
                return i
        return None

    def _fallback(self, rng: np.random.Generator, taken: set[str]) -> Any:
        """Every pool member is taken: a random architecture, unseen if one is found (and
        meeting the cheap constraints if one of 100 draws does)."""
        if self.constraints is not None:
            draws = [self.space.sample(rng) for _ in range(100)]
            unseen = [a for a in draws if self.space.to_string(a) not in taken] or draws
            v = self._violations(unseen)
            ok = np.flatnonzero(np.all(v <= 0, axis=1))
            return unseen[int(ok[0])] if len(ok) else unseen[0]
        draws = (self.space.sample(rng) for _ in range(101))  # the last one in any case
        return next(a for i, a in enumerate(draws) if i == 100
                    or self.space.to_string(a) not in taken)

    def _check_directions(self, directions: list[StudyDirection]) -> None:
        if self.directions is not None and self.directions != directions:
            raise UserError(f"the screening sampler was built for directions "
                            f"{[d.name.lower() for d in self.directions]}, the study has "
                            f"{[d.name.lower() for d in directions]}")
        bad = [i for i in self.cheap_indices if not 0 <= i < len(directions)]
        if bad:
            raise UserError(f"cheap objective index {bad[0]} is outside the study's "
                            f"{len(directions)} objectives")
        if len(self.cheap_indices) == len(directions):
            raise UserError("every objective is cheap; nothing is left for the surrogate "
                            "(at least one objective must be evaluated)")

    # -- trials -> architectures -----------------------------------------------------------------
    def _arch_of(self, trial: FrozenTrial) -> tuple[Any, str] | None:
        params = trial.params or trial.system_attrs.get("fixed_params") or {}
        if not params:
            return None
        key = tuple(sorted((k, repr(v)) for k, v in params.items()))
        if key not in self._arch_cache:
            try:
                arch = self.space.suggest(FixedTrial(dict(params), trial.number))
                self._arch_cache[key] = (arch, self.space.to_string(arch))
            except Exception:  # noqa: BLE001 - params of another space: not ours to learn from
                self._arch_cache[key] = None
        return self._arch_cache[key]

    def _update_history(self, complete: Sequence[FrozenTrial]) -> None:
        known = set(self._hist.numbers)
        for t in sorted(complete, key=lambda t: t.number):
            if t.number in known:
                continue
            got = self._arch_of(t)
            if got is None or any(not math.isfinite(v) for v in t.values):
                continue
            for name, dist in t.distributions.items():  # what mutations may change
                self._choices.setdefault(name, dist)
            self._hist.numbers.append(t.number)
            self._hist.keys.append(got[1])
            self._hist.values.append([float(v) for v in t.values])
            self._hist.constraints.append({str(k): float(v) for k, v in t.constraints.items()})
            self._by_key.setdefault(got[1], got[0])

    # -- pool ------------------------------------------------------------------------------------
    def _encode(self, archs: Sequence[Any]) -> np.ndarray:
        return self._encoder(archs)  # the surrogate's features (``surrogate_features``)

    def _cheap_values(self, archs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Cheap objective values and their standard deviations (zeros when not given)."""
        k = len(self.cheap_indices)
        if self.cheap is None:
            return np.zeros((len(archs), 0)), np.zeros((len(archs), 0))
        got = self.cheap(list(archs))
        vals, std = (got if isinstance(got, tuple) else (got, None))
        vals = np.asarray(vals, dtype=np.float64).reshape(len(archs), -1)
        std = (np.zeros_like(vals) if std is None
               else np.asarray(std, dtype=np.float64).reshape(len(archs), -1))
        if vals.shape[1] != k or std.shape != vals.shape:
            raise UserError(f"the cheap-objectives callable returned {vals.shape[1]} values per "
                            f"architecture; expected {k} (one per cheap objective), and "
                            f"standard deviations of the same shape when it returns a pair")
        if not (np.all(np.isfinite(vals)) and np.all(np.isfinite(std)) and np.all(std >= 0)):
            raise UserError("the cheap-objectives callable returned NaN, infinite or negative-"
                            "deviation values")
        return vals, std

    def _violations(self, archs: Sequence[Any]) -> np.ndarray:
        """Values of the cheap constraints (``len(archs) x m``; m = 0 without any)."""
        m = len(self.constraint_names)
        if self.constraints is None or not archs:
            return np.zeros((len(archs), m))
        v = np.asarray(self.constraints(list(archs)), dtype=np.float64).reshape(len(archs), -1)
        if v.shape[1] != m:
            raise UserError(f"the cheap-constraints callable returned {v.shape[1]} values per "
                            f"architecture; expected {m} (one per constraint name)")
        if not np.all(np.isfinite(v)):
            raise UserError("the cheap-constraints callable returned NaN or infinite values")
        return v

    def _trend(self, vals: np.ndarray) -> np.ndarray:
        """Trend features of cheap values: log where the first pool was positive, then
        standardized by the first pool's mean and deviation."""
        if self._trend_scale is None:
            log = np.all(vals > 0, axis=0)
            v = np.where(log, np.log(np.where(vals > 0, vals, 1.0)), vals)
            sd = v.std(0)
            self._trend_scale = (log, v.mean(0), np.where(sd > 1e-12, sd, 1.0))
        log, mean, sd = self._trend_scale
        v = np.where(log, np.log(np.where(vals > 0, vals, 1e-300)), vals)
        return (v - mean) / sd

    def _trend_inputs(self, archs: Sequence[Any], keys: Sequence[str],
                      vals: np.ndarray) -> np.ndarray:
        """What the trend features are made of: the cheap values, then the FLOPs where
        ``size_trend`` asks for them and the space counts them."""
        if not self.config.size_trend or self._size_col is False:
            return vals
        size = size_prior(self.space, archs, keys)
        if self._size_col is None:
            self._size_col = size is not None and bool(np.ptp(size) > 0)
        if not self._size_col or size is None:
            self._size_col = False
            return vals
        return np.concatenate([vals, np.maximum(size, 1.0)[:, None]], axis=1)

    def _make_pool(self, archs: list[Any], enumerated: bool) -> CandidatePool:
        keys = [self.space.to_string(a) for a in archs]
        vals, std = self._cheap_values(archs)
        trend = self._trend(self._trend_inputs(archs, keys, vals))
        return CandidatePool(archs, keys, {k: i for i, k in enumerate(keys)}, self._encode(archs),
                     vals, std, enumerated, self._violations(archs), trend)

    def _ensure_pool(self, rng: np.random.Generator) -> CandidatePool:
        if self._pool is not None:
            return self._pool
        enum = getattr(self.space, "all_architectures", None)
        archs: list[Any] = []
        if callable(enum):
            for a in enum():
                archs.append(a)
                if len(archs) > self.config.max_pool:
                    archs = []
                    break
        if archs:
            self._pool = self._make_pool(archs, True)
        else:
            self._pool = self._make_pool(self._random_archs(rng, self.config.pool_size, set()),
                                         False)
        return self._pool

    def _random_archs(self, rng: np.random.Generator, n: int, seen: set[str]) -> list[Any]:
        out: list[Any] = []
        for _ in range(20 * n):
            if len(out) >= n:
                break
            a = self.space.sample(rng)
            k = self.space.to_string(a)
            if k not in seen:
                seen.add(k)
                out.append(a)
        return out

    def _mutate(self, rng: np.random.Generator, arch: Any) -> Any | None:
        """``arch`` with one or two Optuna parameters changed to another value of their
        distribution; ``None`` when that is not an architecture of the space."""
        params = dict(self.space.to_params(arch))
        names = [n for n in params if n in self._choices]
        if not names:
            return None
        for name in rng.choice(names, size=min(len(names), int(rng.integers(1, 3))),
                               replace=False):
            params[str(name)] = _other_value(rng, self._choices[str(name)], params[str(name)])
        try:
            return self.space.suggest(FixedTrial(params))
        except Exception:  # noqa: BLE001 - an invalid combination: skip it
            return None

    def _refresh_pool(self, rng: np.random.Generator, front_keys: list[str]) -> None:
        """A new random pool: mutations of the current front and fresh random architectures."""
        pool = self._pool
        assert pool is not None
        if pool.enumerated:
            return
        seen = set(self._hist.keys)
        archs: list[Any] = []
        fronts = [self._by_key[k] for k in front_keys if k in self._by_key]
        n_mut = int(self.config.mutation_fraction * self.config.pool_size) if fronts else 0
        for _ in range(5 * n_mut):
            if len(archs) >= n_mut:
                break
            a = self._mutate(rng, fronts[int(rng.integers(len(fronts)))])
            if a is None:
                continue
            k = self.space.to_string(a)
            if k not in seen:
                seen.add(k)
                archs.append(a)
        archs += self._random_archs(rng, self.config.pool_size - len(archs), seen)
        self._pool = self._make_pool(archs, False)
        for gp in self._gps:
            gp.set_pool(self._pool.features, self._gp_trend(self._pool.trend))

    # -- surrogate and acquisition ----------------------------------------------------------------
    def _expensive(self, directions: list[StudyDirection]) -> list[int]:
        return [i for i in range(len(directions)) if i not in self.cheap_indices]

    def _signed(self, directions: list[StudyDirection]) -> np.ndarray:
        """+1 for maximised objectives, -1 for minimised: values * sign are maximised."""
        return np.array([1.0 if d == StudyDirection.MAXIMIZE else -1.0 for d in directions])

    def _learned_constraints(self) -> list[str]:
        """Names of the constraints the trials report that no cheap callable computes."""
        names: set[str] = set()
        for c in self._hist.constraints:
            names.update(c)
        return sorted(names - set(self.constraint_names))

    def _targets(self, directions: list[StudyDirection]) -> tuple[list[tuple[str, Any]],
                                                                   np.ndarray]:
        """What the GPs model — each expensive objective (maximised form), then each learned
        constraint (its negated value: > 0 feasible) — and the observed values (n x targets)."""
        targets: list[tuple[str, Any]] = [("objective", j) for j in self._expensive(directions)]
        cols = [np.array(self._hist.values)[:, j] * self._signed(directions)[j]
                for _, j in targets]
        for name in self._learned_constraints():
            v = np.array([c.get(name, np.nan) for c in self._hist.constraints])
            if np.isnan(v).any():  # a trial that did not report it: assume the worst seen
                v = np.where(np.isnan(v), np.nanmax(v), v)
            targets.append(("constraint", name))
            cols.append(-v)
        return targets, np.stack(cols, axis=1)

    def _fit(self, directions: list[StudyDirection], rng: np.random.Generator
             ) -> tuple[list[tuple], np.ndarray | None]:
        """Bring the surrogates up to date; returns (mu, sd) per expensive objective
        (maximised form) over the pool, and the probability that each candidate meets the
        learned constraints (``None`` without any)."""
        targets, Y = self._targets(directions)
        n = len(self._hist.keys)
        cfg = self.config
        trend_now = cfg.cheap_trend and not 0 < cfg.trend_trials <= n
        if trend_now != self._cheap_trend:  # the trend's warm start ends: new GPs
            self._cheap_trend, self._gp_targets = trend_now, []
        refit = (not self._gps or n >= self._last_refit * self.config.refit_growth
                 or self._gp_keys != self._hist.keys[: len(self._gp_keys)]
                 or targets != self._gp_targets)
        if refit:
            if self._gps:
                self._refresh_pool(rng, self._front_keys(directions))
            X, H = self._train_features(self._hist.keys)
            if targets != self._gp_targets:
                cfg = self.config  # the warp where it was measured: 2-D EHVI, cheap cost
                warp = cfg.output_warp if len(directions) == 2 and len(targets) == 1 == len(
                    self._expensive(directions)) else "none"  # no learned constraint either
                self._gps = [PoolGP(self._pool.features, length_factors=cfg.length_factors,
                                    noises=cfg.noises, floor_quantile=cfg.floor_quantile,
                                    trend=self._gp_trend(self._pool.trend), ard=cfg.ard,
                                    warp=warp) for _ in targets]
                self._gp_targets = list(targets)
            for gp, j in zip(self._gps, range(len(targets))):
                gp.refit(X, Y[:, j], self._gp_trend(H))
            self._gp_keys = list(self._hist.keys)
            self._last_refit = n
        else:
            new = self._hist.keys[len(self._gp_keys):]
            if new:
                X, H = self._train_features(new)
                H = self._gp_trend(H)
                for gp in self._gps:
                    for i, x in enumerate(X):
                        gp.add(x, None if H is None else H[i])
                self._gp_keys += new
        preds = [gp.predict(Y[:, j]) for j, gp in enumerate(self._gps)]
        objective = [(mu, sd * self.config.explore) for (mu, sd), (kind, _) in zip(preds, targets)
                     if kind == "objective"]
        pof = None
        for (mu, sd), (kind, _) in zip(preds, targets):
            if kind == "constraint":
                p = ndtr(mu / np.maximum(sd, 1e-12))
                pof = p if pof is None else pof * p
        return objective, pof

    def _gp_trend(self, trend: np.ndarray | None) -> np.ndarray | None:
        """The trend features the surrogates use: the cheap objectives' (``cheap_trend``, up
        to ``trend_trials`` evaluations), the FLOPs' (``size_trend``); ``None`` without any."""
        if trend is None or trend.shape[1] == 0:
            return None
        k = len(self.cheap_indices) if self.cheap is not None else 0
        cols = list(range(k)) if self._cheap_trend else []
        if self._size_col:
            cols.append(k)
        return trend[:, cols] if cols else None

    def _train_features(self, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encodings and trend features of evaluated candidates (from the pool where they
        are in it)."""
        pool = self._pool
        rows, trend, todo = [], [], []
        for n, k in enumerate(keys):
            i = pool.index.get(k)
            if i is not None:
                rows.append(pool.features[i])
                trend.append(pool.trend[i])
            else:
                arch = self._by_key[k] if k in self._by_key else self.space.from_string(k)
                rows.append(self._encode([arch])[0])
                trend.append(None)
                todo.append((n, arch))
        if todo:
            archs = [a for _, a in todo]
            cheap = self._trend(self._trend_inputs(
                archs, [self.space.to_string(a) for a in archs], self._cheap_values(archs)[0]))
            for (n, _), h in zip(todo, cheap):
                trend[n] = h
        k = pool.trend.shape[1]
        return np.array(rows), np.array(trend, dtype=float).reshape(len(keys), k)

    def _feasible_history(self) -> np.ndarray:
        """Which evaluated trials meet every constraint they report."""
        return np.array([all(v <= 0 for v in c.values()) for c in self._hist.constraints],
                        dtype=bool)

    def _front_keys(self, directions: list[StudyDirection]) -> list[str]:
        """The non-dominated evaluated candidates: of the feasible ones, if there are any."""
        Y = np.array(self._hist.values) * self._signed(directions)
        keys = list(self._hist.keys)
        feasible = self._feasible_history()
        if feasible.any() and not feasible.all():
            Y, keys = Y[feasible], [k for k, f in zip(keys, feasible) if f]
        dominated = np.zeros(len(Y), dtype=bool)
        for i in range(len(Y)):
            dominated[i] = bool(np.any(np.all(Y >= Y[i], 1) & np.any(Y > Y[i], 1)))
        return [k for k, d in zip(keys, dominated) if not d]

    def _observed(self, directions: list[StudyDirection]) -> np.ndarray:
        """Evaluated values, maximised, each expensive one on its GP's (warped) scale."""
        Y = np.array(self._hist.values) * self._signed(directions)
        for gp, j in zip(self._gps, self._expensive(directions)):
            Y[:, j] = gp.transform(Y[:, j]) if gp.warp != "none" else Y[:, j]
        return Y

    def _acquisition(self, directions: list[StudyDirection],
                     rng: np.random.Generator) -> np.ndarray:
        preds, pof = self._fit(directions, rng)
        score = self._improvement(preds, directions, rng)
        if score is None:  # no evaluated candidate is feasible yet: seek feasibility
            return pof
        if pof is None:
            return score
        score = score - float(score.min())  # >= 0 (the scalarization is not)
        weighted = score * pof
        return weighted if float(weighted.max()) > 0 else pof

    def _improvement(self, preds: list[tuple], directions: list[StudyDirection],
                     rng: np.random.Generator) -> np.ndarray | None:
        """The acquisition before constraints: over the front of the feasible evaluated
        candidates; ``None`` when learned constraints leave none feasible."""
        pool = self._pool
        sign = self._signed(directions)
        exp_idx = self._expensive(directions)
        Y = self._observed(directions)
        feasible = self._feasible_history()
        if not feasible.all():
            if not feasible.any():
                if self._learned_constraints():
                    return None
                feasible[:] = True  # only cheap constraints, all violated: every trial counts
            Y = Y[feasible]
        if len(directions) == 1:
            mu, sd = preds[0]
            return expected_improvement(mu, sd, float(Y[:, 0].max()))
        if len(directions) == 2:
            mu, sd = preds[0]
            if len(exp_idx) == 1:  # the cost is cheap: known (or with the callable's sd)
                e, c = exp_idx[0], self.cheap_indices[0]
                cost = -sign[c] * pool.cheap[:, 0]  # minimised form
                cost_sd = self.config.cheap_std_scale * pool.cheap_sd[:, 0]
            else:  # both learned: the second is the cost, its GP's mean and sd (independent)
                e, c = exp_idx
                cost, cost_sd = -preds[1][0], preds[1][1]
            obs_gain, obs_cost = Y[:, e], -Y[:, c]
            obs_cost += front_slack(self.config, pool, self._hist.keys, feasible, obs_cost)
            best = reference_candidate(mu, sd, cost, pool.feasible, self.config.reference_sd)
            layered = self.cheap_predicted[:1] == (True,) and layered_now(
                self.config, len(self._hist.keys), self._startup_trials())
            taken = np.zeros(len(pool.keys), dtype=bool)
            taken[[pool.index[k] for k in self._hist.keys if k in pool.index]] = True
            return front_ehvi(mu, sd, cost, cost_sd, obs_cost, obs_gain, best, layered, taken)
        return self._parego(preds, directions, rng)

    def _parego(self, preds: list[tuple], directions: list[StudyDirection],
                rng: np.random.Generator) -> np.ndarray:
        """Optimistic augmented Chebyshev scalarization with random weights (maximised)."""
        pool = self._pool
        sign = self._signed(directions)
        exp_idx = self._expensive(directions)
        d = len(directions)
        G = np.zeros((len(pool.keys), d))  # optimistic gains, maximised form
        for (mu, sd), j in zip(preds, exp_idx):
            G[:, j] = mu + self.config.ucb_beta * sd
        for col, j in enumerate(self.cheap_indices):
            G[:, j] = sign[j] * pool.cheap[:, col]
        Y = self._observed(directions)
        lo = np.minimum(Y.min(0), G.min(0))
        hi = np.maximum(Y.max(0), np.quantile(G, 0.99, axis=0))
        span = np.where(hi - lo > 1e-12, hi - lo, 1.0)
        gap = (hi - G) / span  # 0 = ideal
        w = rng.dirichlet(np.ones(d))
        return -(np.max(w * gap, 1) + 0.05 * np.sum(w * gap, 1))


def _direction(d: str | StudyDirection) -> StudyDirection:
    if isinstance(d, StudyDirection):
        return d
    named = {"maximize": StudyDirection.MAXIMIZE, "max": StudyDirection.MAXIMIZE,
             "minimize": StudyDirection.MINIMIZE, "min": StudyDirection.MINIMIZE}
    if str(d).lower() in named:
        return named[str(d).lower()]
    raise UserError(f"direction {d!r}; expected 'maximize' or 'minimize'")


def _other_value(rng: np.random.Generator, dist: BaseDistribution, value: Any) -> Any:
    """A value of ``dist`` other than ``value`` where there is one."""
    if isinstance(dist, CategoricalDistribution):
        others = [c for c in dist.choices if c != value]
        return others[int(rng.integers(len(others)))] if others else value
    if isinstance(dist, IntDistribution):
        n = (dist.high - dist.low) // dist.step + 1
        return int(dist.low + dist.step * int(rng.integers(n)))
    if isinstance(dist, FloatDistribution):
        if dist.step is not None:
            n = int(round((dist.high - dist.low) / dist.step)) + 1
            return float(dist.low + dist.step * int(rng.integers(n)))
        return float(rng.uniform(dist.low, dist.high))
    return value
