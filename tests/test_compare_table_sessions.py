"""benchmarks/compare_table_sessions.py: two sessions of one table agree better normalised than
raw when one of them drifted between its rounds; tables without anchors compare raw only."""

from __future__ import annotations

import numpy as np
from benchmarks import compare_table_sessions as cts
from benchmarks import measure_latency_tables as mlt

ARCHS = [f"a{i}" for i in range(12)]
ANCHORS = ["x", "y", "z"]
TRUE = dict(zip(ARCHS + ANCHORS,
                np.linspace(1.0, 2.0, 15)[np.random.default_rng(0).permutation(15)]))


def session(folder, factors, anchored=True):
    """A table whose rounds split ARCHS evenly, each cell ``true * the round's factor``."""
    t = mlt.Tables({"nb201": ARCHS}, ["d"], {"nb201": ANCHORS} if anchored else None)
    for r, part in enumerate(np.array_split(ARCHS, len(factors))):
        for a in part:
            t.add("nb201", str(a), {"d": (TRUE[a] * factors[r], 0.01)}, r)
        if anchored:
            for a in ANCHORS:
                t.add_anchor("nb201", a, r, {"d": (TRUE[a] * factors[r], 0.01)})
    folder.mkdir()
    t.write(folder, "t")
    return folder


def test_drift_shows_raw_and_goes_normalised(tmp_path):
    a = session(tmp_path / "a", [1.0, 3.0])
    b = session(tmp_path / "b", [2.0])
    res = cts.compare(a, b, "nb201", "t")["d"]
    assert res["architectures"] == len(ARCHS)  # the anchors are left out
    assert res["normalised"] == 1.0 and res["raw"] < 0.9


def test_unanchored_tables_compare_raw(tmp_path):
    a = session(tmp_path / "a", [1.0, 3.0], anchored=False)
    b = session(tmp_path / "b", [2.0], anchored=False)
    res = cts.compare(a, b, "nb201", "t")["d"]
    assert res["raw"] == res["normalised"] < 0.9
    assert cts.main([str(a), str(b), "--tag", "t"]) == 0
