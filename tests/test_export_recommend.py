"""The file recommended per measured device (export.recommend, export.model_export): precision
candidates verified on the device's runtime, one paired timing for the choice, the figures shown
and the manifest - one truth, even when the machine's speed drifts between timings."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from hwnas.export import recommend as rec
from hwnas.export.device_policy import DevicePolicy
from hwnas.export.model_export import ExportSettings, export_model, measurable_devices
from hwnas.export.recommend import (
    CandidateFile,
    DeviceCandidate,
    choose_fastest,
    recommend_file,
)
from hwnas.export.run_export import _summary_line
from hwnas.latency.devices import MeasuredDevice
from hwnas.latency.onnx_measure import openvino_available
from hwnas.quant.policy import uniform
from latency_support import linear_onnx
from torch import nn

from hwnas.core.errors import UserError

FAST = ExportSettings(warmup=1, rounds=2, runs=3, profile_runs=2)


class SmallNet(nn.Module):
    """Conv + BN + ReLU, a 1x1 conv, pooling and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.stem(x)))
        return self.fc(torch.relu(self.pw(x)).mean((2, 3)))


@pytest.fixture(scope="module")
def net() -> nn.Module:
    torch.manual_seed(0)
    return SmallNet().eval()


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Calibration images, test images and, as labels, the float model's own predictions
    (so accuracy is meaningful: 100 % for FP32)."""
    g = torch.Generator().manual_seed(1)
    calib, test = torch.randn(64, 3, 8, 8, generator=g), torch.randn(48, 3, 8, 8, generator=g)
    torch.manual_seed(0)
    with torch.no_grad():
        labels = SmallNet().eval()(test).argmax(1)
    return calib, test, labels


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch) -> None:
    """The machine's real load must not change what these tests print (see the busy test)."""
    monkeypatch.setattr(rec, "busy_machine", lambda threads: "")


def _candidate(label: str, precision: str = "int8", verified: bool = True) -> DeviceCandidate:
    return DeviceCandidate(label, label.split("@")[0], precision, verified=verified)


def test_choose_fastest_needs_every_half_of_one_paired_timing() -> None:
    fp32, lucky, steady, wrong = (_candidate("m.onnx", "fp32"), _candidate("qdq/m.onnx"),
                                  _candidate("m.onnx@bf16", "bf16"),
                                  _candidate("fast-but-wrong.onnx", verified=False))
    drift = np.linspace(1.0, 2.0, 6).reshape(2, 3)  # the machine slows down as it runs
    times = {"m.onnx": 10.0 * drift,
             "qdq/m.onnx": np.array([[5.0, 5.0, 5.0], [5.0, 30.0, 30.0]]),  # one lucky half
             "m.onnx@bf16": 8.0 * drift,
             "fast-but-wrong.onnx": 1.0 * drift}
    chosen = choose_fastest([fp32, lucky, steady, wrong], times, "m.onnx")
    assert chosen is steady and steady.median_ms == pytest.approx(8.0 * np.median(drift))
    assert lucky.median_ms < fp32.median_ms  # faster overall, yet slower in the second half
    assert "both halves" in lucky.note and wrong.median_ms is not None and chosen is not wrong
    only_slower = choose_fastest([fp32, lucky], {"m.onnx": 10.0 * drift,
                                                 "qdq/m.onnx": 11.0 * drift}, "m.onnx")
    assert only_slower is fp32


def _fake_choice(fp32_ms: float, chosen_ms: float):  # noqa: ANN202
    """A per-layer search that claims ``fp32_ms / chosen_ms`` for the int8 variant."""
    def choose(build_model, fp32, quantized, kinds, **kw):  # noqa: ANN001, ANN202
        dev = kw["device"]
        return DevicePolicy(dev.name, dev.threads, dev.batch, [], fp32_ms, fp32_ms,
                            chosen_ms, chosen_ms, chosen_ms, "all-int8")
    return choose


def _drifting(factors: dict[str, float]):  # noqa: ANN202
    """Fake paired timings: each label's base time (by its file) times a clock that slows
    down 5 % per call of the interleaved loop."""
    def time_candidates(runners, *, batch, rounds, runs, warmup, seed=0, **_):  # noqa: ANN001, ANN202
        out, tick = {}, 0
        for label in runners:
            out[label] = np.empty((rounds, runs))
        for r in range(rounds):
            for label in runners:
                for i in range(runs):
                    tick += 1
                    out[label][r, i] = factors[label] * (1.0 + 0.05 * tick)
        return out
    return time_candidates


def _export_timed(net, data, tmp_path, monkeypatch, int8_factor: float):
    """Export ``net`` for cpu-ort-1t with the per-layer search claiming int8 1.40x faster and
    the paired timing (drifting) giving the int8 file ``int8_factor`` of FP32's time."""
    import hwnas.export.model_export as me

    monkeypatch.setattr(me, "choose_float_layers", _fake_choice(14.0, 10.0))
    factors = {"m.onnx": 1.0, "qdq/m.onnx": 3.0, "qdq-cpu-ort-1t/m.onnx": int8_factor}
    monkeypatch.setattr(rec, "time_candidates", _drifting(factors))
    calib, test, labels = data
    return export_model(net, name="m", out_dir=tmp_path, example=test[:1], test_images=test,
                        test_labels=labels, policy=uniform(net, 8, 8), calibration=[calib],
                        devices=measurable_devices(["cpu-ort-1t"]), settings=FAST)


@pytest.mark.parametrize("int8_factor", [1.2, 0.7])
def test_one_truth_with_drifting_timings(net, data, tmp_path, monkeypatch, int8_factor) -> None:
    """The per-layer search claims int8 is 1.40x faster; the paired timing (drifting) says
    otherwise (1.2: slower) or agrees (0.7). The recommendation, the line printed and the
    manifest's figures all follow the paired timing."""
    result = _export_timed(net, data, tmp_path, monkeypatch, int8_factor)
    assert result.status == "ok", result.errors
    entry = result.devices[0]
    timed = {c["label"]: c for c in entry.candidates}
    assert entry.fp32_ms == timed["m.onnx"]["median_ms"]
    assert entry.recommended_ms == timed[entry.recommended]["median_ms"] <= entry.fp32_ms
    assert entry.speedup == pytest.approx(entry.fp32_ms / entry.recommended_ms)
    files = {f.path: f for f in result.files}
    assert files["qdq-cpu-ort-1t/m.onnx"].latency_ms["cpu-ort-1t"] == \
        timed["qdq-cpu-ort-1t/m.onnx"]["median_ms"]
    line = _summary_line(result)
    assert "1.40x" not in line
    if int8_factor > 1:
        assert entry.recommended == "m.onnx" and not entry.quantized_faster
        assert line.endswith(f"cpu-ort-1t: m.onnx fp32 {entry.fp32_ms:.3f} ms")
    else:
        assert entry.recommended == "qdq-cpu-ort-1t/m.onnx" and entry.quantized_faster
        assert entry.precision == "int8" and entry.recommended_ms < entry.fp32_ms
        assert (f"qdq-cpu-ort-1t/m.onnx int8 {entry.recommended_ms:.3f} ms vs fp32 "
                f"{entry.fp32_ms:.3f} ms ({entry.speedup:.2f}x)") in line
    meta = {p.key for p in onnx.load(tmp_path / "qdq-cpu-ort-1t/m.onnx").metadata_props}
    assert "device_choice" in meta  # its timings are not in the file: the manifest has them


def test_a_busy_timing_says_so(net, data, tmp_path, monkeypatch) -> None:
    """Timed while other work competed for the cores: the recommendation stands, but the
    manifest's entry and the line printed say that it may not hold on a quiet machine."""
    monkeypatch.setattr(rec, "busy_machine", lambda threads: f"busy, {threads} thread(s)")
    result = _export_timed(net, data, tmp_path, monkeypatch, 0.7)
    entry = result.devices[0]
    assert entry.busy and entry.recommended == "qdq-cpu-ort-1t/m.onnx"
    assert entry.note.endswith("(busy, 1 thread(s))")
    assert _summary_line(result).endswith(
        "[timed on a busy machine: may not hold on a quiet one]")


def _linear_model() -> bytes:
    return linear_onnx(np.eye(4))


def test_a_candidate_losing_accuracy_is_not_verified(monkeypatch) -> None:
    """Identity model: its predictions are argmax(x). Against a reference that is right on 2
    more of 200 images, agreement is 99 % but accuracy drops 1 point (> 0.3): refused."""
    x = np.random.default_rng(0).standard_normal((200, 4)).astype(np.float32)
    preds = x.argmax(1)
    labels = preds.copy()
    labels[:2] = (preds[:2] + 1) % 4
    reference = np.eye(4, dtype=np.float32)[labels]
    monkeypatch.setattr(rec, "time_candidates", _drifting({"fp32.onnx": 1.0, "q.onnx": 0.5}))
    files = [CandidateFile("fp32.onnx", _linear_model(), "fp32", "float"),
             CandidateFile("q.onnx", _linear_model(), "int8", "searched")]
    out = recommend_file(MeasuredDevice("cpu-ort-1t", threads=1), files=files,
                         references={"float": np.eye(4, dtype=np.float32)[preds],
                                     "searched": reference}, images=x, labels=labels)
    q = {c.label: c for c in out.candidates}["q.onnx"]
    assert q.top1_agreement == pytest.approx(0.99) and not q.verified
    assert "more than 0.3 point(s) below the searched fake-quant model's 100.00%" in q.note and out.chosen.label == "fp32.onnx"
    with pytest.raises(UserError, match="start with the FP32 file"):
        recommend_file(MeasuredDevice("cpu-ort-1t", threads=1), files=files[1:],
                       references={}, images=x, labels=None)


@pytest.mark.skipif(not openvino_available(), reason="OpenVINO is not installed")
def test_openvino_device_gets_precision_candidates(net, data, tmp_path) -> None:
    calib, test, labels = data
    result = export_model(net, name="m", out_dir=tmp_path, example=test[:1], test_images=test,
                          test_labels=labels, policy=uniform(net, 8, 8), calibration=[calib],
                          devices=measurable_devices(["cpu-ort-1t", "cpu-ov-1t"]), settings=FAST)
    assert result.status == "ok", result.errors
    ov = {d.device: d for d in result.devices}["cpu-ov-1t"]
    assert ov.runtime == "openvino" and ov.recommended is not None
    labels_ = {c["label"]: c for c in ov.candidates}
    # FP32, the searched QDQ and the onnxruntime device's int8 variant, each under f32 at least
    assert {"m.onnx", "qdq/m.onnx", "qdq-cpu-ort-1t/m.onnx"} <= set(labels_)
    reduced = [c for c in ov.candidates if c["precision"] in ("bf16", "f16")]
    for c in reduced:  # kept only where the runtime reports it ran that precision
        assert c["runtime_precision"] == c["precision"]
        assert c["settings"] == {"INFERENCE_PRECISION_HINT": c["precision"], "static_batch": 1}
    chosen = next(c for c in ov.candidates
                  if c["path"] == ov.recommended and c["settings"] == ov.settings)
    assert chosen["verified"] and chosen["median_ms"] == ov.recommended_ms <= ov.fp32_ms
    assert all(c["test_accuracy"] >= c["reference_accuracy"] - 0.3 for c in ov.candidates
               if c["verified"])


def test_export_refuses_a_device_it_cannot_measure(tmp_path) -> None:
    from hwnas.export.run_export import export_run

    for name in ("edgetpu-est", "cpu-ort-0t", "no-such-device"):
        with pytest.raises(UserError, match=f"device '{name}' cannot be measured on this CPU"):
            export_run(tmp_path / "run", devices=[name], progress=False)
    assert not list(tmp_path.iterdir())
