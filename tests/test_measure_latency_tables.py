"""The pieces of benchmarks/measure_latency_tables.py: samples, core sets, the round schedule,
complete-row tables, tags, and one tiny end-to-end run (1 architecture, 1 repeat)."""

from __future__ import annotations

import csv
import gzip
import io
import json

import numpy as np
import pytest
from benchmarks import measure_latency_tables as mlt
from hwnas.supernet.spaces import get_space


def test_make_sample_holds_required_distinct_and_seeded():
    space = get_space("nb201")
    rng = np.random.default_rng(5)
    required = [space.to_string(space.sample(rng)) for _ in range(3)]
    a = mlt.make_sample(space, 40, 1, required)
    assert len(a) == len(set(a)) == 40
    assert set(required) <= set(a)
    assert a == mlt.make_sample(space, 40, 1, required)
    assert a != mlt.make_sample(space, 40, 2, required)
    # from a pool: only the pool's architectures
    pool = [space.to_string(space.sample(rng)) for _ in range(60)]
    b = mlt.make_sample(space, 20, 0, pool[:2], pool)
    assert set(b) <= set(pool) and len(b) == 20 and set(pool[:2]) <= set(b)
    # the required ones are not all at the front (the order is random)
    assert a[:3] != required


def test_committed_samples_hold_the_help_reference_archs():
    from hwnas.latency.tables import load_shared_table, help_protocol, shared_table_path

    for name, n in (("nb201", 2000), ("fbnet", 1000)):
        archs = mlt.read_sample(name, 10**6)
        assert len(archs) == n == len(set(archs))
        try:
            shared_table_path(name)
            table = load_shared_table(name, space=get_space(name))
        except Exception as exc:  # noqa: BLE001
            pytest.skip(f"shared latency tables absent: {exc}")
        refs = {table.archs[r] for r in help_protocol(name).reference_rows(table)}
        assert refs <= set(archs)
        assert set(archs) <= set(table.archs)


def test_core_sets_are_disjoint_and_sized():
    cpus = list(range(16))
    sets = mlt.core_sets(cpus, 4, 16)
    assert len(sets) == 4 and all(len(s) == 4 for s in sets)
    assert len({c for s in sets for c in s}) == 16
    assert len(mlt.core_sets(cpus, 1, 6)) == 6
    assert mlt.core_sets(cpus, 16, 16) == [cpus]
    assert mlt.core_sets([0, 1], 4, 4) == [[0, 1]]  # fewer CPUs than threads: one set of all


def test_rounds_cover_every_arch_once_in_proportion():
    sched = mlt.rounds({"a": 20, "b": 10, "c": 0}, 6)
    flat = [x for r in sched for x in r]
    assert sorted(flat) == sorted([("a", i) for i in range(20)] + [("b", i) for i in range(10)])
    first = sched[0]
    assert sum(s == "a" for s, _ in first) == 4 and sum(s == "b" for s, _ in first) == 2


def test_tables_write_complete_rows_only(tmp_path):
    t = mlt.Tables({"nb201": ["x", "y", "z"]}, ["d1", "d2"])
    t.add("nb201", "x", {"d1": (1.0, 0.01), "d2": (2.0, 0.2)})
    t.add("nb201", "y", {"d1": (3.0, 0.01)})
    summary = t.write(tmp_path, "tag")
    rows = list(csv.reader(io.StringIO(gzip.decompress(
        (tmp_path / "nb201_tag.csv.gz").read_bytes()).decode())))
    assert rows == [["arch", "d1", "d2"], ["x", "1", "2"]]
    assert summary["nb201"]["architectures"] == 1 and summary["nb201"]["target"] == 3
    assert summary["nb201"]["cells_above_max_cv"]["d2"] == 1


def test_tags():
    assert mlt.cpu_tag("Intel(R) Xeon(R) Platinum 8480+") == "xeon"
    assert mlt.cpu_tag("AMD EPYC 9654 96-Core Processor") == "epyc"
    assert mlt.gpu_tag("NVIDIA H200") == "h200"
    assert mlt.gpu_tag("NVIDIA GeForce RTX 4090") == "4090"
    names = [d for d, _, _ in mlt.cpu_devices("xeon", [4, 1], False)]
    assert names == ["xeon-ort-1t", "xeon-torch-1t", "xeon-ts-1t",
                     "xeon-ort-4t", "xeon-torch-4t", "xeon-ts-4t"]
    # the execution settings are measured on request only, OpenVINO's only where it imports
    asked = ("ort", "ortnoopt", "ovbf16")
    assert [d for d, _, _ in mlt.cpu_devices("epyc", [1], True, asked)] == [
        "epyc-ort-1t", "epyc-ortnoopt-1t", "epyc-ovbf16-1t"]
    assert [d for d, _, _ in mlt.cpu_devices("epyc", [1], False, asked)] == [
        "epyc-ort-1t", "epyc-ortnoopt-1t"]


def test_time_calls_median_and_cv():
    calls = []
    med, cv = mlt.time_calls(lambda: calls.append(1), 2, 5)
    assert len(calls) == 7 and med >= 0 and cv >= 0


def test_end_to_end_tiny(tmp_path, one_torch_thread):
    out = tmp_path / "out"
    assert mlt.main(["--out", str(out), "--spaces", "nb201", "--n", "1", "--threads", "1",
                     "--repeats", "1", "--warmup", "0", "--runtimes", "cpu", "--no-openvino",
                     "--tag", "t", "--no-anchors"]) == 0
    rows = list(csv.reader(io.StringIO(gzip.decompress(
        (out / "nb201_t.csv.gz").read_bytes()).decode())))
    assert rows[0] == ["arch", "t-ort-1t", "t-torch-1t", "t-ts-1t"]
    assert rows[1][0] == mlt.read_sample("nb201", 1)[0]
    assert all(float(v) > 0 for v in rows[1][1:])
    doc = json.loads((out / "machine_t.json").read_text())
    assert doc["spaces"]["nb201"]["architectures"] == 1 and "cpu_model" in doc["cpu"]
    assert not doc["stopped_by_budget"]


def test_onnxruntime_without_graph_optimisation_is_a_device(tmp_path, one_torch_thread):
    out = tmp_path / "out"
    assert mlt.main(["--out", str(out), "--spaces", "nb201", "--n", "1", "--threads", "1",
                     "--repeats", "1", "--warmup", "0", "--runtimes", "cpu", "--no-openvino",
                     "--tag", "t", "--no-anchors", "--cpu-runtimes", "ortnoopt"]) == 0
    rows = list(csv.reader(io.StringIO(gzip.decompress(
        (out / "nb201_t.csv.gz").read_bytes()).decode())))
    assert rows[0] == ["arch", "t-ortnoopt-1t"] and float(rows[1][1]) > 0


def test_budget_stops_cleanly(tmp_path, one_torch_thread):
    out = tmp_path / "out"
    # no budget left: no round starts, the JSON still says what happened
    assert mlt.main(["--out", str(out), "--spaces", "nb201", "--n", "2", "--round", "1",
                     "--threads", "1", "--runtimes", "cpu", "--no-openvino", "--tag", "t",
                     "--max-minutes", "0", "--no-anchors"]) == 0
    doc = json.loads((out / "machine_t.json").read_text())
    assert doc["stopped_by_budget"] and doc["rounds_done"] == 0 and doc["spaces"] == {}


def test_gpu_loop_with_a_stand_in_device(tmp_path, monkeypatch):
    """The GPU loop's bookkeeping (names, order, tables, JSON) with the CUDA timing replaced by
    a stand-in (this machine has no GPU; the timing itself is MeasuredDevice's)."""
    import torch
    from hwnas.latency.devices import MeasuredDevice

    seen = []

    def fake(self, space, archs):
        seen.append((self.name, self.batch, self.cuda_graph, archs[0]))
        return np.array([1.0 + self.batch / 100]), np.array([0.01])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(MeasuredDevice, "latency_with_std", fake)
    out = tmp_path / "out"
    assert mlt.main(["--out", str(out), "--spaces", "nb201", "fbnet", "--n", "2", "1",
                     "--runtimes", "gpu", "--no-anchors"]) == 0
    rows = list(csv.reader(io.StringIO(gzip.decompress(
        (out / "nb201_h200.csv.gz").read_bytes()).decode())))
    assert rows[0] == ["arch", "h200-torch-b1", "h200-torch-b64", "h200-cudagraph-b1",
                       "h200-cudagraph-b64"]
    assert len(rows) == 3 and rows[1][1:] == ["1.01", "1.64", "1.01", "1.64"]
    assert len(seen) == 12 and {s[:3] for s in seen} == {
        ("h200-torch-b1", 1, False), ("h200-torch-b64", 64, False),
        ("h200-cudagraph-b1", 1, True), ("h200-cudagraph-b64", 64, True)}
    # runtimes in a random order per architecture, not always the same
    orders = [tuple(s[0] for s in seen[i:i + 4]) for i in range(0, 12, 4)]
    assert len(set(orders)) > 1
    doc = json.loads((out / "machine_h200.json").read_text())
    assert doc["gpu"] == "NVIDIA H200" and doc["spaces"]["fbnet"]["architectures"] == 1


def test_resume_measures_only_what_is_missing(tmp_path, one_torch_thread):
    first, second = tmp_path / "a", tmp_path / "b"
    common = ["--spaces", "nb201", "--threads", "1", "--repeats", "1", "--warmup", "0",
              "--runtimes", "cpu", "--no-openvino", "--tag", "t", "--no-anchors"]
    assert mlt.main(["--out", str(first), "--n", "1", *common]) == 0
    assert mlt.main(["--out", str(second), "--n", "2", "--resume", str(first), *common]) == 0
    read = lambda p: list(csv.reader(io.StringIO(gzip.decompress(  # noqa: E731
        p.read_bytes()).decode())))
    a, b = read(first / "nb201_t.csv.gz"), read(second / "nb201_t.csv.gz")
    assert len(b) == 3 and b[1] == a[1]  # the first row is the earlier run's, unchanged
    # another machine's tables are refused
    doc = json.loads((first / "machine_t.json").read_text())
    doc["cpu"]["cpu_model"] = "Some Other CPU"
    (first / "machine_t.json").write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="another machine"):
        mlt.main(["--out", str(second), "--n", "2", "--resume", str(first), *common])
