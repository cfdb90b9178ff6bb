"""Tests for export.qdq: QDQ structure, exact low-bit grids, parity, float islands, INT4,
mapping errors and dead layers (the tiny net and its images: tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hwnas.export.onnx_export import check_parity
from hwnas.export.ort_profile import (
    INTEGER_OPS,
    LayerIndex,
    integer_kernel_check,
    optimized_model,
)
from hwnas.export.qdq import (
    build_qdq,
    float_proto,
    map_layer_nodes,
    node_scope,
    read_metadata,
)
from hwnas.quant.policy import QuantPolicy, uniform
from onnx import TensorProto, numpy_helper

from hwnas.core.errors import UserError
from qdq_support import tiny_fbnet


def _run(proto: onnx.ModelProto, x: torch.Tensor, optimize: bool = True) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x.numpy()})[0]


def _inits(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}


def test_node_scope() -> None:
    assert node_scope("/blocks/blocks.0/expand_conv/Conv") == "blocks.0.expand_conv"
    assert node_scope("/feature_mix/MatMul") == "feature_mix"
    assert node_scope("/blocks/blocks.3/se/reduce/Conv_token_95") == "blocks.3.se.reduce"
    assert node_scope("/head_conv.x/requant_q") == "head_conv.x"


def test_float_graph_folds_bn_and_maps_every_layer(qdq_net, qdq_images) -> None:
    proto = float_proto(qdq_net, qdq_images[0][:1])
    assert not [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch
    names = uniform(qdq_net, 8, 8).layer_names
    mapping = map_layer_nodes(proto, names)
    assert set(mapping) == set(names) == {"stem", "expand", "dw", "project", "fc"}
    with pytest.raises(UserError, match="'ghost'.*no Conv/Gemm/MatMul node"):
        map_layer_nodes(proto, names + ["ghost"])
    with pytest.raises(UserError, match="cannot map ONNX node"):
        map_layer_nodes(proto, names[1:])  # the stem node then maps to no layer


def test_qdq_structure_uint8_activations_int8_per_channel_weights(qdq_net, qdq_images) -> None:
    calib, _ = qdq_images
    build = build_qdq(qdq_net, uniform(qdq_net, 8, 8), [calib])
    proto = build.proto(requantize=False)
    onnx.checker.check_model(proto, full_check=True)
    inits = _inits(proto)
    nodes = {n.name: n for n in proto.graph.node}
    modules = dict(build.qmodel.named_modules())
    for name in build.policy.layer_names:
        module = modules[name]
        w = inits[f"{name}.weight_quantized"]
        assert w.dtype == np.int8 and np.abs(w).max() <= 127
        scale = inits[f"{name}.weight_scale"]
        assert scale.shape == (module.weight.shape[0],)  # per output channel
        assert not inits[f"{name}.weight_zero_point"].any()  # symmetric
        dq = nodes[f"/{name}/weight_dq"]
        assert [a.i for a in dq.attribute if a.name == "axis"] == [0]
        q = nodes[f"/{name}/input_q"]
        zp = inits[q.input[2]]
        assert zp.dtype == np.uint8
        fq_scale, fq_zp, _, _ = module.input_quant.qparams()
        assert inits[q.input[1]] == pytest.approx(float(fq_scale), rel=0, abs=0)
        assert int(zp) == int(fq_zp)
        assert inits[f"{name}.bias_quantized"].dtype == np.int32
    meta = read_metadata(proto)
    assert meta["policy"] == build.policy.to_dict()


def test_low_bit_weights_and_activations_are_exact(qdq_net, qdq_images) -> None:
    calib, test = qdq_images
    bits = {"stem": (8, 8), "expand": (2, 4), "dw": (3, 6), "project": (4, 4), "fc": (6, 8)}
    build = build_qdq(qdq_net, QuantPolicy(bits), [calib])
    modules = dict(build.qmodel.named_modules())
    for requantize in (False, True):
        proto = build.proto(requantize=requantize)
        inits = _inits(proto)
        for name, (w_bits, a_bits) in bits.items():
            ints = inits[f"{name}.weight_quantized"].astype(np.int64)
            limit = 2 ** (w_bits - 1) - 1
            assert ints.min() >= -limit and ints.max() <= limit
            module = modules[name]
            fq = module.weight_quant(module.weight).detach().numpy()
            scale = inits[f"{name}.weight_scale"].reshape(-1, *([1] * (ints.ndim - 1)))
            assert np.array_equal(ints.astype(np.float32) * scale, fq)  # bit-exact grid
            if a_bits < 8:
                assert int(inits[f"{name}.input_qmax"]) == 2 ** a_bits - 1
            else:
                assert f"{name}.input_qmax" not in inits
        assert read_metadata(proto)["weight_bits"] == {n: w for n, (w, _) in bits.items()}
        for optimize in (False, True):
            got = _run(proto, test, optimize)
            with build.reference(requantize=requantize) as ref, torch.no_grad():
                want = ref(test).numpy()
            # exact up to float rounding (an occasional flipped level would show as >> 1e-4)
            assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())


def test_one_sided_layers_are_simulated_exactly(qdq_net, qdq_images) -> None:
    calib, test = qdq_images
    bits = {"stem": (8, 8), "expand": (4, 32), "dw": (32, 8), "project": (8, 8), "fc": (32, 32)}
    build = build_qdq(qdq_net, QuantPolicy(bits), [calib])
    assert {n: build.layers[n].category for n in bits} == {
        "stem": "int", "expand": "sim", "dw": "sim", "project": "int", "fc": "float"}
    proto = build.proto(requantize=False)
    inits = _inits(proto)
    assert "expand.weight_fq" in inits and "expand.input_q" not in {n.output[0] for n in proto.graph.node}
    assert "dw.weight_quantized" not in inits and "fc.weight_quantized" not in inits
    with build.reference(requantize=False) as ref, torch.no_grad():
        want = ref(test).numpy()
    assert np.abs(_run(proto, test, False) - want).max() < 1e-5


def test_float_islands_are_reported_by_name(qdq_net, qdq_images) -> None:
    build = build_qdq(qdq_net, uniform(qdq_net, 8, 8), [qdq_images[0]])
    quantized = build.integer_layers()
    exact = build.proto(requantize=False)
    index = LayerIndex.from_source(exact, build.builder.node_of)
    integer, islands = integer_kernel_check(exact.SerializeToString(), index, quantized)
    # the stem's ReLU output also feeds the residual add, dw feeds h-swish and project the add:
    # without a requantized output onnxruntime keeps them float
    assert {i.split(" ")[0] for i in islands} == {"stem", "dw", "project"}
    assert set(integer) == {"expand", "fc"}
    assert set(build.requant_layers()) == {"stem", "dw", "project"}
    fast = build.proto(requantize=True)
    integer, islands = integer_kernel_check(fast.SerializeToString(), index, quantized)
    assert islands == [] and set(integer) == set(quantized)
    assert set(integer.values()) <= {"QLinearConv", "QGemm", "MatMulIntegerToFloat"}
    # keeping a layer float removes it from the integer set and the check
    partial = build.proto(extra_float=["dw"])
    integer, islands = integer_kernel_check(partial.SerializeToString(), index,
                                            build.integer_layers(["dw"]))
    assert islands == [] and "dw" not in integer


def test_float_layer_between_integer_layers_stays_float(qdq_net, qdq_images) -> None:
    """onnxruntime quantizes a float conv fed by a DequantizeLinear and feeding a
    QuantizeLinear on its own; the exporter's Clip guard keeps a layer chosen float float."""
    calib, test = qdq_images
    build = build_qdq(qdq_net, uniform(qdq_net, 8, 8), [calib], float_layers=["expand"])
    proto = build.proto()
    index = LayerIndex.from_source(proto, build.builder.node_of)
    kernels = index.kernels(optimized_model(proto.SerializeToString()).graph)
    assert all(op not in INTEGER_OPS for _, op in kernels["expand"]), kernels["expand"]
    assert "/expand/float_guard" in {n.name for n in proto.graph.node}
    assert all(op in INTEGER_OPS for _, op in kernels["dw"])
    with build.reference(requantize=True) as ref, torch.no_grad():
        want = ref(test).numpy()
    assert np.abs(_run(proto, test) - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    unguarded = [n for n in build_qdq(qdq_net, uniform(qdq_net, 8, 8), [calib]).proto().graph.node
                 if n.op_type == "Clip"]
    assert unguarded == []  # no guard where no layer is float


def test_int4_storage_on_opset_21(qdq_net, qdq_images) -> None:
    calib, test = qdq_images
    build = build_qdq(qdq_net, QuantPolicy({n: (4, 8) for n in uniform(qdq_net, 8, 8).layer_names}),
                      [calib])
    packed = build.proto(requantize=False, int4=True)
    onnx.checker.check_model(packed)
    assert max(o.version for o in packed.opset_import if o.domain in ("", "ai.onnx")) == 21
    kinds = {i.name: i.data_type for i in packed.graph.initializer}
    assert kinds["expand.weight_quantized"] == TensorProto.INT4
    plain = build.proto(requantize=False)
    sizes = {p: {i.name: len(i.raw_data) for i in m.graph.initializer}
             for p, m in (("packed", packed), ("plain", plain))}
    assert sizes["packed"]["expand.weight_quantized"] * 2 == sizes["plain"]["expand.weight_quantized"]
    assert "INT4" in read_metadata(packed)["weight_storage"]
    np.testing.assert_allclose(_run(packed, test, False), _run(plain, test, False), atol=1e-6)


def test_bad_policies_and_float_layers(qdq_net, qdq_images) -> None:
    with pytest.raises(UserError, match="ghost"):
        build_qdq(qdq_net, QuantPolicy({"ghost": (8, 8)}), [qdq_images[0]])
    with pytest.raises(UserError, match="cannot keep layer 'ghost'"):
        build_qdq(qdq_net, uniform(qdq_net, 8, 8), [qdq_images[0]], float_layers=["ghost"])
    build = build_qdq(qdq_net, uniform(qdq_net, 8, 8), [qdq_images[0]], float_layers=["dw"])
    assert build.policy["dw"] == (32, 32) and build.searched_policy["dw"] == (8, 8)
    assert "dw" not in build.integer_layers()
    with pytest.raises(UserError, match="no such quantizable layer"):
        build.proto(extra_float=["ghost"])


def test_dead_layers_of_a_nb201_cell_are_left_out() -> None:
    """Node 2 of this cell reaches no output: the ONNX exporter drops its two convs in every
    cell, and the export quantizes the rest instead of failing on a policy mismatch."""
    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    torch.manual_seed(0)
    model = space.build_supernet().eval().extract(space.from_string(
        "|avg_pool_3x3~0|+|nor_conv_3x3~0|nor_conv_1x1~1|+|skip_connect~0|skip_connect~1|none~2|"))
    x = torch.randn(40, *space.input_shape, generator=torch.Generator().manual_seed(2))
    build = build_qdq(model.eval(), uniform(model, 8, 8), [x[:32]], example=x[:1])
    assert len(build.dead_layers) == 30  # 15 cells x (e2_0, e2_1)
    assert all(n.endswith((".e2_0.conv", ".e2_1.conv")) for n in build.dead_layers)
    assert not set(build.dead_layers) & set(build.builder.node_of)
    proto = build.proto()
    onnx.checker.check_model(proto)
    assert read_metadata(proto)["dead_layers"] == build.dead_layers
    with build.reference() as ref:
        parity = check_parity(proto.SerializeToString(), ref, x[32:], atol=float("inf"))
    assert parity.top1_agreement == 1.0


def test_float_layer_behind_a_channel_shuffle_stays_float(monkeypatch) -> None:
    """fbnet's ``_g2`` block: expand conv (integer, requantized after its ReLU) - channel
    shuffle (Reshape - Transpose - Reshape) - depthwise conv kept float - ReLU - project conv
    (integer). onnxruntime moves the requantization's DequantizeLinear past the shuffle and then
    quantized the float depthwise conv with weight scales of its own: the project conv's input
    codes left the reference in every image (session 34, ``benchmarks/qdq_divergence.md``).
    The guard must follow the shuffle, and the file's codes match the reference's."""
    from hwnas.export.code_trace import trace_codes
    model, calib, test = tiny_fbnet("skip-k3_e1_g2", (1, 1), 32)
    build = build_qdq(model, uniform(model, 8, 8), [calib], float_layers=["blocks.1.dw_conv"])
    assert "blocks.1.expand_conv" in build.requant_layers()
    proto = build.proto()
    assert "/blocks.1.dw_conv/float_guard" in {n.name for n in proto.graph.node}
    index = LayerIndex.from_source(proto, build.builder.node_of)
    kernels = index.kernels(optimized_model(proto.SerializeToString()).graph)
    assert all(op not in INTEGER_OPS for _, op in kernels["blocks.1.dw_conv"]), kernels
    ref = build.reference()
    with ref as deployed:
        trace = trace_codes(proto.SerializeToString(), deployed, test,
                            points=ref.rounding_points())
    codes = {r["layer"]: r for r in trace.layers}
    # unguarded: dw_conv ran as a QLinearConv, and 13 % of these codes differed, in 100 % of the
    # images, by up to 3 levels, 0.5 level from a boundary ("nothing upstream touched")
    assert codes["blocks.1.project_conv.input_quant"]["images_touched_pct"] < 10, codes
    assert trace.unexplained is None, trace.describe()
    # without the guard, the export's check names the layer onnxruntime made an integer kernel
    monkeypatch.setattr(type(build.builder), "_float_guards", lambda *_: {})
    integer, _ = integer_kernel_check(build.proto().SerializeToString(), index,
                                      build.integer_layers(), kept_float=["blocks.1.dw_conv"])
    assert integer["blocks.1.dw_conv"] == "QLinearConv"
