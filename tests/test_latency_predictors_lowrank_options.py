"""The low-rank predictor's options: pairwise cell terms, the tempered hyper-parameter average
and the ranking objective (checks, effects, files)."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.latency.predictors import LatencyPredictor, LowRankPredictor
from hwnas.latency.predictors.features import encoding_positions, features, pair_products

from hwnas.core.errors import UserError
from hwnas.core.maths import spearman as rho


@pytest.fixture(scope="module")
def nb201(nb201_sample):
    return nb201_sample(300, seed=4)


def pair_devices(space, archs, n_devices: int, seed: int,
                 pair_weight: float = 3.0) -> dict[str, np.ndarray]:
    """Devices whose cost mixes two additive and one pairwise hidden factor (what feeds an
    operation changes its cost), plus a per-device constant."""
    rng = np.random.default_rng(seed)
    E = features(space, archs, "encode")
    P = pair_products(E, encoding_positions(space))
    add = rng.uniform(0, 1, (2, E.shape[1]))
    pair = rng.uniform(0, 1, P.shape[1]) * (rng.uniform(0, 1, P.shape[1]) < 0.2)
    out = {}
    for d in range(n_devices):
        w = rng.uniform(0, 1, 3)
        out[f"dev{d}"] = rng.uniform(0.5, 2) + E @ (w[:2] @ add) + pair_weight * w[2] * (P @ pair)
    return out


def _adapt_score(pred, archs, y, rows) -> float:
    pred.adapt([archs[i] for i in rows], y[rows], seed=0)
    return rho(pred.predict(archs), y)


def test_pairs_learn_non_additive_costs(nb201) -> None:
    space, archs = nb201
    table = pair_devices(space, archs, 9, seed=1)
    new = table.pop("dev8")
    rows = np.random.default_rng(2).choice(len(archs), 10, replace=False)
    plain = LowRankPredictor(space, pool_size=300).meta_fit(space, archs, table, seed=0)
    pairs = LowRankPredictor(space, pool_size=300, pairs="all").meta_fit(space, archs, table,
                                                                        seed=0)
    assert pairs._p["linear.mu"].shape[0] == 30 + 1 + 15 * 25 + 1  # + flag, pairs, constant
    assert _adapt_score(pairs, archs, new, rows) > _adapt_score(plain, archs, new, rows) + 0.02
    assert _adapt_score(pairs, archs, new, rows) > 0.95


def test_temperature_and_rank_objective(nb201) -> None:
    space, archs = nb201
    table = pair_devices(space, archs, 7, seed=3, pair_weight=0.3)
    new = table.pop("dev6")
    rows = np.random.default_rng(4).choice(len(archs), 10, replace=False)
    base = LowRankPredictor(space, pool_size=300).meta_fit(space, archs, table, seed=0)
    s0 = _adapt_score(base, archs, new, rows)
    n0 = len(base._post["members"])
    for opt in ({"temperature": 4.0}, {"objective": "rank"}):
        other = LowRankPredictor(space, pool_size=300, **opt)
        other._p, other._ref, other.devices_ = base._p, base._ref, base.devices_
        other.execution_prior_ = base.execution_prior_
        s = _adapt_score(other, archs, new, rows)
        assert s > s0 - 0.05, opt  # a real fit, on the measurements' scale
        p = other.predict(archs)
        assert np.all(p > 0) and abs(np.mean(p) / np.mean(new) - 1) < 0.3
        if "temperature" in opt:  # a flatter average keeps more members
            assert len(other._post["members"]) > n0
        else:
            assert len(other._post["members"]) <= 8
            assert any(m[-1] != 0.0 for m in other._post["members"])  # offsets refitted


def test_options_are_checked_and_saved(nb201, tmp_path) -> None:
    space, archs = nb201
    for bad in ({"pairs": "some"}, {"objective": "kendall"}, {"temperature": 0.5},
                {"temperature": float("nan")}, {"pair_scale": 0.0}):
        with pytest.raises(UserError):
            LowRankPredictor(space, **bad)
    table = pair_devices(space, archs, 4, seed=5)
    pred = LowRankPredictor(space, pool_size=300, pairs="all", pair_scale=0.5, temperature=2.0,
                            objective="rank").meta_fit(space, archs, table, seed=0)
    back = LatencyPredictor.load(pred.save(tmp_path / "p.npz"))
    assert (back.pairs, back.pair_scale, back.temperature, back.objective) == (
        "all", 0.5, 2.0, "rank")
    y = table["dev0"]
    rows = np.arange(10)
    np.testing.assert_allclose(
        back.adapt([archs[i] for i in rows], y[rows], seed=0).predict(archs),
        pred.adapt([archs[i] for i in rows], y[rows], seed=0).predict(archs))
