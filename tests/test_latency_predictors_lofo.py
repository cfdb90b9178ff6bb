"""The benchmark pieces that bring the low-rank predictor and the family protocol into
benchmarks/latency_lofo.py and benchmarks/latency_fewshot.py (no data needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

lofo = pytest.importorskip("benchmarks.latency_lofo")
fewshot = pytest.importorskip("benchmarks.latency_fewshot")


def test_lowrank_options_parse_to_keywords() -> None:
    opts = lofo.parse_lowrank_options(["rank=4", "targets=linear,log", "layer_vars=0,0.1",
                                       "surrogate_ridge=0.1"])
    assert opts == {"rank": 4, "targets": ("linear", "log"), "layer_vars": (0.0, 0.1),
                    "surrogate_ridge": 0.1}


def test_rank_mean_orders_by_the_mean_rank() -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0])
    b = np.array([10.0, 40.0, 20.0, 30.0])
    np.testing.assert_allclose(lofo.rank_mean(a, b), [1.0, 3.0, 2.5, 3.5])


def _lofo_doc() -> dict:
    results = []
    for fam, devs, base in (("phone", ["p1", "p2"], 0.9), ("xeon-ort", ["x1"], 0.8)):
        for i, d in enumerate(devs):
            for meas, shift in (("ref", 0.0), ("random", -0.02)):
                results.append({"space": "nb201", "predictor": "lowrank", "measurements": meas,
                                "n_measurements": 10, "family": fam, "device": d,
                                "spearman_mean": base + shift + 0.02 * i, "spearman_std": 0.01,
                                "seeds": 1 if meas == "ref" else 5, "adapt_seconds": 0.01})
    summary = lofo.summarize(results)
    return {"command": "x", "results": results, "summary": summary}


def test_lofo_rows_one_per_family_and_summary() -> None:
    rows = fewshot.lofo_rows(_lofo_doc())
    fam = {(r["predictor"], r["protocol"]): r for r in rows}
    phone = fam[("lowrank", "lofo-phone")]
    assert phone["device"] == "phone" and phone["devices"] == ["p1", "p2"]
    assert phone["spearman_mean"] == pytest.approx(0.91)
    assert fam[("lowrank[random]", "lofo-xeon-ort")]["spearman_mean"] == pytest.approx(0.78)
    assert fam[("lowrank", "lofo-mean")]["spearman_mean"] == pytest.approx((0.91 + 0.8) / 2)
    worst = fam[("lowrank[random]", "lofo-worst")]
    assert worst["device"] == "xeon-ort" and worst["spearman_mean"] == pytest.approx(0.78)
    keys = {"space", "predictor", "device", "n_measurements", "protocol", "spearman_mean",
            "spearman_std", "seeds", "adapt_seconds"}
    assert all(keys <= set(r) for r in rows)


def test_fewshot_refuses_a_file_that_is_not_a_lofo_result(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"results": []}))
    out = tmp_path / "out.json"
    assert fewshot.main(["--spaces", "nb201", "--predictors", "flops", "--n", "2", "--seeds",
                         "1", "--lofo", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a benchmarks/latency_lofo.py result" in err and "\n" not in err
    assert not out.exists()
