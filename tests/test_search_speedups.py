"""A run's export measures int8 speed-ups per layer shape; the next search of that run prices
quantized candidates on those devices with them (RunDir.int8_speedups -> Device.int8_speedup)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hwnas.core.errors import UserError
from hwnas.latency.devices import Device
from hwnas.quant.device_rules import layer_key
from hwnas.quant.policy import uniform
from hwnas.search.evaluator import device_latencies
from hwnas.search.rundir import RunDir
from hwnas.supernet.spaces import get_space


class _Constant(Device):
    """1 ms for every float network: what quantization changes is all that moves."""

    name, kind, quant_rules = "board", "measured", "cpu-ort"

    def latency(self, space, archs):
        return np.ones(len(archs))


def _policy(space, arch):
    layers = [layer.name for layer in space.layers(arch) if layer.op in ("conv", "linear")]
    return uniform(layers, 8, 8)


def test_a_measured_table_changes_the_quantized_latency() -> None:
    space = get_space("mbv3-tiny")
    arch = space.largest()
    device = _Constant()
    policy = _policy(space, arch)
    default, _ = device_latencies(device, space, [arch], [policy])
    assert default[0] == pytest.approx(1.0)  # no measured gain: int8 costs what float costs
    device.int8_speedup = {layer_key(layer): 4.0 for layer in space.layers(arch)}
    faster, _ = device_latencies(device, space, [arch], [policy])
    assert 0.2 < faster[0] < 0.5
    float_only, _ = device_latencies(device, space, [arch], [None])
    assert float_only[0] == pytest.approx(1.0)


def test_run_dir_reads_the_export_tables(tmp_path) -> None:
    run = RunDir(tmp_path)
    run.export_dir.mkdir()
    run.int8_speedup("cpu-ort-1t").write_text(json.dumps(
        {"device": "cpu-ort-1t", "threads": 1, "int8_speedup": {"conv:8x16:k3:s1:g1:8x8": 1.7}}))
    assert run.int8_speedups(["cpu-ort-1t", "edgetpu-est"]) == {
        "cpu-ort-1t": {"conv:8x16:k3:s1:g1:8x8": 1.7}}
    run.int8_speedup("cpu-ort-1t").write_text("{not json")
    with pytest.raises(UserError, match="is not an int8 speed-up table"):
        run.int8_speedups(["cpu-ort-1t"])
    run.int8_speedup("cpu-ort-1t").write_text(json.dumps({"int8_speedup": {"k": -2}}))
    with pytest.raises(UserError, match="outside"):
        run.int8_speedups(["cpu-ort-1t"])
