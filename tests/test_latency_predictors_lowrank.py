"""The low-rank prior predictor: meta-fit on synthetic devices, 10-shot ranks, input checks,
files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hwnas.latency.predictors import (
    LatencyPredictor,
    LowRankPredictor,
    get_predictor,
    pretrained_path,
)
from hwnas.latency.predictors.features import features

from hwnas.core.errors import UserError
from hwnas.core.maths import spearman as rho


@pytest.fixture(scope="module")
def nb201(nb201_sample):
    return nb201_sample(400, seed=3)


def factor_devices(space, archs, n_devices: int, seed: int) -> dict[str, np.ndarray]:
    """Devices whose per-(edge, op) costs mix three hidden cost factors (a low-rank family),
    plus a per-device constant."""
    rng = np.random.default_rng(seed)
    X = features(space, archs, "encode")
    factors = rng.uniform(0, 1, (3, X.shape[1]))
    return {f"dev{d}": rng.uniform(0.5, 2) + X @ (rng.uniform(0, 1, 3) @ factors)
            for d in range(n_devices)}


def test_lowrank_ranks_an_unseen_device_from_10_measurements(nb201) -> None:
    space, archs = nb201
    table = factor_devices(space, archs, 9, seed=1)
    new = table.pop("dev8")
    pred = LowRankPredictor(space, pool_size=300).meta_fit(space, archs, table, seed=0)
    refs = pred.reference_archs
    assert len(refs) == 20 and len(set(refs)) == 20 and set(refs) <= set(archs)
    where = {a: i for i, a in enumerate(archs)}
    pred.adapt(refs[:10], new[[where[a] for a in refs[:10]]], seed=0)
    mean, std = pred.predict_with_std(archs)
    assert rho(mean, new) > 0.98
    assert np.all(std >= 0) and np.all(np.isfinite(std))
    np.testing.assert_allclose(pred.predict(archs), mean)
    # ten random architectures do almost as well: the prior, not the design, carries the fit
    rnd = np.random.default_rng(5).choice(len(archs), 10, replace=False)
    pred.adapt([archs[i] for i in rnd], new[rnd], seed=0)
    assert rho(pred.predict(archs), new) > 0.97


def test_lowrank_log_target_and_groups(nb201) -> None:
    space, archs = nb201
    table = factor_devices(space, archs, 6, seed=2)
    new = table.pop("dev5")
    groups = {"dev0": "a", "dev1": "a", "dev2": "a", "dev3": "b", "dev4": "c"}
    pred = LowRankPredictor(space, targets=("linear", "log"), pool_size=200)
    pred.meta_fit(space, archs, table, seed=0, groups=groups)
    pred.adapt(archs[:10], new[:10], seed=0)
    assert rho(pred.predict(archs), new) > 0.95
    with pytest.raises(UserError, match="groups names device 'nope'"):
        LowRankPredictor(space).meta_fit(space, archs, table, seed=0, groups={"nope": "a"})


def test_lowrank_refuses_bad_input_in_one_line(nb201) -> None:
    space, archs = nb201
    with pytest.raises(UserError, match="not been meta-trained") as err:
        LowRankPredictor(space).adapt(archs[:5], np.ones(5), seed=0)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="at least 2 devices"):
        LowRankPredictor(space).meta_fit(space, archs, {"a": np.ones(len(archs))}, seed=0)
    with pytest.raises(UserError, match="finite number > 0"):
        LowRankPredictor(space).meta_fit(space, archs, {"a": np.ones(len(archs)),
                                                        "b": -np.ones(len(archs))}, seed=0)
    with pytest.raises(UserError, match=r"targets \['cubic'\]; expected some of"):
        LowRankPredictor(space, targets=("cubic",))
    with pytest.raises(UserError, match="lams must be a non-empty list of numbers > 0"):
        LowRankPredictor(space, lams=(0.0,))
    with pytest.raises(UserError, match="rank and n_reference must be >= 1"):
        LowRankPredictor(space, rank=0)
    table = factor_devices(space, archs, 3, seed=4)
    pred = LowRankPredictor(space, pool_size=100).meta_fit(space, archs, table, seed=0)
    with pytest.raises(UserError, match="needs at least 2 measurements"):
        pred.adapt(archs[:1], [1.0], seed=0)
    with pytest.raises(UserError, match="expected a finite latency"):
        pred.adapt(archs[:3], [1.0, np.nan, 2.0], seed=0)
    with pytest.raises(UserError, match="not been adapted"):
        pred.predict(archs[:3])


def test_lowrank_save_load_and_registry(nb201, tmp_path: Path) -> None:
    space, archs = nb201
    table = factor_devices(space, archs, 4, seed=6)
    truth = table.pop("dev3")
    pred = LowRankPredictor(space, pool_size=100, targets=("linear", "log"))
    pred.meta_fit(space, archs, table, seed=0)
    pred.adapt(archs[:12], truth[:12], seed=1)
    path = pred.save(tmp_path / "lowrank.npz")
    loaded = LatencyPredictor.load(path)
    assert isinstance(loaded, LowRankPredictor) and loaded.reference_archs == pred.reference_archs
    m0, s0 = pred.predict_with_std(archs)
    m1, s1 = loaded.predict_with_std(archs)
    np.testing.assert_allclose(m1, m0, rtol=1e-12)
    np.testing.assert_allclose(s1, s0, rtol=1e-9, atol=1e-12)
    assert path.stat().st_size < 200_000
    assert isinstance(get_predictor("lowrank", space, rank=3), LowRankPredictor)
    assert not get_predictor("lowrank", space, rank=3).is_meta_trained
    with pytest.raises(UserError, match="kind 'gbdt'; expected meta or lowrank"):
        pretrained_path("nb201", "gbdt")


@pytest.mark.parametrize("name", ["nb201", "fbnet"])
def test_shipped_lowrank_predictors(name) -> None:
    """``latency/data/<space>_lowrank.npz``: meta-trained on HELP's 9 meta-training devices,
    small, and what ``get_predictor('lowrank', space)`` returns."""
    from hwnas.supernet.spaces import get_space

    path = pretrained_path(name, "lowrank")
    assert path.is_file() and path.stat().st_size < 100_000
    pre = get_predictor("lowrank", get_space(name))
    assert isinstance(pre, LowRankPredictor) and pre.is_meta_trained and not pre.is_adapted
    assert len(pre.devices_) == 9 and len(pre.reference_archs) == 20

