"""Tests of the analytical latency estimators (latency.estimators): FPGA, Edge TPU, roofline.

The Estimator contract (positive, finite, deterministic, monotone in size, a breakdown that adds
up, a fresh instance per ``get_estimator``) is checked for every estimator of the registry
(``available_estimators()`` when the tests are collected) and for a user's own estimator
registered here with ``register_estimator`` (``UserMacRate``), so it meets the same checks."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from hwnas.latency.estimators import (
    ESTIMATORS,
    Breakdown,
    Estimator,
    LayerCost,
    available_estimators,
    get_estimator,
    layer_kind,
    register_estimator,
)
from hwnas.latency.estimators.edgetpu import (
    USB_ACCELERATOR,
    EdgeTPUEstimator,
    param_bytes,
)
from hwnas.latency.estimators.fpga import ZCU102, FPGAEstimator, FPGAParams
from hwnas.latency.estimators.roofline import (
    PIXEL7_CPU,
    RooflineEstimator,
    RooflineParams,
)
from hwnas.supernet.layers import Layer
from hwnas.supernet.spaces import available_spaces, get_space
from registry_support import contract_entry

from hwnas.core.errors import UserError



class UserMacRate(Estimator):
    """A user's device: a MAC rate plus a fixed cost per layer."""

    description = "a user's accelerator: 50 GMAC/s and 20 us per layer"

    def __init__(self) -> None:
        self.name = USER_ESTIMATOR

    def breakdown(self, layers):
        parts = [LayerCost(layer.name, layer.op, 0.02 + layer.macs / 50e6, "compute")
                 for layer in layers]
        return Breakdown(sum(c.ms for c in parts), parts, {"compute": sum(c.ms for c in parts)})


USER_ESTIMATOR = "user-mac-rate-est"


@pytest.fixture(scope="module", params=[*available_estimators(), USER_ESTIMATOR])
def name(request) -> str:
    return contract_entry(request, USER_ESTIMATOR, register_estimator, UserMacRate, ESTIMATORS)


def conv(name: str, cin: int, cout: int, k: int = 3, size: int = 16, groups: int = 1,
         bits: int = 32, act: str | None = "relu") -> Layer:
    return Layer(name, "conv", cin, cout, k, 1, groups, size, size, bias=True, activation=act,
                 w_bits=bits, a_bits=bits)


def small_net(width: int = 16, bits: int = 32, size: int = 16) -> list[Layer]:
    """A plain CNN: stem, two 3x3 convs, a depthwise conv, a 1x1 conv, residual add, pool, FC."""
    w = width
    return [
        conv("stem", 3, w, 3, size, bits=bits),
        conv("c1", w, 2 * w, 3, size, bits=bits),
        conv("c2", 2 * w, 2 * w, 3, size, bits=bits),
        conv("dw", 2 * w, 2 * w, 3, size, groups=2 * w, bits=bits),
        conv("pw", 2 * w, 2 * w, 1, size, bits=bits),
        Layer("add", "add", 2 * w, 2 * w, in_h=size, in_w=size),
        Layer("pool", "avgpool", 2 * w, 2 * w, in_h=size, in_w=size),
        Layer("fc", "linear", 2 * w, 10, bias=True, w_bits=bits, a_bits=bits),
    ]


def space_networks(n: int = 6) -> list[list[Layer]]:
    """Smallest, largest and a few random members of each registered space, as layer lists."""
    out = []
    for name in available_spaces():
        space = get_space(name)
        rng = np.random.default_rng(0)
        archs = [space.smallest(), space.largest()] + [space.sample(rng) for _ in range(n)]
        out += [space.layers(a) for a in archs]
    return out


# --------------------------------------------------------------------------------------------
# every estimator: the contract
# --------------------------------------------------------------------------------------------


def test_registry_has_the_promised_devices():
    for name in ("fpga-zcu102-est", "edgetpu-est", "jetson-orin-nano-est", "jetson-agx-orin-est",
                 "pixel7-cpu-est", "raspi4-est"):
        assert name in available_estimators() and ESTIMATORS.is_builtin(name)
    with pytest.raises(UserError, match="did you mean 'fpga-zcu102-est'"):
        get_estimator("fpga-zcu12-est")


def test_a_fresh_described_estimator_by_name(name):
    from hwnas.quant.device_rules import DEVICE_RULES

    est = get_estimator(name)
    assert isinstance(est, Estimator) and est is not get_estimator(name)
    assert est.name == name and isinstance(est.description, str) and est.description
    assert est.quant_rules in DEVICE_RULES and name in repr(est)


def test_positive_finite_and_deterministic(name):
    networks = space_networks(4) + [small_net()]
    first = get_estimator(name).estimate_many(networks)
    again = get_estimator(name).estimate_many(networks)
    assert np.all(np.isfinite(first)) and np.all(first > 0)
    np.testing.assert_array_equal(first, again)


def test_bigger_network_is_not_faster(name):
    est = get_estimator(name)
    for space_name in available_spaces():
        space = get_space(space_name)
        small = est.estimate(space.layers(space.smallest()))
        large = est.estimate(space.layers(space.largest()))
        assert large > small, (space_name, small, large)
    # wider, and deeper (one more layer, same budget)
    assert est.estimate(small_net(32)) >= est.estimate(small_net(16))
    net = small_net(16)
    deeper = net[:3] + [conv("extra", 32, 32, 3, 16)] + net[3:]
    assert est.estimate(deeper) >= est.estimate(net)


def test_breakdown_adds_up(name):
    est = get_estimator(name)
    layers = small_net()
    b = est.breakdown(layers)
    assert b.total_ms == pytest.approx(est.estimate(layers))
    assert [c.name for c in b.layers] == [layer.name for layer in layers]
    assert all(c.ms >= 0 for c in b.layers)


def test_layer_kind():
    assert layer_kind(conv("a", 8, 8, 3, groups=8)) == "depthwise"
    assert layer_kind(conv("a", 8, 16, 1, groups=2)) == "grouped"
    assert layer_kind(conv("a", 8, 16, 1)) == "pointwise"
    assert layer_kind(conv("a", 8, 16, 3)) == "conv"
    assert layer_kind(Layer("p", "avgpool", 8, 8, in_h=4, in_w=4)) == "global_pool"


def test_estimators_import_without_torch():
    code = ("import sys, hwnas.latency.estimators, hwnas.latency.devices, hwnas.latency.profiles, hwnas.latency.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------------------------
# FPGA
# --------------------------------------------------------------------------------------------


def test_fpga_narrower_weights_are_not_slower():
    est = FPGAEstimator(ZCU102)
    for width in (16, 64):
        t32 = est.estimate(small_net(width, bits=32))
        t8 = est.estimate(small_net(width, bits=8))
        t4 = est.estimate(small_net(width, bits=4))
        assert t4 <= t8 <= t32, (width, t4, t8, t32)
    # on a big network the DSP budget binds, so int4 (4 MACs per DSP) is strictly faster
    big = get_space("fbnet")
    layers = big.layers(big.largest())
    at = lambda b: [dataclasses.replace(la, w_bits=b, a_bits=b) for la in layers]  # noqa: E731
    assert est.estimate(at(4)) < est.estimate(at(8)) < est.estimate(at(16))


def test_fpga_units_respect_the_budget_and_the_folding_constraints():
    est = FPGAEstimator(ZCU102)
    space = get_space("fbnet")
    layers = space.layers(space.largest())
    fold = est.fold(layers)
    assert fold["dsp"] <= ZCU102.dsp * ZCU102.dsp_fraction
    for layer, units, cycles in zip(layers, fold["units"], fold["cycles"]):
        if layer.macs:
            mw = (layer.in_channels // layer.groups) * layer.kernel**2 if layer.op == "conv" else layer.in_channels
            assert units >= 1 and layer.out_channels * mw % units == 0
            assert cycles == pytest.approx(layer.macs / units)
            assert cycles >= (layer.out_h * layer.out_w if layer.op == "conv" else 1) - 1e-9


def test_fpga_modes_and_more_dsps():
    layers = small_net(48)
    lat = FPGAEstimator(ZCU102).estimate(layers)
    thr = FPGAEstimator(dataclasses.replace(ZCU102, mode="throughput")).estimate(layers)
    seq = FPGAEstimator(dataclasses.replace(ZCU102, mode="sequential")).estimate(layers)
    assert thr <= lat and thr <= seq
    small_part = FPGAEstimator(dataclasses.replace(ZCU102, dsp=200)).estimate(layers)
    assert small_part > lat


def test_fpga_weights_beyond_bram_are_streamed_from_ddr():
    layers = [Layer("fc1", "linear", 1024, 2048, bias=True, w_bits=8, a_bits=8)]  # 16.8 Mb
    roomy = FPGAEstimator(ZCU102).breakdown(layers)
    tight = FPGAEstimator(dataclasses.replace(ZCU102, bram36=100)).breakdown(layers)
    assert roomy.terms["weight_spill"] == 0
    assert tight.terms["weight_spill"] > 0
    assert tight.total_ms > roomy.total_ms


def test_fpga_lut_macs_for_binary_weights_and_overcommit():
    layers = [dataclasses.replace(la, w_bits=1, a_bits=2) if la.macs else la for la in small_net(32)]
    b = FPGAEstimator(ZCU102).breakdown(layers)
    assert b.terms["lut_used"] > 0 and b.terms["dsp_used"] == 0
    tiny = dataclasses.replace(ZCU102, dsp=2, dsp_fraction=1.0)  # fewer DSPs than layers
    b2 = FPGAEstimator(tiny).breakdown(small_net(16))
    assert b2.terms["overcommit"] > 1


def test_fpga_params_are_validated():
    with pytest.raises(UserError, match="dsp"):
        FPGAParams(name="x", dsp=0, lut=1, bram36=1, clock_mhz=100, ddr_gbs=1)
    with pytest.raises(UserError, match="mode"):
        dataclasses.replace(ZCU102, mode="fastest")
    with pytest.raises(UserError, match="dsp_fraction"):
        dataclasses.replace(ZCU102, dsp_fraction=1.5)


# --------------------------------------------------------------------------------------------
# Edge TPU
# --------------------------------------------------------------------------------------------


def fc_with_params(megabytes: float) -> list[Layer]:
    """Stem + one int8 fully connected layer holding about ``megabytes`` MiB of weights."""
    cin = 1024
    cout = int(megabytes * 1024 * 1024 / cin)
    return [conv("stem", 3, 16, 3, 8, bits=8),
            Layer("pool", "avgpool", 16, 16, in_h=8, in_w=8),
            Layer("fc0", "linear", 16, cin, bias=True, w_bits=8, a_bits=8),
            Layer("fc", "linear", cin, cout, bias=True, w_bits=8, a_bits=8)]


def test_edgetpu_parameters_beyond_the_cache_cost_a_jump():
    est = EdgeTPUEstimator(USB_ACCELERATOR)
    below = est.breakdown(fc_with_params(7.0))
    above = est.breakdown(fc_with_params(8.5))
    assert param_bytes(fc_with_params(8.5)[:]) > 8 * 1024 * 1024
    assert below.terms["param_stream"] == 0
    assert above.terms["param_stream"] > 0
    # the jump is far larger than the extra compute of the wider layer
    extra_compute = above.terms["tpu"] - below.terms["tpu"]
    assert above.total_ms - below.total_ms > 10 * extra_compute
    assert above.total_ms - below.total_ms > 1.0  # > 1 ms for ~1.5 MB over USB


def test_edgetpu_unsupported_op_sends_the_rest_to_the_host():
    layers = small_net(16, bits=8)
    odd = dataclasses.replace(layers[2], activation="gelu")
    b = EdgeTPUEstimator(USB_ACCELERATOR).breakdown(layers[:2] + [odd] + layers[3:])
    assert b.terms["tpu_layers"] == 2
    assert [c.where for c in b.layers] == ["accelerator"] * 2 + ["host"] * (len(layers) - 2)
    assert b.terms["host"] > 0
    full = EdgeTPUEstimator(USB_ACCELERATOR).breakdown(layers)
    assert full.terms["host"] == 0 and full.terms["tpu_layers"] == len(layers)
    assert b.total_ms > full.total_ms


def test_edgetpu_follows_the_host_placement_of_quant_rules():
    """A float layer in a quantized policy runs on the host with everything after it
    (quant.device_rules.effective_layers marks it; the estimator follows the mark)."""
    from hwnas.quant.device_rules import effective_layers, get_device_rules

    layers = small_net(16, bits=8)
    floated = layers[:2] + [dataclasses.replace(layers[2], w_bits=32, a_bits=32)] + layers[3:]
    est = EdgeTPUEstimator(USB_ACCELERATOR)
    b = est.breakdown(effective_layers(floated, get_device_rules("edgetpu")))
    assert b.terms["tpu_layers"] == 2 and b.terms["host"] > 0
    all_int8 = est.breakdown(effective_layers(layers, get_device_rules("edgetpu")))
    assert all_int8.terms["tpu_layers"] == len(layers)
    assert b.total_ms > all_int8.total_ms


def test_edgetpu_depthwise_uses_the_array_poorly():
    est = EdgeTPUEstimator(USB_ACCELERATOR)
    dense = conv("dense", 64, 64, 1, 16)  # 64 x 64 matrix: fills the array
    dw = conv("dw", 64, 64, 3, 16, groups=64)
    per_mac_dense = est.tpu_cycles(dense) / dense.macs
    per_mac_dw = est.tpu_cycles(dw) / dw.macs
    assert per_mac_dw > 4 * per_mac_dense


def test_edgetpu_runs_everything_as_int8():
    est = EdgeTPUEstimator(USB_ACCELERATOR)
    assert est.estimate(small_net(16, bits=32)) == est.estimate(small_net(16, bits=8))


def test_edgetpu_channel_shuffle_switch():
    layers = small_net(16)
    shuffled = [layers[0], dataclasses.replace(layers[1], extra={"channel_shuffle": 2})] + layers[2:]
    on = EdgeTPUEstimator(USB_ACCELERATOR).breakdown(shuffled)
    off = EdgeTPUEstimator(dataclasses.replace(USB_ACCELERATOR, channel_shuffle_on_tpu=False)).breakdown(shuffled)
    assert on.terms["tpu_layers"] == len(layers) and off.terms["tpu_layers"] == 1


# --------------------------------------------------------------------------------------------
# roofline
# --------------------------------------------------------------------------------------------


def test_roofline_bounds_and_precision():
    est = RooflineEstimator(PIXEL7_CPU)
    big = conv("big", 128, 128, 3, 32)
    add = Layer("add", "add", 128, 128, in_h=32, in_w=32)
    assert est.layer_cost(big).bound == "compute"
    assert est.layer_cost(add).bound == "memory"
    assert est.estimate(small_net(32, bits=8)) < est.estimate(small_net(32, bits=32))


def test_roofline_overheads_count_per_layer():
    p = dataclasses.replace(PIXEL7_CPU, layer_overhead_us=100.0)
    layers = small_net(8)
    diff = RooflineEstimator(p).estimate(layers) - RooflineEstimator(PIXEL7_CPU).estimate(layers)
    assert diff == pytest.approx(len(layers) * (100.0 - PIXEL7_CPU.layer_overhead_us) * 1e-3)


def test_roofline_params_are_validated():
    with pytest.raises(UserError, match="default"):
        RooflineParams("x", {32: 1.0}, 32, 1.0, {"conv": 0.5}, 1.0, 0.0, 1)
    with pytest.raises(UserError, match="float_bits"):
        RooflineParams("x", {8: 1.0}, 32, 1.0, {"default": 0.5}, 1.0, 0.0, 1)
    with pytest.raises(UserError, match="efficiency"):
        dataclasses.replace(PIXEL7_CPU, efficiency={"default": 2.0})
