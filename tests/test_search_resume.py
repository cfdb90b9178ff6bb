"""Resume and concurrency of a search: one writer per SQLite study and per run directory, no
live trial failed by another process, a continued study draws new candidates, Ctrl-C ends in
one line with the interrupted trial enqueued again."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
from hwnas.search.objectives import parse_objectives
from hwnas.search.study import (
    OWNER_ATTR,
    lock_sqlite,
    open_study,
    recover_interrupted,
    run_trials,
    sampler_seed,
    sqlite_url,
)
from optuna.trial import TrialState

from hwnas.cli import main
from hwnas.core.errors import UserError

OBJS = parse_objectives("accuracy,size")


@pytest.fixture(scope="module")
def checkpoint(digits_checkpoint) -> Path:
    """The session's one-epoch digits supernet (``hwnas train --epochs 1``, tests/conftest.py):
    the searches here only read it."""
    return digits_checkpoint


def _search(checkpoint: Path, out: Path, *extra: str) -> list[str]:
    return ["search", "--supernet", str(checkpoint), "--devices", "edgetpu-est", "--no-bits",
            "--objectives", "accuracy,size", "--sampler", "random", "--out", str(out),
            "--name", "r", "--quiet", *extra]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _objective(trial):
    x = trial.suggest_float("x", 0, 1)
    return x, 1 - x * x


def test_sampler_seed_is_the_seed_only_for_the_first_process_of_a_fresh_study():
    assert sampler_seed(7, 0) == 7
    seeds = {sampler_seed(7, 0, 1), sampler_seed(7, 10), sampler_seed(7, 20), sampler_seed(7, 10, 1)}
    assert len(seeds) == 4 and 7 not in seeds
    assert sampler_seed(7, 10) == sampler_seed(7, 10)  # deterministic


def test_a_continued_search_draws_new_candidates(tmp_path, checkpoint):
    # two seeds and two random draws, then four more by a second process
    assert main(_search(checkpoint, tmp_path, "--trials", "4")) == 0
    assert main(_search(checkpoint, tmp_path, "--trials", "8")) == 0
    trials = pd.read_csv(tmp_path / "r" / "trials.csv")
    assert len(trials) == 8 and trials["arch"].nunique() == 8


def test_ctrl_c_prunes_the_trial_and_enqueues_it_again(tmp_path):
    study = open_study(sqlite_url(tmp_path / "s.db"), "s", "random", 0, OBJS)
    calls = []

    def interrupted_third(trial):
        calls.append(trial.suggest_float("x", 0, 1))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return calls[-1], 1 - calls[-1]

    with pytest.raises(KeyboardInterrupt):
        run_trials(study, interrupted_third, 10, progress=False)
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE] * 2 + [TrialState.PRUNED, TrialState.WAITING]
    assert study.trials[3].user_attrs["retry_of"] == 2
    assert run_trials(study, _objective, 4, progress=False) == 2
    assert study.trials[3].state == TrialState.COMPLETE and study.trials[3].params == {"x": calls[2]}


def test_ctrl_c_in_the_cli_is_one_line_naming_a_command_that_exists(tmp_path, checkpoint,
                                                                    capsys, monkeypatch):
    from hwnas.search import runner

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "write_outputs", interrupt)
    assert main(_search(checkpoint, tmp_path, "--trials", "2")) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "hwnas: interrupted; run the same command again to continue"), err


def test_recovery_never_fails_a_trial_a_live_process_owns(tmp_path):
    study = open_study(sqlite_url(tmp_path / "s.db"), "s", "random", 0, OBJS)
    live = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    study._storage.set_trial_system_attr(live._trial_id, OWNER_ATTR,
                                         f"{socket.gethostname()}:{os.getppid()}")
    dead = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    study._storage.set_trial_system_attr(dead._trial_id, OWNER_ATTR, f"{socket.gethostname()}:{gone}")
    assert recover_interrupted(study) == 1
    assert [t.state for t in study.trials[:2]] == [TrialState.RUNNING, TrialState.FAIL]
    assert study.trials[2].system_attrs["fixed_params"] == study.trials[1].params  # again


def test_a_sqlite_study_has_one_writer(tmp_path, checkpoint, capsys):
    url = sqlite_url(tmp_path / "shared.db")
    held = lock_sqlite(url)
    try:
        with pytest.raises(UserError, match="SQLite cannot be shared"):
            lock_sqlite(url)
        out = tmp_path / "runs"
        before = _tree(tmp_path)
        assert main(_search(checkpoint, out, "--trials", "2", "--storage", url,
                            "--study-name", "shared")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "SQLite cannot be shared" in err[0], err
        assert _tree(tmp_path) == before  # nothing written: no run directory, no lock left
    finally:
        held.release()


def test_the_run_lock_is_taken_before_the_directory_is_checked(tmp_path, checkpoint, capsys):
    from hwnas.search.runner import _lock_run_dir

    held = _lock_run_dir(tmp_path / "r")
    try:
        before = _tree(tmp_path)
        assert main(_search(checkpoint, tmp_path, "--trials", "2")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "another hwnas process is writing" in err[0], err
        assert _tree(tmp_path) == before
    finally:
        held.release()


def test_a_run_whose_study_db_was_deleted_is_refused(tmp_path, checkpoint, capsys):
    assert main(_search(checkpoint, tmp_path, "--trials", "2")) == 0
    (tmp_path / "r" / "study.db").unlink()
    before = _tree(tmp_path)
    capsys.readouterr()
    assert main(_search(checkpoint, tmp_path, "--trials", "3")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study.db is missing" in err[0], err
    assert _tree(tmp_path) == before
