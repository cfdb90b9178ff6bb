"""Unit tests of the search package's pieces: samplers, study helpers, the 2-D front, plots."""

from __future__ import annotations

import numpy as np
import optuna
import pandas as pd
import pytest

from search.plots import front_2d, plot_pareto
from search.samplers import SAMPLERS, make_sampler
from search.study import enqueue_seeds, open_study, pareto_trials, sqlite_url, trials_frame
from supernet.errors import UserError
from supernet.spaces import get_space


@pytest.mark.parametrize("name", SAMPLERS)
def test_every_sampler_is_built_and_seeded(name):
    a, b = make_sampler(name, 3), make_sampler(name, 3)
    assert type(a) is type(b)
    study = optuna.create_study(sampler=a)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    study2 = optuna.create_study(sampler=b)
    study2.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    assert [t.params for t in study.trials] == [t.params for t in study2.trials]


def test_unknown_sampler_is_a_user_error():
    with pytest.raises(UserError, match="unknown sampler 'sa'"):
        make_sampler("sa", 0)


def test_front_2d_keeps_exactly_the_non_dominated_points():
    rng = np.random.default_rng(0)
    cost, acc = rng.random(200), rng.random(200)
    idx = front_2d(cost, acc)
    brute = [i for i in range(200)
             if not np.any((cost <= cost[i]) & (acc >= acc[i]) & ((cost < cost[i]) | (acc > acc[i])))]
    assert sorted(idx.tolist()) == sorted(brute)
    assert np.all(np.diff(cost[idx]) >= 0) and np.all(np.diff(acc[idx]) > 0)


def _fake_study(tmp_path, values_by_arch):
    space = get_space("mbv3-tiny")
    study = open_study(sqlite_url(tmp_path / "s.db"), "s", "random", 0)
    for arch, (acc, flops, lat) in values_by_arch:
        t = study.ask()
        space.suggest(t)
        for k, v in {"arch": arch, "accuracy": acc, "flops": flops, "params": 1.0,
                     "size_bytes": 4.0, "latency_ms": lat, "latency_p95_ms": lat,
                     "latency_cv": 0.0}.items():
            t.set_user_attr(k, v)
        study.tell(t, (acc, flops, lat))
    return study


def test_pareto_trials_drop_repeated_architectures(tmp_path):
    study = _fake_study(tmp_path, [("a", (90.0, 10.0, 1.0)), ("a", (90.0, 10.0, 1.0)),
                                   ("b", (95.0, 20.0, 2.0)), ("c", (80.0, 30.0, 3.0))])
    front = pareto_trials(study)
    assert [t.user_attrs["arch"] for t in front] == ["a", "b"]  # c is dominated, a's repeat dropped
    frame = trials_frame(study)
    assert frame["pareto"].tolist() == [True, False, True, False]


def test_reopening_a_study_with_other_objectives_is_refused(tmp_path):
    _fake_study(tmp_path, [("a", (90.0, 10.0, 1.0))])
    with pytest.raises(UserError, match="optimises"):
        open_study(sqlite_url(tmp_path / "s.db"), "s", "random", 0,
                   objectives={"accuracy": "maximize", "latency_ms": "minimize"})


def test_seeds_are_enqueued_once_in_a_fresh_study(tmp_path):
    space = get_space("mbv3-tiny")
    study = open_study(sqlite_url(tmp_path / "q.db"), "q", "tpe", 0)
    enqueue_seeds(study, space)
    enqueue_seeds(study, space)  # second call: the study is no longer empty
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert len(waiting) == 2
    archs = {space.to_string(space.suggest(study.ask())) for _ in waiting}  # ask() takes the queue
    assert archs == {space.to_string(space.largest()), space.to_string(space.smallest())}


def test_plot_is_written_atomically(tmp_path):
    frame = pd.DataFrame({"accuracy": [90.0, 95.0, 80.0], "flops": [1e6, 2e6, 3e6],
                          "latency_ms": [1.0, 2.0, 3.0], "size_bytes": [10.0, 20.0, 30.0],
                          "pareto": [True, True, False]})
    path = plot_pareto(frame, tmp_path / "p.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"]
