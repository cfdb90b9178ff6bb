"""The Optuna study of a search: storage, creation, seeding, the trial budget, recovery.

Storage is an RDB URL: SQLite in the run directory by default (one worker), PostgreSQL (or any
server RDB) for many workers on many machines — Optuna's pattern of independent workers
sharing one study. Every worker runs the same loop (:func:`run_trials`); the budget counts
*completed* trials over all workers and is exact: before a trial evaluates anything it checks
how many trials numbered below it are complete, running or waiting, and if those already fill
the budget it is pruned (not counted) and its worker stops.

Crash safety: the storage keeps a heartbeat for running trials; a trial whose worker died is
marked failed after the grace period and its parameters are enqueued again
(:class:`optuna.storages.RetryHeartbeatStaleTrialCallback`), so no trial is lost. With SQLite (one
worker by construction) trials left running by a killed process are recovered at start-up.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from hwnas.search.objectives import Metric
from hwnas.search.samplers import make_sampler
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from tqdm.auto import tqdm

from hwnas.core.errors import UserError

HEARTBEAT_S = 10
GRACE_S = 30
_COUNTED = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_storage(url: str) -> RDBStorage:
    """An RDB storage with heartbeats and retry of trials whose worker died."""
    with warnings.catch_warnings():  # heartbeat options are experimental in some versions
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                              heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3))
        except ImportError as exc:
            raise UserError(f"storage {url.split('://')[0]}:// needs a database driver that is "
                            f"not installed ({exc}); for PostgreSQL: pip install 'psycopg[binary]'") from None
        except Exception as exc:  # SQLAlchemy's connection errors
            raise UserError(f"cannot open the study storage {_redact(url)}: "
                            f"{str(exc).splitlines()[0]}") from None


def _redact(url: str) -> str:
    """The URL without a password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':')[0]}:***@{host}"
    return url


def describe_study(study: optuna.Study, attrs: dict[str, Any]) -> None:
    """Record ``attrs`` (space, dataset, supernet, hwnas version...) as the study's user
    attributes, so a dashboard or another worker sees what the objectives are about; only
    changed values are written."""
    current = study.user_attrs
    for key, value in attrs.items():
        if current.get(key) != value:
            study.set_user_attr(key, value)


def open_study(storage: str | RDBStorage, study_name: str,
               sampler: str | optuna.samplers.BaseSampler, seed: int,
               objectives: Sequence[Metric], *, n_seeds: int = 0) -> optuna.Study:
    """Create the study, or load it if it exists (then its objectives must be the same).
    ``sampler`` is a sampler, or a name for :func:`hwnas.search.samplers.make_sampler` (with
    ``seed`` and ``n_seeds``)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if isinstance(storage, str):
        storage = make_storage(storage)
    if isinstance(sampler, str):
        sampler = make_sampler(sampler, seed, n_seeds=n_seeds)
    study = optuna.create_study(
        storage=storage, study_name=study_name, sampler=sampler,
        directions=[m.direction for m in objectives], load_if_exists=True,
    )
    keys = [m.key for m in objectives]
    if study.metric_names is None:
        with warnings.catch_warnings():  # set_metric_names is marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(keys)
    elif list(study.metric_names) != keys:
        raise UserError(f"study {study_name!r} optimises {list(study.metric_names)}, not {keys}; "
                        f"use another study name or --overwrite")
    return study


def enqueue_once(study: optuna.Study, seeds: Sequence[tuple[dict[str, Any], str]]) -> int:
    """Enqueue the seed trials (params, label) at the start of a fresh study; returns how many
    are in the study (0 if it already had trials)."""
    if study.get_trials(deepcopy=False):
        return sum(1 for t in study.get_trials(deepcopy=False) if "seed" in t.user_attrs)
    for params, label in seeds:
        study.enqueue_trial(params, user_attrs={"seed": label}, skip_if_exists=True)
    return len(seeds)


def recover_interrupted(study: optuna.Study) -> int:
    """Fail the trials left *running* by a killed process and enqueue their parameters again.
    Only for single-worker storages (SQLite): with several workers a running trial may be
    alive, and the heartbeat handles the dead ones."""
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
        study.enqueue_trial(t.params, user_attrs={**{k: v for k, v in t.user_attrs.items()
                                                      if k == "seed"}, "retry_of": t.number})
    return len(stale)


def completed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def run_trials(study: optuna.Study, objective: Callable[[optuna.Trial], Sequence[float]],
               budget: int, *, progress: bool = True, desc: str = "search") -> int:
    """Run trials until ``budget`` trials of the study have completed (over all workers);
    returns how many this call completed."""
    before = len(completed(study))
    if before >= budget:
        return 0

    def guarded(trial: optuna.Trial) -> Sequence[float]:
        ahead = sum(1 for t in study.get_trials(deepcopy=False, states=_COUNTED)
                    if t.number < trial.number)
        if ahead >= budget:
            study.stop()
            raise optuna.TrialPruned("trial budget reached")
        return objective(trial)

    bar = tqdm(total=budget, initial=before, desc=desc, unit="trial", disable=not progress,
               leave=False)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == TrialState.COMPLETE:
            bar.update(1)

    logging.getLogger("optuna").setLevel(logging.WARNING)
    try:
        study.optimize(guarded, n_trials=budget - before, callbacks=[callback], catch=())
    finally:
        bar.close()
    return len(completed(study)) - before
