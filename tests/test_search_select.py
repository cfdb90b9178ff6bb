"""Reading a run's fronts: the most accurate model within a latency budget on one device
(:func:`hwnas.search.outputs.select_under_budget`) and the models' ranks across devices
(:func:`hwnas.search.outputs.device_ranks`). Synthetic frames in the run directory's columns."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hwnas.search.objectives import parse_objectives
from hwnas.search.outputs import device_front, device_ranks, select_under_budget

from hwnas.core.errors import UserError


def _frame(rows: list[tuple]) -> pd.DataFrame:
    """rows: (trial, accuracy, latency on x, latency on y, size_bytes[, feasible])."""
    out = []
    for r in rows:
        trial, acc, lx, ly, size = r[:5]
        out.append({"trial": trial, "arch": f"a{trial}", "policy": "", "bits": "float",
                    "accuracy": acc, "size_bytes": size, "latency_ms:x": lx, "latency_ms:y": ly,
                    "feasible": r[5] if len(r) > 5 else True})
    return pd.DataFrame(out)


def test_picks_the_most_accurate_model_within_the_budget():
    f = _frame([(0, 90.0, 1.0, 5.0, 100), (1, 95.0, 2.0, 1.0, 200), (2, 97.0, 3.0, 2.0, 300)])
    assert int(select_under_budget(f, "x", 2.5)["trial"]) == 1
    assert int(select_under_budget(f, "x", 3.0)["trial"]) == 2  # the bound itself fits
    assert int(select_under_budget(f, "x", 1.0)["trial"]) == 0
    # another device, another choice from the same models
    assert int(select_under_budget(f, "y", 1.5)["trial"]) == 1
    assert int(select_under_budget(f, "y", 4.9)["trial"]) == 2


def test_ties_go_to_the_faster_then_the_smaller_model():
    f = _frame([(0, 95.0, 2.0, 1.0, 100), (1, 95.0, 1.5, 1.0, 300), (2, 95.0, 1.5, 1.0, 200)])
    assert int(select_under_budget(f, "x", 2.0)["trial"]) == 2


def test_skips_infeasible_rows_and_missing_latencies():
    f = _frame([(0, 90.0, 1.0, 1.0, 100), (1, 99.0, 1.0, 1.0, 100, False),
                (2, 98.0, np.nan, 1.0, 100)])
    assert int(select_under_budget(f, "x", 5.0)["trial"]) == 0


def test_no_model_within_the_budget_names_the_fastest():
    f = _frame([(3, 90.0, 1.25, 5.0, 100), (4, 95.0, 2.0, 1.0, 200)])
    with pytest.raises(UserError, match=r"within 0\.5 ms on x.*trial 3, takes 1\.25 ms"):
        select_under_budget(f, "x", 0.5)


def test_unknown_device_lists_the_known_ones():
    f = _frame([(0, 90.0, 1.0, 1.0, 100)])
    with pytest.raises(UserError, match=r"'z'.*devices: x, y"):
        select_under_budget(f, "z", 1.0)


@pytest.mark.parametrize("budget", [0, -1.0, float("nan"), float("inf"), "5ms", True, None])
def test_bad_budgets_are_user_errors(budget):
    with pytest.raises(UserError, match="positive number of milliseconds"):
        select_under_budget(_frame([(0, 90.0, 1.0, 1.0, 100)]), "x", budget)


def test_empty_front_is_a_user_error():
    with pytest.raises(UserError, match="empty front"):
        select_under_budget(_frame([(0, 90.0, 1.0, 1.0, 100)]).head(0), "x", 1.0)


def test_choice_from_a_device_front_is_the_best_of_all_trials():
    """The most accurate trial within a budget is always on the device's front, so choosing
    from the front loses nothing (checked against brute force on random trials)."""
    rng = np.random.default_rng(0)
    n = 60
    trials = _frame([(i, float(rng.uniform(80, 99)), float(rng.uniform(0.1, 2)),
                      float(rng.uniform(0.1, 2)), float(rng.integers(1, 500)),
                      bool(rng.random() > 0.1)) for i in range(n)])
    objectives = parse_objectives("accuracy,latency:x,size")
    for device in ("x", "y"):
        front = device_front(trials, device, objectives)
        for budget in (0.3, 0.7, 1.2, 2.0):
            ok = trials[trials["feasible"] & (trials[f"latency_ms:{device}"] <= budget)]
            if ok.empty:
                continue
            chosen = select_under_budget(front, device, budget)
            assert chosen["accuracy"] == ok["accuracy"].max()
            assert chosen[f"latency_ms:{device}"] <= budget


def test_device_ranks_union_ranks_and_front_flags():
    trials = _frame([(0, 90.0, 1.0, 3.0, 100), (1, 95.0, 2.0, 1.0, 200), (2, 97.0, 3.0, 2.0, 300),
                     (3, 80.0, 4.0, 4.0, 400)])
    fronts = {"x": trials[trials["trial"].isin([0, 1, 2])], "y": trials[trials["trial"].isin([1, 2])]}
    table = device_ranks(fronts)
    assert table["trial"].tolist() == [2, 1, 0]  # most accurate first, each model once
    assert table["rank:x"].tolist() == [3, 2, 1]
    assert table["rank:y"].tolist() == [2, 1, 3]
    assert table["front:x"].tolist() == [True, True, True]
    assert table["front:y"].tolist() == [True, True, False]
    assert table["latency_ms:y"].tolist() == [2.0, 1.0, 3.0]


def test_device_ranks_over_all_trials_keeps_dominated_models_once():
    trials = _frame([(0, 90.0, 1.0, 3.0, 100), (1, 95.0, 2.0, 1.0, 200), (2, 97.0, 3.0, 2.0, 300),
                     (3, 80.0, 4.0, 4.0, 400)])
    repeat = trials[trials["trial"] == 1].assign(trial=4)  # same arch and policy again
    fronts = {"x": trials[trials["trial"].isin([0, 1, 2])], "y": trials[trials["trial"].isin([1, 2])]}
    table = device_ranks(fronts, trials=pd.concat([trials, repeat], ignore_index=True))
    assert table["trial"].tolist() == [2, 1, 0, 3]
    assert table["rank:x"].tolist() == [3, 2, 1, 4]
    assert table["rank:y"].tolist() == [2, 1, 3, 4]
    assert table["front:x"].tolist() == [True, True, True, False]
    assert table["front:y"].tolist() == [True, True, False, False]


def test_device_ranks_of_empty_fronts_is_an_empty_table():
    empty = _frame([(0, 90.0, 1.0, 1.0, 100)]).head(0)
    table = device_ranks({"x": empty, "y": empty})
    assert table.empty and "rank:x" in table.columns and "front:y" in table.columns
