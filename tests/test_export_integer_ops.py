"""Tests for export.integer_ops: h-swish, squeeze-excitation and residual adds of a QDQ export
run as onnxruntime integer kernels, and DeployedReference computes what the graph computes."""

from __future__ import annotations

import onnx
import pytest
import torch
from hwnas.export.integer_ops import integer_elementwise
from hwnas.export.onnx_export import check_parity
from hwnas.export.ort_profile import optimized_model
from hwnas.export.qdq import DeployedReference, build_qdq, read_metadata
from hwnas.quant.policy import uniform
from torch import nn


class Block(nn.Module):
    """MobileNetV3 block: expand 1x1 + h-swish, depthwise 3x3 + h-swish, squeeze-excitation
    (mean, reduce + ReLU, expand + h-sigmoid, multiply), project 1x1, residual add."""

    def __init__(self, c: int, mid: int) -> None:
        super().__init__()
        self.expand, self.act1 = nn.Conv2d(c, mid, 1), nn.Hardswish()
        self.dw, self.act2 = nn.Conv2d(mid, mid, 3, padding=1, groups=mid), nn.Hardswish()
        self.se_reduce, self.se_act = nn.Conv2d(mid, 4, 1), nn.ReLU()
        self.se_expand, self.se_gate = nn.Conv2d(4, mid, 1), nn.Hardsigmoid()
        self.project = nn.Conv2d(mid, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act2(self.dw(self.act1(self.expand(x))))
        s = self.se_gate(self.se_expand(self.se_act(self.se_reduce(y.mean((2, 3), keepdim=True)))))
        return x + self.project(y * s)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.stem_act = nn.Conv2d(3, 8, 3, padding=1), nn.Hardswish()
        self.block1, self.block2 = Block(8, 24), Block(8, 24)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.block1(self.stem_act(self.stem(x))))
        return self.fc(x.mean((2, 3)))


@pytest.fixture(scope="module")
def built():  # noqa: ANN201 - (QdqBuild, test images)
    torch.manual_seed(0)
    net = Net().eval()
    g = torch.Generator().manual_seed(1)
    calib, test = torch.randn(128, 3, 8, 8, generator=g), torch.randn(256, 3, 8, 8, generator=g)
    return build_qdq(net, uniform(net, 8, 8), [calib], example=calib[:1]), test


def _ops(proto: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in optimized_model(proto.SerializeToString()).graph.node]


def test_elementwise_ops_run_as_integer_kernels(built) -> None:
    build, _ = built
    plain = _ops(build.builder._build(float_layers=(), requantize=True, int4=False))
    ops = _ops(build.proto())
    # before: h-swish and the SE multiply in float between DequantizeLinear/QuantizeLinear
    assert "Mul" in plain and plain.count("DequantizeLinear") > ops.count("DequantizeLinear")
    # after: onnxruntime fused them into integer element-wise kernels
    assert ops.count("QLinearMul") == 7  # 5 h-swish + 2 SE multiplies
    assert ops.count("QLinearAdd") == 6  # 5 h-swish "+3" + block1's residual add
    assert ops.count("QLinearGlobalAveragePool") == 2
    assert "HardSwish" not in ops and "Mul" not in ops
    assert ops.count("Add") == 1  # block2's add feeds the float head (a mean without keepdim)


def test_rewrite_records_what_the_reference_mirrors(built) -> None:
    build, _ = built
    rw = build.builder.rewrite()
    assert set(rw.hswish) == {"stem_act", "block1.act1", "block1.act2", "block2.act1",
                              "block2.act2"}
    # the depthwise h-swish feeds the SE pool and the multiply: quantized with its input's grid
    assert rw.hswish["block1.act2"] is not None and rw.hswish["block1.act1"] is None
    assert sorted(rw.gates) == ["block1.se_gate", "block2.se_gate"]
    assert set(rw.residual) == {"block1"}  # block2's add feeds only the head's pooling
    onnx.checker.check_model(rw.proto)
    meta = read_metadata(build.proto())
    assert meta["integer_elementwise"] == {"hswish": 5, "se_gates": 2, "residual_adds": 1}


def test_reference_mirrors_the_rewritten_graph(built) -> None:
    build, test = built
    data = build.proto().SerializeToString()
    with torch.no_grad():
        before = build.qmodel(test[:8])
    with build.reference() as ref:
        mirrored = check_parity(data, ref, test, atol=float("inf"))
    unmirrored = DeployedReference(build.qmodel, build.layers, build.builder.int32_bias_layers(),
                                   build.builder.requant_layers())
    with unmirrored as ref:
        plain = check_parity(data, ref, test, atol=float("inf"))
    assert mirrored.top1_agreement >= 0.99
    assert mirrored.max_abs_diff < 0.5 * plain.max_abs_diff
    with torch.no_grad():  # the hooks are gone after the context
        assert torch.equal(build.qmodel(test[:8]), before)


def test_rewrite_leaves_graphs_without_those_modules_alone(built) -> None:
    build, _ = built
    proto = build.builder._build(float_layers=(), requantize=True, int4=False)
    before = [n.op_type for n in proto.graph.node]
    rw = integer_elementwise(proto, hswish_modules=set(), hsigmoid_modules=set(), modules=set(),
                             requant_layer_of={})
    after = [n.op_type for n in rw.proto.graph.node]
    assert not rw.hswish and not rw.gates and not rw.residual and not rw.requant
    # only the two SE means (over H, W, kept dims) become GlobalAveragePool, the same op
    assert after.count("ReduceMean") == before.count("ReduceMean") - 2
    assert after.count("GlobalAveragePool") == before.count("GlobalAveragePool") + 2
    assert after.count("HardSwish") == before.count("HardSwish") == 5


def test_a_float_layer_gets_no_dequantize_in_front(built) -> None:
    build, test = built
    proto = build.proto(extra_float=["block1.dw"])
    producers = {o: n for n in proto.graph.node for o in n.output}
    dw = next(n for n in proto.graph.node if n.name == "/block1/dw/Conv")
    assert producers[dw.input[0]].op_type != "DequantizeLinear"
    ops = _ops(proto)
    # onnxruntime would otherwise quantize the float conv with its own scales
    assert ops.count("QLinearConv") == 10 and ops.count("Conv") + ops.count("FusedConv") == 1
    # block1's two h-swish around the float conv and its SE multiply stay float
    assert ops.count("QLinearMul") == 4
