"""Optuna samplers by name, always seeded.

The default, ``auto``, is ``screening`` wherever an objective needs an evaluation, else
multivariate TPE (:func:`resolve_sampler`). ``screening``
(:class:`hwnas.search.screening.ScreeningSampler`) learns only what is expensive: a GP
surrogate of accuracy (and of latency measured here) screens a pool of candidates whose cheap
metrics — size, BOPs, latency on estimated, table and adapted devices, under each candidate's
bit policy — are computed for every candidate before one is chosen (:func:`screening_problem`).
It is the best sampler of ``benchmarks/search_nb201.py`` and ``benchmarks/search_joint.py``;
TPE is the best of Optuna's own there, NSGA-II needs larger budgets to pay off, random is the
baseline every method must beat. Every option is set explicitly
(:func:`make_sampler`), so a change of Optuna's defaults does not silently change a study.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hwnas.core.errors import UserError
from hwnas.core.registry import Registry

if TYPE_CHECKING:
    import optuna

#: name -> ``factory(seed, *, n_startup_trials, problem)`` returning a seeded Optuna sampler
#: (:func:`make_sampler`; ``problem`` is the search's :class:`ScreeningProblem` or ``None``).
#: A user adds one with :func:`register_sampler`; ``tests/test_search_units.py`` checks each.
SAMPLERS: Registry[Callable[..., Any]] = Registry("sampler")
#: ``auto``: ``screening`` when an objective needs an evaluation (accuracy, latency measured
#: here), else ``tpe`` (:func:`resolve_sampler`); chosen on ``benchmarks/search_nb201.py``
DEFAULT_SAMPLER = "auto"
STARTUP_TRIALS = 10
#: size of the screening sampler's random candidate pool in a search (its cheap metrics cost
#: about 0.5 ms per candidate on mbv3-tiny with bits: layer list, policy, estimators), refreshed
#: with mutations of the front whenever the surrogate is refitted
SCREENING_POOL = 1000


@dataclass(frozen=True)
class ScreeningProblem:
    """What the screening sampler must know of a search (:func:`screening_problem` builds it
    from the search's settings): the candidates (``space``: the search space, or
    :class:`hwnas.search.bits.ArchBitsSpace` when bit-widths are searched), the study's directions,
    the cheap objectives (``cheap`` for the objectives at ``cheap_indices``; ``cheap_predicted``
    says which of them are predictions, e.g. latency on an adapted device, rather than the value
    itself) and the cheap constraints (``constraints`` for the constraints named
    ``constraint_names``)."""

    space: Any
    directions: tuple[str, ...]
    cheap: Callable[[Sequence[Any]], tuple[np.ndarray, np.ndarray]] | None = None
    cheap_indices: tuple[int, ...] = ()
    constraints: Callable[[Sequence[Any]], np.ndarray] | None = None
    constraint_names: tuple[str, ...] = ()
    cheap_predicted: tuple[bool, ...] = ()


def check_screening_objectives(objectives: Sequence[Any]) -> None:
    """UserError unless some objective needs an evaluation: the screening sampler learns
    those and screens candidates with the cheap ones."""
    from hwnas.search.objectives import is_cheap

    if all(is_cheap(m) for m in objectives):
        raise UserError(f"--sampler screening learns the objectives that need an evaluation "
                        f"(accuracy, latency measured here) and screens candidates with the "
                        f"others; objectives {','.join(m.key for m in objectives)} have none: "
                        f"add accuracy or use another sampler")


def resolve_sampler(name: str, objectives: Sequence[Any]) -> str:
    """The sampler ``name`` stands for in a search with these objectives: ``auto`` is
    ``screening`` where some objective needs an evaluation (its surrogate learns those and
    screens candidates with the others), ``tpe`` where every objective is cheap (nothing to
    learn: TPE on the cheap values); other names stand for themselves."""
    if name != "auto":
        return name
    from hwnas.search.objectives import is_cheap

    return "tpe" if all(is_cheap(m) for m in objectives) else "screening"


def screening_problem(space: Any, objectives: Sequence[Any], constraints: Sequence[Any],
                      devices: Mapping[str, Any], *, bits: bool,
                      bit_choices: Sequence[int] = ()) -> ScreeningProblem:
    """The screening problem of a search of ``space`` with these objectives
    (:class:`hwnas.search.objectives.Metric`) and constraints (:class:`hwnas.search.objectives.Constraint`);
    ``devices`` maps device names to :class:`hwnas.latency.devices.Device` (the trial evaluator's).

    Cheap (:func:`hwnas.search.objectives.is_cheap`) objectives and constraints are computed for
    candidates by :class:`hwnas.search.evaluator.CheapMetrics` — the functions the trial evaluator
    uses, with the candidate's bit policy — and cached by candidate; every other objective
    is learned by the sampler's surrogate, every other constraint by a feasibility model.
    A cheap latency is *predicted* where its device is of kind ``adapted`` (a latency predictor
    adapted to measurements); a table, an estimator or a cost model is the value the trial
    reports and the search is scored by (the screening sampler's layered trials need a
    predicted cost, :mod:`hwnas.search.layered`).
    """
    from hwnas.search.bits import ArchBitsSpace
    from hwnas.search.evaluator import CheapMetrics
    from hwnas.search.objectives import is_cheap

    objectives, constraints = list(objectives), list(constraints)
    check_screening_objectives(objectives)
    cands = ArchBitsSpace(space, bit_choices) if bits else space
    cheap_idx = tuple(i for i, m in enumerate(objectives) if is_cheap(m))
    cheap_cons = [c for c in constraints if is_cheap(c.metric)]
    metrics: list[Any] = []
    for m in [*(objectives[i] for i in cheap_idx), *(c.metric for c in cheap_cons)]:
        if m not in metrics:
            metrics.append(m)
    table = CheapMetrics(space, devices, metrics)
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def lookup(batch: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        keys = [cands.to_string(c) for c in batch]
        todo: dict[str, Any] = {}
        for k, c in zip(keys, batch):
            if k not in cache:
                todo.setdefault(k, c)
        if todo:
            if len(cache) > 200_000:
                cache.clear()
            pairs = [(c.arch, cands.policy(c)) if bits else (c, None) for c in todo.values()]
            values, std = table(pairs)
            for k, v, s in zip(todo, values, std):
                cache[k] = (v, s)
        if not keys:
            return np.zeros((0, len(metrics))), np.zeros((0, len(metrics)))
        return (np.stack([cache[k][0] for k in keys]), np.stack([cache[k][1] for k in keys]))

    obj_cols = [metrics.index(objectives[i]) for i in cheap_idx]
    con_cols = [metrics.index(c.metric) for c in cheap_cons]

    def cheap(batch: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        values, std = lookup(batch)
        return values[:, obj_cols], std[:, obj_cols]

    def violations(batch: Sequence[Any]) -> np.ndarray:
        values = lookup(batch)[0]
        return np.stack([c.violation(values[:, j]) for c, j in zip(cheap_cons, con_cols)],
                        axis=1)

    return ScreeningProblem(
        space=cands, directions=tuple(m.direction for m in objectives),
        cheap=cheap if cheap_idx else None, cheap_indices=cheap_idx,
        constraints=violations if cheap_cons else None,
        constraint_names=tuple(c.text for c in cheap_cons),
        cheap_predicted=tuple(objectives[i].device is not None
                              and devices[objectives[i].device].kind == "adapted"
                              for i in cheap_idx))


def register_sampler(name: str,
                     factory: Callable[..., optuna.samplers.BaseSampler]) -> None:
    """Make a sampler available by name (``--sampler NAME``, ``SearchConfig(sampler=NAME)``):
    ``factory(seed, *, n_startup_trials, problem)`` returns a new seeded Optuna sampler
    (``problem``: the search's :class:`ScreeningProblem`, for samplers that screen candidates)."""
    SAMPLERS.register(name, factory)


def available_samplers() -> list[str]:
    """The names of the registered samplers, sorted (``auto`` stands for one of them)."""
    return SAMPLERS.names()


def make_sampler(name: str, seed: int, *, n_startup_trials: int = STARTUP_TRIALS,
                 n_seeds: int = 0, problem: ScreeningProblem | None = None,
                 screening_options: Mapping[str, Any] | None = None,
                 ) -> optuna.samplers.BaseSampler:
    """A seeded sampler; ``screening`` needs the search's ``problem``
    (:func:`screening_problem`), and takes ``screening_options`` (fields of
    :class:`hwnas.search.candidates.ScreeningConfig`, for benchmarks of its variants). Optuna
    is imported by the factories, so that the settings (and ``hwnas train``, which shares
    them) do not need it.

    Seed trials (enqueued: largest, smallest, sensitivity-based bit policies) are evaluated
    before the sampler is asked for anything, and TPE, GP and screening count *every*
    completed trial towards their random start-up phase; ``n_seeds`` extends that phase so
    the seeds do not eat into it. Every option is set explicitly, so a change of Optuna's
    defaults does not silently change a study (Optuna 5: constraints come from
    ``trial.set_constraint``, which TPE, NSGA-II, GP and screening read without a
    ``constraints_func``)."""
    extra = {"options": dict(screening_options)} if screening_options else {}
    return SAMPLERS.get(name)(seed, n_startup_trials=n_startup_trials + n_seeds, problem=problem,
                              **extra)


def _auto(seed: int, **_: Any) -> optuna.samplers.BaseSampler:
    raise UserError("sampler 'auto' depends on the objectives: resolve it first with "
                    "search.samplers.resolve_sampler(name, objectives)")


def _tpe(seed: int, *, n_startup_trials: int, **_: Any) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.TPESampler(
        seed=seed, multivariate=True, n_startup_trials=n_startup_trials, constant_liar=True,
        n_ei_candidates=24,
    )


def _nsga2(seed: int, **_: Any) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.NSGAIISampler(seed=seed, population_size=20)


def _random(seed: int, **_: Any) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


def _gp(seed: int, *, n_startup_trials: int, **_: Any) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup_trials)


def _screening(seed: int, *, n_startup_trials: int, problem: ScreeningProblem | None,
               options: Mapping[str, Any] | None = None, **_: Any) -> optuna.samplers.BaseSampler:
    if problem is None:
        raise UserError("sampler 'screening' needs the search problem (candidates, cheap "
                        "objectives): pass problem=search.samplers.screening_problem(...)")
    from hwnas.search.screening import ScreeningConfig, ScreeningSampler

    return ScreeningSampler(
        problem.space, problem.cheap, problem.cheap_indices, seed=seed,
        directions=problem.directions,
        config=ScreeningConfig(**{"n_startup_trials": n_startup_trials,
                                  "pool_size": SCREENING_POOL, **(options or {})}),
        constraints=problem.constraints, constraint_names=problem.constraint_names,
        cheap_predicted=problem.cheap_predicted)


for _name, _factory in (("auto", _auto), ("tpe", _tpe), ("nsga2", _nsga2), ("random", _random),
                        ("gp", _gp), ("screening", _screening)):
    SAMPLERS.register(_name, _factory, builtin=True)
del _name, _factory
