"""The Optuna study of a search: storage, creation, seeding, the trial budget, recovery.

Storage is an RDB URL: SQLite in the run directory by default (one worker), PostgreSQL (or any
server RDB) for many workers on many machines: Optuna's pattern of independent workers sharing
one study. Every worker runs the same loop (:func:`run_trials`); the budget counts *completed*
trials over all workers and is exact.

Crash safety: the storage keeps a heartbeat for running trials; a trial whose worker died is
marked failed after the grace period and its parameters are enqueued again
(:class:`optuna.storages.RetryHeartbeatStaleTrialCallback`), so no trial is lost. SQLite has one
writer: a process holds :func:`lock_sqlite` for the whole search, so trials left running in it
belong to a process that died and are recovered at start-up; a trial whose owner (host and
process id, recorded when it starts) is alive on this host is never failed. Ctrl-C ends the
trial being evaluated as pruned (it does not count) and enqueues its parameters again.
"""

from __future__ import annotations

import logging
import os
import socket
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
from hwnas.core.io import LockFile, first_line, pid_alive

HEARTBEAT_S = 10
GRACE_S = 30
_COUNTED = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URL (None for in-memory databases)."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    path = rest[1:] if rest.startswith("/") else rest
    path = path.split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def check_storage(url: str) -> None:
    """UserError unless the storage URL can be opened, without writing anything: SQLite needs
    an existing, writable directory (and a database file, if there is one, that is a file);
    a server database must accept a connection."""
    if is_sqlite(url):
        path = sqlite_path(url)
        if path is None:
            return
        if path.exists() and not path.is_file():
            raise UserError(f"--storage {url}: {path} exists and is not a database file")
        parent = path.resolve().parent
        if not parent.is_dir():
            raise UserError(f"--storage {url}: directory {parent} does not exist; create it or "
                            f"give an existing directory")
        if not os.access(parent, os.W_OK):
            raise UserError(f"--storage {url}: directory {parent} is not writable")
        return
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url)
    except ImportError as exc:
        raise UserError(f"storage {url.split('://')[0]}:// needs a database driver that is "
                        f"not installed ({exc}); for PostgreSQL: pip install 'psycopg[binary]'") from None
    except Exception as exc:
        raise UserError(f"--storage {_redact(url)} is not a usable database URL: "
                        f"{first_line(exc)}") from None
    try:
        with engine.connect():
            pass
    except Exception as exc:  # SQLAlchemy's connection errors
        raise UserError(f"cannot connect to the study storage {_redact(url)}: "
                        f"{first_line(exc)}") from None
    finally:
        engine.dispose()


def lock_sqlite(url: str) -> LockFile | None:
    """An exclusive lock on a SQLite storage (a ``.lock`` file beside the database), held for a
    whole search: SQLite cannot be shared by several writers, as ``--workers`` already says.
    None for other storages."""
    path = sqlite_path(url) if is_sqlite(url) else None
    if path is None:
        return None
    lock = LockFile(path.with_name(f"{path.name}.lock"))
    if not lock.held:
        raise UserError(f"another hwnas process is using the SQLite study storage {path}; "
                        f"SQLite cannot be shared by several writers: wait for it, or pass "
                        f"--storage postgresql://USER@HOST/DB to share a study")
    return lock


def sampler_seed(seed: int, n_trials: int, worker: int = 0) -> int:
    """The sampler's seed for a process joining a study that holds ``n_trials`` trials: ``seed``
    for the first process of a fresh study, otherwise a seed derived from all three, so a
    continued study or another worker draws new candidates instead of replaying the first."""
    if n_trials == 0 and worker == 0:
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, n_trials, worker]).generate_state(1)[0])


OWNER_ATTR = "hwnas_owner"


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_alive(owner: str | None) -> bool:
    """Whether ``owner`` (host:pid) is a live process of this host other than this one."""
    if not owner or ":" not in owner:
        return False
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    return pid_alive(int(pid))


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
                            f"{first_line(exc)}") from None


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
        return len({t.user_attrs["seed"] for t in study.get_trials(deepcopy=False)
                    if "seed" in t.user_attrs})
    for params, label in seeds:
        study.enqueue_trial(params, user_attrs={"seed": label}, skip_if_exists=True)
    return len(seeds)


def _requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Enqueue ``trial``'s parameters again (with its seed label)."""
    attrs = {k: v for k, v in trial.user_attrs.items() if k == "seed"}
    study.enqueue_trial(trial.params, user_attrs={**attrs, "retry_of": trial.number})


def recover_interrupted(study: optuna.Study) -> int:
    """Fail the trials left *running* by a process that died and enqueue their parameters
    again. For SQLite, under :func:`lock_sqlite` (no other hwnas process writes the study);
    a trial whose recorded owner is a live process of this host is left alone all the same."""
    stale = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
             if not _owner_alive(t.system_attrs.get(OWNER_ATTR))]
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
        _requeue(study, t)
    return len(stale)


def completed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _install_sigint(handler):
    """Install ``handler`` for SIGINT in the main thread; returns the previous one (None
    elsewhere, where signals cannot be handled)."""
    import signal
    import threading

    if (handler is None or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        return None
    return signal.signal(signal.SIGINT, handler)


def run_trials(study: optuna.Study, objective: Callable[[optuna.Trial], Sequence[float]],
               budget: int, *, progress: bool = True, desc: str = "search",
               callbacks: Sequence[Callable] = ()) -> int:
    """Run trials until ``budget`` trials of the study have completed (over all workers);
    returns how many this call completed. ``callbacks``: more Optuna callbacks (experiment
    tracking).

    The budget is exact over all workers: before a trial evaluates anything it checks how many
    trials numbered below it are complete, running or waiting, and if those already fill the
    budget it is pruned (not counted) and its worker stops."""
    before = len(completed(study))
    if before >= budget:
        return 0

    interrupted: list[int] = []
    state = {"in_objective": False, "requested": False}

    def guarded(trial: optuna.Trial) -> Sequence[float]:
        study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, _owner())
        ahead = sum(1 for t in study.get_trials(deepcopy=False, states=_COUNTED)
                    if t.number < trial.number)
        if ahead >= budget or state["requested"]:
            study.stop()
            if state["requested"]:
                interrupted.append(trial.number)
            raise optuna.TrialPruned("trial budget reached")
        try:
            state["in_objective"] = True
            return objective(trial)
        except KeyboardInterrupt:  # end quietly: pruned (not counted), run again later
            interrupted.append(trial.number)
            study.stop()
            raise optuna.TrialPruned("interrupted") from None
        finally:
            state["in_objective"] = False

    def on_sigint(signum, frame) -> None:
        """Ctrl-C interrupts an evaluation at once; elsewhere (Optuna writing the storage) it
        takes effect when the storage is consistent, before the next evaluation."""
        if state["in_objective"]:
            raise KeyboardInterrupt
        state["requested"] = True

    bar = tqdm(total=budget, initial=before, desc=desc, unit="trial", disable=not progress,
               leave=False)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == TrialState.COMPLETE:
            bar.update(1)
        if state["requested"]:
            study.stop()

    logging.getLogger("optuna").setLevel(logging.WARNING)
    previous = _install_sigint(on_sigint)
    try:
        study.optimize(guarded, n_trials=budget - before, callbacks=[callback, *callbacks],
                       catch=())
    finally:
        bar.close()
        _install_sigint(previous)
    if interrupted or state["requested"]:
        for number in interrupted:
            _requeue(study, study.trials[number])
        raise KeyboardInterrupt
    return len(completed(study)) - before
