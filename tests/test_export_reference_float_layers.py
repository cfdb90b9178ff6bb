"""The reference of a mixed-precision QDQ file and the layers the file keeps float (session 38,
``benchmarks/qdq_divergence.md``): a float layer changes the element-wise rewrite around it (a
residual add or h-swish that feeds it stays float, an h-swish after it is not rewritten), and
the reference (``QdqBuild.reference()``) must round exactly where the file does. The top-1
check alone cannot tell: a reference with the all-int8 graph's points there agrees on 100 % of
the images, so the verification compares the graphs."""

from __future__ import annotations

import pytest
import torch
from hwnas.export.code_trace import trace_codes
from hwnas.export.onnx_export import check_parity
from hwnas.export.passes import ImagePasses
from hwnas.export.qdq import DeployedReference, build_qdq
from hwnas.export.records import ExportSettings, FileReport
from hwnas.export.verify import verify_qdq
from hwnas.quant.policy import uniform
from qdq_support import tiny_mbv3_se

from hwnas.core.errors import UserError

#: float layer -> the integer rounding points of the all-int8 graph it removes
CHANGED = {
    # block 0's residual add feeds the float expand conv: float in the file; block 1's first
    # h-swish reads that conv's float output: no integer h-sigmoid
    "blocks.1.expand_conv": {("blocks.0", "residual"), ("blocks.1.act1", "hsigmoid")},
    # the h-swish after the float depthwise conv is not rewritten at all
    "blocks.1.dw_conv": {("blocks.1.act2", "hswish"), ("blocks.1.act2", "hsigmoid")},
}


@pytest.fixture(scope="module")
def mbv3():  # noqa: ANN201 - (model, calibration images, test images, all-int8 build)
    model, calib, test = tiny_mbv3_se(256)
    return model, calib, test, build_qdq(model, uniform(model, 8, 8), [calib], example=calib[:1])


def _mixed(mbv3, layer: str):  # noqa: ANN001, ANN202
    model, calib, _, _ = mbv3
    return build_qdq(model, uniform(model, 8, 8), [calib], example=calib[:1],
                     float_layers=[layer])


@pytest.mark.parametrize("layer", sorted(CHANGED))
def test_reference_rounds_where_the_file_does_next_to_a_float_layer(mbv3, layer) -> None:
    _, _, test, int8 = mbv3
    build = _mixed(mbv3, layer)
    proto, ref = build.proto(), build.reference()
    # the float layer did change the points around it (else this test would prove nothing)
    assert set(int8.builder.rewrite().nodes) - set(ref.rewrite.nodes) == CHANGED[layer]
    # the reference mirrors the file's own rewrite, node for node and scale for scale
    assert ref.rewrite.proto.graph == proto.graph
    file_q = {n.name for n in proto.graph.node if n.op_type == "QuantizeLinear"}
    assert {p.node for p in ref.rounding_points()} <= file_q
    with ref as deployed:
        trace = trace_codes(proto.SerializeToString(), deployed, test,
                            points=ref.rounding_points())
    assert trace.unexplained is None, trace.describe()


@pytest.mark.parametrize("layer", sorted(CHANGED))
def test_the_int8_points_next_to_a_float_layer_would_pass_top1(mbv3, layer) -> None:
    """The divergence the session-37 note feared, made on purpose: the reference rounds the
    removed points as the all-int8 graph does. Top-1 agreement stays 100 %; the code trace
    (and the graph comparison of :func:`verify_qdq`) are what see it."""
    _, _, test, int8 = mbv3
    build = _mixed(mbv3, layer)
    data = build.proto().SerializeToString()
    good, bad = build.builder.rewrite(), build.builder.rewrite()
    rw0 = int8.builder.rewrite()
    for module, kind in CHANGED[layer]:
        if kind == "residual":
            bad.residual[module] = rw0.residual[module]
        else:
            bad.hswish[module] = rw0.hswish[module]
        bad.nodes[(module, kind)] = rw0.nodes[(module, kind)]
    for rewrite, want in ((good, True), (bad, False)):
        ref = DeployedReference(build.qmodel, build.layers, build.builder.int32_bias_layers(),
                                build.builder.requant_layers(), rewrite)
        file_q = {n.name for n in rewrite.proto.graph.node}
        with ref as deployed:
            parity = check_parity(data, deployed, test, atol=float("inf"))
            trace = trace_codes(data, deployed, test,
                                points=[p for p in ref.rounding_points() if p.node in file_q])
        assert parity.top1_agreement == 1.0
        assert (trace.unexplained is None) == want, trace.describe()


def test_verify_refuses_a_file_that_is_not_the_references_graph(mbv3) -> None:
    """The note's case literally: a timing variant with a layer kept float (``extra_float``)
    checked against the build's reference, whose rewrite knows no such float layer. It agrees
    on 100 % of the images; the verification must still refuse it."""
    _, _, test, int8 = mbv3
    s = ExportSettings()
    with torch.no_grad():
        before = int8.qmodel(test[:4])
    verify_qdq(int8.proto(), int8, ImagePasses(test), FileReport("a.onnx", "qdq", ""), s,
               requantize=True, require_integer=False)
    variant = int8.proto(extra_float=["blocks.1.dw_conv"])
    with pytest.raises(UserError, match="not the graph of its reference"):
        verify_qdq(variant, int8, ImagePasses(test), FileReport("b.onnx", "qdq", ""), s,
                   requantize=True, require_integer=False)
    with torch.no_grad():  # the reference's hooks are gone after a refused check
        assert torch.equal(int8.qmodel(test[:4]), before)
