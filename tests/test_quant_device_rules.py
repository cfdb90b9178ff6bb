"""Per-device quantization rules: rounding to native widths, storage vs speed, host placement,
measured int8 speed-ups."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hwnas.quant.allocate import SensitivityTable, allocate
from hwnas.quant.cost import bops, model_size_bytes
from hwnas.quant.device_rules import (
    DeviceQuantRules,
    device_size_bytes,
    effective_layers,
    execution_bits,
    get_device_rules,
    layer_key,
    layer_latency_fn,
    measure_int8_speedup,
    speed_factor,
    storage_w_bits,
)
from hwnas.quant.policy import apply_to_layers, uniform
from hwnas.supernet.layers import Layer
from hwnas.supernet.spaces import get_space

from hwnas.core.errors import UserError

LAYERS = [
    Layer("stem", "conv", 1, 16, 3, in_h=8, in_w=8, bias=True),
    Layer("mid", "conv", 16, 32, 3, in_h=8, in_w=8, bias=True),
    Layer("add", "add", 32, 32, in_h=8, in_w=8),
    Layer("head", "conv", 32, 64, 1, in_h=8, in_w=8, bias=True),
    Layer("fc", "linear", 64, 10, bias=True),
]


def test_edgetpu_rounds_low_widths_up_to_int8():
    tpu = get_device_rules("edgetpu")
    assert execution_bits(tpu, 4, 8) == (8, 8)
    assert execution_bits(tpu, 2, 4) == (8, 8)
    assert execution_bits(tpu, 8, 32) == (32, 32)
    assert storage_w_bits(tpu, 4) == 8
    w4 = [layer.with_bits(4, 8) if layer.op in ("conv", "linear") else layer for layer in LAYERS]
    w8 = [layer.with_bits(8, 8) if layer.op in ("conv", "linear") else layer for layer in LAYERS]
    eff = effective_layers(w4, tpu)
    assert all((layer.w_bits, layer.a_bits) == (8, 8) for layer in eff if layer.op != "add")
    assert bops(eff) == bops(w8)  # 4-bit weights buy no compute
    assert device_size_bytes(w4, tpu) == model_size_bytes(w8)  # ... and no storage
    assert eff[1].extra["requested_bits"] == [4, 8] and eff[1].extra["storage_w_bits"] == 8
    assert (tpu.native) == [(8, 8)]


def test_edgetpu_float_layer_moves_the_rest_of_the_network_to_the_host():
    tpu = get_device_rules("edgetpu")
    layers = [layer.with_bits(*((32, 32) if layer.name == "mid" else (8, 8)))
              if layer.op in ("conv", "linear") else layer for layer in LAYERS]
    placement = [layer.extra["placement"] for layer in effective_layers(layers, tpu)]
    assert placement == ["device", "host", "host", "host", "host"]


def test_cpu_ort_gains_size_not_speed_below_8_bits():
    cpu = get_device_rules("cpu-ort")
    w4 = [layer.with_bits(4, 8) if layer.op in ("conv", "linear") else layer for layer in LAYERS]
    w8 = [layer.with_bits(8, 8) if layer.op in ("conv", "linear") else layer for layer in LAYERS]
    # int8 containers: no size gain without packing, and speed counts 8 bits
    assert device_size_bytes(w4, cpu) == device_size_bytes(w8, cpu)
    assert [speed_factor(layer, cpu) for layer in w4] == [speed_factor(layer, cpu) for layer in w8]
    assert bops(effective_layers(w4, cpu)) == bops(w8)
    # a packed (int4) export: size counts the packed width, speed still 8 bits
    packed = replace(cpu, storage_bits=(4, 8))
    assert device_size_bytes(w4, packed) == model_size_bytes(w4)
    assert device_size_bytes(w4, packed) < device_size_bytes(w8, packed)
    assert storage_w_bits(packed, 3) == 4 and storage_w_bits(packed, 6) == 8
    assert [layer.w_bits for layer in effective_layers(w4, packed) if layer.op != "add"] == [8] * 4


def test_cpu_ort_speed_comes_from_measurement_and_float_stays_valid():
    cpu = get_device_rules("cpu-ort")
    layer = LAYERS[1].with_bits(8, 8)
    assert speed_factor(layer, cpu) == 1.0  # nothing measured: no gain assumed
    assert speed_factor(LAYERS[1], cpu) == 1.0  # float
    # a measured table where int8 is *slower* for this layer (as issue 5 saw on onnxruntime)
    slow = cpu.with_speedups({"mid": 0.8, layer_key(LAYERS[3]): 2.0})
    assert speed_factor(layer, slow) == pytest.approx(1.25)
    assert speed_factor(LAYERS[3].with_bits(8, 8), slow) == pytest.approx(0.5)  # by shape key
    with pytest.raises(UserError, match="must be positive"):
        cpu.with_speedups({"mid": 0.0})
    # allocation with device latency picks float where int8 is slower, int8 where it is faster
    fn = layer_latency_fn(slow, lambda layer: float(layer.macs))
    table = SensitivityTable({n: {(8, 8): 1.0, (32, 32): 0.0} for n in ("stem", "mid", "head", "fc")})
    budget = sum(fn(layer) for layer in LAYERS)  # the all-float latency
    alloc = allocate(table, LAYERS, budget * 0.9, fn)
    assert alloc.policy["mid"] == (32, 32)
    assert alloc.policy["head"] == (8, 8)


def test_fpga_runs_every_width_with_bitops_cost():
    fpga = get_device_rules("fpga")
    assert execution_bits(fpga, 3, 4) == (3, 4)
    assert storage_w_bits(fpga, 2) == 2
    a = speed_factor(LAYERS[1].with_bits(4, 8), fpga)
    b = speed_factor(LAYERS[1].with_bits(8, 8), fpga)
    c = speed_factor(LAYERS[1].with_bits(2, 4), fpga)
    assert a == pytest.approx(b / 2) and c == pytest.approx(b / 8)
    w4 = [layer.with_bits(4, 8) if layer.op in ("conv", "linear") else layer for layer in LAYERS]
    assert device_size_bytes(w4, fpga) == model_size_bytes(w4)
    assert bops(effective_layers(w4, fpga)) == bops(w4)


def test_effective_layers_on_a_space_policy():
    space = get_space("mbv3-tiny")
    layers = space.layers(space.smallest())
    priced = apply_to_layers(uniform(layers, 3, 8), layers)
    for name in ("edgetpu", "cpu-ort", "fpga"):
        eff = effective_layers(priced, get_device_rules(name))
        assert [layer.name for layer in eff] == [layer.name for layer in layers]
    assert get_device_rules("fpga").name == "fpga"
    with pytest.raises(UserError, match="unknown device family 'tpu' for quantization rules; expected one of cpu-ort, edgetpu, fpga"):
        get_device_rules("tpu")
    with pytest.raises(ValueError):
        DeviceQuantRules("x", "bad", compute_bits=(8, 4), storage_bits=(8,))


def test_measure_int8_speedup_with_a_timer_hook():
    calls = []

    def timer(layer: Layer, int8: bool) -> float:
        calls.append((layer.name, int8))
        return 1.0 if int8 else 2.0 * layer.kernel

    table = measure_int8_speedup(LAYERS + [replace(LAYERS[1], name="mid2")], timer)
    assert table == {"stem": 6.0, "mid": 6.0, "mid2": 6.0, "head": 2.0, "fc": 2.0}
    assert ("mid2", True) not in calls  # same shape as "mid": measured once
    by_shape = measure_int8_speedup(LAYERS, timer, by="shape")
    assert layer_key(LAYERS[3]) in by_shape


def test_ort_layer_timer_measures_float_and_int8():
    pytest.importorskip("onnxruntime.quantization")
    from hwnas.export.layer_timer import OrtLayerTimer

    timer = OrtLayerTimer(repeats=5, warmup=1)
    layer = Layer("c", "conv", 8, 16, 3, in_h=8, in_w=8, bias=True)
    t_float, t_int8 = timer(layer, False), timer(layer, True)
    assert t_float > 0 and t_int8 > 0
