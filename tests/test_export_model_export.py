"""Tests for export.model_export: the verified files of one model, a parity failure that
writes nothing, and the settings' checks."""

from __future__ import annotations

import onnx
import pytest
import torch
from hwnas.export.model_export import ExportSettings, export_model, measurable_devices
from hwnas.export.qdq import read_metadata
from hwnas.quant.policy import uniform
from torch import nn

from hwnas.core.errors import UserError

FAST = dict(warmup=1, rounds=1)


def _export(qdq_net, qdq_images, tmp_path, **kw):
    calib, test = qdq_images
    settings = ExportSettings(**FAST, **kw.pop("settings", {}))
    return export_model(qdq_net, name="m", out_dir=tmp_path, example=test[:1], test_images=test,
                        policy=kw.pop("policy", uniform(qdq_net, 8, 8)), calibration=[calib],
                        arch="tiny", accuracy=42.0, settings=settings, **kw)


def test_export_model_writes_verified_files(qdq_net, qdq_images, tmp_path) -> None:
    result = _export(qdq_net, qdq_images, tmp_path, devices=measurable_devices(["cpu-ort-1t"]),
                     predicted_latency={"cpu-ort-1t": 0.5, "fpga-zcu102-est": 0.1})
    assert result.status == "ok", result.errors
    files = {f.path: f for f in result.files}
    assert set(files) == {"m.onnx", "qdq/m.onnx", "qdq-cpu-ort-1t/m.onnx"}
    for rel, report in files.items():
        assert report.ok and report.written and (tmp_path / rel).is_file()
        assert report.latency_ms["cpu-ort-1t"] > 0  # from the device's paired timing
    assert files["m.onnx"].max_abs_diff <= 1e-4
    assert files["qdq/m.onnx"].top1_agreement >= 0.99
    assert [i.split(" ")[0] for i in files["qdq/m.onnx"].float_islands] == ["stem", "dw", "project"]
    assert files["qdq-cpu-ort-1t/m.onnx"].float_islands == []
    meta = read_metadata(onnx.load(tmp_path / "qdq-cpu-ort-1t/m.onnx"))
    assert meta["arch"] == "tiny" and meta["accuracy"] == 42.0
    assert meta["predicted_latency_ms"] == {"cpu-ort-1t": 0.5, "fpga-zcu102-est": 0.1}
    assert meta["target_device"] == "cpu-ort-1t" and meta["searched_policy"]["layers"]
    devices = {d.device: d for d in result.devices}
    cpu = devices["cpu-ort-1t"]
    assert cpu.measured and isinstance(cpu.quantized_faster, bool) and cpu.runtime == "onnxruntime"
    timed = {c["label"]: c["median_ms"] for c in cpu.candidates}
    assert set(timed) >= {"m.onnx", "qdq-cpu-ort-1t/m.onnx"} and timed["m.onnx"] == cpu.fp32_ms
    assert timed[cpu.recommended] == cpu.recommended_ms <= cpu.fp32_ms  # never slower than FP32
    assert cpu.quantized_faster == (cpu.recommended != "m.onnx")
    fpga = devices["fpga-zcu102-est"]
    assert not fpga.measured and fpga.quantized_faster is None and fpga.predicted_latency_ms == 0.1


class _Drift(nn.Module):
    """Traced with its (class-wide) call counter as a constant, then run with another value:
    its export cannot match it."""

    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return self.fc(x.flatten(1)) + float(type(self).calls)


def test_parity_failure_is_reported_and_not_written(qdq_images, tmp_path) -> None:
    result = export_model(_Drift().eval(), name="bad", out_dir=tmp_path, example=qdq_images[1][:1],
                          test_images=qdq_images[1], settings=ExportSettings(**FAST))
    assert result.status == "failed"
    report = result.files[0]
    assert not report.ok and not report.written and "FP32 parity failed" in report.error
    assert not (tmp_path / "bad.onnx").exists() and not list(tmp_path.glob(".*tmp"))


def test_export_settings_validation() -> None:
    with pytest.raises(UserError, match="opset"):
        ExportSettings(opset=13).validate()
    with pytest.raises(UserError, match="min_agreement"):
        ExportSettings(min_agreement=1.5).validate()
    with pytest.raises(UserError, match="policy_batch"):
        ExportSettings(policy_batch=0).validate()


def _sample_case(tmp_path, pixels):  # noqa: ANN001, ANN202
    """A written FP32 file, its verification pass over ``pixels`` normalised as the data
    loader does, and what _write_verify_sample needs beside it."""
    from hwnas.export.model_export import FileReport, ModelExport
    from hwnas.export.onnx_export import InputSpec
    from hwnas.export.passes import ImagePasses
    from hwnas.supernet.onnx import onnx_bytes

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()
    spec = InputSpec((0.49, 0.48, 0.45), (0.25, 0.24, 0.26), tuple("abcde"))
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (spec.mean, spec.std))
    images = pixels.float().div_(255.0).sub_(mean).div_(std)  # as BatchLoader normalises
    labels = torch.arange(len(images)) % 5
    data = onnx_bytes(net, images[:1])
    (tmp_path / "m.onnx").write_bytes(data)
    passes = ImagePasses(images, labels)
    passes.onnx("m.onnx", data)
    result = ModelExport(name="m", arch="tiny", files=[FileReport("m.onnx", "fp32", "",
                                                                  written=True)])
    return result, images, labels, spec, passes


@pytest.mark.parametrize("from_uint8", [True, False])
def test_verify_sample_reads_the_verification_pass(tmp_path, monkeypatch, from_uint8) -> None:
    """Images that came from uint8: each file's top-1 on the sample comes from its
    verification pass (no new session) and equals a fresh run on the sample; other images
    (no exact uint8 source): the file runs on the sample."""
    import numpy as np
    from hwnas.export import model_export
    from hwnas.latency import ondevice

    gen = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (40, 3, 8, 8), generator=gen, dtype=torch.uint8)
    result, images, labels, spec, passes = _sample_case(tmp_path, pixels)
    if not from_uint8:
        images = images + 1e-3 * torch.randn(images.shape, generator=gen)
        passes = model_export.ImagePasses(images, labels)
        passes.onnx("m.onnx", (tmp_path / "m.onnx").read_bytes())
    s = ExportSettings(verify_images=20)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "m.onnx").write_bytes((tmp_path / "m.onnx").read_bytes())
    model_export._write_verify_sample(result, fresh, images, labels, spec, s)  # no passes: runs
    runs = []
    real = ondevice.verify_runner
    monkeypatch.setattr(ondevice, "verify_runner", lambda *a: runs.append(a) or real(*a))
    model_export._write_verify_sample(result, tmp_path, images, labels, spec, s, passes)
    assert len(runs) == (0 if from_uint8 else 1)
    got, want = (np.load(d / "verify" / "m.npz") for d in (tmp_path, fresh))
    assert sorted(got.files) == sorted(want.files)
    for key in want.files:
        assert np.array_equal(got[key], want[key]), key


def test_float32_rounding_tells_rounding_from_an_export_error() -> None:
    """An FP32 file over ``atol`` passes where its logits are no farther from the float64
    answer than ``FLOAT32_SLACK`` times PyTorch's float32 ones; an export error (farther) or a
    network that cannot run in float64 leaves the failure standing (None)."""
    import numpy as np
    from hwnas.export.verify import float32_rounding

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 10), nn.BatchNorm1d(10, eps=1e-10)).eval()
    model[1].running_var.fill_(1e-10)  # near-zero variance: float32 rounding amplified
    x = torch.randn(256, 64)
    with torch.no_grad():
        want = model(x).numpy()
        exact = model.double()(x.double()).float().numpy()  # the float64 answer, rounded
    model.float()
    assert np.abs(want - exact).max() > 1e-4  # PyTorch's own pass is over the default atol
    note, own = float32_rounding(model, x, exact, want, atol=1e-4)
    assert "is float32 rounding" in note and own > 1e-4  # PyTorch float32 vs float64
    assert float32_rounding(model, x, want + 1.0, want, atol=1e-4) is None

    class Mixed(nn.Module):  # a float32 tensor that is no parameter: float64 fails
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.randn(64, 10)

        def forward(self, t):
            return t @ self.w

    mixed = Mixed()
    with torch.no_grad():
        out = mixed(x).numpy()
    assert float32_rounding(mixed, x, out + 1e-3, out, atol=1e-4) is None
