"""Device files of one model that keep the same layers float (export.model_export): one PTQ
and one pass of the file and its reference for all of them, and each file exactly what its own
PTQ would have given."""

from __future__ import annotations

import onnx
import torch
from hwnas.export import model_export as me
from hwnas.export import passes as passes_module
from hwnas.export import recommend as rec
from hwnas.export.device_policy import DevicePolicy
from hwnas.export.model_export import export_model, measurable_devices
from hwnas.quant.policy import uniform
from onnx import numpy_helper
from test_export_recommend import FAST
from test_export_recommend import SmallNet as PwNet  # conv, BN, a 1x1 conv, classifier


def _keep_pw_float(build_model, fp32, quantized, kinds, **kw):  # noqa: ANN001, ANN202
    """A per-layer choice that keeps ``pw`` float on every device."""
    dev = kw["device"]
    return DevicePolicy(dev.name, dev.threads, dev.batch, ["pw"], 2.0, 2.0, 1.0, 1.0, 1.0,
                        "float-pw")


def _initializers(proto: onnx.ModelProto) -> dict[str, bytes]:
    return {i.name: numpy_helper.to_array(i).tobytes() for i in proto.graph.initializer}


def test_devices_with_one_choice_share_one_ptq_and_pass(tmp_path, monkeypatch) -> None:
    torch.manual_seed(0)
    net = PwNet().eval()
    g = torch.Generator().manual_seed(1)
    calib, test = torch.randn(64, 3, 8, 8, generator=g), torch.randn(48, 3, 8, 8, generator=g)
    with torch.no_grad():
        labels = net(test).argmax(1)
    policy = uniform(net, 8, 8)
    monkeypatch.setattr(me, "choose_float_layers", _keep_pw_float)
    monkeypatch.setattr(rec, "busy_machine", lambda threads: "")
    builds, onnx_passes = [], []
    real_build, real_pass = me.build_qdq, passes_module.ImagePasses._onnx_pass

    def counted_build(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        builds.append(tuple(kwargs.get("float_layers", ())))
        return real_build(*args, **kwargs)

    def counted_pass(self, path, data, beside):  # noqa: ANN001, ANN202
        onnx_passes.append(path)
        return real_pass(self, path, data, beside)
    monkeypatch.setattr(me, "build_qdq", counted_build)
    monkeypatch.setattr(passes_module.ImagePasses, "_onnx_pass", counted_pass)
    result = export_model(net, name="m", out_dir=tmp_path, example=test[:1], test_images=test,
                          test_labels=labels, policy=policy, calibration=[calib],
                          devices=measurable_devices(["cpu-ort-1t", "cpu-ort-1t-b2"]),
                          settings=FAST)
    assert result.status == "ok", result.errors
    assert builds == [(), ("pw",)]  # the searched PTQ and one for both devices
    files = ["qdq-cpu-ort-1t/m.onnx", "qdq-cpu-ort-1t-b2/m.onnx"]
    assert [p for p in onnx_passes if p.startswith("qdq-")] == files[:1]
    reports = {f.path: f for f in result.files}
    protos = [onnx.load(str(tmp_path / rel)) for rel in files]
    # each file is what a PTQ of its own gives: same graph, same initializers, bit for bit
    own = real_build(net, policy, [calib], example=test[:1], float_layers=["pw"])
    alone = own.proto(requantize=FAST.requantize)
    for rel, proto in zip(files, protos):
        assert reports[rel].status == "ok" and reports[rel].float_layers_for_speed == ["pw"]
        assert proto.graph.SerializeToString() == alone.graph.SerializeToString()
        assert _initializers(proto) == _initializers(alone)
    one, two = (reports[rel] for rel in files)
    assert (one.top1_agreement, one.max_abs_diff, one.test_accuracy, one.integer_layers) == (
        two.top1_agreement, two.max_abs_diff, two.test_accuracy, two.integer_layers)
