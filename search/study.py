"""The Optuna study over a space's architectures: creation, seeding, resuming, results.

The study lives in an RDB storage (SQLite in the run directory by default), so rerunning the
same command continues it: only the trials still missing from the budget are run, and every
finished trial's metrics are reused from storage.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState
from tqdm.auto import tqdm

from search.evaluator import OBJECTIVES, SubnetEvaluator
from search.samplers import make_sampler
from supernet.errors import UserError
from supernet.space import SearchSpace

#: metrics stored with every trial (as user attributes) besides the objectives
TRIAL_METRICS = ("accuracy", "flops", "params", "size_bytes", "latency_ms", "latency_p95_ms",
                 "latency_cv")


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def open_study(storage: str, study_name: str, sampler: str, seed: int,
               objectives: dict[str, str] = OBJECTIVES) -> optuna.Study:
    """Create the study, or load it if it exists (with the same objectives)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=storage, study_name=study_name, sampler=make_sampler(sampler, seed),
        directions=list(objectives.values()), load_if_exists=True,
    )
    if study.metric_names is None:
        with warnings.catch_warnings():  # set_metric_names is marked experimental in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(objectives))
    elif list(study.metric_names) != list(objectives):
        raise UserError(f"study {study_name!r} in {storage} optimises {study.metric_names}, "
                        f"not {list(objectives)}; use another study name or --overwrite")
    return study


def enqueue_seeds(study: optuna.Study, space: SearchSpace) -> None:
    """Enqueue the largest and smallest architectures once, at the start of a fresh study: they
    anchor the two ends of the front for every sampler."""
    if study.trials:
        return
    for arch in (space.largest(), space.smallest()):
        study.enqueue_trial(space.to_params(arch), user_attrs={"seed_arch": True})


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]


def run_trials(study: optuna.Study, space: SearchSpace, evaluator: SubnetEvaluator,
               n_trials: int, *, progress: bool = True) -> int:
    """Run trials until ``n_trials`` have completed in total; returns how many ran now."""
    for t in finished_trials(study):  # resumed study: reuse measured metrics
        if "arch" in t.user_attrs:
            evaluator.cache.setdefault(t.user_attrs["arch"],
                                       {m: t.user_attrs[m] for m in TRIAL_METRICS if m in t.user_attrs})
    remaining = n_trials - len(finished_trials(study))
    if remaining <= 0:
        return 0

    def objective(trial: optuna.Trial) -> tuple[float, ...]:
        arch = space.suggest(trial)
        trial.set_user_attr("arch", space.to_string(arch))
        metrics = evaluator(arch)
        for name in TRIAL_METRICS:
            trial.set_user_attr(name, metrics[name])
        return tuple(metrics[name] for name in OBJECTIVES)

    bar = tqdm(total=remaining, desc="search", unit="trial", disable=not progress, leave=False)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        bar.update(1)
        if trial.state == TrialState.COMPLETE:
            bar.set_postfix(front=len(study.best_trials))

    logging.getLogger("optuna").setLevel(logging.WARNING)
    try:
        study.optimize(objective, n_trials=remaining, callbacks=[callback], catch=())
    finally:
        bar.close()
    return remaining


def pareto_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The non-dominated trials (``study.best_trials``), one per architecture: a sampler may
    suggest the same architecture again, and its repeats are not further models."""
    seen, front = set(), []
    for t in sorted(study.best_trials, key=lambda t: t.number):
        arch = t.user_attrs.get("arch")
        if arch not in seen:
            seen.add(arch)
            front.append(t)
    return front


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per completed trial: number, arch string, every metric, and whether it is on
    the Pareto front (:func:`pareto_trials`)."""
    front = {t.number for t in pareto_trials(study)}
    rows = []
    for t in finished_trials(study):
        row = {"trial": t.number, "arch": t.user_attrs.get("arch", "")}
        row.update({m: t.user_attrs.get(m) for m in TRIAL_METRICS})
        row["pareto"] = t.number in front
        rows.append(row)
    columns = ["trial", "arch", *TRIAL_METRICS, "pareto"]
    return pd.DataFrame(rows, columns=columns)
