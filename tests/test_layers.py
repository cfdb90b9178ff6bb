"""Tests for supernet.layers (the Layer list) and quant.cost (model size, BOPs)."""

from __future__ import annotations

import json

import pytest
from hwnas.quant.cost import bops, model_size_bytes
from hwnas.supernet.layers import (
    Layer,
    load_layers,
    save_layers,
    total_flops,
    total_macs,
    total_params,
)

# --------------------------------------------------------------------------------------------
# spatial size
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "kernel", "stride", "expected"),
    [
        (8, 3, 1, 8),   # 'same' padding keeps the size at stride 1
        (8, 1, 1, 8),
        (8, 7, 1, 8),
        (8, 3, 2, 4),
        (8, 5, 2, 4),
        (7, 3, 2, 4),   # odd sizes round up: (7 + 2 - 3) // 2 + 1
        (7, 1, 2, 4),
        (2, 7, 1, 2),   # kernel larger than the input
        (32, 3, 2, 16),
        (1, 3, 2, 1),
    ],
)
def test_conv_output_size(size, kernel, stride, expected):
    layer = Layer("c", "conv", 4, 8, kernel, stride, 1, size, size + 1)
    assert layer.out_h == expected
    # width is computed independently of height
    assert layer.out_w == (size + 1 + 2 * (kernel // 2) - kernel) // stride + 1


def test_non_conv_output_size():
    assert Layer("p", "avgpool", 8, 8, in_h=5, in_w=6).out_h == 1
    assert Layer("p", "avgpool", 8, 8, in_h=5, in_w=6).out_w == 1
    add = Layer("a", "add", 8, 8, in_h=5, in_w=6)
    assert (add.out_h, add.out_w) == (5, 6)


# --------------------------------------------------------------------------------------------
# MACs and parameters, by hand
# --------------------------------------------------------------------------------------------


def test_dense_conv_macs_params():
    # 3 -> 8 channels, 3x3, stride 1 on 8x8: 8*8 outputs * 8 channels * (3*3*3) MACs each
    conv = Layer("c", "conv", 3, 8, 3, 1, 1, 8, 8)
    assert conv.macs == 8 * 8 * 8 * 27 == 13824
    assert conv.params == 8 * 3 * 9 == 216
    assert conv.weight_count == 216
    with_bias = Layer("c", "conv", 3, 8, 3, 1, 1, 8, 8, bias=True)
    assert with_bias.params == 216 + 8
    assert with_bias.weight_count == 216
    assert with_bias.macs == conv.macs  # the bias costs no MACs here


def test_strided_conv_macs():
    conv = Layer("c", "conv", 4, 6, 3, 2, 1, 8, 8)  # -> 4x4
    assert conv.macs == 4 * 4 * 6 * 4 * 9


def test_depthwise_conv_macs_params():
    dw = Layer("dw", "conv", 16, 16, 3, 2, 16, 8, 8, bias=True)  # -> 4x4
    assert dw.macs == 4 * 4 * 16 * 9 == 2304
    assert dw.params == 16 * 9 + 16 == 160
    assert dw.weight_count == 144


def test_grouped_conv_macs_params():
    g = Layer("g", "conv", 8, 4, 1, 1, 2, 5, 5)  # 4 input channels per group
    assert g.macs == 5 * 5 * 4 * 4
    assert g.params == 4 * 4


def test_linear_macs_params():
    fc = Layer("fc", "linear", 96, 10, bias=True)
    assert fc.macs == 960
    assert fc.params == 970
    assert fc.weight_count == 960
    assert Layer("fc", "linear", 96, 10).params == 960


def test_pool_and_add_are_free():
    for layer in (
        Layer("p", "avgpool", 64, 64, in_h=4, in_w=4, bias=True),
        Layer("a", "add", 64, 64, in_h=4, in_w=4, bias=True),
    ):
        assert layer.macs == 0
        assert layer.params == 0
        assert layer.weight_count == 0


def test_totals():
    layers = [
        Layer("c", "conv", 3, 8, 3, 1, 1, 8, 8, bias=True),
        Layer("dw", "conv", 8, 8, 3, 2, 8, 8, 8, bias=True),
        Layer("a", "add", 8, 8, in_h=4, in_w=4),
        Layer("p", "avgpool", 8, 8, in_h=4, in_w=4),
        Layer("fc", "linear", 8, 10, bias=True),
    ]
    macs = 8 * 8 * 8 * 27 + 4 * 4 * 8 * 9 + 80
    assert total_macs(layers) == macs
    assert total_flops(layers) == 2 * macs
    assert total_params(layers) == (216 + 8) + (72 + 8) + 90
    assert total_macs([]) == total_flops([]) == total_params([]) == 0


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def test_invalid_op_raises():
    with pytest.raises(ValueError, match="unknown op 'maxpool'"):
        Layer("x", "maxpool", 4, 4)


@pytest.mark.parametrize(("cin", "cout", "groups"), [(16, 16, 3), (4, 6, 4), (6, 4, 4)])
def test_groups_must_divide_channels(cin, cout, groups):
    with pytest.raises(ValueError, match="groups"):
        Layer("x", "conv", cin, cout, 3, 1, groups)


# --------------------------------------------------------------------------------------------
# serialization
# --------------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    layers = [
        Layer("stem_conv", "conv", 1, 16, 3, 1, 1, 8, 8, bias=True, activation="hswish"),
        Layer("blocks.0.dw_conv", "conv", 32, 32, 5, 2, 32, 8, 8, bias=True,
              activation="relu", w_bits=4, a_bits=8, extra={"note": [1, 2]}),
        Layer("blocks.0.add", "add", 16, 16, in_h=4, in_w=4),
        Layer("pool", "avgpool", 16, 16, in_h=4, in_w=4),
        Layer("classifier", "linear", 16, 10, bias=True),
    ]
    path = tmp_path / "layers.json"
    save_layers(layers, path)
    json.loads(path.read_text())  # plain JSON
    loaded = load_layers(path)
    assert loaded == layers
    # `extra` is excluded from equality, so check it separately
    assert [layer.extra for layer in loaded] == [layer.extra for layer in layers]
    assert total_flops(loaded) == total_flops(layers)


def test_with_bits_keeps_everything_else():
    layer = Layer("c", "conv", 3, 8, 3, 1, 1, 8, 8, bias=True)
    q = layer.with_bits(4, 8)
    assert (q.w_bits, q.a_bits) == (4, 8)
    assert (layer.w_bits, layer.a_bits) == (32, 32)  # frozen original untouched
    assert (q.macs, q.params, q.name) == (layer.macs, layer.params, layer.name)


# --------------------------------------------------------------------------------------------
# quant.cost
# --------------------------------------------------------------------------------------------


def test_model_size_fp32_is_four_bytes_per_param():
    layers = [
        Layer("c", "conv", 3, 8, 3, 1, 1, 8, 8, bias=True),
        Layer("p", "avgpool", 8, 8, in_h=8, in_w=8),
        Layer("fc", "linear", 8, 10, bias=True),
    ]
    assert model_size_bytes(layers) == 4 * total_params(layers) == 4 * (224 + 90)


def test_model_size_quantized_weights_pack_biases_stay_32bit():
    conv = Layer("c", "conv", 3, 8, 3, 1, 1, 8, 8, bias=True).with_bits(4, 8)
    # 216 weights at half a byte + 8 biases at 4 bytes
    assert model_size_bytes([conv]) == 216 // 2 + 8 * 4 == 140
    fc8 = Layer("fc", "linear", 8, 10, bias=True).with_bits(8, 8)
    assert model_size_bytes([conv, fc8]) == 140 + 80 + 40


def test_model_size_rounds_up_packed_bits():
    odd = Layer("fc", "linear", 3, 3).with_bits(4, 8)  # 9 weights * 4 bits = 36 bits
    assert model_size_bytes([odd]) == 5
    two = [odd, Layer("fc2", "linear", 3, 3).with_bits(4, 8)]  # 72 bits, packed together
    assert model_size_bytes(two) == 9


def test_bops():
    conv = Layer("c", "conv", 3, 8, 3, 1, 1, 8, 8, bias=True)
    fc = Layer("fc", "linear", 8, 10, bias=True)
    add = Layer("a", "add", 8, 8, in_h=8, in_w=8)
    assert bops([conv]) == 13824 * 32 * 32
    assert bops([conv.with_bits(4, 8), fc.with_bits(2, 4), add]) == 13824 * 4 * 8 + 80 * 2 * 4
