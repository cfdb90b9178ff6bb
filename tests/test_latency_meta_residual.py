"""The meta predictor's residual learner (``residual``) and member screening (``screen_margin``):
a predictor that keeps learning as measurements grow, while files written before keep
predicting as before."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hwnas.latency.predictors import LatencyPredictor, MetaPredictor
from hwnas.latency.predictors.meta import RESIDUAL_MIN

from hwnas.core.errors import UserError
from hwnas.core.maths import spearman as rho
from tests.test_latency_predictors_lowrank_options import pair_devices


@pytest.fixture(scope="module")
def nb201(nb201_sample):
    return nb201_sample(400, seed=6)


@pytest.fixture(scope="module")
def additive_meta(nb201):
    """Meta-trained on additive devices only (no pair profiles): a prior that cannot follow
    a device whose costs pair."""
    space, archs = nb201
    table = pair_devices(space, archs, 6, seed=3, pair_weight=0.0)
    return MetaPredictor(space, pool_size=300, pair_profiles=0.0, residual="kernel").meta_fit(
        space, archs, table, seed=0)


def _strip(path, keys) -> bytes:
    """The file at ``path`` as a version that predates ``keys`` would have written it."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    doc = json.loads(arrays["__meta__"].tobytes().decode())
    for k in keys:
        doc["state"].pop(k)
    arrays["__meta__"] = np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def test_files_written_before_load_and_predict_as_before(nb201, additive_meta,
                                                         tmp_path) -> None:
    space, archs = nb201
    assert MetaPredictor(space).residual == "off"  # the default, chosen on the families
    assert additive_meta.residual == "kernel" and additive_meta.screen_margin > 0
    path = additive_meta.save(tmp_path / "new.npz")
    old = tmp_path / "old.npz"
    old.write_bytes(_strip(path, ("residual", "screen_margin")))
    back = LatencyPredictor.load(old)
    assert back.residual == "off" and back.screen_margin == 0.0
    y = pair_devices(space, archs, 1, seed=9, pair_weight=3.0)["dev0"]
    rows = np.arange(60)
    before = MetaPredictor._from_state(space, *_state_off(additive_meta))
    for pred in (back, before):
        pred.adapt([archs[i] for i in rows], y[rows], seed=0)
    np.testing.assert_array_equal(back.predict(archs), before.predict(archs))
    assert "residual" not in back._post
    # and the new file round-trips with its options
    again = LatencyPredictor.load(path)
    assert again.residual == "kernel" and again.screen_margin == additive_meta.screen_margin


def _state_off(pred):
    meta, arrays = pred._state()
    return {**meta, "residual": "off", "screen_margin": 0.0}, arrays


def test_below_residual_min_the_prior_alone(nb201, additive_meta) -> None:
    space, archs = nb201
    y = pair_devices(space, archs, 1, seed=9, pair_weight=3.0)["dev0"]
    rows = np.arange(RESIDUAL_MIN - 1)
    off = MetaPredictor._from_state(space, *_state_off(additive_meta))
    for pred in (additive_meta, off):
        pred.adapt([archs[i] for i in rows], y[rows], seed=0)
    np.testing.assert_array_equal(additive_meta.predict(archs), off.predict(archs))


def _against_off(nb201, meta, pair_weight: float) -> tuple[float, dict[str, float]]:
    """Adapted on 80 measurements of a device whose costs pair (``pair_weight``; 0: additive),
    ``meta`` and the same predictor without its residual learner rank the other architectures:
    ``(meta's residual weight, {"new": its Spearman, "off": the other's})``."""
    space, archs = nb201
    rows = np.random.default_rng(1).choice(len(archs), 80, replace=False)
    rest = np.setdiff1d(np.arange(len(archs)), rows)
    off = MetaPredictor._from_state(space, *_state_off(meta))
    y = pair_devices(space, archs, 1, seed=9, pair_weight=pair_weight)["dev0"]
    s = {}
    for name, pred in (("new", meta), ("off", off)):
        pred.adapt([archs[i] for i in rows], y[rows], seed=0)
        s[name] = rho(pred.predict([archs[i] for i in rest]), y[rest])
    return meta.explain()["residual"]["weight"], s


@pytest.mark.parametrize("learner", ["kernel", "mixed"])
def test_residual_learns_what_the_prior_cannot(nb201, additive_meta, learner) -> None:
    """A device whose costs pair, under an additive prior: with 80 measurements the residual
    learner takes weight and ranks better; on an additive device it stays (nearly) out."""
    additive_meta.residual = learner
    for weight, must_gain in ((3.0, True), (0.0, False)):
        w, s = _against_off(nb201, additive_meta, weight)
        if must_gain:
            assert w > 0.15 and s["new"] > s["off"] + 0.02, (w, s)
        else:
            assert s["new"] > s["off"] - 0.005
    additive_meta.residual = "kernel"


def test_loo_predictions_match_refits(nb201, additive_meta) -> None:
    space, archs = nb201
    y = pair_devices(space, archs, 1, seed=9, pair_weight=1.0)["dev0"]
    rows = np.arange(30)
    keys = [archs[i] for i in rows]
    off = MetaPredictor._from_state(space, *_state_off(additive_meta))
    loo = off.adapt(keys, y[rows], seed=0).loo_predictions()
    refit = [MetaPredictor._from_state(space, *_state_off(additive_meta)).adapt(
        keys[:i] + keys[i + 1:], np.delete(y[rows], i), seed=0).predict([keys[i]])[0]
        for i in range(3)]
    np.testing.assert_allclose(loo[:3], refit, rtol=0.03)


def test_bad_options_refused(nb201) -> None:
    space, _ = nb201
    with pytest.raises(UserError, match="residual must be one of"):
        MetaPredictor(space, residual="forest")
    with pytest.raises(UserError, match="screen_margin"):
        MetaPredictor(space, screen_margin=-1)


def test_blend_weight_grows_with_n_and_follows_the_device(nb201, additive_meta) -> None:
    """``blend``: the device's own trees take weight on a device whose costs pair (under an
    additive prior) and rank it better, at most n / (n + BLEND_N0) of the weight; on an
    additive device the prior stays (nearly) alone."""
    from hwnas.latency.predictors.residual import BLEND_N0, blend_weight

    ly = np.log(np.arange(1.0, 41.0))
    own = ly + np.random.default_rng(0).normal(0, 0.01, 40)  # the own model ranks perfectly
    assert blend_weight(ly[::-1], own, ly) == pytest.approx(0.3, abs=0.025)  # 40 / 140
    assert blend_weight(ly, own[::-1], ly) == 0.0  # the own model is no help
    space, archs = nb201
    additive_meta.residual = "blend"
    for weight, must_gain in ((3.0, True), (0.0, False)):
        w, s = _against_off(nb201, additive_meta, weight)
        assert w <= 80 / (80 + BLEND_N0) + 0.025
        if must_gain:
            assert w > 0.1 and s["new"] > s["off"] + 0.01, (w, s)
        else:
            assert s["new"] > s["off"] - 0.005, (w, s)
    mean, std = additive_meta.predict_with_std(archs[:5])
    np.testing.assert_allclose(mean, additive_meta.predict(archs[:5]))
    additive_meta.residual = "kernel"
