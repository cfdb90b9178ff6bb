"""OpenVINO beside onnxruntime: runners, measured CPU device names, ``hwnas latency measure
--runtime`` and ``latency/ondevice.py --runtime openvino``. The OpenVINO cases skip when the
``openvino`` extra is not installed; nothing here needs torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hwnas.latency.devices import MeasuredDevice, get_device, parse_cpu_device
from hwnas.latency.onnx_measure import (
    Runner,
    make_runner,
    measure_onnx,
    random_input,
    time_interleaved,
)
from latency_support import ONDEVICE, needs_ov, run_ondevice_without
from onnx import TensorProto, helper, numpy_helper

from hwnas.core.errors import UserError


def conv_model(arch: str | None = None) -> bytes:
    """Conv(3->4, 3x3) + Relu on a dynamic-batch [N, 3, 8, 8] input."""
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), name="W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if arch:
        helper.set_model_props(model, {"arch": arch})
    return model.SerializeToString()


def test_onnxruntime_runner_and_precision_rules() -> None:
    runner = make_runner(conv_model(), threads=1)
    assert (runner.runtime, runner.precision, runner.threads) == ("onnxruntime", "f32", 1)
    feeds = random_input(runner, batch=2)
    assert runner.run(feeds)[0].shape == (2, 4, 8, 8)
    with pytest.raises(UserError, match="needs runtime 'openvino'"):
        make_runner(conv_model(), precision="bf16")
    with pytest.raises(UserError, match="runtime 'tvm'; expected one of onnxruntime, openvino"):
        make_runner(conv_model(), runtime="tvm")
    with pytest.raises(UserError, match="precision 'int3'"):
        make_runner(conv_model(), runtime="openvino", precision="int3")


def test_time_interleaved_shapes_and_order() -> None:
    calls: list[str] = []

    class Fake(Runner):
        runtime, threads, precision = "onnxruntime", 1, "f32"

        def __init__(self, label: str) -> None:
            self.label = label

        def get_inputs(self):  # noqa: ANN202
            return make_runner(conv_model()).get_inputs()

        def run(self, feeds):  # noqa: ANN001, ANN202
            calls.append(self.label)
            return []

    times = time_interleaved({"a": Fake("a"), "b": Fake("b")}, rounds=3, runs=2, warmup=1)
    assert times["a"].shape == (3, 2) and (times["b"] >= 0).all()
    # warm-up of each, then per round one untimed + 2 timed calls each, the order reversed
    # every other round
    assert calls == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3 + ["a"] * 3 + ["b"] * 3


@needs_ov
def test_openvino_runner_agrees_with_onnxruntime_and_reports_precision() -> None:
    data = conv_model()
    ort_runner = make_runner(data)
    feeds = random_input(ort_runner, batch=3, seed=1)
    ref = ort_runner.run(feeds)[0]
    ov32 = make_runner(data, runtime="openvino", threads=1)
    assert (ov32.runtime, ov32.precision) == ("openvino", "f32")
    assert np.allclose(ov32.run(feeds)[0], ref, atol=1e-4)
    low = make_runner(data, runtime="openvino", precision="bf16")
    assert low.precision in ("bf16", "f32")  # f32 where the CPU has no BF16: a fall-back, recorded
    assert np.allclose(low.run(feeds)[0], ref, atol=0.1 * np.abs(ref).max())
    stats = measure_onnx(data, runtime="openvino", repeats=3, warmup=1, batch=2)
    assert stats.median_ms > 0 and (stats.runtime, stats.precision, stats.batch) == ("openvino", "f32", 2)
    with pytest.raises(UserError, match="OpenVINO cannot load the ONNX model bytes"):
        make_runner(b"not onnx", runtime="openvino")


@needs_ov
def test_openvino_runner_at_a_static_batch() -> None:
    data = conv_model()
    dynamic = make_runner(data, runtime="openvino", threads=1)
    assert dynamic.get_inputs()[0].shape[0] == "?"
    static = dynamic.at_batch(3)
    assert static is not dynamic and static.get_inputs()[0].shape[0] == 3
    assert static.at_batch(3) is static and make_runner(data).at_batch(3).runtime == "onnxruntime"
    feeds = random_input(static, batch=3, seed=2)
    assert np.allclose(static.run(feeds)[0], dynamic.run(feeds)[0], atol=1e-5)
    with pytest.raises(Exception):  # compiled for batch 3 only
        static.run(random_input(dynamic, batch=2, seed=2))
    assert make_runner(data, runtime="openvino", batch=4).get_inputs()[0].shape[0] == 4


def test_cpu_device_names_say_runtime_threads_and_batch() -> None:
    assert parse_cpu_device("cpu-ort-1t") == ("onnxruntime", 1, 1)
    assert parse_cpu_device("cpu-ov-8t-b32") == ("openvino", 8, 32)
    assert parse_cpu_device("cpu-ov-0t") is None and parse_cpu_device("gpu-ov-1t") is None
    device = get_device("cpu-ort-3t-b4")
    assert isinstance(device, MeasuredDevice) and (device.runtime, device.threads, device.batch) == (
        "onnxruntime", 3, 4)
    assert get_device("cpu-ort-1t").runtime == "onnxruntime"


@needs_ov
def test_openvino_devices_are_registered_and_measure() -> None:
    from hwnas.latency.devices import device_names

    assert "cpu-ov-1t" in device_names()
    device = get_device("cpu-ov-1t", model_fn=lambda arch: conv_model(), repeats=3, warmup=1)
    assert device.runtime == "openvino" and device.threads == 1
    ms = device.latency("mbv3-tiny", [_tiny_arch()])
    assert ms.shape == (1,) and ms[0] > 0


def _tiny_arch() -> str:
    from hwnas.supernet.spaces import get_space

    space = get_space("mbv3-tiny")
    return space.to_string(space.smallest())


def test_openvino_devices_need_openvino(monkeypatch) -> None:
    import hwnas.latency.onnx_measure as om

    monkeypatch.setattr(om, "openvino_available", lambda: False)
    from hwnas.latency.devices import device_names

    assert not [n for n in device_names() if n.startswith("cpu-ov-")]
    with pytest.raises(UserError, match=r"needs OpenVINO: pip install 'hwnas\[openvino\]'"):
        get_device("cpu-ov-4t")


@needs_ov
def test_latency_measure_with_openvino(tmp_path, capsys) -> None:
    from hwnas.cli import main

    d = tmp_path / "models"
    d.mkdir()
    (d / "a.onnx").write_bytes(conv_model("arch-a"))
    out = tmp_path / "m.csv"
    code = main(["latency", "measure", str(d), "--runtime", "openvino", "--precision", "bf16",
                 "--repeats", "3", "--warmup", "1", "--max-cv", "100", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    frame = pd.read_csv(out)
    assert list(frame["arch"]) == ["arch-a"] and (frame["latency_ms"] > 0).all()


def test_latency_measure_precision_needs_openvino(tmp_path, capsys) -> None:
    from hwnas.cli import main

    d = tmp_path / "models"
    d.mkdir()
    (d / "a.onnx").write_bytes(conv_model())
    code = main(["latency", "measure", str(d), "--precision", "f16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--precision f16 needs --runtime openvino" in err[0]


@needs_ov
def test_ondevice_script_with_openvino_and_hwnas_blocked(tmp_path) -> None:
    """The copied script runs OpenVINO with hwnas, torch and pandas unimportable."""
    d = tmp_path / "models"
    d.mkdir()
    for i in range(2):
        (d / f"trial_{i}.onnx").write_bytes(conv_model(f"arch-{i}"))
    out = tmp_path / "m.csv"
    proc = run_ondevice_without(
        {"hwnas", "torch", "pandas"},
        [d, "--out", out, "--repeats", "3", "--warmup", "1", "--max-cv", "100", "--runtime",
         "openvino", "--precision", "bf16"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "precision bf16" in proc.stderr or "precision f32" in proc.stderr
    frame = pd.read_csv(out)
    assert sorted(frame["arch"]) == ["arch-0", "arch-1"]


def test_ondevice_refuses_openvino_settings_without_the_runtime(tmp_path) -> None:
    d = tmp_path / "models"
    d.mkdir()
    (d / "a.onnx").write_bytes(conv_model())
    proc = subprocess.run([sys.executable, "-I", str(ONDEVICE), str(d), "--precision", "bf16"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "add --runtime openvino" in proc.stderr



def test_missing_openvino_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    """Without OpenVINO: one error line from the CLI and from the copied script."""
    from hwnas.cli import main

    d = tmp_path / "models"
    d.mkdir()
    (d / "a.onnx").write_bytes(conv_model())
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    code = main(["latency", "measure", str(d), "--runtime", "openvino"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pip install 'hwnas[openvino]'" in err[0]
    proc = run_ondevice_without({"openvino"}, [d, "--runtime", "openvino", "--out",
                                               tmp_path / "m.csv"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "needs OpenVINO: pip install openvino" in proc.stderr
    assert not (tmp_path / "m.csv").exists()
