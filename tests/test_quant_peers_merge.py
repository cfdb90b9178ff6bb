"""benchmarks/quant_peers.py --merge: a split run (other methods, other runtimes) updates the
table value by value and the drops follow each subnet's FP32 onnxruntime top-1."""

from __future__ import annotations

from benchmarks.quant_peers import markdown, merge_rows


def test_merge_keeps_old_values_and_recomputes_drops():
    old = [{"subnet": "smallest", "method": "fp32", "top1_ort": 89.0, "drop_ort": 0.0},
           {"subnet": "smallest", "method": "hwnas_w4a8", "top1_ort": 88.0, "drop_ort": -1.0,
            "top1_ov": 87.9, "drop_ov": -1.1, "ort_ms_b32": 50.0}]
    new = [{"subnet": "smallest", "method": "hwnas_w4a8", "top1_ort": 88.5, "ort_ms_b32": None},
           {"subnet": "smallest", "method": "hwnas_w4a8_adaround", "top1_ov": 88.6},
           {"subnet": "middle", "method": "hwnas_int8", "top1_ort": 91.0}]
    rows = merge_rows(old, new)
    got = {(r["subnet"], r["method"]): r for r in rows}
    w4 = got["smallest", "hwnas_w4a8"]
    assert (w4["top1_ort"], w4["drop_ort"], w4["top1_ov"], w4["ort_ms_b32"]) == (88.5, -0.5, 87.9, 50.0)
    assert got["smallest", "hwnas_w4a8_adaround"]["drop_ov"] == -0.4
    assert got["middle", "hwnas_int8"]["drop_ort"] is None  # no FP32 row for that subnet
    # methods in the script's order within a subnet
    assert [r["method"] for r in rows if r["subnet"] == "smallest"] == [
        "fp32", "hwnas_w4a8", "hwnas_w4a8_adaround"]
    doc = {"date": "d", "command": "c", "machine": "m", "runtimes": "r",
           "isa": {"isa": ["avx2"], "int8_without_saturation": False},
           "results": [dict(r, int16_safe=None, worst_pair_sum=None) for r in rows]}
    assert "| smallest | hwnas_w4a8_adaround |  | 88.60 (-0.40) |" in markdown(doc)


def test_adaround_steps_rule_prefers_fewer_steps_within_tolerance():
    """benchmarks/adaround_steps.py's choice: highest mean validation top-1 over the subnets,
    a smaller step count within the tolerance preferred; counts not run on every subnet and
    nearest rounding (steps 0) are not candidates."""
    from benchmarks.adaround_steps import choose

    rows = [{"subnet": s, "steps": n, "val_top1": v} for s, n, v in (
        ("a", 0, 95.0), ("a", 50, 88.0), ("a", 100, 88.95), ("a", 500, 89.0),
        ("b", 50, 90.0), ("b", 100, 90.0), ("b", 500, 90.1), ("b", 1000, 99.0))]
    assert choose(rows, tolerance=0.1) == 100  # means 89.0 and 89.475 vs 89.55
    assert choose(rows, tolerance=0.0) == 500
    assert choose([], tolerance=0.1) is None
    # int8 rows (--recipe int8) never vote in the W4A8 choice
    int8 = [{"subnet": s, "method": "hwnas_int8_adaround", "recipe": "int8", "steps": 50,
             "val_top1": 99.0} for s in ("a", "b")]
    assert choose(rows + int8, tolerance=0.1) == 100
