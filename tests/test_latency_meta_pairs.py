"""The meta predictor's pair profiles (``pair_profiles``): meta-training profiles with pairwise
cell terms, weighed against the additive ones by each adaptation's evidence."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hwnas.latency.predictors import LatencyPredictor, MetaPredictor
from hwnas.supernet.spaces import get_space

from hwnas.core.errors import UserError
from hwnas.core.maths import spearman as rho
from tests.test_latency_predictors_lowrank_options import pair_devices


@pytest.fixture(scope="module")
def nb201(nb201_sample):
    return nb201_sample(300, seed=4)


def _adapted(pred, archs, y, rows):
    return pred.adapt([archs[i] for i in rows], y[rows], seed=0)


def test_pair_profiles_win_where_costs_pair_and_not_where_they_add(nb201) -> None:
    space, archs = nb201
    rows = np.random.default_rng(2).choice(len(archs), 10, replace=False)
    for pair_weight, must_gain in ((3.0, True), (0.0, False)):
        table = pair_devices(space, archs, 9, seed=1, pair_weight=pair_weight)
        new = table.pop("dev8")
        plain = MetaPredictor(space, pool_size=300, pair_profiles=0.0).meta_fit(
            space, archs, table, seed=0)
        pairs = MetaPredictor(space, pool_size=300, pair_profiles=0.1).meta_fit(
            space, archs, table, seed=0)
        assert pairs._p["q_coef_p"].shape == (8, 15 * 25)  # 6 edges: 15 pairs of 5 x 5 choices
        assert "q_coef" not in plain._p
        s_plain = rho(_adapted(plain, archs, new, rows).predict(archs), new)
        s_pairs = rho(_adapted(pairs, archs, new, rows).predict(archs), new)
        shares = {}
        for m in pairs.explain()["hyper_posterior"]:
            shares[m["profiles"]] = shares.get(m["profiles"], 0.0) + m["weight"]
        if must_gain:  # the evidence picks the pair profiles, and they rank better
            assert s_pairs > s_plain + 0.02 and s_pairs > 0.9
            assert shares.get("pairs", 0.0) > shares.get("additive", 0.0)
        else:  # additive costs: no worse than the additive profiles alone
            assert s_pairs > s_plain - 0.01


def test_pair_profiles_saved_and_checked(nb201, tmp_path) -> None:
    space, archs = nb201
    table = pair_devices(space, archs, 4, seed=5)
    pred = MetaPredictor(space, pool_size=300, pair_profiles=0.3).meta_fit(space, archs, table,
                                                                          seed=0)
    back = LatencyPredictor.load(pred.save(tmp_path / "p.npz"))
    assert back.pair_profiles == 0.3
    y, rows = table["dev0"], np.arange(10)
    np.testing.assert_allclose(_adapted(back, archs, y, rows).predict(archs),
                               _adapted(pred, archs, y, rows).predict(archs))
    for bad in (-0.1, float("nan")):
        with pytest.raises(UserError, match="pair_profiles"):
            MetaPredictor(space, pair_profiles=bad)
    fbnet = get_space("fbnet")  # 22 layers x 9 blocks: too wide for pairs
    fb_archs = [fbnet.sample(np.random.default_rng(i)) for i in range(12)]
    fb_table = {f"d{k}": np.linspace(1.0, 2.0, 12) * (k + 1) for k in range(2)}
    with pytest.raises(UserError, match="pair_profiles"):
        MetaPredictor(fbnet, pair_profiles=0.1).meta_fit(fbnet, fb_archs, fb_table, seed=0)


def test_pair_profiles_default_per_space_and_off_for_older_files(nb201, tmp_path) -> None:
    """NB-201 has them by default (chosen on the family protocol), FBNet does not; a file
    written before they existed (no ``pair_profiles`` key) loads with them off."""
    space, archs = nb201
    assert MetaPredictor(space).pair_profiles == 0.1
    assert MetaPredictor(get_space("fbnet")).pair_profiles == 0.0
    table = pair_devices(space, archs, 4, seed=5)
    pred = MetaPredictor(space, pool_size=300, pair_profiles=0.0).meta_fit(space, archs, table,
                                                                          seed=0)
    path = pred.save(tmp_path / "old.npz")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    doc = json.loads(arrays["__meta__"].tobytes().decode("utf-8"))
    doc["state"].pop("pair_profiles")
    arrays["__meta__"] = np.frombuffer(json.dumps(doc).encode("utf-8"), dtype=np.uint8)
    np.savez(tmp_path / "older.npz", **arrays)
    back = LatencyPredictor.load(tmp_path / "older.npz")
    assert back.pair_profiles == 0.0
    y, rows = table["dev0"], np.arange(10)
    np.testing.assert_allclose(_adapted(back, archs, y, rows).predict(archs),
                               _adapted(pred, archs, y, rows).predict(archs))
