"""Pieces of benchmarks/latency_lofo.py (families, the summary) and the meta predictor's
operation-count prior block (issue 23.2)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from benchmarks import latency_lofo as lofo


def test_families_of_help_and_measured_devices():
    fam = {d: lofo.family(d) for d in (
        "1080ti_1", "titan_rtx_256", "titanx_32", "titanxp_1", "gold_6226", "silver_4210r",
        "pixel2", "samsung_s7", "essential_ph_1", "raspi4", "eyeriss", "fpga",
        "xeon-ort-1t", "xeon-ort-16t", "xeon-ov-4t", "h200-cudagraph-b64", "oddball")}
    assert {d for d, f in fam.items() if f == "desktop-gpu"} == {
        "1080ti_1", "titan_rtx_256", "titanx_32", "titanxp_1"}
    assert fam["gold_6226"] == fam["silver_4210r"] == "server-cpu"
    assert fam["pixel2"] == fam["samsung_s7"] == fam["essential_ph_1"] == "phone"
    assert fam["raspi4"] == "single-board" and fam["fpga"] == fam["eyeriss"] == "simulated-accel"
    assert fam["xeon-ort-1t"] == fam["xeon-ort-16t"] == "xeon-ort"
    assert fam["xeon-ov-4t"] == "xeon-ov" and fam["h200-cudagraph-b64"] == "h200-cudagraph"
    assert fam["oddball"] == "oddball"


def test_known_execution_pins_what_a_user_can_tell():
    from hwnas.supernet.spaces import get_space

    nb201, fbnet = get_space("nb201"), get_space("fbnet")
    onnx = {f: lofo.known_execution(nb201, f, "onnx")
            for f in ("xeon-ort", "vm-ov", "xeon-ts", "h200-torch", "phone")}
    assert onnx == {"xeon-ort": "pruned", "vm-ov": "pruned", "xeon-ts": None,
                    "h200-torch": None, "phone": None}
    declared = {f: lofo.known_execution(nb201, f, "declared")
                for f in ("xeon-ort", "epyc-ts", "h200-torch", "h200-cudagraph", "desktop-gpu")}
    assert declared == {"xeon-ort": "pruned", "epyc-ts": "pruned", "h200-torch": "raw",
                        "h200-cudagraph": "raw", "desktop-gpu": None}
    assert lofo.known_execution(nb201, "xeon-ort", None) is None
    assert lofo.known_execution(fbnet, "xeon-ort", "declared") is None  # one variant only


def test_summary_means_families_not_devices_and_finds_the_worst():
    rows = [{"space": "s", "predictor": "p", "measurements": "ref", "family": f, "device": d,
             "spearman_mean": v}
            for f, d, v in (("a", "a1", 0.9), ("a", "a2", 0.7), ("b", "b1", 1.0))]
    (s,) = lofo.summarize(rows)
    assert s["per_family"] == {"a": 0.8, "b": 1.0}
    assert s["spearman_mean"] == pytest.approx(0.9)
    assert s["worst_family"] == "a" and s["worst_spearman"] == pytest.approx(0.8)


def test_read_gz_table_canonicalises_and_skips_empty(tmp_path):
    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    rng = np.random.default_rng(0)
    a, b = (space.to_string(space.sample(rng)) for _ in range(2))
    path = tmp_path / "nb201_x.csv.gz"
    path.write_bytes(gzip.compress(f"arch,x-ort-1t,x-ov-1t\n{a},1.5,\n{b},2.5,3\n".encode()))
    t = lofo.read_gz_table(path, space)
    assert t["x-ort-1t"] == {a: 1.5, b: 2.5} and t["x-ov-1t"] == {b: 3.0}


def test_load_devices_reads_the_normalised_tables_only(tmp_path, monkeypatch):
    """Anchored tables come with ``_raw``, ``_anchors`` and ``_cv`` files beside the table;
    only ``<space>_<tag>.csv.gz`` holds devices."""
    from types import SimpleNamespace

    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    a = space.to_string(space.sample(np.random.default_rng(0)))
    class HelpTable(SimpleNamespace):
        def __len__(self):
            return 1

    help_table = HelpTable(archs=[a], devices=["h1"], column=lambda d: np.array([1.0]))
    monkeypatch.setattr(lofo, "load_shared_table", lambda name, space: help_table)
    (tmp_path / "nb201_t.csv.gz").write_bytes(gzip.compress(f"arch,t-ort-1t\n{a},2\n".encode()))
    for suffix, head in (("_cv", "arch,t-ort-1t"), ("_raw", "arch,round,t-ort-1t"),
                         ("_anchors", "arch,round,t-ort-1t")):
        (tmp_path / f"nb201_t{suffix}.csv.gz").write_bytes(
            gzip.compress(f"{head}\n{a},0,9\n".encode()))
    devices, sources = lofo.load_devices(space, tmp_path)
    assert set(devices) == {"h1", "t-ort-1t"} and devices["t-ort-1t"][1].tolist() == [2.0]
    assert len(sources) == 2

    # a column whose averaged sessions are noise-level is left out on request, and said so
    (tmp_path / "nb201_t.csv.gz").write_bytes(
        gzip.compress(f"arch,t-ort-1t,t-torch-1t,t-ov-1t\n{a},2,3,4\n".encode()))
    (tmp_path / "nb201_t_sessions.json").write_text(json.dumps(
        {"sessions": ["s1", "s2"], "devices": {
            "t-ort-1t": {"spearman_between_sessions": {"1-2": 0.9}},
            "t-torch-1t": {"spearman_between_sessions": {"1-2": 0.1}}}}))
    devices, sources = lofo.load_devices(space, tmp_path, min_reliability=0.5)
    assert set(devices) == {"h1", "t-ort-1t", "t-ov-1t"}  # t-ov-1t: one session, kept
    assert "left out, reliability below 0.5: t-torch-1t 0.18" in sources[1]
    assert set(lofo.load_devices(space, tmp_path)[0]) == {"h1", "t-ort-1t", "t-torch-1t", "t-ov-1t"}


def test_follow_up_rows_add_k_settling_or_random_measurements():
    class Meta:
        def settling_archs(self, candidates, n):
            assert "a3" not in candidates  # already measured
            return ["a7"]  # one only: the rest are topped up at random

    archs = [f"a{i}" for i in range(20)]
    rnd = np.array([3, 5, 11])
    rows = lofo.follow_up_rows(Meta(), archs, rnd, 4, seed=0)
    assert set(rows) == {"random+4", "random+4-settle"}
    for r in rows.values():
        assert len(r) == 7 and r[:3].tolist() == [3, 5, 11] and len(set(r.tolist())) == 7
    assert rows["random+4-settle"][3] == 7
    assert rows["random+4-settle"][4:].tolist() == [i for i in rows["random+4"][3:] if i != 7][:3]


def test_meta_opcount_block_changes_nothing_at_zero_and_round_trips(tmp_path):
    from hwnas.latency.predictors import MetaPredictor
    from hwnas.latency.predictors.base import LatencyPredictor
    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    rng = np.random.default_rng(1)
    archs = list(dict.fromkeys(space.to_string(space.sample(rng)) for _ in range(300)))
    enc = np.stack([space.encode(space.from_string(a)) for a in archs])
    tables = {f"d{i}": 1.0 + enc @ rng.uniform(0, 1, enc.shape[1]) for i in range(3)}
    # a new device: op counts matter, positions do not
    from hwnas.latency.predictors.opcount import op_count_matrix

    counts, _ = op_count_matrix(space, archs)
    y = 0.5 + counts @ np.array([0.0, 0.05, 0.3, 1.0, 0.2])
    base = MetaPredictor(space, pool_size=200).meta_fit(space, archs, tables, seed=0)
    zero = MetaPredictor(space, pool_size=200, opcounts=(0.0,)).meta_fit(space, archs, tables,
                                                                      seed=0)
    oc = MetaPredictor(space, pool_size=200, opcounts=(0.0, 1.0)).meta_fit(space, archs, tables,
                                                                        seed=0)
    assert base.reference_archs == oc.reference_archs  # the design does not use the block
    refs = base.reference_archs[:10]
    rows = [archs.index(r) for r in refs]
    p0 = base.adapt(refs, y[rows], seed=0).predict(archs)
    assert np.allclose(p0, zero.adapt(refs, y[rows], seed=0).predict(archs))
    p1 = oc.adapt(refs, y[rows], seed=0).predict(archs)
    err = lambda p: float(np.mean(np.abs(p - y)))  # noqa: E731
    assert err(p1) < err(p0)
    path = oc.save(tmp_path / "m.npz")
    back = LatencyPredictor.load(path)
    assert back.opcounts == (0.0, 1.0)
    assert np.allclose(back.adapt(refs, y[rows], seed=0).predict(archs), p1)


def test_meta_fit_with_missing_cells_and_redesign():
    """A device measured on a sample (NaN elsewhere) is meta-trained on its sample; redesign
    chooses reference architectures among given ones."""
    from hwnas.core.errors import UserError
    from hwnas.latency.predictors import MetaPredictor
    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    rng = np.random.default_rng(2)
    archs = list(dict.fromkeys(space.to_string(space.sample(rng)) for _ in range(300)))
    enc = np.stack([space.encode(space.from_string(a)) for a in archs])
    w = rng.uniform(0, 1, enc.shape[1])
    full = 1.0 + enc @ w
    part = full.copy()
    part[100:] = np.nan  # measured on the first 100 only
    m = MetaPredictor(space, pool_size=200).meta_fit(
        space, archs, {"a": 1.0 + enc @ rng.uniform(0, 1, enc.shape[1]), "b": part}, seed=0)
    # b's profile learned from its 100 cells predicts its other 200
    j = m.devices_.index("b")
    prof = enc @ m._p["coef"][j] + m._p["icpt"][j]
    assert np.corrcoef(prof[100:], full[100:])[0, 1] > 0.99
    subset = archs[:40]
    refs = m.redesign(subset, seed=0)
    assert set(refs) <= set(subset) and m.reference_archs == refs
    with pytest.raises(UserError):
        MetaPredictor(space).meta_fit(space, archs, {"a": full, "b": np.r_[part[:5],
                                                                           np.full(295, np.nan)]},
                                      seed=0)


def test_loo_ensemble_weighs_the_member_that_predicts_left_out_measurements():
    """ens-loo: a member whose leave-one-out error is tiny dominates the weighted mean."""
    from hwnas.latency.predictors import FlopsPredictor, OpCountPredictor
    from hwnas.latency.predictors.opcount import op_count_matrix
    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    rng = np.random.default_rng(3)
    archs = list(dict.fromkeys(space.to_string(space.sample(rng)) for _ in range(120)))
    counts, _ = op_count_matrix(space, archs)
    y = 0.5 + counts @ np.array([0.0, 0.9, 0.05, 0.1, 0.6])  # cheap convs, dear skips/pools
    rows = np.arange(10)
    m_archs, m_y = [archs[i] for i in rows], y[rows]
    members = {"opcount": (OpCountPredictor(space), None), "flops": (FlopsPredictor(space), None)}
    p = lofo.loo_ensemble(members, m_archs, m_y, archs, seed=0)
    oc = OpCountPredictor(space).adapt(m_archs, m_y, seed=0)
    exact = oc.predict(archs) / np.mean(oc.predict(m_archs))
    np.testing.assert_allclose(p, exact, rtol=1e-3)


def test_summary_per_number_of_measurements_and_top_up():
    rows = [{"space": "s", "predictor": "p", "measurements": "random", "family": "a",
             "device": "a1", "n_measurements": n, "spearman_mean": v,
             "adapt_seconds_max": 0.1 * n}
            for n, v in ((10, 0.8), (100, 0.95))]
    by_n = {s["n_measurements"]: s for s in lofo.summarize(rows)}
    assert by_n[10]["spearman_mean"] == 0.8 and by_n[100]["spearman_mean"] == 0.95
    assert by_n[100]["adapt_seconds_max"] == pytest.approx(10.0)
    assert lofo._top_up([4, 2], np.array([2, 7, 4, 9]), 4) == [4, 2, 7, 9]
    assert lofo._top_up([4, 2, 5], np.array([1]), 2) == [4, 2]


def test_processor_kinds_cover_the_families():
    import fnmatch

    fams = ["desktop-gpu", "phone", "single-board", "simulated-accel", "server-cpu",
            "h200-torch", "h200-cudagraph", "xeon-ort", "epyc-ts", "vm-ov"]
    kind = {f: [k for k, pats in lofo.KINDS.items() if any(fnmatch.fnmatch(f, p) for p in pats)]
            for f in fams}
    assert all(len(v) == 1 for v in kind.values())  # every family in exactly one kind
    assert kind["phone"] == kind["single-board"] == ["arm-like"]
    assert kind["h200-torch"] == ["gpu"] and kind["epyc-ts"] == ["x86-cpu"]


def test_simple_baselines_rank_an_op_count_device():
    from hwnas.core.maths import spearman
    from hwnas.supernet.spaces import get_space
    from tests.test_latency_reference import opcount_truth

    space = get_space("nb201")
    rng = np.random.default_rng(3)
    archs = list(dict.fromkeys(space.to_string(space.sample(rng)) for _ in range(400)))
    y = opcount_truth(space, archs, 0.02, 0)
    fit, rest = archs[:60], archs[60:]
    for baseline in (lofo.gbm_baseline, lofo.gp_baseline):
        assert spearman(baseline(space, fit, y[:60], rest, 0), y[60:]) > 0.8


def test_residual_select_summary_is_a_mean_over_families():
    from benchmarks import latency_residual_select as sel

    rows = [{"family": f, "device": d, "n": 20, "kind": "random", "draw": s, "meta[off]": v}
            for f, d, s, v in (("a", "a1", 0, 0.9), ("a", "a1", 1, 0.7), ("a", "a2", 0, 0.8),
                               ("b", "b1", 0, 0.5))]
    (out,) = sel.summarize(rows)
    assert out["families"] == 2 and out["per_family"]["a"]["meta[off]"] == pytest.approx(0.8)
    assert out["mean"]["meta[off]"] == pytest.approx(0.65)
    assert out["worst"]["meta[off]"] == pytest.approx(0.5)


def test_cell_graph_terms_and_measurement_draws():
    """latency_growth_variants.path_features on known cells (paths, the parallelism bound),
    and latency_residual_select.measurement_draws: reference rows first, disjoint scoring."""
    from benchmarks import latency_growth_variants as var
    from benchmarks import latency_residual_select as sel
    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    conv = ("|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+"
            "|nor_conv_3x3~0|nor_conv_3x3~1|nor_conv_3x3~2|")
    chain = "|nor_conv_3x3~0|+|none~0|skip_connect~1|+|none~0|none~1|nor_conv_1x1~2|"
    f = var.path_features(space, [conv, chain])
    # live paths, longest, convs / 3x3 on the costliest path, then per node 1..3: live inputs,
    # conv inputs, convs beyond the first among parallel inputs
    assert f[0].tolist() == [4, 3, 3, 3, 1, 1, 0, 2, 2, 1, 3, 3, 2]
    assert f[1].tolist() == [1, 3, 2, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0]

    class Meta:
        reference_archs = ["r2", "r0", "missing"]

    archs = [f"r{i}" for i in range(80)]
    draws = list(sel.measurement_draws(Meta(), archs, [10, 40], 2, 50))
    assert [(n, k, s) for n, k, s, _, _ in draws] == [(10, "ref", 0), (10, "random", 0),
                                                      (10, "random", 1)]  # 40 + 50 > 80
    _, _, _, rows, scored = draws[0]
    assert rows[:2].tolist() == [2, 0] and len(set(rows.tolist())) == 10
    assert not set(rows.tolist()) & set(scored.tolist())


def test_blend_schedule_rows_gzip_and_every_candidate(tmp_path):
    """latency_blend_schedule: rows written gzip-compressed (``.gz``) or plain read back alike;
    every residual learner (``blend`` included) and baseline is a candidate; the summary's
    worst family is named."""
    from benchmarks import latency_blend_schedule as bs

    rows = [{"family": f, "device": f + "1", "n": 20, "kind": "ref", "draw": 0, "off": v,
             "blend": v + 0.01, "baseline[opcount]": v - 0.2}
            for f, v in (("a", 0.9), ("b", 0.5))]
    for name in ("r.json", "r.json.gz"):
        bs.write_rows(tmp_path / name, {"rows": rows})
        assert bs.read_rows(tmp_path / name) == {"rows": rows}
    assert (tmp_path / "r.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    table = bs.summarize(rows)["ref 20"]
    assert table["residual:blend"][:3] == pytest.approx((0.71, 0.01, 0.01))
    assert table["baseline:opcount"][0] == pytest.approx(0.5)
    assert table["off"][3:] == (0.5, "b")
