"""Anchors of benchmarks/measure_latency_tables.py (on the vit sample, the smallest to rank):
the per-(round, device) speed factors undo
a device's changing speed. A fake timer multiplies a known latency per architecture by a
factor per round (and per session) plus small noise; the normalised table must rank the known
latencies where the raw one cannot, also when --resume stitches two sessions."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from benchmarks import measure_latency_tables as mlt
from hwnas.core.maths import spearman
from hwnas.supernet.spaces import get_space

COMMON = ["--spaces", "vit", "--threads", "1", "--runtimes", "cpu", "--cpu-runtimes", "ort",
          "torch", "--no-openvino", "--tag", "t", "--round", "10"]


def true_ms(arch: str, runtime: str) -> float:
    """A fixed latency per architecture and runtime, spread over 1-3 ms (narrower than the
    fake drift, so drift would reorder a raw table)."""
    return 1.0 + (zlib.crc32(f"{runtime}{arch}".encode()) % 1000) / 500


@pytest.fixture
def fake_timer(monkeypatch):
    """Replace export and timing: a cell is ``true_ms * factor[round] * (1 + 1% noise)``; the
    round advances each time the loop asks whether a round still fits."""
    state = {"round": -1, "factors": [1.0], "rng": np.random.default_rng(0)}

    def next_round(durations, deadline):
        state["round"] += 1
        return False

    def measure(self, runtime, threads, space_name, arch, onnx_path, ts_path):
        f = state["factors"][state["round"] % len(state["factors"])]
        return true_ms(arch, runtime) * f * (1 + 0.01 * state["rng"].standard_normal()), 0.01

    monkeypatch.setattr(mlt, "no_time_for_a_round", next_round)
    monkeypatch.setattr(mlt, "versions", lambda: {"torch": "fake"})  # no runtime imports
    monkeypatch.setattr(mlt.CpuRunner, "prepare", lambda self, *a, **k: None)
    monkeypatch.setattr(mlt.CpuRunner, "measure", measure)
    return state


def read(path):
    rows = mlt.read_csv_gz(path)
    return rows[0], rows[1:]


def rank_vs_truth(path, runtime="ort", column=1):
    head, rows = read(path)
    col = head.index(f"t-{runtime}-1t") if column is None else column
    got = np.array([float(r[col]) for r in rows])
    truth = np.array([true_ms(r[0], runtime) for r in rows])
    return spearman(got, truth)


def test_choose_anchors_spread_over_flops_and_deterministic():
    space = get_space("nb201")
    rng = np.random.default_rng(3)
    archs = list(dict.fromkeys(space.to_string(space.sample(rng)) for _ in range(80)))
    a = mlt.choose_anchors(space, archs, 8)
    assert len(a) == len(set(a)) == 8 and set(a) <= set(archs)
    assert a == mlt.choose_anchors(space, list(reversed(archs)), 8)  # order-free
    flops = [space.flops(space.from_string(x)) for x in a]
    every = sorted(space.flops(space.from_string(x)) for x in archs)
    assert flops == sorted(flops)
    assert flops[0] <= every[len(every) // 8] and flops[-1] >= every[-len(every) // 8 - 1]
    assert mlt.choose_anchors(space, archs[:3], 8) == mlt.choose_anchors(space, archs[:3], 3)
    assert mlt.choose_anchors(space, archs, 0) == []


def test_sample_anchors_follow_the_sample_file(tmp_path, monkeypatch):
    import gzip

    archs = mlt.read_sample("vit", 20)
    monkeypatch.setattr(mlt, "TABLES_DIR", tmp_path)
    for part in (archs[:10], archs[10:]):
        mlt.sample_path("vit").write_bytes(gzip.compress("\n".join(part).encode()))
        got = mlt.sample_anchors("vit", 3)
        assert got == mlt.choose_anchors(get_space("vit"), part, 3)  # not a cached other sample


def test_speed_factors_follow_the_rounds():
    rng = np.random.default_rng(1)
    f = [1.0, 2.0, 0.5, 1.5, 1.0]
    times = {("s", f"a{j}"): {r: {"d": t * f[r] * (1 + 0.005 * rng.standard_normal())}
                              for r in range(len(f))}
             for j, t in enumerate(rng.uniform(1, 10, 8))}
    got = mlt.speed_factors(times, ["d", "missing"])
    ratio = np.array([got[r]["d"] for r in range(len(f))]) / np.array(f)
    assert np.allclose(ratio, ratio[0], rtol=0.02)  # the same factors up to one scale
    assert abs(got[0]["d"] - 1.0) < 0.03  # relative to the anchors' median round
    assert all(got[r]["missing"] == 1.0 for r in got)
    se = mlt.factor_errors(times, ["d", "missing"])
    # (the round that is most anchors' median has ratios of exactly 1: its error reads 0)
    assert all(se[r]["d"] < 0.01 for r in se) and np.median([se[r]["d"] for r in se]) > 0
    assert np.isnan(se[0]["missing"])
    noisy = {k: {r: {"d": t["d"] * np.exp(0.5 * rng.standard_normal())} for r, t in v.items()}
             for k, v in times.items()}
    noisy_se = mlt.factor_errors(noisy, ["d"])
    assert np.median([noisy_se[r]["d"] for r in noisy_se]) > 0.05


def test_round_size_and_jobs():
    import argparse

    anchors = {"nb201": list("abcdefgh"), "fbnet": list("ABCDEFGH"), "mbv3": list("01234567")}
    args = argparse.Namespace(round=0)
    n = mlt.round_size(args, 64, anchors)
    assert 0.12 <= 24 / (n + 24) <= mlt.ANCHOR_SHARE
    assert mlt.round_size(args, 64, None) == 64
    assert mlt.round_size(argparse.Namespace(round=5), 64, anchors) == 5
    rnd = [("nb201", 0), ("nb201", 1), ("fbnet", 0)]
    rng = np.random.default_rng(0)
    assert mlt.round_jobs(rnd, None, rng) == [("arch", s, i) for s, i in rnd]
    assert rng.integers(1 << 30) == np.random.default_rng(0).integers(1 << 30)  # untouched
    jobs = mlt.round_jobs(rnd, anchors, rng)
    assert sorted(jobs) == sorted([("arch", s, i) for s, i in rnd]
                                  + [("anchor", s, j) for s in anchors
                                     for j in range(8)])  # mbv3's too, though not in the round
    assert [k for k, _, _ in jobs[-3:]] != ["arch"] * 3 or jobs[:16] != sorted(jobs[:16])


def test_normalised_table_undoes_round_drift(tmp_path, fake_timer):
    fake_timer["factors"] = [1.0, 2.5, 0.6, 1.8, 0.8, 3.0]
    out = tmp_path / "a"
    assert mlt.main(["--out", str(out), "--n", "60", *COMMON]) == 0
    doc = json.loads((out / "machine_t.json").read_text())
    anchors = doc["anchors"]
    assert len(anchors["archs"]["vit"]) == 8 and doc["rounds_done"] == 6
    f = np.array([anchors["factors"][str(r)]["t-ort-1t"] for r in range(6)])
    assert np.allclose(f / f[0], np.array(fake_timer["factors"]), rtol=0.03)
    assert anchors["drift"]["t-ort-1t"]["max_over_min"] == pytest.approx(5.0, rel=0.05)
    assert anchors["drift"]["t-ort-1t"]["log_se_median"] < 0.01
    head, rows = read(out / "vit_t.csv.gz")
    # the 60 architectures and the 8 anchors (an anchor among the 60 is measured as an anchor)
    plain = [a for a in mlt.read_sample("vit", 60) if a not in anchors["archs"]["vit"]]
    assert [r[0] for r in rows[:len(plain)]] == plain
    assert sorted(r[0] for r in rows[len(plain):]) == sorted(anchors["archs"]["vit"])
    for runtime in ("ort", "torch"):
        col = head.index(f"t-{runtime}-1t")
        assert rank_vs_truth(out / "vit_t.csv.gz", runtime, col) > 0.98
        assert rank_vs_truth(out / "vit_t_raw.csv.gz", runtime, col + 1) < 0.8
    # the raw file keeps each row's round, the anchors file every anchor measurement
    rhead, raw = read(out / "vit_t_raw.csv.gz")
    assert rhead[:2] == ["arch", "round"]
    assert sorted({r[1] for r in raw}) == ["0", "1", "2", "3", "4", "5", "anchor"]
    _, anc = read(out / "vit_t_anchors.csv.gz")
    assert len(anc) == 8 * 6


def test_resume_stitches_two_sessions(tmp_path, fake_timer):
    first, second = tmp_path / "a", tmp_path / "b"
    fake_timer["factors"] = [1.0, 1.1, 0.9]
    assert mlt.main(["--out", str(first), "--n", "30", *COMMON]) == 0
    fake_timer.update(round=-1, factors=[2.6, 2.4, 2.9])  # a slower host, next session
    assert mlt.main(["--out", str(second), "--n", "60", "--resume", str(first), *COMMON]) == 0
    _, raw1 = read(first / "vit_t_raw.csv.gz")
    _, raw2 = read(second / "vit_t_raw.csv.gz")
    assert [r for r in raw2 if r[1] in ("0", "1", "2")] == [r for r in raw1 if r[1] != "anchor"]
    assert {r[1] for r in raw2} == {"0", "1", "2", "3", "4", "5", "anchor"}
    assert rank_vs_truth(second / "vit_t.csv.gz") > 0.98
    assert rank_vs_truth(second / "vit_t_raw.csv.gz", column=2) < 0.8
    doc = json.loads((second / "machine_t.json").read_text())
    f = doc["anchors"]["factors"]
    assert len(f) == 6 and doc["anchors"]["rounds_this_session_from"] == 3
    assert f["3"]["t-ort-1t"] / f["0"]["t-ort-1t"] == pytest.approx(2.6, rel=0.03)
    assert [s["command"].split("--out ")[1].split()[0] for s in doc["sessions"]] == [
        str(first), str(second)]
    # the registry lists the normalised table only
    from hwnas.latency.devices import MEASURED_TABLES_ENV, measured_tables

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MEASURED_TABLES_ENV, str(second))
        assert measured_tables() == {"vit": [second / "vit_t.csv.gz"]}


def test_resume_refuses_mixed_tables(tmp_path, fake_timer):
    plain, anchored = tmp_path / "plain", tmp_path / "anchored"
    assert mlt.main(["--out", str(plain), "--n", "4", "--no-anchors", *COMMON]) == 0
    with pytest.raises(SystemExit, match="without anchors"):
        mlt.main(["--out", str(tmp_path / "x"), "--n", "6", "--resume", str(plain), *COMMON])
    assert mlt.main(["--out", str(anchored), "--n", "4", "--anchors", "3", *COMMON]) == 0
    with pytest.raises(SystemExit, match="with anchors"):
        mlt.main(["--out", str(tmp_path / "y"), "--n", "6", "--resume", str(anchored),
                  "--no-anchors", *COMMON])
    with pytest.raises(SystemExit, match="anchors"):
        mlt.main(["--out", str(tmp_path / "z"), "--n", "6", "--resume", str(anchored),
                  "--anchors", "4", *COMMON])
    (anchored / "vit_t_anchors.csv.gz").unlink()
    with pytest.raises(SystemExit, match="vit_t_anchors.csv.gz is missing"):
        mlt.main(["--out", str(tmp_path / "w"), "--n", "6", "--resume", str(anchored),
                  "--anchors", "3", *COMMON])


def test_gpu_loop_measures_anchors_every_round(tmp_path, monkeypatch):
    """The GPU loop with a stand-in timing (no GPU here): anchors of both spaces in each round,
    shuffled among the architectures, their times and the factors recorded."""
    import torch
    from hwnas.latency.devices import MeasuredDevice

    seen = []

    def fake(self, space, archs):
        seen.append((space.name, archs[0]))
        return np.array([1.0 + self.batch / 100]), np.array([0.01])

    monkeypatch.setattr(mlt, "versions", lambda: {"torch": "fake"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(MeasuredDevice, "latency_with_std", fake)
    out = tmp_path / "out"
    assert mlt.main(["--out", str(out), "--spaces", "nb201", "fbnet", "--n", "4", "2",
                     "--runtimes", "gpu", "--anchors", "2", "--round", "3"]) == 0
    doc = json.loads((out / "machine_h200.json").read_text())
    anchors = doc["anchors"]["archs"]
    assert doc["rounds_done"] == 2 and len(doc["anchors"]["factors"]) == 2
    assert all(v == 1.0 for f in doc["anchors"]["factors"].values() for v in f.values())
    for space in ("nb201", "fbnet"):
        _, anc = read(out / f"{space}_h200_anchors.csv.gz")
        assert sorted((r[0], r[1]) for r in anc) == sorted(
            (a, r) for a in anchors[space] for r in ("0", "1"))
    archs = [a for _, a in seen[::4]]  # four devices per item
    assert len(archs) == 2 * 4 + 6  # each round: its 3 architectures and the 4 anchors
    assert archs[:7] != sorted(archs[:7], key=lambda a: a in anchors["nb201"] + anchors["fbnet"])
