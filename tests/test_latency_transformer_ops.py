"""The transformer ops of the layer list (matmul, layernorm, softmax, gelu) in the cost models,
the analytical estimators (Edge TPU host fallback, roofline, FPGA) and the predictor features,
and the guarantee that adding them left the features of the existing spaces unchanged."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hwnas.latency.estimators import (
    ELEMENTWISE_OPS,
    in_elems,
    layer_kind,
    out_elems,
    vector_ops,
)
from hwnas.latency.estimators.edgetpu import (
    USB_ACCELERATOR,
    EdgeTPUEstimator,
    tpu_supported,
)
from hwnas.latency.estimators.fpga import ZCU102, FPGAEstimator
from hwnas.latency.estimators.roofline import (
    JETSON_ORIN_NANO,
    PIXEL7_CPU,
    RooflineEstimator,
)
from hwnas.latency.predictors.features import (
    LAYER_KINDS,
    LAYER_QUANTITIES,
    layer_features,
)
from hwnas.quant.cost import bops, model_size_bytes
from hwnas.quant.device_rules import effective_layers, get_device_rules
from hwnas.quant.policy import apply_to_layers, uniform
from hwnas.supernet.layers import OPS, Layer
from hwnas.supernet.spaces import get_space

#: The layer kinds before the transformer ops: their columns must never move.
KINDS_BEFORE = ("conv_kxk", "conv_1x1", "conv_grouped", "conv_dw", "linear", "avgpool", "add",
                "pool", "mul", "other")


def attention(n: int = 64, heads: int = 4, d: int = 32, e: int = 128) -> list[Layer]:
    """One attention half-block on n tokens (names as the vit space writes them)."""
    t = {"in_h": n, "in_w": 1}
    return [
        Layer("ln", "layernorm", e, e, bias=True, **t),
        Layer("qkv", "linear", e, 3 * heads * d, bias=True, **t),
        Layer("qk", "matmul", heads * d, heads * n, groups=heads, **t),
        Layer("sm", "softmax", heads * n, heads * n, **t),
        Layer("av", "matmul", heads * n, heads * d, groups=heads, **t),
        Layer("proj", "linear", heads * d, e, bias=True, **t),
        Layer("add", "add", e, e, **t),
        Layer("fc1", "linear", e, 2 * e, bias=True, **t),
        Layer("gelu", "gelu", 2 * e, 2 * e, **t),
        Layer("fc2", "linear", 2 * e, e, bias=True, **t),
    ]


# -- layer records and cost models ---------------------------------------------------------------

def test_new_ops_are_appended_to_the_op_list() -> None:
    assert OPS[:6] == ("conv", "linear", "avgpool", "add", "pool", "mul")
    assert OPS[6:] == ("matmul", "layernorm", "softmax", "gelu")


def test_matmul_record_by_hand() -> None:
    qk = Layer("qk", "matmul", 4 * 32, 4 * 64, groups=4, in_h=64)
    assert qk.macs == 4 * 64 * 32 * 64 and qk.params == qk.weight_count == 0
    assert qk.second_operand == 4 * 32 * 64  # K: 64 tokens × 32 per head
    assert in_elems(qk) == 64 * 128 + 4 * 32 * 64 and out_elems(qk) == 64 * 4 * 64
    with pytest.raises(ValueError, match="not divisible by groups"):
        Layer("bad", "matmul", 6, 8, groups=4, in_h=2)


def test_token_wise_linear_counts_every_token() -> None:
    fc = Layer("fc", "linear", 32, 64, bias=True, in_h=10)
    assert fc.macs == 10 * 32 * 64 and fc.params == 32 * 64 + 64  # weights shared by tokens
    assert out_elems(fc) == 10 * 64 and layer_kind(fc) == "pointwise"
    assert layer_kind(Layer("cls", "linear", 32, 10)) == "linear"


def test_vector_ops_and_params_of_the_elementwise_ops() -> None:
    ln = Layer("ln", "layernorm", 32, 32, bias=True, in_h=10)
    assert ln.params == 64 and ln.weight_count == 32 and ln.macs == 0
    for op, n in ELEMENTWISE_OPS.items():
        layer = Layer(op, op, 32, 32, in_h=10, bias=op == "layernorm")
        assert vector_ops(layer) == n * 320 and layer.macs == 0


def test_size_and_bops_see_the_transformer_layers() -> None:
    layers = attention()
    float_size = model_size_bytes(layers)
    assert float_size == 4 * sum(la.params for la in layers)  # LayerNorm's 2·e included
    policy = uniform(layers, 8, 8)
    q = apply_to_layers(policy, layers)
    # linear layers at 8 bits; the matmuls (both operands activations) at their Q/K/V
    # projection's activation bits
    matmul_bops = sum(la.macs for la in layers if la.op == "matmul") * 8 * 8
    linear_bops = sum(la.macs for la in layers if la.op == "linear") * 8 * 8
    assert bops(q) == matmul_bops + linear_bops
    assert model_size_bytes(q) < float_size


# -- predictor features --------------------------------------------------------------------------

def test_layer_kinds_keep_the_columns_of_the_existing_spaces() -> None:
    assert LAYER_KINDS[: len(KINDS_BEFORE)] == KINDS_BEFORE
    width = len(KINDS_BEFORE) * len(LAYER_QUANTITIES)
    for name in ("mbv3", "mbv3-tiny", "nb201", "fbnet"):
        space = get_space(name)
        f = layer_features(space.layers(space.largest()))
        assert not f[width:].any()  # nothing lands in the new kinds' columns
    vit = get_space("vit")
    f = layer_features(vit.layers(vit.largest())).reshape(len(LAYER_KINDS), -1)
    for kind in ("matmul", "layernorm", "softmax", "gelu"):
        assert f[LAYER_KINDS.index(kind), 0] > 0
    assert f[LAYER_KINDS.index("other")].sum() == 0


TRANSFORMER_OPS = ("matmul", "layernorm", "softmax", "gelu")


def test_shipped_meta_predictors_read_only_the_old_columns() -> None:
    width = len(KINDS_BEFORE) * len(LAYER_QUANTITIES)
    files = sorted((Path(__file__).resolve().parents[1] / "latency" / "data").glob("*_meta.npz"))
    assert files
    for path in files:
        space = get_space(path.name[: -len("_meta.npz")])
        if any(la.op in TRANSFORMER_OPS for la in space.layers(space.largest())):
            continue  # a transformer space's predictor reads the new columns by design
        with np.load(path, allow_pickle=True) as data:
            cols = data["state.l_cols"]
            assert cols.size and int(cols.max()) < width, path.name


# -- Edge TPU ------------------------------------------------------------------------------------

def test_edgetpu_leaves_the_tpu_at_the_first_attention_product() -> None:
    vit = get_space("vit")
    arch = vit.largest()
    layers = effective_layers(apply_to_layers(uniform(vit.layers(arch), 8, 8), vit.layers(arch)),
                              get_device_rules("edgetpu"))
    est = EdgeTPUEstimator(USB_ACCELERATOR)
    b = est.breakdown(layers)
    names = [la.name for la in layers]
    cut = names.index("blocks.0.attn.qk")
    assert b.terms["tpu_layers"] == cut
    assert [c.where for c in b.layers] == ["accelerator"] * cut + ["host"] * (len(layers) - cut)
    assert "blocks.0.attn.qkv" in names[:cut] and "blocks.0.norm1" in names[:cut]
    # a compiler that maps BatchMatMul moves the cut to the row softmax
    mapped = EdgeTPUEstimator(dataclasses.replace(USB_ACCELERATOR, batch_matmul_on_tpu=True))
    assert mapped.breakdown(layers).terms["tpu_layers"] == names.index("blocks.0.attn.softmax")
    assert b.total_ms > mapped.breakdown(layers).total_ms  # less on the slow host


def test_edgetpu_op_rules() -> None:
    p = USB_ACCELERATOR
    assert tpu_supported(Layer("ln", "layernorm", 64, 64, bias=True, in_h=8), p)[0]
    assert not tpu_supported(Layer("ln", "layernorm", 30, 30, bias=True, in_h=8), p)[0]
    assert not tpu_supported(Layer("g", "gelu", 64, 64, in_h=8), p)[0]
    assert not tpu_supported(Layer("s", "softmax", 64, 64, in_h=8), p)[0]  # rows: not 1-D
    assert tpu_supported(Layer("s", "softmax", 1000, 1000), p)[0]  # a classifier's softmax
    assert not tpu_supported(Layer("s", "softmax", 20_000, 20_000), p)[0]
    ok, why = tpu_supported(Layer("m", "matmul", 64, 64, groups=2, in_h=8), p)
    assert not ok and "BatchMatMul" in why


# -- roofline and FPGA ---------------------------------------------------------------------------

@pytest.mark.parametrize("params", [JETSON_ORIN_NANO, PIXEL7_CPU])
def test_roofline_prices_attention_by_macs_and_memory(params) -> None:
    est = RooflineEstimator(params)
    p = est.params
    peak, bw, over = p.peak_gops[p.float_bits] * 1e9, p.mem_gbs * 1e9, p.layer_overhead_us * 1e-3

    def expected(layer: Layer, ops: float, eff: float) -> float:
        util = min(1.0, out_elems(layer) / p.saturation_outputs)
        moved = (in_elems(layer) + out_elems(layer)) * p.float_bits / 8 + 4 * layer.params
        return max(ops / (peak * eff * util), moved / bw) * 1e3 + over

    qk = Layer("qk", "matmul", 4 * 32, 4 * 64, groups=4, in_h=64)  # both operands read
    assert est.layer_cost(qk).ms == pytest.approx(expected(qk, 2 * qk.macs, p.efficiency["matmul"]))
    gelu = Layer("g", "gelu", 256, 256, in_h=64)
    assert est.layer_cost(gelu).ms == pytest.approx(
        expected(gelu, ELEMENTWISE_OPS["gelu"] * 256 * 64, p.efficiency["default"]))
    more_tokens = Layer("qk", "matmul", 4 * 32, 4 * 128, groups=4, in_h=128)
    assert est.layer_cost(more_tokens).ms > est.layer_cost(qk).ms  # quadratic in the tokens
    vit = get_space("vit")
    small, large = vit.layers(vit.smallest()), vit.layers(vit.largest())
    assert est.estimate(small) < est.estimate(large)


def test_fpga_gives_attention_an_engine_and_holds_its_operand_on_chip() -> None:
    est = FPGAEstimator(ZCU102)
    layers = attention()
    fold = est.fold(layers)
    for i, la in enumerate(layers):
        if la.op in ("matmul", "linear"):
            assert fold["units"][i] >= 1 and fold["cycles"][i] <= la.macs
        else:
            assert fold["units"][i] == 0
    sm = layers.index(next(la for la in layers if la.op == "softmax"))
    lanes = ZCU102.special_lanes
    assert fold["cycles"][sm] == max(64, -(-out_elems(layers[sm]) // lanes))
    weights_only = sum(la.weight_count * 16 + 32 * (la.params - la.weight_count) for la in layers)
    operands = sum(la.second_operand * 16 for la in layers)
    assert est.weight_bits(layers) == weights_only + operands
    # long sequences: the K/V buffers alone overflow the BRAM and spill to DDR
    long = attention(n=2048, heads=8, d=64, e=256)
    assert est.breakdown(long).terms["weight_spill"] > 0
    assert est.breakdown(attention(n=32)).terms["weight_spill"] == 0
    vit = get_space("vit")
    assert est.estimate(vit.layers(vit.smallest())) < est.estimate(vit.layers(vit.largest()))
