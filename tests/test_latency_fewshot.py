"""Few-shot scoring of latency predictors on a latency table (latency.fewshot)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hwnas.latency.fewshot import (
    FewShotScore,
    choose_measurements,
    fewshot_scores,
    spearman,
)
from hwnas.latency.predictors import get_predictor, load_pretrained
from hwnas.latency.tables import LatencyTable, help_protocol
from hwnas.supernet.data import shared_data_dir
from hwnas.supernet.spaces import get_space

from hwnas.core.errors import UserError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def nb201_table() -> tuple[object, LatencyTable]:
    """A synthetic nb201 table: the shipped meta predictor's reference architectures plus 40
    seeded samples; 'flops_dev' is a power law of FLOPs (what the flops predictor models),
    'noisy' adds 20% multiplicative noise to it."""
    space = get_space("nb201")
    refs = load_pretrained("nb201").reference_archs
    archs = list(refs)
    rng = np.random.default_rng(0)
    while len(archs) < len(refs) + 40:
        s = space.to_string(space.sample(rng))
        if s not in archs:
            archs.append(s)
    flops = np.array([space.flops(space.from_string(a)) for a in archs], dtype=np.float64)
    lat = 0.05 + 1e-7 * flops ** 0.9
    noisy = lat * np.exp(0.2 * rng.standard_normal(len(lat)))
    return space, LatencyTable(archs, ["flops_dev", "noisy"], np.stack([lat, noisy], 1))


def test_spearman() -> None:
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0
    with pytest.raises(UserError, match="equal length"):
        spearman([1, 2], [1, 2, 3])


def test_random_measurements_are_seeded_nested_and_in_the_pool(nb201_table) -> None:
    space, table = nb201_table
    flops = get_predictor("flops", space)
    pool = np.arange(20, 60)
    r5 = choose_measurements(flops, table, 5, seed=1, pool_rows=pool)
    r10 = choose_measurements(flops, table, 10, seed=1, pool_rows=pool)
    assert list(r10[:5]) == list(r5)  # the 10-sample contains the 5-sample
    assert len(set(r10)) == 10 and set(r10) <= set(pool)
    assert list(choose_measurements(flops, table, 5, seed=1, pool_rows=pool)) == list(r5)
    assert list(choose_measurements(flops, table, 5, seed=2, pool_rows=pool)) != list(r5)
    # the meta predictor on random rows draws the same rows as every other predictor
    meta = get_predictor("meta", space)
    assert list(choose_measurements(meta, table, 5, seed=1, pool_rows=pool,
                                    reference=False)) == list(r5)


def test_reference_measurements(nb201_table) -> None:
    space, table = nb201_table
    meta = get_predictor("meta", space)
    rows = choose_measurements(meta, table, 4, seed=7)
    assert [table.archs[i] for i in rows] == meta.reference_archs[:4]
    with pytest.raises(UserError, match="reference architectures"):
        choose_measurements(meta, table, len(meta.reference_archs) + 1, seed=0)


@pytest.mark.parametrize("kwargs, needle", [
    ({"n": 0}, "positive integer"),
    ({"n": 5, "pool_rows": [0, 1]}, "pool of 2"),
    ({"n": 2, "pool_rows": [0, 999]}, "row indices"),
])
def test_choose_measurements_errors(nb201_table, kwargs, needle) -> None:
    space, table = nb201_table
    with pytest.raises(UserError, match=needle):
        choose_measurements(get_predictor("lut", space), table, seed=0, **kwargs)


def test_scores_per_predictor_n_and_seed(nb201_table) -> None:
    space, table = nb201_table
    scores = fewshot_scores(space, table, "flops_dev", predictors=["flops", "mlp", "meta"],
                            ns=[2, 5], seeds=2, pool_rows=np.arange(20, 60))
    assert all(isinstance(s, FewShotScore) for s in scores)
    keys = {(s.predictor, s.n_measurements, s.seed) for s in scores}
    # mlp needs 3 measurements: n=2 is left out
    assert keys == {(p, n, seed) for p in ("flops", "meta") for n in (2, 5) for seed in (0, 1)} | \
        {("mlp", 5, 0), ("mlp", 5, 1)}
    by = {(s.predictor, s.n_measurements, s.seed): s for s in scores}
    # a device that follows FLOPs exactly is ranked perfectly by the FLOPs proxy
    assert by[("flops", 2, 0)].spearman == pytest.approx(1.0)
    # the meta predictor measures its reference architectures: the seed does not matter
    assert by[("meta", 5, 0)].spearman == pytest.approx(by[("meta", 5, 1)].spearman)
    assert all(-1.0 <= s.spearman <= 1.0 and s.adapt_seconds >= 0 for s in scores)
    assert {s.device for s in scores} == {"flops_dev"}


def test_scores_meta_on_random_rows_and_eval_rows(nb201_table) -> None:
    space, table = nb201_table
    scores = fewshot_scores(space, table, "noisy", predictors=["meta"], ns=[5], seeds=2,
                            pool_rows=np.arange(20, 60), eval_rows=np.arange(20, 60),
                            reference=False)
    assert [s.predictor for s in scores] == ["meta[random]", "meta[random]"]
    assert scores[0].spearman != scores[1].spearman  # different random measurements
    # more reference architectures than the predictor has: left out, not an error
    assert fewshot_scores(space, table, "noisy", predictors=["meta"], ns=[999], seeds=1) == []


@pytest.mark.parametrize("kwargs, needle", [
    ({"device": "nope"}, "no device column 'nope'"),
    ({"predictors": ["xgb"]}, "unknown latency predictor 'xgb'"),
    ({"seeds": 0}, "seeds must be a positive integer"),
    ({"ns": [0]}, "positive integer"),
])
def test_scores_errors(nb201_table, kwargs, needle) -> None:
    space, table = nb201_table
    args = {"device": "noisy", **kwargs}
    with pytest.raises(UserError, match=needle):
        fewshot_scores(space, table, args.pop("device"), **args)


def test_matches_the_benchmark_on_shared_data() -> None:
    """On the shared NB201 table the library reproduces benchmarks/latency_fewshot.json
    (same measurement draws, same predictors): HELP's query set, 5 measurements, 5 seeds."""
    data = shared_data_dir()
    bench = REPO / "benchmarks" / "latency_fewshot.json"
    if data is None or not (data / "latency" / "nb201_latency_ms.csv").is_file():
        pytest.skip("shared latency data not available (set HWNAS_SHARED_DATA)")
    if not bench.is_file():
        pytest.skip("benchmarks/latency_fewshot.json not present")
    from hwnas.latency.tables import load_shared_table

    space = get_space("nb201")
    table = load_shared_table("nb201", space=space)
    protocol = help_protocol("nb201")
    device = "raspi4"
    scores = fewshot_scores(space, table, device, predictors=["lut", "mlp"], ns=[5], seeds=5,
                            pool_rows=protocol.meta_train_rows(table),
                            eval_rows=protocol.query_rows(table, device))
    expected = {r["predictor"]: r["spearman_mean"] for r in json.loads(bench.read_text())["results"]
                if r["space"] == "nb201" and r["device"] == device and r["n_measurements"] == 5
                and r["protocol"] == "help800" and r["seeds"] == 5}
    for name in ("lut", "mlp"):
        got = np.mean([s.spearman for s in scores if s.predictor == name])
        assert got == pytest.approx(expected[name], abs=1e-3), name
