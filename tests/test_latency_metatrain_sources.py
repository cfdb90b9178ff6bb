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
