"""The screening sampler (search/screening.py) and the scoring of benchmarks/search_nb201.py."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import optuna
import pytest
from hwnas.search.acquisition import expected_hvi_2d
from hwnas.search.gp import PoolGP
from hwnas.search.layered import front_ehvi, is_layered_trial, layered_now, reference_candidate
from hwnas.search.pareto import front_indices_2d, hypervolume_2d
from hwnas.search.screening import ScreeningConfig, ScreeningSampler
from hwnas.supernet.space import SearchSpace

from hwnas.core.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    """The benchmark script as a module (registered so that its dataclasses resolve)."""
    name = "search_nb201_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "search_nb201.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# -- scoring ------------------------------------------------------------------------------------


def test_hv_ratio_on_a_hand_made_example():
    bench = _bench()
    # (latency, accuracy): three front points, one dominated point
    lat = np.array([1.0, 2.0, 3.0, 2.5, 4.0])
    acc = np.array([50.0, 60.0, 70.0, 55.0, 40.0])
    front = bench.true_front(lat, acc)
    assert front.size == 3
    assert front.ref_latency == pytest.approx(3.0 * 1.01)   # highest front latency x 1.01
    assert front.ref_accuracy == pytest.approx(50.0 - 1.0)  # lowest front accuracy - 1
    # staircase: [1, 2) at 50, [2, 3) at 60, [3, 3.03) at 70, above 49
    assert front.hypervolume == pytest.approx(1 * 1 + 1 * 11 + 0.03 * 21)
    assert bench.hv_ratio([1], lat, acc, front) == pytest.approx(1.03 * 11 / 12.63)
    # the dominated point and one beyond the reference point add nothing
    assert bench.hv_ratio([1, 3, 4], lat, acc, front) == pytest.approx(1.03 * 11 / 12.63)
    assert bench.hv_ratio([4], lat, acc, front) == 0.0
    assert bench.hv_ratio([0, 1, 2], lat, acc, front) == pytest.approx(1.0)
    # a budget counts evaluations, repeats included
    traj = [1, 1, 1, 0, 2]
    got = bench.score_trajectory(traj, [2, 4, 5], lat, acc, front)
    assert got[2] == pytest.approx(1.03 * 11 / 12.63)
    assert got[4] == pytest.approx((1 * 1 + 1.03 * 11) / 12.63)
    assert got[5] == pytest.approx(1.0)


def test_paired_differences_pair_device_and_seed():
    bench = _bench()

    def row(device, b, seeds, sampler="screening"):
        return {"device": device, "sampler": sampler, "evaluations": b, "hv_ratio_per_seed": seeds}

    base = [row("a", 100, [0.5, 0.6, 0.7]), row("b", 100, [0.9, 0.9, 0.9])]
    new = [row("a", 100, [0.6, 0.6, 0.8]), row("b", 100, [0.9, 0.8, 1.0])]
    (got,) = bench.paired_differences(new, base)
    # per seed, mean over the two devices: +0.05, -0.05, +0.1
    assert got["paired_difference"] == pytest.approx(0.1 / 3, abs=1e-4)
    assert got["standard_error"] == pytest.approx(np.std([.05, -.05, .1], ddof=1) / 3 ** .5,
                                                  abs=1e-4)
    assert got["seeds_ahead"] == 2 and got["seeds"] == 3
    with pytest.raises(UserError, match="baseline lacks"):
        bench.paired_differences([row("c", 100, [0.5])], base)
    # a fresh-seed run (--seed-start) pairs only with a baseline of the same first seed
    fresh = [dict(r, seed_start=10) for r in new]
    with pytest.raises(UserError, match="seed-start"):
        bench.paired_differences(fresh, base)
    (same,) = bench.paired_differences(fresh, [dict(r, seed_start=10) for r in base])
    assert same == got


def test_seed_start_runs_the_later_seeds(monkeypatch):
    """``--seed-start 10 --seeds 2`` searches with seeds 10 and 11, and the rows say so; the
    default (0) keeps the seeds, hence the results, of the runs before the option."""
    from types import SimpleNamespace

    bench = _bench()
    seen = []

    def fake_search(space, problem, sampler, seed, n_evals, std_scale=0.0, options=None):
        seen.append(seed)
        return [seed] * n_evals

    monkeypatch.setattr(bench, "run_search", fake_search)
    monkeypatch.setattr(bench, "score_trajectory",
                        lambda traj, budgets, *a: {b: traj[0] / 100 for b in budgets})
    monkeypatch.setattr(bench, "missed_by_latency", lambda *a: [0.0] * len(bench.BREAKDOWN_PARTS))
    problem = SimpleNamespace(device="d", latency=None, accuracy=None, front=None, measured=10)
    rows, _ = bench.run_benchmark(None, [problem], ["screening"], 2, [5], progress=False,
                                  seed_start=10)
    assert seen == [10, 11]
    assert rows[0]["hv_ratio_per_seed"] == [0.1, 0.11] and rows[0]["seed_start"] == 10
    seen.clear()
    bench.run_benchmark(None, [problem], ["screening"], 2, [5], progress=False)
    assert seen == [0, 1]


def test_missed_hypervolume_by_latency_third():
    bench = _bench()
    lat = np.array([1.0, 2.0, 3.0, 2.5, 4.0])
    acc = np.array([50.0, 60.0, 70.0, 55.0, 40.0])
    front = bench.true_front(lat, acc)
    # thirds of [1, 3.03]; the point (2, 60) alone misses [1, 2) at 1 point and [3, 3.03) at 10
    third = 2.03 / 3
    got = bench.missed_by_latency([1], lat, acc, front)
    want = [third * 1, (2.0 - 1 - third) * 1, 0.03 * 10]
    assert got == pytest.approx([w / 12.63 for w in want], abs=1e-4)
    assert sum(got) == pytest.approx(1 - bench.hv_ratio([1], lat, acc, front), abs=1e-3)
    assert bench.missed_by_latency([0, 1, 2], lat, acc, front) == [0.0, 0.0, 0.0]


def test_front_and_hypervolume_agree_with_brute_force():
    rng = np.random.default_rng(0)
    cost, gain = rng.random(300), rng.random(300)
    idx = front_indices_2d(cost, gain)
    brute = [i for i in range(300) if not np.any((cost <= cost[i]) & (gain >= gain[i])
                                                 & ((cost < cost[i]) | (gain > gain[i])))]
    assert sorted(idx.tolist()) == sorted(brute)
    # Monte Carlo estimate of the dominated area
    ref = (0.9, 0.2)
    u = rng.random((200_000, 2)) * [ref[0], 1 - ref[1]] + [0, ref[1]]
    dominated = np.zeros(len(u), bool)
    for i in idx:
        dominated |= (u[:, 0] >= cost[i]) & (u[:, 1] <= gain[i])
    area = dominated.mean() * ref[0] * (1 - ref[1])
    assert hypervolume_2d(cost, gain, *ref) == pytest.approx(area, rel=0.02)


@pytest.mark.parametrize("uncertain_cost", [False, True])
def test_expected_hvi_matches_monte_carlo(uncertain_cost):
    rng = np.random.default_rng(1)
    fc, fg = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.7, 0.9])
    mu, sd, cost = np.array([0.8, 0.6, 0.95]), np.array([0.1, 0.05, 0.2]), np.array([1.5, 0.5, 3.5])
    cost_sd = np.array([0.5, 0.3, 0.4]) if uncertain_cost else None
    ref = (4.0, 0.3)
    got = expected_hvi_2d(mu, sd, cost, fc, fg, *ref, cost_sd=cost_sd)
    base = hypervolume_2d(fc, fg, *ref)
    for j in range(3):
        g = rng.normal(mu[j], sd[j], 4000)
        c = rng.normal(cost[j], cost_sd[j], 4000) if uncertain_cost else np.full(4000, cost[j])
        mc = np.mean([hypervolume_2d(np.r_[fc, cj], np.r_[fg, gj], *ref) - base
                      for gj, cj in zip(g, c)])
        assert got[j] == pytest.approx(mc, rel=0.08, abs=2e-3)
    if uncertain_cost:  # uncertainty about the cost gives a chance to the slow candidate
        assert got[2] > expected_hvi_2d(mu, sd, cost, fc, fg, *ref)[2]


def test_pool_gp_incremental_update_equals_refit():
    rng = np.random.default_rng(0)
    pool = rng.random((200, 4))
    y = np.sin(3 * pool[:, 0]) + pool[:, 1] ** 2
    gp = PoolGP(pool, length_factors=(0.5,), noises=(1e-2,), floor_quantile=0.0)
    gp.refit(pool[:20], y[:20])
    for i in range(20, 30):
        gp.add(pool[i])
    mu, sd = gp.predict(y[:30])
    ref = PoolGP(pool, length_factors=(0.5,), noises=(1e-2,), floor_quantile=0.0)
    ref.refit(pool[:30], y[:30])
    mu2, sd2 = ref.predict(y[:30])
    np.testing.assert_allclose(mu, mu2, atol=1e-8)
    np.testing.assert_allclose(sd, sd2, atol=1e-8)


# -- the sampler on a synthetic problem ---------------------------------------------------------


class ToySpace(SearchSpace):
    """6 categorical choices of 4 values (4,096 architectures): accuracy has interactions,
    latency is a known additive cost (the cheap objective)."""

    name = "toy"
    input_shape = (1, 1, 1)
    num_classes = 2
    K, V = 6, 4

    def sample(self, rng):
        return tuple(int(v) for v in rng.integers(0, self.V, self.K))

    def smallest(self):
        return (0,) * self.K

    def largest(self):
        return (self.V - 1,) * self.K

    def all_architectures(self):
        return itertools.product(range(self.V), repeat=self.K)

    def to_string(self, arch):
        return "-".join(map(str, arch))

    def from_string(self, text):
        return tuple(int(v) for v in text.split("-"))

    @property
    def feature_names(self):
        return [f"x{i}={v}" for i in range(self.K) for v in range(self.V)]

    def encode(self, arch):
        out = np.zeros((self.K, self.V), np.float32)
        out[np.arange(self.K), list(arch)] = 1
        return out.reshape(-1)

    def layers(self, arch):
        raise NotImplementedError

    def suggest(self, trial):
        return tuple(int(trial.suggest_categorical(f"x{i}", list(range(self.V))))
                     for i in range(self.K))

    def to_params(self, arch):
        return {f"x{i}": int(v) for i, v in enumerate(arch)}

    def build_supernet(self):
        raise NotImplementedError


class SampledToySpace(ToySpace):
    """The same space without enumeration: the sampler must use a random pool."""

    all_architectures = None


def toy_values(arch):
    x = np.asarray(arch, float)
    acc = 60 + 4 * np.sqrt(x[:3].sum()) + 3 * np.tanh(x[3] * x[4] - 2) - (x[5] - 1.5) ** 2
    lat = 1 + x[:3].sum() + 0.5 * x[3] + 0.3 * x[4]
    return float(acc), float(lat)


def run_toy(space, sampler, n):
    evaluated = []

    def objective(trial):
        arch = space.suggest(trial)
        evaluated.append(arch)
        return toy_values(arch)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    study.optimize(objective, n_trials=n)
    return evaluated


def toy_hv_ratio(evaluated):
    bench = _bench()
    allv = np.array([toy_values(a) for a in itertools.product(range(4), repeat=6)])
    front = bench.true_front(allv[:, 1], allv[:, 0])
    v = np.array([toy_values(a) for a in evaluated])
    return bench.hv_ratio(np.arange(len(v)), v[:, 1], v[:, 0], front)


def cheap_latency(archs):
    return np.array([toy_values(a)[1] for a in archs])


def cheap_latency_with_std(archs):
    lat = cheap_latency(archs)
    return lat, 0.05 * lat


@pytest.mark.parametrize("space_cls,config,cheap", [
    (ToySpace, ScreeningConfig(), cheap_latency),
    (SampledToySpace, ScreeningConfig(pool_size=400, cheap_std_scale=1.0),
     cheap_latency_with_std),
    (ToySpace, ScreeningConfig(output_warp="none", layer_share=0.0), cheap_latency),
])
def test_screening_is_deterministic_and_beats_random(space_cls, config, cheap):
    space = space_cls()
    n = 40

    def screening(seed):
        return ScreeningSampler(space, cheap, (1,), seed=seed, config=config,
                                directions=["maximize", "minimize"])

    sampler = screening(0)
    a = run_toy(space, sampler, n)
    assert sampler._gps[0].warp == config.output_warp  # two objectives, one cheap: the EHVI
    assert run_toy(space, screening(0), n) == a
    assert run_toy(space, screening(1), n) != a
    assert len(set(a)) == n  # never pays twice for one architecture
    ours = np.mean([toy_hv_ratio(run_toy(space, screening(s), n)) for s in range(3)])
    rand = np.mean([toy_hv_ratio(run_toy(space, optuna.samplers.RandomSampler(seed=s), n))
                    for s in range(3)])
    assert ours > rand + 0.03, (ours, rand)


def test_front_cost_slack_revisits_cells_just_slower_than_the_front():
    space = ToySpace()

    def run(slack, seed=0):
        cfg = ScreeningConfig(front_cost_slack=slack)
        return run_toy(space, ScreeningSampler(space, cheap_latency, (1,), seed=seed,
                                               config=cfg, directions=["maximize", "minimize"]),
                       30)

    a = run(0.2)
    assert run(0.2) == a and len(set(a)) == 30  # deterministic, never pays twice
    assert a != run(0.0)  # the slack changes the choices after the start-up
    assert a[:10] == run(0.0)[:10]  # the start-up is untouched

    def run_sd(cheap, sd):
        cfg = ScreeningConfig(front_slack_sd=sd)
        return run_toy(space, ScreeningSampler(space, cheap, (1,), seed=0, config=cfg,
                                               directions=["maximize", "minimize"]), 30)

    # in units of the cost's standard deviation: nothing where the cost has none (exact)
    assert run_sd(cheap_latency, 3.0) == run(0.0)
    assert run_sd(cheap_latency_with_std, 3.0) != run_sd(cheap_latency_with_std, 0.0)


def test_early_layer_share_takes_more_layered_trials_before_early_trials():
    early = ScreeningConfig(early_layer_share=0.5, early_trials=20)  # layer_share 0.25 after
    # 10 start-up trials: one in two of the surrogate's trials until 20 are complete, then 1 in 4
    assert [d for d in range(10, 32) if layered_now(early, d, 10)] == [11, 13, 15, 17, 19, 21,
                                                                        25, 29]
    off = ScreeningConfig()  # early_layer_share 0: layer_share throughout, as before
    assert [layered_now(off, d, 10) for d in range(10, 40)] == [
        is_layered_trial(0.25, d - 10) for d in range(10, 40)]
    space = ToySpace()

    def run(cfg):
        return run_toy(space, ScreeningSampler(space, cheap_latency, (1,), seed=0, config=cfg,
                                               directions=["maximize", "minimize"],
                                               cheap_predicted=(True,)), 26)

    # before early_trials the same trials as a constant share of 0.5, not those of 0.25
    const, quarter = run(ScreeningConfig(layer_share=0.5)), run(ScreeningConfig())
    got = run(early)
    assert got[:20] == const[:20] and got[:20] != quarter[:20]
    for bad in ({"early_layer_share": 1.0}, {"early_trials": -1}):
        with pytest.raises(UserError, match="early_layer_share"):
            ScreeningConfig(**bad)


def test_layered_ehvi_looks_behind_the_front_for_hidden_cells():
    assert [j for j in range(12) if is_layered_trial(0.25, j)] == [3, 7, 11]
    assert not any(is_layered_trial(0.0, j) for j in range(12))
    # evaluated: the front (1, 10), (3, 12) and (2, 5) behind it (layer 2); candidates: hidden by
    # (1, 10) at cost 1.5, improving the front at cost 0.5, two of the evaluated points
    obs_cost, obs_gain = np.array([1.0, 3.0, 2.0]), np.array([10.0, 12.0, 5.0])
    cost, mu, sd = np.array([1.5, 0.5, 1.0, 2.0]), np.array([8.0, 11.0, 10.0, 5.0]), np.full(4, .1)
    taken = np.array([False, False, True, True])
    plain = front_ehvi(mu, sd, cost, None, obs_cost, obs_gain, 2)
    assert plain[1] > 0.1 and plain[0] < 1e-9  # the EHVI sees no gain behind the front
    got = front_ehvi(mu, sd, cost, None, obs_cost, obs_gain, 2, layered=True, taken=taken)
    assert got[0] > 0.1 and np.all(got[1:] == -1.0)  # only the hidden, untaken candidate
    # no hidden candidate improves the second layer: the plain EHVI
    mu2 = np.array([4.0, 11.0, 10.0, 5.0])
    assert np.array_equal(front_ehvi(mu2, sd, cost, None, obs_cost, obs_gain, 2, True, taken),
                          front_ehvi(mu2, sd, cost, None, obs_cost, obs_gain, 2))
    space = ToySpace()

    def run(share, predicted=(True,), cheap=cheap_latency):
        return run_toy(space, ScreeningSampler(space, cheap, (1,), seed=0,
                                               config=ScreeningConfig(layer_share=share),
                                               directions=["maximize", "minimize"],
                                               cheap_predicted=predicted), 30)

    a, plain = run(0.5), run(0.0)
    assert run(0.5) == a and len(set(a)) == 30  # deterministic, never pays twice
    assert a[:11] == plain[:11]  # the 10 start-up trials and the first plain one
    assert a[11] != plain[11]  # the second surrogate trial is layered
    # gated on a predicted cost: an exact one (the default), even with a deviation (a
    # measurement's noise), never takes a layered trial
    assert run(0.5, ()) == plain
    assert run(0.5, (False,), cheap_latency_with_std) == run(0.0, (True,), cheap_latency_with_std)
    with pytest.raises(UserError, match="cheap_predicted has 2 flags for 1 cheap"):
        run(0.5, (True, False))


def test_three_objectives_and_enqueued_trials():
    space = ToySpace()
    sampler = ScreeningSampler(space, lambda archs: np.array(
        [[toy_values(a)[1], float(sum(a))] for a in archs]), (1, 2), seed=0,
        config=ScreeningConfig(n_startup_trials=5))
    study = optuna.create_study(directions=["maximize", "minimize", "minimize"],
                                sampler=sampler)
    study.enqueue_trial(space.to_params(space.largest()))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(lambda t: (*toy_values(space.suggest(t)), float(sum(space.suggest(t)))),
                   n_trials=15)
    archs = [space.suggest(optuna.trial.FixedTrial(t.params)) for t in study.trials]
    assert archs[0] == space.largest()
    assert len(set(archs)) == 15
    assert sampler._gps[0].warp == "none"  # the default copula warp is for the 2-D EHVI only


def test_bad_configuration_is_a_user_error():
    space = ToySpace()
    with pytest.raises(UserError, match="cheap_indices"):
        ScreeningSampler(space, cheap_latency, (), seed=0)
    with pytest.raises(UserError, match="floor_quantile"):
        ScreeningConfig(floor_quantile=1.0)
    sampler = ScreeningSampler(space, cheap_latency, (1,), seed=0,
                               directions=["maximize", "maximize"])
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UserError, match="directions"):
            study.optimize(lambda t: toy_values(space.suggest(t)), n_trials=1)


# -- --latency-csv errors -----------------------------------------------------------------------

ARCH = ("|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|"
        "+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|")


@pytest.mark.parametrize("body,device,expected", [
    (f"arch,dev\n{ARCH},1.5\n", "other", "has no device column 'other'"),
    (f"arch,dev\n{ARCH},nan\n", "dev", "line 2: dev is nan"),
])
def test_latency_csv_errors_are_one_line(tmp_path, capsys, body, device, expected):
    path = tmp_path / "lat.csv"
    path.write_text(body)
    code = _bench().main(["--latency-csv", str(path), "--device", device, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("search_nb201: error: ") and expected in err
    assert err.count("\n") == 1


def test_incomplete_latency_csv_is_refused(tmp_path, capsys):
    from hwnas.supernet.data import shared_data_dir

    if shared_data_dir() is None or not (shared_data_dir() / "nb201").is_dir():
        pytest.skip("the shared NAS-Bench-201 accuracy table is absent")
    path = tmp_path / "lat.csv"
    path.write_text(f"arch,dev\n{ARCH},1.5\n")
    code = _bench().main(["--latency-csv", str(path), "--device", "dev", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "lacks 15624 of the 15625" in err and err.count("\n") == 1


# -- options and the default ---------------------------------------------------------------------


def test_pool_gp_output_warps_keep_the_order_and_unskew():
    from scipy.stats import skew

    rng = np.random.default_rng(0)
    y = 100.0 - rng.gamma(1.5, 6.0, 200)  # left-skewed, as NAS-Bench-201 accuracies
    y[:5] = 1.0  # broken cells
    y[5] = y[6]  # a tie
    pool = rng.random((10, 3))
    out = {w: PoolGP(pool, length_factors=(0.5,), noises=(1e-2,), floor_quantile=0.0,
                     warp=w).transform(y) for w in ("none", "copula", "power")}
    np.testing.assert_array_equal(out["none"], y)
    for w in ("copula", "power"):
        t = out[w]
        assert np.array_equal(np.argsort(t, kind="stable"), np.argsort(y, kind="stable")), w
        assert t[5] == t[6]
        assert abs(skew(t)) < 0.3 * abs(skew(y)), (w, skew(t), skew(y))
    # normal scores of (rank - 1/2) / n; the five broken cells share the mean rank 3
    assert np.allclose(np.sort(out["copula"])[[0, -1]], [-2.2414, 2.5758], atol=1e-4)
    with pytest.raises(ValueError, match="warp"):
        PoolGP(pool, length_factors=(0.5,), noises=(1e-2,), floor_quantile=0.0, warp="log")
    with pytest.raises(UserError, match="output_warp"):
        ScreeningConfig(output_warp="log")
    with pytest.raises(UserError, match="front_cost_slack"):
        ScreeningConfig(front_cost_slack=1.5)
    with pytest.raises(UserError, match="front_slack_sd"):
        ScreeningConfig(front_slack_sd=-1.0)
    with pytest.raises(UserError, match="layer_share"):
        ScreeningConfig(layer_share=1.0)


def test_pool_gp_trend_extrapolates_a_linear_mean():
    rng = np.random.default_rng(0)
    pool = rng.random((300, 3))
    h = (pool[:, :1] - 0.5) * 4  # a cheap feature the target follows linearly
    y = 5.0 * h[:, 0] + 0.1 * np.sin(6 * pool[:, 1])
    near = np.argsort(h[:, 0])[:40]  # train on the low end only
    far = np.argsort(h[:, 0])[-40:]
    err = {}
    for trend in (None, h):
        gp = PoolGP(pool, length_factors=(0.2,), noises=(1e-2,), floor_quantile=0.0,
                    trend=trend)
        gp.refit(pool[near], y[near], None if trend is None else h[near])
        mu, _ = gp.predict(y[near])
        err[trend is not None] = float(np.abs(mu[far] - y[far]).mean())
    assert err[True] < 0.2 * err[False], err


def test_pool_gp_ard_finds_the_relevant_column_and_its_gradient_is_exact():
    rng = np.random.default_rng(0)
    pool = rng.random((1000, 5))
    y = np.sin(6 * pool[:, 0]) + 0.05 * pool[:, 1]  # only column 0 matters
    train = rng.choice(len(pool), 60, replace=False)
    err, gps = {}, {}
    for ard in (False, True):
        gp = PoolGP(pool, length_factors=(0.1, 0.4, 1.6), noises=(1e-3, 1e-2, 0.1),
                    floor_quantile=0.0, ard=ard)
        gp.refit(pool[train], y[train])
        mu, _ = gp.predict(y[train])
        err[ard], gps[ard] = float(np.sqrt(np.mean((mu - y) ** 2))), gp
    w = gps[True].weights
    assert w[0] > 5 * w[1:].max(), w
    assert err[True] < 0.5 * err[False], err
    np.testing.assert_array_equal(gps[False].weights, 1.0)
    # the marginal likelihood's gradient (what L-BFGS follows) against finite differences
    from scipy.optimize import check_grad

    from hwnas.search.gp import _ard_nll

    X = pool[train[:20]]
    D = (X[:, None, :] - X[None, :, :]) ** 2
    r = y[train[:20]] - y[train[:20]].mean()
    theta = np.array([0.3, -0.2, 0.1, 0.0, -0.5, math.log(1e-2)])
    assert check_grad(lambda t: _ard_nll(t, D, r, 1.0)[0],
                      lambda t: _ard_nll(t, D, r, 1.0)[1], theta) < 1e-4


def test_stratified_start_spans_the_cheap_objective():
    space = ToySpace()
    sampler = ScreeningSampler(space, cheap_latency, (1,), seed=0,
                               directions=["maximize", "minimize"],
                               config=ScreeningConfig(n_startup_trials=5, startup="stratified"))
    archs = run_toy(space, sampler, 5)
    lat = np.sort(cheap_latency(list(space.all_architectures())))
    got = cheap_latency(archs)
    bins = [(lat[(len(lat) * k) // 5], lat[(len(lat) * (k + 1)) // 5 - 1]) for k in range(5)]
    assert all(lo <= v <= hi for v, (lo, hi) in zip(got, bins)), (got, bins)
    with pytest.raises(UserError, match="startup"):
        ScreeningConfig(startup="sobol")


def test_auto_sampler_is_screening_where_something_is_evaluated():
    from hwnas.search.objectives import parse_metric
    from hwnas.search.samplers import DEFAULT_SAMPLER, make_sampler, resolve_sampler

    assert DEFAULT_SAMPLER == "auto"
    accuracy, size = parse_metric("accuracy"), parse_metric("size")
    assert resolve_sampler("auto", [accuracy, size]) == "screening"
    assert resolve_sampler("auto", [size, parse_metric("latency:edgetpu-est")]) == "tpe"
    assert resolve_sampler("nsga2", [accuracy]) == "nsga2"
    with pytest.raises(UserError, match="resolve"):
        make_sampler("auto", 0)


class SizedToySpace(ToySpace):
    """The toy space with FLOPs: accuracy grows with the first three choices, as FLOPs do."""

    def flops(self, arch):
        return int(10 * sum(arch[:3]) + arch[3])


def test_cheap_front_start_is_spread_along_latency_vs_flops():
    from hwnas.search.startup import cheap_front_plan

    cost, size = np.array([1.0, 2, 3, 4, 5, 2, 3]), np.array([1.0, 2, 3, 4, 5, 1, 1])
    assert list(cheap_front_plan(cost, size, 3)) == [0, 2, 4]  # ends included, evenly spaced
    assert sorted(cheap_front_plan(cost, size, 6)) == [0, 1, 2, 3, 4, 5]  # second layer used
    space = SizedToySpace()
    archs = list(space.all_architectures())
    lat, fl = cheap_latency(archs), np.array([space.flops(a) for a in archs], float)
    on_front = {archs[i] for i in front_indices_2d(lat, fl)}
    config = ScreeningConfig(n_startup_trials=5, startup="cheap_front", cheap_front_trials=5)
    starts = [run_toy(space, ScreeningSampler(space, cheap_latency, (1,), seed=s, config=config),
                      5) for s in (0, 1)]
    assert starts[0] == starts[1]  # no seed luck in the start-up
    assert set(starts[0]) <= on_front and len(set(starts[0])) == 5
    got = cheap_latency(starts[0])
    assert got.min() == lat.min() and got.max() == max(lat[i] for i in front_indices_2d(lat, fl))
    # a space that counts no FLOPs starts at random, as before
    plain = run_toy(ToySpace(), ScreeningSampler(ToySpace(), cheap_latency, (1,), seed=0,
                                                 config=config), 5)
    assert len(set(plain)) == 5


def test_mixed_start_is_the_cheap_front_then_random_candidates():
    space = SizedToySpace()
    archs = list(space.all_architectures())
    lat, fl = cheap_latency(archs), np.array([space.flops(a) for a in archs], float)
    on_front = {archs[i] for i in front_indices_2d(lat, fl)}
    mixed = ScreeningConfig(n_startup_trials=4, startup="mixed", cheap_front_trials=3)
    runs = [run_toy(space, ScreeningSampler(space, cheap_latency, (1,), seed=s, config=mixed), 9)
            for s in (0, 1)]
    assert runs[0][:3] == runs[1][:3] and set(runs[0][:3]) <= on_front  # the plan, whole
    assert runs[0][3:7] != runs[1][3:7]  # then each seed's own random candidates
    # the same as a cheap-front plan of 3 inside a random start-up of 3 + 4 trials
    same = ScreeningConfig(n_startup_trials=7, startup="cheap_front", cheap_front_trials=3)
    assert run_toy(space, ScreeningSampler(space, cheap_latency, (1,), seed=0, config=same),
                   9) == runs[0]


def test_screening_options_of_the_benchmark():
    bench = _bench()
    assert bench.screening_options(["startup=random", "cheap_front_trials=12",
                                     "size_trend=true", "noises=0.01,0.1"]) == {
        "startup": "random", "cheap_front_trials": 12, "size_trend": True,
        "noises": (0.01, 0.1)}
    for bad in ("startup", "bogus=1", "cheap_front_trials=x", "startup=sobol",
                "cheap_std_scale=1"):
        with pytest.raises(UserError):
            bench.screening_options([bad])


#: session 39's variant (benchmarks/search_nb201.md): the length-scale grid three doublings longer
LONG_GRID = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6)


def test_longer_length_grid_is_chosen_for_an_additive_target():
    """On one-hot cells whose value is a sum of per-edge effects the marginal likelihood wants
    a length-scale beyond the default grid's largest factor (3.2), and the longer grid gives it;
    the benchmark's option string is that grid."""
    bench = _bench()
    text = "length_factors=" + ",".join(str(f) for f in LONG_GRID)
    assert bench.screening_options([text]) == {"length_factors": LONG_GRID}
    assert ScreeningConfig().length_factors == LONG_GRID[:7]
    rng = np.random.default_rng(0)
    ops = rng.integers(5, size=(400, 6))
    pool = np.zeros((400, 30))
    pool[np.arange(400)[:, None], np.arange(6) * 5 + ops] = 1.0
    y = rng.normal(size=(6, 5))[np.arange(6), ops].sum(1)
    chosen = []
    for grid in (LONG_GRID[:7], LONG_GRID):
        gp = PoolGP(pool, length_factors=grid, noises=ScreeningConfig().noises,
                    floor_quantile=0.0)
        gp.refit(pool[:60], y[:60])
        chosen.append(gp.two_l2 / gp.d2_scale)
    assert chosen[0] == pytest.approx(3.2) and chosen[1] > 3.2


def test_size_trend_adds_log_flops_to_the_surrogate_mean():
    space = SizedToySpace()
    for size_trend, cols in ((False, None), (True, 1)):
        sampler = ScreeningSampler(space, cheap_latency, (1,), seed=0,
                                   config=ScreeningConfig(n_startup_trials=3,
                                                          size_trend=size_trend))
        assert len(set(run_toy(space, sampler, 6))) == 6
        trend = sampler._gp_trend(sampler._pool.trend)
        assert (trend is None) if cols is None else trend.shape == (len(sampler._pool.keys), 1)
    archs = list(space.all_architectures())
    fl = np.log(np.maximum([space.flops(a) for a in archs], 1.0))
    assert abs(np.corrcoef(trend[:, 0], fl)[0, 1] - 1) < 1e-9  # standardized log FLOPs
    # without FLOPs (no layer list) the option is a no-op, not an error
    plain = ScreeningSampler(ToySpace(), cheap_latency, (1,), seed=0,
                             config=ScreeningConfig(n_startup_trials=3, size_trend=True))
    run_toy(ToySpace(), plain, 6)
    assert plain._gp_trend(plain._pool.trend) is None


@pytest.mark.parametrize("argv,expected", [
    (["--fold-cache", "x"], "pass it"),
    (["--fold-training", "shipped"], "pass it"),
    (["--predictor-holdout", "phone", "--latency-source", "table"], "does not go with"),
    (["--predictor-holdout", "phone", "--validation"], "does not go with"),
])
def test_predictor_holdout_errors_are_one_line(capsys, argv, expected):
    code = _bench().main([*argv, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("search_nb201: error: ") and expected in err
    assert err.count("\n") == 1


def test_predictor_holdout_names_a_family_without_the_test_devices(capsys):
    from hwnas.supernet.data import shared_data_dir

    if shared_data_dir() is None or not (shared_data_dir() / "nb201").is_dir():
        pytest.skip("the shared NAS-Bench-201 latency table is absent")
    assert _bench().main(["--predictor-holdout", "pixel", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no such device family" in err and "phone" in err
    assert "simulated-accel" not in err  # fpga and eyeriss are HELP test devices: left out


def test_reference_reaches_the_slowest_plausibly_most_accurate_candidate():
    mu = np.array([0.2, 1.0, 0.7, 0.9, 0.1])
    sd = np.array([0.1, 0.1, 0.4, 0.05, 0.1])
    cost = np.array([1.0, 2.0, 5.0, 4.0, 9.0])
    every = np.ones(5, dtype=bool)
    assert reference_candidate(mu, sd, cost, every) == 1  # the most accurate predicted
    # within one deviation of its mean: candidates 2 (0.7 + 0.4) and 1; the slower is 2
    assert reference_candidate(mu, sd, cost, every, 1.0) == 2
    assert reference_candidate(mu, sd, cost, every, 10.0) == 4  # 0.1 + 10 x 0.1 >= 1.0
    ok = np.array([True, False, False, True, True])  # constraints leave 0, 3 and 4
    assert reference_candidate(mu, sd, cost, ok) == 3
    assert reference_candidate(mu, sd, cost, ok, 10.0) == 4
    # the EHVI gives a slower candidate a gain only once the reference reaches it
    obs_cost, obs_gain = np.array([1.0, 2.0]), np.array([0.2, 1.0])
    for plausible, gains in ((0.0, False), (1.0, True)):
        ref = reference_candidate(mu, sd, cost, every, plausible)
        ehvi = front_ehvi(mu, sd, cost, None, obs_cost, obs_gain, ref)
        assert (ehvi[3] > 0) == gains
    with pytest.raises(UserError, match="reference_sd"):
        ScreeningConfig(reference_sd=-1.0)
    assert ScreeningConfig().reference_sd == 2.0  # the default since session 56 (issue 47)
