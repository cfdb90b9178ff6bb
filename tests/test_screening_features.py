"""What the screening surrogate sees of a candidate (search/features.py,
``ScreeningConfig.surrogate_features``)."""

from __future__ import annotations

import warnings

import numpy as np
import optuna
import pytest
from hwnas.search.features import FEATURE_SETS, executed_archs, surrogate_features
from hwnas.search.screening import ScreeningConfig, ScreeningSampler
from hwnas.supernet.spaces import get_space
from hwnas.supernet.spaces.nb201 import NB201Arch

from hwnas.core.errors import UserError

SPACE = get_space("nb201")
# node 1 feeds only node 2, and node 2 reaches the output by a `none` edge only: edges 1<-0,
# 2<-0 and 2<-1 are dead code, so both cells compute 3<-0 = conv3x3 (+ skip from node 1, dead)
DEAD_A = NB201Arch(("nor_conv_3x3", "avg_pool_3x3", "nor_conv_1x1",
                    "nor_conv_3x3", "none", "none"))
DEAD_B = NB201Arch(("skip_connect", "nor_conv_1x1", "avg_pool_3x3",
                    "nor_conv_3x3", "none", "none"))
# the same operations on other edges
PERM_A = NB201Arch(("nor_conv_3x3", "skip_connect", "nor_conv_1x1",
                    "avg_pool_3x3", "nor_conv_3x3", "skip_connect"))
PERM_B = NB201Arch(("skip_connect", "nor_conv_3x3", "skip_connect",
                    "nor_conv_1x1", "avg_pool_3x3", "nor_conv_3x3"))


def test_executed_features_merge_cells_that_differ_only_in_dead_code():
    enc, counts, _ = surrogate_features(SPACE, [DEAD_A, DEAD_B], "encoding")
    assert counts.shape == (2, 0)
    assert not np.array_equal(enc[0], enc[1])
    ex, _, _ = surrogate_features(SPACE, [DEAD_A, DEAD_B], "executed")
    assert np.array_equal(ex[0], ex[1])
    assert executed_archs(SPACE, [DEAD_A])[0].ops == ("none",) * 3 + ("nor_conv_3x3",
                                                                      "none", "none")
    # a live cell is its own executed cell
    assert executed_archs(SPACE, [PERM_A]) == [PERM_A]


def test_counts_are_per_value_and_keep_their_columns():
    enc, counts, values = surrogate_features(SPACE, [PERM_A, PERM_B, DEAD_A], "counts")
    assert not np.array_equal(enc[0], enc[1])
    assert np.array_equal(counts[0], counts[1])  # same operations, other edges
    assert counts.sum(1).tolist() == [6, 6, 6]   # one per edge
    assert values == sorted(values) and "nor_conv_3x3" in values
    col = values.index("nor_conv_3x3")
    assert counts[2, col] == 2
    _, ex_counts, _ = surrogate_features(SPACE, [DEAD_A], "executed_counts", values)
    assert ex_counts[0, col] == 1 and ex_counts[0, values.index("none")] == 5
    # later calls keep the first call's columns, even without some value
    _, c2, v2 = surrogate_features(SPACE, [NB201Arch(("none",) * 6)], "counts", values)
    assert v2 == values and c2[0, values.index("none")] == 6 and c2.sum() == 6


def test_a_space_without_dead_code_is_encoded_as_is():
    space = get_space("mbv3")
    archs = [space.sample(np.random.default_rng(s)) for s in range(3)]
    a, _, _ = surrogate_features(space, archs, "encoding")
    b, _, _ = surrogate_features(space, archs, "executed")
    assert np.array_equal(a, b)


def test_sampler_surrogate_sees_the_configured_features():
    """The default keeps the space's encoding; ``executed_counts`` merges dead code and adds
    one count column per operation, unscaled; a bad name is one clear error."""
    def cheap(archs):
        return np.array([float(sum(op.startswith("nor_conv") for op in a.ops)) for a in archs])

    feats = {}
    for name in ("encoding", "executed_counts"):
        sampler = ScreeningSampler(SPACE, cheap, (1,), seed=0,
                                   config=ScreeningConfig(surrogate_features=name))
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study.optimize(lambda t: (float(len(set(SPACE.suggest(t).ops))),
                                      float(cheap([SPACE.suggest(t)])[0])), n_trials=3)
        pool = sampler._pool
        feats[name] = pool.features[[pool.index[SPACE.to_string(a)] for a in (DEAD_A, DEAD_B)]]
    assert feats["encoding"].shape == (2, 30)
    assert not np.array_equal(feats["encoding"][0], feats["encoding"][1])
    assert feats["executed_counts"].shape == (2, 35)
    assert np.array_equal(feats["executed_counts"][0], feats["executed_counts"][1])
    assert feats["executed_counts"][0, 30:].max() == 5  # five `none` edges, unscaled
    assert set(FEATURE_SETS) >= {"encoding", "executed_counts"}
    with pytest.raises(UserError, match="surrogate_features"):
        ScreeningConfig(surrogate_features="paths")


def test_band_metrics_of_the_surrogate_diagnosis():
    """``search_nb201_surrogate.band_metrics``: a perfect ranking scores 1 within every band
    and no regret, a reversed one -1 and the band's full spread; evaluated cells are left out."""
    from benchmarks import search_nb201_surrogate as bench

    rng = np.random.default_rng(0)
    seen = rng.uniform(1, 10, 400)
    acc = rng.uniform(0, 70, 400)
    free = np.ones(400, bool)
    m = bench.band_metrics(acc.copy(), acc, seen, free)
    assert m["all"] == pytest.approx(1) and m["band"] == pytest.approx(1)
    assert m["band_top"] == pytest.approx(1) and m["pick_regret"] == 0
    m = bench.band_metrics(-acc, acc, seen, free)
    assert m["band"] == pytest.approx(-1) and m["pick_regret"] > 30
    # the best cell evaluated: it is not the band's best any more, and no regret is counted
    best = int(np.argmax(acc))
    free[best] = False
    mu = acc.copy()
    mu[best] = -1.0
    assert bench.band_metrics(mu, acc, seen, free)["pick_regret"] == 0


def test_cheap_trend_warm_start_ends_after_trend_trials():
    """``trend_trials``: the GP mean is linear in the cheap objective while fewer evaluations
    are complete, constant after (new GPs without the trend); 0 keeps it throughout."""
    def cheap(archs):
        return np.array([1.0 + sum(op.startswith("nor_conv") for op in a.ops) for a in archs])

    def run(trend_trials, n):
        cfg = ScreeningConfig(cheap_trend=True, trend_trials=trend_trials, n_startup_trials=3,
                              cheap_front_trials=2)
        sampler = ScreeningSampler(SPACE, cheap, (1,), seed=0, config=cfg)
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study.optimize(lambda t: (float(len(set(SPACE.suggest(t).ops))),
                                      float(cheap([SPACE.suggest(t)])[0])), n_trials=n)
        return sampler

    early = run(12, 8)
    assert early._cheap_trend and early._gps[0].pool_trend.shape[1] == 1
    late = run(6, 9)
    assert not late._cheap_trend and late._gps[0].pool_trend.shape[1] == 0
    assert run(0, 9)._cheap_trend
    with pytest.raises(UserError, match="trend_trials"):
        ScreeningConfig(trend_trials=-1)


def test_hidden_split_of_the_gap_diagnosis():
    """``search_nb201_gap.hidden_split``: a missed true-front cell is hidden when an evaluated
    cell is as accurate and no slower in the *seen* latency; the others would raise the seen
    front. Each group's hypervolume is what its cells add alone to the evaluated ones."""
    from benchmarks import search_nb201_gap as bench

    # true front: cells 0 (1 ms, 50 %), 1 (2 ms, 60 %), 2 (3 ms, 70 %); cell 3 is dominated
    lat = np.array([1.0, 2.0, 3.0, 4.0])
    acc = np.array([50.0, 60.0, 70.0, 65.0])
    seen = np.array([1.0, 2.0, 3.0, 1.5])  # cell 3 is predicted fast: it hides cell 1 only
    front = bench.nb.true_front(lat, acc)
    free, hidden, gain_free, gain_hidden = bench.hidden_split(np.array([3]), lat, acc, seen,
                                                             front)
    assert (free, hidden) == ([0, 2], [1])
    rows = np.array([3])
    base = bench.nb.hv_ratio(rows, lat, acc, front)
    assert gain_hidden == pytest.approx(bench.nb.hv_ratio(np.array([3, 1]), lat, acc, front)
                                        - base)
    assert gain_free == pytest.approx(sum(bench.nb.hv_ratio(np.array([3, y]), lat, acc, front)
                                          - base for y in (0, 2)))
