"""Tests for the export's shared work: early stop of settled paired timings, one pass over the
test images per file and model, shared calibration batches, stage seconds, and the parallel
export whose timings run alone (export.passes, export.parallel, latency.onnx_measure)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hwnas.export.model_export import ExportSettings
from hwnas.export.onnx_export import check_parity, parity_of
from hwnas.export.parallel import TimingGate, auto_workers
from hwnas.export.passes import ImagePasses, StageClock
from hwnas.latency.devices import MeasuredDevice
from hwnas.latency.onnx_measure import Runner, order_settled, time_interleaved
from hwnas.supernet.onnx import onnx_bytes

from hwnas.core.errors import UserError

FAST = ExportSettings(warmup=1, rounds=1, runs=2, profile_runs=2)


def _times(**ranges: tuple[float, float]) -> dict[str, np.ndarray]:
    return {k: np.linspace(lo, hi, 6).reshape(2, 3) for k, (lo, hi) in ranges.items()}


def test_order_settled_needs_whole_ranges_apart() -> None:
    # int8 clearly faster, qdq clearly slower than FP32: decided
    assert order_settled(_times(fp32=(9, 10), int8=(5, 6), qdq=(40, 41)), "fp32")
    # a candidate whose range touches FP32's: not decided
    assert not order_settled(_times(fp32=(9, 10), int8=(5, 9.5)), "fp32")
    # two candidates faster than FP32 that overlap: which is fastest is open
    assert not order_settled(_times(fp32=(9, 10), a=(5, 6), b=(5.5, 7)), "fp32")
    # candidates all slower than FP32: FP32 stays, their own order is open
    assert order_settled(_times(fp32=(9, 10), b=(20, 30), c=(25, 35)), "fp32")
    assert not order_settled(_times(fp32=(9, 10), b=(20, 30), c=(25, 35)), "fp32",
                             faster_only=False)  # ... which matters when all compete
    assert order_settled(_times(fp32=(9, 10), a=(5, 6), b=(20, 30), c=(25, 35)), "fp32",
                         faster_only=False)  # only the fastest must stand apart
    assert order_settled(_times(fp32=(9, 10)), "fp32")


def test_time_interleaved_stops_once_settled(monkeypatch) -> None:
    import hwnas.latency.onnx_measure as om

    base = {"fp32": 10.0, "int8": 5.0, "qdq": 40.0}
    ran: list[str] = []

    class Fake(Runner):
        def __init__(self, label: str) -> None:
            self.label = label

        def get_inputs(self):  # noqa: ANN202
            return []

        def run(self, feeds):  # noqa: ANN001, ANN202
            ran.append(self.label)

    monkeypatch.setattr(om, "random_input", lambda r, **kw: {})
    noise = iter(np.random.default_rng(0).uniform(0.99, 1.01, 10_000))

    def timed(runner, feeds, runs):  # noqa: ANN001, ANN202
        return np.array([base[runner.label] * next(noise) for _ in range(runs)])
    monkeypatch.setattr(om, "timed_runs", timed)
    runners = {k: Fake(k) for k in base}
    t = time_interleaved(runners, rounds=8, runs=3, warmup=0, min_rounds=2,
                         settled=lambda t: order_settled(t, "fp32"))
    assert {v.shape for v in t.values()} == {(2, 3)}  # decided after the second round
    full = time_interleaved(runners, rounds=8, runs=3, warmup=0)
    assert {v.shape for v in full.values()} == {(8, 3)}  # no rule: every round
    base["int8"] = 10.0  # a tie with FP32 never settles
    tie = time_interleaved(runners, rounds=5, runs=3, warmup=0, min_rounds=2,
                           settled=lambda t: order_settled(t, "fp32"))
    assert {v.shape for v in tie.values()} == {(5, 3)}


def test_stage_clock_adds_repeated_stages() -> None:
    calls: list[int] = []
    clock = StageClock(before=lambda: calls.append(1))
    for _ in range(2):
        with clock("a"):
            time.sleep(0.01)
    with pytest.raises(ValueError), clock("b"):
        raise ValueError
    assert set(clock.seconds) == {"a", "b"} and clock.seconds["a"] >= 0.02
    assert len(calls) == 3


class _Counting(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x.flatten(1))


def test_image_passes_run_each_file_and_model_once() -> None:
    torch.manual_seed(0)
    model = _Counting().eval()
    x = torch.randn(300, 4)
    labels = torch.randint(0, 3, (300,))
    data = onnx_bytes(model, x[:1])
    model.calls = 0
    passes = ImagePasses(x, labels, batch_size=128, cpu_batch_size=128)
    got = passes.onnx("m.onnx", data)
    again = passes.onnx("m.onnx", b"not read: the pass is kept")
    assert again is got and got.shape == (300, 3)
    want = passes.torch("float", model)
    passes.torch("float", model)
    assert model.calls == 3  # one pass of 3 chunks, not two
    parity = parity_of(got, want, atol=1e-4)
    reference = check_parity(data, model, x, atol=1e-4)
    assert parity == reference and parity.passed
    assert passes.accuracy(got) == pytest.approx(100 * float((want.argmax(1) == labels.numpy()).mean()))
    assert ("onnxruntime", "m.onnx", 1, "f32") in passes.sessions  # reused for the timing


class _SlowRunner:
    """An onnxruntime runner that says when a chunk is in flight and on which thread."""

    def __init__(self, runner: Runner, log: dict) -> None:
        self.runner, self.log = runner, log

    def get_inputs(self):  # noqa: ANN201
        return self.runner.get_inputs()

    def run(self, feed: dict) -> list:
        self.log["threads"].add(threading.get_ident())
        self.log["in_flight"] = True
        try:
            time.sleep(0.02)
            return self.runner.run(None, feed)
        finally:
            self.log["in_flight"] = False


def test_together_overlaps_onnxruntime_with_pytorch_and_joins_at_yield_points(monkeypatch) -> None:
    from hwnas.core import cooperate
    from hwnas.export import passes as passes_mod
    from hwnas.latency.onnx_measure import make_session

    torch.manual_seed(0)
    model = _Counting().eval()
    x = torch.randn(300, 4)
    data = onnx_bytes(model, x[:1])
    alone = ImagePasses(x, batch_size=128, cpu_batch_size=32)
    want_file, want_torch = alone.onnx("m.onnx", data), alone.torch("float", model)
    log: dict = {"threads": set(), "in_flight": False, "seen": [], "yields": []}
    monkeypatch.setattr(passes_mod, "make_runner",
                        lambda blob, **kw: _SlowRunner(make_session(blob, threads=1), log))
    forward = model.forward

    def watched(t: torch.Tensor) -> torch.Tensor:
        time.sleep(0.005)
        log["seen"].append(log["in_flight"])
        return forward(t)
    model.forward = watched
    both = ImagePasses(x, batch_size=128, cpu_batch_size=32, side_by_side=True)
    with cooperate.installed(lambda: log["yields"].append(log["in_flight"])):
        got_file, got_torch = both.together("m.onnx", data, "float", model)
    assert np.array_equal(got_file, want_file) and np.array_equal(got_torch, want_torch)
    assert threading.get_ident() not in log["threads"]  # onnxruntime ran beside, not here
    assert any(log["seen"])  # PyTorch computed while an onnxruntime chunk was in flight
    assert log["yields"] and not any(log["yields"])  # nothing runs at a yield point
    assert both.together("m.onnx", b"", "float", model)[0] is got_file  # kept, not rerun
    assert ("onnxruntime", "m.onnx", 1, "f32") in both.sessions
    # two sessions share the file's pass (PyTorch on a GPU leaves its core): the same logits
    log["threads"].clear()
    split = ImagePasses(x, batch_size=64, onnx_sessions=2)
    assert np.array_equal(split.onnx("m.onnx", data), want_file) and len(log["threads"]) == 2
    # by default a second thread only where PyTorch runs on a GPU (and leaves its core)
    assert not ImagePasses(x, cores=64).side_by_side
    assert ImagePasses(x, cores=1, device="meta").side_by_side
    assert ImagePasses(x, cores=2).onnx_sessions == 1
    assert ImagePasses(x, cores=2, device="meta").onnx_sessions == 2
    assert ImagePasses(x, cores=1, device="meta").onnx_sessions == 1
    # a worker's whole share of a many-core machine, not two of its cores (Session 36)
    assert ImagePasses(x, cores=8, device="meta").onnx_sessions == 8
    assert ImagePasses(x, cores=8).onnx_sessions == 8
    assert ImagePasses(x, cores=3).onnx_sessions == 1
    log["threads"].clear()
    many = ImagePasses(x, onnx_batch_size=16, onnx_sessions=5)  # 19 chunks: the last step short
    assert np.array_equal(many.onnx("m.onnx", data), want_file) and len(log["threads"]) == 5
    log["threads"].clear()
    one_core = ImagePasses(x, batch_size=128)
    got = one_core.together("m.onnx", data, "float", model)
    assert np.array_equal(got[0], want_file) and log["threads"] == {threading.get_ident()}


def test_onnxruntime_logits_do_not_depend_on_the_chunk_size() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, groups=8), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(8, 10)).eval()
    x = torch.randn(90, 3, 16, 16)
    data = onnx_bytes(net, x[:1])
    whole = ImagePasses(x, onnx_batch_size=256).onnx("n.onnx", data)
    for size in (1, 7, 64):
        assert np.array_equal(ImagePasses(x, onnx_batch_size=size).onnx("n.onnx", data), whole)


def test_together_reports_a_failing_file_once_its_chunk_is_joined() -> None:
    torch.manual_seed(0)
    model = _Counting().eval()
    x = torch.randn(40, 4)
    data = onnx_bytes(torch.nn.Linear(5, 3), torch.randn(1, 5))  # wants 5 features: it fails
    passes = ImagePasses(x, side_by_side=True)
    with pytest.raises(UserError, match="onnxruntime failed on inputs of shape"):
        passes.together("m.onnx", data, "float", model)
    assert "m.onnx" not in passes.files
    assert not [t for t in threading.enumerate() if t.name.startswith("hwnas-ort")]


def test_reference_that_cannot_run_on_the_device_runs_on_the_cpu() -> None:
    torch.manual_seed(0)
    model = _Counting().eval()
    x = torch.randn(50, 4)
    on_meta = ImagePasses(x, device="meta")  # runs there, but its logits cannot be read back
    got = on_meta.torch("float", model)
    assert np.array_equal(got, ImagePasses(x).torch("float", model))
    assert len(on_meta.notes) == 1 and "'float' ran on the CPU" in on_meta.notes[0]


def test_parity_of_reports_nan_and_refuses_other_shapes() -> None:
    a = np.zeros((4, 3), np.float32)
    b = a.copy()
    b[1, 2] = np.nan
    assert not parity_of(b, a).passed
    with pytest.raises(UserError, match="shape"):
        parity_of(a, np.zeros((4, 2), np.float32))


def test_agreement_cache_matches_a_fresh_verification() -> None:
    from hwnas.export.recommend import CandidateFile, verify_candidates

    torch.manual_seed(1)
    model = _Counting().eval()
    x = torch.randn(200, 4)
    labels = torch.randint(0, 3, (200,))
    data = onnx_bytes(model, x[:1])
    passes = ImagePasses(x, labels)
    passes.onnx("m.onnx", data)
    refs = {"float": passes.torch("float", model)}
    files = [CandidateFile("m.onnx", data, "fp32", "float")]
    cached, _, _ = verify_candidates(runtime="onnxruntime", threads=1, files=files,
                                     references=refs, images=passes.np, labels=passes.labels,
                                     cache=passes.agreement_cache(refs, files),
                                     sessions=passes.sessions)
    fresh, _, _ = verify_candidates(runtime="onnxruntime", threads=1, files=files,
                                    references=refs, images=passes.np, labels=passes.labels)
    assert cached == fresh and cached[0].verified


def test_shared_bn_batches_give_the_same_subnet(digits) -> None:
    from hwnas.supernet.evaluate import bn_calibration_batches, recalibrated_subnet
    from hwnas.supernet.spaces import get_space

    space = get_space("mbv3-tiny", in_channels=1, image_size=8, num_classes=10)
    torch.manual_seed(0)
    supernet = space.build_supernet()
    batches = bn_calibration_batches(digits, 3, seed=5)
    assert len(batches) == 3
    for arch in (space.smallest(), space.largest()):
        own = recalibrated_subnet(supernet, arch, digits, calib_batches=3, seed=5)
        shared = recalibrated_subnet(supernet, arch, digits, calib_batches=3, seed=5,
                                     batches=batches)
        a, b = own.state_dict(), shared.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_auto_workers() -> None:
    assert auto_workers(11, 0, cores=16) == 8
    assert auto_workers(3, 0, cores=16) == 3
    assert auto_workers(11, 0, cores=2) == 1
    assert auto_workers(2, 5, cores=2) == 2  # asked for: as many as there are models
    assert auto_workers(1, 0, cores=64) == 1


def test_export_settings_refuse_bad_knobs() -> None:
    for bad in ({"workers": -1}, {"workers": True}, {"min_rounds": 0}, {"device": "gpu9"}):
        with pytest.raises(UserError):
            ExportSettings(**bad).validate()


def test_timing_gate_never_overlaps_a_timing_with_work() -> None:
    """Threads stand in for worker processes: while one times, none computes."""
    import multiprocessing

    gate = TimingGate(multiprocessing.get_context("spawn"))
    state = {"computing": 0, "timing": 0, "overlaps": 0}
    lock = threading.Lock()

    def worker(i: int) -> None:
        with gate.computing():
            for step in range(6):
                gate.pause_if_wanted()
                if (i + step) % 3 == 0:
                    with gate.exclusive():
                        with lock:
                            state["timing"] += 1
                            state["overlaps"] += state["computing"] > 0 or state["timing"] > 1
                        time.sleep(0.002)
                        with lock:
                            state["timing"] -= 1
                else:
                    with lock:
                        state["computing"] += 1
                        state["overlaps"] += state["timing"] > 0
                    time.sleep(0.002)
                    with lock:
                        state["computing"] -= 1
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert state["overlaps"] == 0
    assert 8 * 0.002 <= gate.held.value < 5.0  # the 8 timings' seconds, reported as alone
    assert 0.0 <= gate.waited.value < 5.0


def _figures(result) -> dict:  # noqa: ANN001
    return {m.name: (m.status, [(f.path, f.status, f.written) for f in m.files])
            for m in result.models}


def test_parallel_export_writes_what_the_sequential_one_writes(small_run: Path,
                                                               tmp_path: Path) -> None:
    """Two models in two worker processes: the same files, verified alike, as one process
    writes (no device is measurable in this run, so the comparison does not hang on timings)."""
    import json
    from dataclasses import replace

    from hwnas.export.run_export import export_run, stage_summary

    kw = {"select": "top:2", "progress": False, "report": lambda line: None,
          "max_test_images": 200}
    one = export_run(small_run, out=tmp_path / "one", settings=FAST, **kw)
    two = export_run(small_run, out=tmp_path / "two", settings=replace(FAST, workers=2), **kw)
    assert len(one.models) == 2 and _figures(one) == _figures(two)
    for a, b in zip(one.models, two.models):
        for fa, fb in zip(a.files, b.files):
            assert fa.test_accuracy == pytest.approx(fb.test_accuracy, abs=0.5)
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert manifest["workers"] == 2
    stages = manifest["models"][0]["info"]["stage_seconds"]
    assert {"recalibrate", "fp32"} <= set(stages)
    # where the export's seconds went: nothing was timed (no measurable device)
    assert set(one.stages) == {"prepare", "models", "timings_alone", "finish"}
    assert set(two.stages) == set(one.stages) | {"workers_ready", "timings_waited"}
    assert one.stages["timings_alone"] == two.stages["timings_alone"] == 0.0
    assert 0 < two.stages["workers_ready"] < two.stages["models"] < two.seconds
    assert manifest["export_stages_s"]["models"] == pytest.approx(two.stages["models"])
    lines = stage_summary(two).splitlines()
    assert lines[0].startswith("export stages (s): prepare ") and "workers ready after" in lines[0]
    assert lines[1].startswith("model stages summed over 2 model(s) (s): ") and "fp32" in lines[1]
    assert sorted(str(p.relative_to(tmp_path / "one")) for p in (tmp_path / "one").rglob("*.onnx")) \
        == sorted(str(p.relative_to(tmp_path / "two")) for p in (tmp_path / "two").rglob("*.onnx"))


def test_benchmark_summarises_stages_and_rows() -> None:
    from types import SimpleNamespace

    from benchmarks.export_speed import stage_medians, table

    models = [SimpleNamespace(info={"stage_seconds": {"fp32": 1.0, "qdq": 4.0}}),
              SimpleNamespace(info={"stage_seconds": {"fp32": 3.0}}),
              SimpleNamespace(info={"stage_seconds": {"fp32": 2.0, "qdq": 2.0}})]
    medians = stage_medians(models)
    assert medians == {"fp32": 2.0, "qdq": 2.0}  # a stage a model skipped counts 0
    row = {"dataset": "/data/C10.npz", "device": "cuda", "trials": 20, "models": 3,
           "search_s": 100.0, "export_s": 30.0, "export_s_per_model": 10.0, "total_s": 130.0,
           "stage_median_s": medians}
    text = table([row])
    assert "C10.npz" in text and "fp32=2 qdq=2" in text and "10.00" in text


def test_passes_benchmark_compares_the_ways_bit_for_bit(small_run: Path, tmp_path: Path) -> None:
    import json

    from benchmarks.export_passes import main

    out = tmp_path / "passes.json"
    assert main([str(small_run), "--select", "top:1", "--rounds", "2", "--max-images", "40",
                 "--compare", "together,chunks", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {tuple(r["modes"]) for r in rows} == {("alone", "together"), ("chunks 256", "chunks 64")}
    for r in rows:
        assert r["bit_identical"] and r["images"] == 40
        assert all(len(r[m]["wall_s"]) == 2 and r[m]["max_yield_gap_median_s"] > 0
                   for m in r["modes"])


def test_range_errors_in_place_match_the_formula() -> None:
    from hwnas.quant.observers import _range_errors

    torch.manual_seed(0)
    for bits in (4, 8):
        values = torch.randn(5000) * 3 + 0.5
        ratios = torch.linspace(0.05, 1.0, 17)
        los, his = values.min() * ratios, values.max() * ratios
        qmax = 2 ** bits - 1
        scale = ((his - los) / qmax).clamp_min(1e-8)[:, None]
        zp = torch.round(-los[:, None] / scale).clamp(0, qmax)
        q = (torch.clamp(torch.round(values[None, :] / scale) + zp, 0, qmax) - zp) * scale
        assert torch.equal(_range_errors(values, los, his, bits),
                           ((q - values[None, :]) ** 2).mean(dim=1))


def _chain(n: int, size: int = 64) -> bytes:
    """An ONNX model of ``n`` chained (size x size) MatMuls: its time grows with ``n``."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.eye(size, dtype=np.float32), name="W")
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", "W"],
                              ["y" if i == n - 1 else f"h{i + 1}"]) for i in range(n)]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", size])],
                              initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


def test_recommendation_stops_timing_once_fp32_clearly_wins(monkeypatch) -> None:
    """A candidate ~200x slower than FP32: the paired timing ends before its last round, and
    the verdict and every figure come from the rounds that ran."""
    import hwnas.export.recommend as rec

    shapes: list[tuple] = []
    real = rec.time_interleaved

    def spy(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        out = real(*a, **kw)
        shapes.append({v.shape for v in out.values()})
        return out
    monkeypatch.setattr(rec, "time_interleaved", spy)
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    files = [rec.CandidateFile("m.onnx", _chain(1), "fp32", "float"),
             rec.CandidateFile("slow/m.onnx", _chain(200), "int8", "float")]
    got = rec.recommend_file(MeasuredDevice("cpu-ort-1t", threads=1), files=files,
                             references={"float": x}, images=x, labels=None, rounds=8, runs=3,
                             warmup=1, min_rounds=2)
    (rows,) = shapes[0]
    assert rows[0] < 8 and rows[1] == 3  # stopped early
    assert got.rounds == rows[0] and got.as_dict()["rounds"] == rows[0]
    assert got.chosen is got.fp32 and got.fp32.median_ms < got.candidates[1].median_ms


def test_parallel_export_reports_a_missing_dataset_in_one_line(small_run: Path,
                                                               tmp_path: Path) -> None:
    """The export loads the data once, before any worker starts: its UserError reaches the
    caller, and nothing is written."""
    import json
    import shutil
    from dataclasses import replace

    from hwnas.export.run_export import export_run

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    config = json.loads((run / "config.json").read_text())
    config["dataset"] = str(tmp_path / "moved.npz")
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="moved.npz"):
        export_run(run, select="top:2", out=tmp_path / "out", progress=False,
                   settings=replace(FAST, workers=2), report=lambda line: None)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_prepare_takes_a_loaded_dataset_and_ships_its_batches(small_run: Path) -> None:
    """``dataset`` (hwnas run passes the search's) replaces loading: the same batches as loading
    it here; another seed's split gives other batches (so it is the one used); a worker gets
    the batches bit for bit, without the data set or the supernet."""
    import pickle

    from hwnas.export.run_export import _for_worker, _load_run, _prepare
    from hwnas.supernet.data.sources import load_dataset

    cfg = _load_run(small_run)
    own = _prepare(small_run, cfg, FAST, [], {}, 100)
    given = _prepare(small_run, cfg, FAST, [], {}, 100,
                     dataset=load_dataset(cfg.dataset, seed=cfg.data_seed))
    other = _prepare(small_run, cfg, FAST, [], {}, 100,
                     dataset=load_dataset(cfg.dataset, seed=cfg.data_seed + 1))

    def tensors(ctx):  # noqa: ANN001, ANN202
        return [ctx.test_images, ctx.test_labels, *ctx.ptq_batches,
                *(t for b in ctx.bn_batches for t in b)]
    assert all(torch.equal(a, b) for a, b in zip(tensors(own), tensors(given), strict=True))
    assert not torch.equal(own.test_images, other.test_images)
    assert given.input_spec == own.input_spec
    shipped = pickle.loads(pickle.dumps(_for_worker(given)))
    assert shipped.data is None and shipped.supernet is None
    assert all(torch.equal(a, b) for a, b in zip(tensors(shipped), tensors(own), strict=True))


def _rows_of_three():  # noqa: ANN202
    """(space, rows in the fronts' order: smallest int8, largest int8, largest W4; a float one)."""
    import json

    from hwnas.export.run_export import ModelRow
    from hwnas.supernet.spaces import get_space

    space = get_space("mbv3-tiny", in_channels=1, image_size=8, num_classes=10)
    small, large = space.to_string(space.smallest()), space.to_string(space.largest())

    def policy(w_bits: int) -> str:
        return json.dumps({"format": "hwnas-quant-policy-1",
                           "layers": {"stem_conv": {"w_bits": w_bits, "a_bits": 8},
                                      "classifier": {"w_bits": 8, "a_bits": 8}}})
    rows = [ModelRow(1, small, policy(8), 0.5, {}), ModelRow(2, large, policy(8), 0.7, {}),
            ModelRow(3, large, policy(4), 0.7, {}), ModelRow(4, small, "", 0.5, {}),
            ModelRow(5, "not an arch", "", None, {})]
    return space, rows


def test_estimated_cost_follows_flops_adaround_and_policy() -> None:
    from hwnas.export.run_export import ADAROUND_COST, estimated_cost, submission_order
    from hwnas.quant.ptq import rounding_learned

    space, rows = _rows_of_three()
    small, large, large_w4, small_float, bad = (estimated_cost(r, space, "adaround") for r in rows)
    assert bad == 0.0 and 0 < small_float < small < large < large_w4
    assert large_w4 == pytest.approx(ADAROUND_COST * large)
    assert estimated_cost(rows[2], space, "nearest") == large  # W4 rounded to nearest: no AdaRound
    assert submission_order(rows, space, "adaround") == [2, 1, 0, 3, 4]
    assert submission_order(rows, space, "nearest") == [1, 2, 0, 3, 4]  # ties: fronts' order
    assert rounding_learned([8, 4, 32], "adaround") and not rounding_learned([8, 6, 32], "adaround")
    assert rounding_learned([8], "adaround-all") and not rounding_learned([32], "adaround-all")
    assert not rounding_learned([4], "nearest")


def test_parallel_export_submits_costliest_first_and_reports_in_fronts_order(monkeypatch) -> None:
    """The pool gets the largest models first (the old code submitted the fronts' order, the
    smallest first), while ``done`` still sees the fronts' order."""
    import concurrent.futures
    from types import SimpleNamespace

    from hwnas.export import run_export

    space, rows = _rows_of_three()
    submitted = []

    class Pool:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def __enter__(self):  # noqa: ANN204
            return self

        def __exit__(self, *exc) -> None:
            pass

        def submit(self, fn, row, staging, index, total, progress):  # noqa: ANN001, ANN201
            submitted.append(row.trial)
            future = concurrent.futures.Future()
            future.set_result((f"{index + 1}/{total} {row.name}", 0.5))
            return future

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(run_export, "_for_worker", lambda ctx: ctx)
    context = SimpleNamespace(space=space, settings=SimpleNamespace(rounding="adaround"))
    done = []
    stages = run_export._export_parallel(Path("run"), context, rows, Path("staging"), False, 2,
                                         done.append)
    assert submitted == [3, 2, 1, 4, 5]
    assert done == [f"{i + 1}/5 {r.name}" for i, r in enumerate(rows)]
    assert stages["workers_ready"] == 0.5


def test_makespan_benchmark_list_schedules_both_orders(tmp_path: Path) -> None:
    import json

    from benchmarks.export_makespan import main, makespan

    # one model more than workers: the largest last waits for the first to finish
    assert makespan([10.0, 20.0, 100.0], [0, 1, 2], 2) == 110.0
    assert makespan([10.0, 20.0, 100.0], [2, 1, 0], 2) == 100.0
    assert main(["--seconds", "10,20,100", "--workers", "2", "--json", str(tmp_path / "m.json")]) == 0
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["makespan"][0] == {"workers": 2, "fronts": 110.0, "costliest_first": 100.0,
                                  "lpt_measured": 100.0, "lower_bound": 100.0}


def test_makespan_benchmark_reads_a_device_manifest_whose_run_directory_is_gone(
        tmp_path: Path) -> None:
    """Session 40's GPU export (its run directory stayed in the device's /tmp): the space comes
    from ``--supernet``, and the committed figures come back."""
    import gzip
    import json

    from benchmarks.export_makespan import main

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "manifest.json").write_bytes(gzip.decompress(
        (root / "benchmarks/results/gpu_matrix/session40/manifest_current.json.gz").read_bytes()))
    assert main([str(tmp_path / "export"), "--supernet",
                 str(root / "supernet/checkpoints/mbv3_cifar10.pt"), "--workers", "8,9",
                 "--json", str(tmp_path / "m.json")]) == 0
    doc = json.loads((tmp_path / "m.json").read_text())
    committed = json.loads(
        (root / "benchmarks/results/gpu_matrix/session40/export_makespan_current.json").read_text())
    assert doc["submitted"] == committed["submitted"]
    assert doc["makespan"] == committed["makespan"]
