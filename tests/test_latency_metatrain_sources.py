"""benchmarks/latency_metatrain_sources.py on synthetic tables: every measured family is held
out once and scored by a meta predictor trained with and without the other measured families."""

from __future__ import annotations

import numpy as np
from benchmarks import latency_metatrain_sources as bench
from hwnas.latency.tables import help_protocol
from hwnas.supernet.spaces import get_space


def test_each_measured_family_is_held_out_with_both_sources(monkeypatch):
    space = get_space("nb201")
    rng = np.random.default_rng(0)
    archs = [space.to_string(space.sample(rng)) for _ in range(120)]
    archs = list(dict.fromkeys(archs))
    cost = {a: 1.0 + a.count("conv_3x3") * 2.0 + a.count("conv_1x1") for a in archs}
    base = np.array([cost[a] for a in archs])
    devices = {d: (archs, base * (1 + 0.05 * rng.random(len(archs))))
               for d in help_protocol("nb201").meta_train}
    for d in ("vm-ort-1t", "xeon-ort-1t", "xeon-ts-1t"):
        devices[d] = (archs, base * (1 + 0.05 * rng.random(len(archs))))
    monkeypatch.setattr(bench.lofo, "load_devices", lambda s: (devices, []))
    rows = bench.run("nb201", seeds=1)
    assert sorted({r["family"] for r in rows}) == ["vm-ort", "xeon-ort", "xeon-ts"]
    assert sorted(r["meta_train"] for r in rows if r["family"] == "vm-ort") == ["help",
                                                                                "help+measured"]
    for r in rows:  # latency is a clean function of the op counts: both rank it well
        assert r["reference"] > 0.8 and r["random"] > 0.8, r


def test_machine_and_help_kind_views_hold_out_whole_groups(monkeypatch):
    space = get_space("nb201")
    rng = np.random.default_rng(1)
    archs = list(dict.fromkeys(space.to_string(space.sample(rng)) for _ in range(90)))
    base = np.array([1.0 + a.count("conv_3x3") * 2.0 + a.count("conv_1x1") for a in archs])
    devices = {d: (archs, base * (1 + 0.05 * rng.random(len(archs))))
               for d in help_protocol("nb201").meta_train}
    for d in ("vm-ort-1t", "xeon-ort-1t", "xeon-ts-1t", "2080ti_1"):
        devices[d] = (archs, base * (1 + 0.05 * rng.random(len(archs))))
    monkeypatch.setattr(bench.lofo, "load_devices", lambda s: (devices, []))
    trained = []
    real_meta = bench._meta
    monkeypatch.setattr(bench, "_meta", lambda s, dev, train: trained.append(sorted(train))
                        or real_meta(s, dev, train))
    rows = bench.run_view("nb201", "machine", seeds=1, ns=[20, 200])
    assert sorted({r["fold"] for r in rows}) == ["vm", "xeon"]
    # the xeon fold holds out both xeon runtimes; its extra source is the other machine only
    assert ["1080ti_1", "1080ti_256", "1080ti_32", "essential_ph_1", "pixel3", "samsung_a50",
            "samsung_s7", "silver_4114", "silver_4210r", "vm-ort-1t"] in trained
    assert all(("xeon-ts-1t" in t) == ("xeon-ort-1t" in t) for t in trained)  # never one alone
    assert {r["measurements"] for r in rows} == {"ref", "random20"}  # 200 > the table
    summary = bench.view_summary(rows)
    assert {m["families"] for m in summary} == {3}
    assert all(abs(m["change"] - (m["help+measured"] - m["help"])) < 2e-4 for m in summary)
    rows = bench.run_view("nb201", "help-kinds", seeds=1, ns=[20])
    phones = {r["family"] for r in rows if r["fold"] == "phone"}
    assert phones == {"phone"} and {r["fold"] for r in rows} == {"phone", "gpu", "cpu"}
    # HELP's further columns (2080ti_1) are never an extra source
    assert not any("2080ti_1" in t for t in trained)
    for r in rows:
        assert r["spearman"] > 0.7, r
