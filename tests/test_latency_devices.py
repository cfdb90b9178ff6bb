"""Tests of each kind of device (latency.devices): table, estimated and measured devices; what
every device must satisfy (and the registry's listing) is tests/test_device_contract.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hwnas.latency.devices import (
    EstimatedDevice,
    MeasuredDevice,
    device_names,
    get_device,
    latency_tables,
)
from hwnas.latency.estimators import get_estimator
from hwnas.supernet.data import shared_data_dir
from hwnas.supernet.spaces import get_space
from latency_support import SPACE, sample_archs, tiny_onnx

from hwnas.core.errors import UserError

pytestmark = pytest.mark.usefixtures("profile_dir")  # never the user's device profiles


def needs_tables() -> Path:
    data = shared_data_dir()
    if data is None or not latency_tables():
        pytest.skip("shared latency tables absent (set HWNAS_SHARED_DATA)")
    return data / "latency"


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------


def test_space_coverage_is_checked():
    device = get_device("fpga-zcu102-est", SPACE)
    assert isinstance(device, EstimatedDevice) and device.supports(SPACE)
    needs_tables()
    with pytest.raises(UserError, match="has no latency for space 'mbv3-tiny'"):
        get_device("pixel3", SPACE)
    assert "pixel3" in device_names("nb201") and "pixel3" not in device_names(SPACE)
    assert "1080ti_64" in device_names("fbnet") and "1080ti_64" not in device_names("nb201")


@pytest.mark.parametrize("space_name", ["nb201", "fbnet"])
def test_table_devices_return_the_csv_values(space_name):
    path = needs_tables() / f"{space_name}_latency_ms.csv"
    frame = pd.read_csv(path).sample(25, random_state=1)
    space = get_space(space_name)
    for column in ("fpga", "pixel3", "1080ti_1"):
        device = get_device(column, space_name)
        assert device.kind == "table"
        got = device.latency(space, list(frame["arch"]))
        np.testing.assert_array_equal(got, frame[column].to_numpy())
    # architecture objects work as well as strings
    archs = [space.from_string(a) for a in frame["arch"][:3]]
    np.testing.assert_array_equal(get_device("fpga").latency(space_name, archs), frame["fpga"][:3])


def test_table_device_refuses_unmeasured_archs_and_other_configs():
    needs_tables()
    fbnet = get_space("fbnet")
    known = set(pd.read_csv(needs_tables() / "fbnet_latency_ms.csv", usecols=["arch"])["arch"])
    rng = np.random.default_rng(0)
    missing = next(s for s in (fbnet.to_string(fbnet.sample(rng)) for _ in range(100)) if s not in known)
    with pytest.raises(UserError, match="not in the fbnet latency table"):
        get_device("fpga").latency(fbnet, [missing])
    other = get_space("nb201", image_size=16)
    with pytest.raises(UserError, match="another configuration"):
        get_device("fpga").latency(other, [other.to_string(other.largest())])


def test_estimated_device_is_the_estimator_on_the_layer_list():
    space = get_space(SPACE)
    archs = sample_archs(5)
    device = get_device("edgetpu-est", space)
    want = [get_estimator("edgetpu-est").estimate(space.layers(space.parse(a))) for a in archs]
    np.testing.assert_allclose(device.latency(space, archs), want)


def test_measured_device_with_a_model_fn():
    sizes = {}

    def model_fn(arch):
        sizes[arch] = 8 if arch.stages[0][0][0] == 3 else 64
        return tiny_onnx(width=sizes[arch])

    space = get_space(SPACE)
    device = get_device("cpu-ort-1t", SPACE, model_fn=model_fn, repeats=5, warmup=1)
    assert isinstance(device, MeasuredDevice) and device.kind == "measured"
    med, std = device.latency_with_std(space, sample_archs(2))
    assert med.shape == (2,) and np.all(med > 0) and np.all(std >= 0)
    bad = get_device("cpu-ort-1t", SPACE, model_fn=lambda arch: "not a model", repeats=1, warmup=0)
    with pytest.raises(UserError, match="model_fn must return"):
        bad.latency(space, sample_archs(1))


def test_measured_device_batch_and_cuda_graph_options(monkeypatch):
    import hwnas.latency.onnx_measure as onnx_measure

    seen = {}
    real = onnx_measure.measure_onnx

    def spy(model, **kw):
        seen.update(kw)
        return real(model, **kw)

    monkeypatch.setattr(onnx_measure, "measure_onnx", spy)
    space = get_space(SPACE)
    device = MeasuredDevice("cpu-b4", threads=1, model_fn=lambda a: tiny_onnx(width=8),
                            repeats=2, warmup=0, batch=4)
    assert device.latency(space, sample_archs(1))[0] > 0 and seen["batch"] == 4
    with pytest.raises(UserError, match="batch must be >= 1"):
        MeasuredDevice("x", threads=1, batch=0)
    with pytest.raises(UserError, match="cuda_graph needs provider 'cuda-torch'"):
        MeasuredDevice("x", threads=1, provider="cpu", cuda_graph=True)


def test_measured_device_builds_the_subnet_itself():
    pytest.importorskip("torch")
    device = get_device("cpu-ort-1t", SPACE, repeats=3, warmup=1)
    space = get_space(SPACE)
    t = device.latency(space, [space.to_string(space.smallest())])
    assert t.shape == (1,) and t[0] > 0


def test_gpu_devices_are_listed_only_with_a_gpu(monkeypatch):
    import hwnas.latency.devices.measured as devices

    monkeypatch.setattr(devices, "_gpu_present", lambda: True)
    listed = devices._measured_factories()
    assert {"cuda-torch", "cuda-graph"} <= set(listed)
    graph = listed["cuda-graph"][0]()
    assert graph.provider == "cuda-torch" and graph.cuda_graph and graph.batch == 1
    monkeypatch.setattr(devices, "_gpu_present", lambda: False)
    assert not {"cuda-torch", "cuda-graph"} & set(devices._measured_factories())


def test_a_cpu_device_fixes_its_batch_only_when_its_name_gives_one():
    """What the export times a device at: its own batch when the name gives one (``-b8``),
    else the workload's (``at_batch``); the runtime's precision hints and stream counts."""
    plain, fixed = get_device("cpu-ort-2t"), get_device("cpu-ort-2t-b8")
    assert (plain.batch, plain.fixed_batch, fixed.batch, fixed.fixed_batch) == (1, False, 8, True)
    assert plain.at_batch(16).batch == 16 and plain.batch == 1  # a copy, the device unchanged
    assert fixed.at_batch(16) is fixed and plain.at_batch(1) is plain
    assert plain.precision_hints == ("f32",) and plain.at_batch(16).stream_counts == ()
    ov = MeasuredDevice("ov-box", threads=8, batch=32, runtime="openvino")
    assert ov.precision_hints == ("f32", "bf16", "f16") and ov.stream_counts == (2, 4, 8)
    with pytest.raises(UserError, match="batch must be >= 1"):
        plain.at_batch(0)
