"""Unit tests of the search package's pieces: objectives, bits, samplers, study, outputs, plots."""

from __future__ import annotations

import numpy as np
import optuna
import pandas as pd
import pytest
from hwnas.search.bits import (
    bit_groups,
    describe_bits,
    layer_group,
    policy_for,
    suggest_group_bits,
)
from hwnas.search.objectives import parse_constraint, parse_objectives
from hwnas.search.outputs import (
    closest_infeasible,
    device_front,
    hypervolume_history,
    pareto_mask,
)
from hwnas.search.pareto import front_indices_2d, hypervolume_2d
from hwnas.search.plots import plot_across_devices, plot_fronts
from hwnas.search.samplers import (
    SAMPLERS,
    ScreeningProblem,
    available_samplers,
    make_sampler,
    register_sampler,
    resolve_sampler,
    screening_problem,
)
from hwnas.search.study import (
    enqueue_once,
    open_study,
    recover_interrupted,
    run_trials,
    sqlite_url,
)
from hwnas.supernet.spaces import get_space
from registry_support import contract_entry

from hwnas.core.errors import UserError

# -- objectives and constraints ----------------------------------------------------------------

def test_objectives_parse_with_devices_and_directions():
    objs = parse_objectives("accuracy, latency:edgetpu-est ,size")
    assert [m.key for m in objs] == ["accuracy", "latency:edgetpu-est", "size"]
    assert [m.column for m in objs] == ["accuracy", "latency_ms:edgetpu-est", "size_bytes"]
    assert [m.direction for m in objs] == ["maximize", "minimize", "minimize"]


@pytest.mark.parametrize("text, column, op, bound", [
    ("latency:edgetpu-est<=5ms", "latency_ms:edgetpu-est", "<=", 5.0),
    ("latency:x<=250us", "latency_ms:x", "<=", 0.25),
    ("size<=2MB", "size_bytes", "<=", 2e6),
    ("size <= 64KiB", "size_bytes", "<=", 65536.0),
    ("accuracy>=90%", "accuracy", ">=", 90.0),
    ("bops<=3G", "bops", "<=", 3e9),
])
def test_constraints_parse_units(text, column, op, bound):
    c = parse_constraint(text)
    assert (c.metric.column, c.op, c.bound) == (column, op, pytest.approx(bound))
    assert c.satisfied(bound) and c.violation(bound) == 0
    assert not c.satisfied(bound * 1.1 + 1 if op == "<=" else bound * 0.9 - 1)


@pytest.mark.parametrize("text", ["latency<=5ms", "size<=5 parsecs", "size=5", "accuracy>=x"])
def test_bad_constraints_are_user_errors(text):
    with pytest.raises(UserError):
        parse_constraint(text)


# -- the bit-width half of the space -------------------------------------------------------------

def test_layer_groups_follow_blocks():
    assert layer_group("blocks.3.dw_conv") == "blocks.3"
    assert layer_group("cells.12.edges.e1_0.conv") == "cells.12"
    assert layer_group("stem_conv") == "stem_conv" and layer_group("stem.conv") == "stem"


@pytest.mark.parametrize("name", ["mbv3-tiny", "nb201", "fbnet"])
def test_policy_covers_exactly_the_quantizable_layers(name):
    space = get_space(name)
    groups = bit_groups(space)
    rng = np.random.default_rng(0)
    for _ in range(3):
        arch = space.sample(rng)
        bits = {g: int(rng.choice([4, 8])) for g in groups}
        policy = policy_for(space, arch, bits)
        quantizable = [l.name for l in space.layers(arch) if l.op in ("conv", "linear")]
        assert sorted(policy.layer_names) == sorted(quantizable)
        assert all(a == 8 for _, a in policy.bits.values())
    assert policy_for(space, space.largest(), {g: 32 for g in groups}) is None
    assert describe_bits(None) == "float"


def test_group_bits_are_suggested_for_every_group():
    space = get_space("mbv3-tiny")
    groups = bit_groups(space)
    trial = optuna.trial.FixedTrial({f"bits:{g}": 6 for g in groups})
    assert suggest_group_bits(trial, groups, [4, 6, 8]) == {g: 6 for g in groups}


# -- samplers and the study ---------------------------------------------------------------------

# The sampler contract, for every sampler of the registry (``available_samplers()`` when the
# tests are collected; ``auto`` as the search resolves it) and a user's own registered one: built
# by name with a seed, an Optuna sampler, and the same seed gives the same trials, past its
# random start-up (model-based samplers fit their model here).

def user_sampler(seed, *, n_startup_trials, **_):
    """A user's sampler: TPE over each parameter on its own (Optuna's default, univariate)."""
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials)


USER_SAMPLER = "user-univariate-tpe"


@pytest.fixture(scope="module", params=[*available_samplers(), USER_SAMPLER])
def sampler_name(request) -> str:
    return contract_entry(request, USER_SAMPLER, register_sampler, user_sampler, SAMPLERS)


def test_every_sampler_is_built_and_seeded(sampler_name):
    space = get_space("nb201")
    weights = np.random.default_rng(0).normal(size=(space.feature_dim, 2))
    accuracy, size = parse_objectives("accuracy,size")
    name = resolve_sampler(sampler_name, [accuracy, size])

    def cheap(batch):  # the cheap objective (a "size"), known for every candidate
        size = np.stack([space.encode(a) for a in batch]) @ np.abs(weights[:, 1:])
        return size, np.zeros_like(size)

    def objective(trial):
        arch = space.suggest(trial)
        return float(space.encode(arch) @ weights[:, 0]), float(cheap([arch])[0][0, 0])

    problem = ScreeningProblem(space=space, directions=("maximize", "minimize"), cheap=cheap,
                               cheap_indices=(1,))
    trials = []
    for _ in range(2):
        sampler = make_sampler(name, 3, n_startup_trials=2, problem=problem)
        assert isinstance(sampler, optuna.samplers.BaseSampler)
        study = optuna.create_study(sampler=sampler, directions=["maximize", "minimize"])
        study.optimize(objective, n_trials=3)
        trials.append([t.params for t in study.trials])
    assert trials[0] == trials[1] and len(trials[0]) == 3


def test_only_a_predicted_latency_is_flagged_predicted(profile_dir, tmp_path, monkeypatch):
    """The screening sampler's layered trials need a predicted cost: latency on an adapted device
    (a predictor) is one; an estimator's, a table's and a cost model's are exact."""
    from hwnas.latency import profiles
    from hwnas.latency.devices import get_device
    from hwnas.latency.profiles import read_measurements, save_profile
    from latency_support import SPACE, write_measurements
    from test_latency_profiles import FlopsPredictor

    monkeypatch.setattr(profiles, "TRUSTED_PREDICTOR_PACKAGES",
                        profiles.TRUSTED_PREDICTOR_PACKAGES + [FlopsPredictor.__module__])
    archs, ms = write_measurements(tmp_path / "m.csv", 8)
    space = get_space(SPACE)
    save_profile("my-phone", space, FlopsPredictor().adapt(archs, ms),
                 read_measurements(tmp_path / "m.csv", space))
    devices = {d: get_device(d, space) for d in ("my-phone", "edgetpu-est")}
    for text, flags in (("accuracy,latency:my-phone", (True,)),
                        ("accuracy,latency:edgetpu-est", (False,)),
                        ("accuracy,size,latency:my-phone", (False, True))):
        problem = screening_problem(space, parse_objectives(text), [], devices, bits=False)
        assert problem.cheap_predicted == flags, text
        assert make_sampler("screening", 0, problem=problem).cheap_predicted == flags


def test_auto_and_screening_need_the_search():
    with pytest.raises(UserError, match="resolve it first"):
        make_sampler("auto", 0)
    with pytest.raises(UserError, match="needs the search problem"):
        make_sampler("screening", 0)


def test_screening_options_reach_the_screening_config_only(monkeypatch):
    """``screening_options`` set :class:`ScreeningConfig` fields of the screening sampler
    (a benchmark's variant) over the factory's own; other samplers ignore them."""
    from hwnas.search import samplers
    from hwnas.search.screening import ScreeningSampler

    seen = []
    monkeypatch.setattr(ScreeningSampler, "__init__",
                        lambda self, *a, config=None, **k: seen.append(config))
    problem = samplers.ScreeningProblem(space=get_space("nb201"), directions=("maximize",),
                                        cheap=lambda archs: (None, None), cheap_indices=())
    make_sampler("screening", 0, n_seeds=2, problem=problem,
                 screening_options={"reference_sd": 0.0})
    make_sampler("screening", 0, problem=problem)
    assert seen[0].reference_sd == 0.0 and seen[1].reference_sd == 2.0
    assert seen[0].n_startup_trials == seen[1].n_startup_trials + 2
    assert seen[0].pool_size == samplers.SCREENING_POOL
    assert make_sampler("tpe", 0, screening_options={"reference_sd": 0.0})._n_startup_trials


def test_seeds_extend_the_random_start_up():
    assert make_sampler("tpe", 0, n_seeds=4)._n_startup_trials == 14


def test_unknown_sampler_is_a_user_error():
    with pytest.raises(UserError, match="unknown sampler 'sa'"):
        make_sampler("sa", 0)
    with pytest.raises(UserError, match="taken by a built-in sampler"):
        register_sampler("tpe", user_sampler)


def _objective(trial):
    x = trial.suggest_float("x", 0, 1)
    return x, 1 - x * x


def test_budget_counts_completed_trials_and_recovers_interrupted(tmp_path):
    objs = parse_objectives("accuracy,size")
    study = open_study(sqlite_url(tmp_path / "s.db"), "s", "random", 0, objs)
    assert enqueue_once(study, [({"x": 0.5}, "half")]) == 1
    assert run_trials(study, _objective, 4, progress=False) == 4
    assert run_trials(study, _objective, 4, progress=False) == 0  # budget already met
    study.ask()  # a worker that died mid-trial
    assert recover_interrupted(study) == 1
    assert run_trials(study, _objective, 6, progress=False) == 2
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 6
    assert states.count(optuna.trial.TrialState.RUNNING) == 0
    assert study.trials[0].user_attrs["seed"] == "half" and study.trials[0].params == {"x": 0.5}


def test_reopening_a_study_with_other_objectives_is_refused(tmp_path):
    open_study(sqlite_url(tmp_path / "s.db"), "s", "random", 0, parse_objectives("accuracy,size"))
    with pytest.raises(UserError, match="optimises"):
        open_study(sqlite_url(tmp_path / "s.db"), "s", "random", 0, parse_objectives("accuracy"))


# -- outputs ------------------------------------------------------------------------------------

def test_pareto_mask_matches_brute_force():
    rng = np.random.default_rng(0)
    v = rng.random((150, 3))
    mask = pareto_mask(v, ["maximize", "minimize", "minimize"])
    s = v * np.array([-1, 1, 1])
    brute = [not np.any(np.all(s <= s[i], axis=1) & np.any(s < s[i], axis=1)) for i in range(150)]
    assert mask.tolist() == brute


def test_hypervolume_2d_by_hand():
    # points (acc, lat): (2, 1) and (3, 2); reference (0, 4): area 2*1 + 3*2 = 8
    assert hypervolume_2d(np.array([1.0, 2.0]), np.array([2.0, 3.0]), 4.0, 0.0) == pytest.approx(8.0)
    # a point beyond the reference adds nothing
    assert hypervolume_2d(np.array([9.0]), np.array([5.0]), 4.0, 0.0) == 0.0


def _frame():
    return pd.DataFrame({
        "trial": [0, 1, 2, 3, 4], "arch": ["a", "b", "c", "a", "d"], "policy": ["", "", "", "", ""],
        "bits": ["float"] * 5, "accuracy": [90.0, 95.0, 80.0, 90.0, 99.0],
        "size_bytes": [10.0, 20.0, 30.0, 10.0, 5.0],
        "latency_ms:x": [1.0, 2.0, 3.0, 1.0, 9.0], "latency_ms:y": [3.0, 2.0, 1.0, 3.0, 9.0],
        "feasible": [True, True, True, True, False], "pareto": [False] * 5,
    })


def test_device_fronts_differ_and_skip_repeats_and_infeasible():
    objs = parse_objectives("accuracy,latency:x")
    assert device_front(_frame(), "x", objs)["trial"].tolist() == [0, 1]
    assert device_front(_frame(), "y", objs)["trial"].tolist() == [2, 1]
    hv = hypervolume_history(_frame(), ["x"])
    assert (np.diff(hv["hypervolume"]) >= 0).all() and len(hv) == 5
    closest = closest_infeasible(_frame(), [parse_constraint("latency:x<=0.5ms")], n=2)
    assert closest["trial"].tolist() == [0, 3]


def test_front_2d_keeps_exactly_the_non_dominated_points():
    rng = np.random.default_rng(0)
    cost, acc = rng.random(200), rng.random(200)
    idx = front_indices_2d(cost, acc)
    brute = [i for i in range(200)
             if not np.any((cost <= cost[i]) & (acc >= acc[i]) & ((cost < cost[i]) | (acc > acc[i])))]
    assert sorted(idx.tolist()) == sorted(brute)


def test_plots_are_written_atomically(tmp_path):
    frame = _frame()
    objs = parse_objectives("accuracy,latency:x")
    fronts = {d: device_front(frame, d, objs) for d in ("x", "y")}
    for path in (plot_fronts(frame, fronts, tmp_path / "f.png"),
                 plot_across_devices(frame, fronts, tmp_path / "d.png")):
        assert path.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.png", "f.png"]


STALE_FONT_CACHE = """
import json
from pathlib import Path
import matplotlib
from matplotlib import font_manager  # noqa: F401 (builds the cache)
(cache,) = Path(matplotlib.get_cachedir()).glob("fontlist-*.json")
data = json.loads(cache.read_text())
data["ttflist"] = [f for f in data["ttflist"] if f["name"] == "DejaVu Sans"]
cache.write_text(json.dumps(data))
"""

LOG_PLOT = """
import sys
import matplotlib.pyplot as plt
fig, ax = plt.subplots(); ax.set_yscale("log"); ax.plot([1, 2, 3], [1, 10, 100])
fig.savefig(sys.argv[1])
"""

ACROSS_DEVICES = """
import sys
sys.path.insert(0, sys.argv[2])
from test_search_units import _frame
from hwnas.search.objectives import parse_objectives
from hwnas.search.outputs import device_front
from hwnas.search.plots import plot_across_devices
frame, objs = _frame(), parse_objectives("accuracy,latency:x")
plot_across_devices(frame, {d: device_front(frame, d, objs) for d in ("x", "y")}, sys.argv[1])
"""


def test_plots_keep_stderr_clean_with_a_stale_font_cache(tmp_path):
    """A font cache from another matplotlib install (only system DejaVu fonts listed, as on the CI
    machines) makes log-axis ticks warn per mathtext font; the plots hold those warnings back."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")}
    run = lambda code, *args: subprocess.run([sys.executable, "-c", code, *args], env=env,  # noqa: E731
                                             capture_output=True, text=True, check=True)
    run(STALE_FONT_CACHE)
    assert "findfont" in run(LOG_PLOT, str(tmp_path / "bare.png")).stderr  # the setup reproduces it
    out = tmp_path / "d.png"
    proc = run(ACROSS_DEVICES, str(out), str(Path(__file__).parent))
    assert proc.stderr == "" and out.read_bytes()[:4] == b"\x89PNG"


# -- the accuracy predictor -----------------------------------------------------------------------

def test_accuracy_predictor_ranks_a_learnable_target_and_reports_honestly():
    from hwnas.search.accuracy_predictor import (
        candidate_features,
        fit_and_report,
        sample_candidates,
    )

    space = get_space("mbv3-tiny")
    groups = bit_groups(space)
    cands = sample_candidates(space, groups, [4, 8, 32], 80, seed=0)
    x = np.stack([candidate_features(space, a, policy_for(space, a, b), groups) for a, b in cands])
    # a synthetic accuracy: more FLOPs and more bits help
    y = np.array([np.log(space.flops(a)) * 5 + sum(np.log2(v) for v in b.values()) / len(b)
                  for a, b in cands])
    predictor, report = fit_and_report(x, y, seed=0)
    assert report.n_train + report.n_test == 80 and report.spearman > 0.7
    mean, std = predictor.predict_with_std(x[:5])
    assert mean.shape == std.shape == (5,) and (std >= 0).all()
    # noise cannot be learnt: the held-out Spearman says so
    _, noise = fit_and_report(x, np.random.default_rng(1).random(80), seed=0)
    assert abs(noise.spearman) < 0.6


def test_a_run_directory_is_written_by_one_process_at_a_time(tmp_path):
    from hwnas.search.runner import _lock_run_dir

    first = _lock_run_dir(tmp_path / "r")
    with pytest.raises(UserError, match="another hwnas process is writing"):
        _lock_run_dir(tmp_path / "r")
    first.close()
    _lock_run_dir(tmp_path / "r").close()  # free again


def test_hessian_seeds_only_when_the_budget_reaches_them(monkeypatch):
    """A search whose trials are all taken by the plain seeds (largest / smallest, float and
    int8) does not compute the Hessian policies no trial would run; a larger budget does."""
    from hwnas.search import runner
    from hwnas.search.config import SearchConfig
    from hwnas.supernet import get_space

    calls = []
    monkeypatch.setattr(runner, "sensitivity_seeds",
                        lambda *a, **k: calls.append(1) or [])
    space, lines = get_space("mbv3-tiny"), []
    for trials, expected in ((4, 0), (5, 1)):
        cfg = SearchConfig(trials=trials, bits=True)
        seeds = runner.seed_trials(space, None, None, cfg, log=lines.append)
        assert len(seeds) == 4 and len(calls) == expected
    assert lines[0] == "sensitivity seeds: skipped (4 trials run only the 4 plain seeds)"
