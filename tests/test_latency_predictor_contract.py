"""The LatencyPredictor contract, checked for every predictor of the registry
(``available_predictors()`` when the tests are collected) and for a user's own predictor
registered here with ``register_predictor`` (``UserFlopsRatio``), so a user's predictor meets
the same checks: built by name, bad measurements refused with one UserError, adapted to a few
measurements it predicts finite positive latencies (deterministic for a seed), and its file
loads back to the same predictions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hwnas.latency.predictors import (
    PREDICTORS,
    LatencyPredictor,
    available_predictors,
    get_predictor,
    register_predictor,
)
from registry_support import contract_entry

from hwnas.core.errors import UserError

#: The measurements a predictor is adapted to here (the meta predictor's reference count).
N_MEASURED = 12


class UserFlopsRatio(LatencyPredictor):
    """A user's predictor: latency is the median ms-per-FLOP of the measurements times FLOPs."""

    name = "user-flops-ratio"

    def _flops(self, keys: list[str]) -> np.ndarray:
        return np.array([self.space.flops(self.space.parse(k)) for k in keys], dtype=np.float64)

    def _adapt(self, keys, latency_ms, seed):
        self.ratio_ = float(np.median(latency_ms / self._flops(keys)))

    def _predict(self, keys):
        return self.ratio_ * self._flops(keys), None


USER_PREDICTOR = UserFlopsRatio.name


@pytest.fixture(scope="module", params=[*available_predictors(), USER_PREDICTOR])
def name(request) -> str:
    return contract_entry(request, USER_PREDICTOR, register_predictor, UserFlopsRatio, PREDICTORS)


@pytest.fixture(scope="module")
def problem(nb201_sample):
    """The nb201 space, architectures and a synthetic device: a base cost plus FLOPs and a
    per-cell pooling cost (deterministic)."""
    space, archs = nb201_sample(200, seed=5)
    flops = np.array([space.flops(space.parse(a)) for a in archs])
    pools = np.array([a.count("avg_pool") for a in archs])
    return space, archs, 0.3 + 2e-9 * flops + 0.05 * pools


def adapted(name: str, space, archs, truth, seed: int = 0) -> tuple[LatencyPredictor, list]:
    """A predictor ``name`` adapted to N_MEASURED measurements (its reference ones first)."""
    pred = get_predictor(name, space)
    refs = list(pred.reference_archs or [])[:N_MEASURED]
    measured = refs + [a for a in archs if a not in refs][: N_MEASURED - len(refs)]
    rows = {a: i for i, a in enumerate(archs)}
    lookup = {a: truth[rows[a]] if a in rows else 0.3 + 2e-9 * space.flops(space.parse(a))
              for a in measured}
    return pred.adapt(measured, [lookup[a] for a in measured], seed=seed), measured


def test_built_by_name_as_a_latency_predictor(name, problem) -> None:
    space = problem[0]
    pred = get_predictor(name, space)
    assert isinstance(pred, LatencyPredictor) and pred.space.config() == space.config()
    assert isinstance(pred.min_samples, int) and 1 <= pred.min_samples <= N_MEASURED
    assert not pred.is_adapted and pred.measurements is None
    assert pred.name in repr(pred)


def test_bad_measurements_are_user_errors(name, problem) -> None:
    space, archs, _ = problem
    pred = get_predictor(name, space)
    n = max(5, pred.min_samples + 1)
    y = np.linspace(1, 2, n)
    with pytest.raises(UserError, match="not been adapted"):
        pred.predict(archs[:3])
    with pytest.raises(UserError, match=f"needs at least {pred.min_samples} measurements"):
        pred.adapt(archs[: pred.min_samples - 1], y[: pred.min_samples - 1], seed=0)
    with pytest.raises(UserError, match="one latency per architecture"):
        pred.adapt(archs[:n], y[: n - 1], seed=0)
    for bad in (np.nan, 0.0, -1.0, np.inf):
        with pytest.raises(UserError, match="expected a finite latency"):
            pred.adapt(archs[:n], [*y[:-1], bad], seed=0)
    with pytest.raises(UserError, match="measured twice"):
        pred.adapt([archs[0], *archs[: n - 1]], y, seed=0)
    with pytest.raises(UserError, match="bogus"):
        pred.adapt(["|bogus~0|", *archs[: n - 1]], y, seed=0)
    assert not pred.is_adapted  # nothing half-fitted


def test_adapted_predictions_are_finite_positive_and_deterministic(name, problem) -> None:
    space, archs, truth = problem
    pred, measured = adapted(name, space, archs, truth)
    assert pred.is_adapted and pred.measurements[0] == measured
    mean, std = pred.predict_with_std(archs)
    assert mean.shape == (len(archs),) and np.all(np.isfinite(mean)) and np.all(mean > 0)
    assert std is None or (std.shape == mean.shape and np.all(np.isfinite(std))
                           and np.all(std >= 0))
    np.testing.assert_array_equal(pred.predict(archs), mean)
    again, _ = adapted(name, space, archs, truth)
    np.testing.assert_array_equal(again.predict(archs), mean)
    objects = [space.parse(a) for a in archs[:5]]  # architecture objects work as strings do
    np.testing.assert_allclose(pred.predict(objects), mean[:5], rtol=1e-12)


def test_file_loads_back_to_the_same_predictions(name, problem, tmp_path: Path) -> None:
    space, archs, truth = problem
    pred, _ = adapted(name, space, archs, truth)
    path = pred.save(tmp_path / f"{name}.npz")
    loaded = LatencyPredictor.load(path)
    assert type(loaded) is type(pred) and loaded.is_adapted
    assert type(pred).load(path).measurements[0] == pred.measurements[0]
    m0, s0 = pred.predict_with_std(archs)
    m1, s1 = loaded.predict_with_std(archs)
    np.testing.assert_allclose(m1, m0, rtol=1e-9, atol=0)
    assert (s0 is None) == (s1 is None)
    if s0 is not None:
        np.testing.assert_allclose(s1, s0, rtol=1e-9, atol=1e-12)
    assert path.stat().st_size < 1_000_000 and not list(tmp_path.glob(".*"))
