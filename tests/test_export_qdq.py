"""Tests for export.qdq / export.ort_profile / export.device_policy / export.model_export:
QDQ structure, exact low-bit grids, parity, float islands, INT4, mapping errors, per-device
choice and the never-slower rule."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hwnas.export.device_policy import DevicePolicy, LayerSpeed, ProfiledLayerTimer
from hwnas.export.model_export import ExportSettings, export_model
from hwnas.export.onnx_export import check_parity
from hwnas.export.ort_profile import (
    INTEGER_OPS,
    LayerIndex,
    integer_kernel_check,
    optimized_model,
    profile_model,
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
from torch import nn

from hwnas.core.errors import UserError

FAST = dict(warmup=1, rounds=1)


class TinyNet(nn.Module):
    """Stem conv+BN+ReLU, expand 1x1 + ReLU, depthwise 3x3 + h-swish, project 1x1 with a
    residual add, pooling and a classifier: the patterns the exporter has to handle."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(8)
        self.expand = nn.Conv2d(8, 16, 1, bias=False)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.dw_bn = nn.BatchNorm2d(16)
        self.project = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem_bn(self.stem(x)))
        y = torch.relu(self.expand(x))
        y = nn.functional.hardswish(self.dw_bn(self.dw(y)))
        x = x + self.project(y)
        return self.fc(x.mean((2, 3)))


@pytest.fixture(scope="module")
def net() -> nn.Module:
    torch.manual_seed(0)
    model = TinyNet()
    with torch.no_grad():  # non-trivial BN statistics, so folding matters
        for bn in (model.stem_bn, model.dw_bn):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(128, 3, 8, 8, generator=g), torch.randn(64, 3, 8, 8, generator=g)


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


def test_float_graph_folds_bn_and_maps_every_layer(net, data) -> None:
    proto = float_proto(net, data[0][:1])
    assert not [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch
    names = uniform(net, 8, 8).layer_names
    mapping = map_layer_nodes(proto, names)
    assert set(mapping) == set(names) == {"stem", "expand", "dw", "project", "fc"}
    with pytest.raises(UserError, match="'ghost'.*no Conv/Gemm/MatMul node"):
        map_layer_nodes(proto, names + ["ghost"])
    with pytest.raises(UserError, match="cannot map ONNX node"):
        map_layer_nodes(proto, names[1:])  # the stem node then maps to no layer


def test_qdq_structure_uint8_activations_int8_per_channel_weights(net, data) -> None:
    calib, _ = data
    build = build_qdq(net, uniform(net, 8, 8), [calib])
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


def test_low_bit_weights_and_activations_are_exact(net, data) -> None:
    calib, test = data
    bits = {"stem": (8, 8), "expand": (2, 4), "dw": (3, 6), "project": (4, 4), "fc": (6, 8)}
    build = build_qdq(net, QuantPolicy(bits), [calib])
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


def test_one_sided_layers_are_simulated_exactly(net, data) -> None:
    calib, test = data
    bits = {"stem": (8, 8), "expand": (4, 32), "dw": (32, 8), "project": (8, 8), "fc": (32, 32)}
    build = build_qdq(net, QuantPolicy(bits), [calib])
    assert {n: build.layers[n].category for n in bits} == {
        "stem": "int", "expand": "sim", "dw": "sim", "project": "int", "fc": "float"}
    proto = build.proto(requantize=False)
    inits = _inits(proto)
    assert "expand.weight_fq" in inits and "expand.input_q" not in {n.output[0] for n in proto.graph.node}
    assert "dw.weight_quantized" not in inits and "fc.weight_quantized" not in inits
    with build.reference(requantize=False) as ref, torch.no_grad():
        want = ref(test).numpy()
    assert np.abs(_run(proto, test, False) - want).max() < 1e-5


def test_float_islands_are_reported_by_name(net, data) -> None:
    build = build_qdq(net, uniform(net, 8, 8), [data[0]])
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


def test_float_layer_between_integer_layers_stays_float(net, data) -> None:
    """onnxruntime quantizes a float conv fed by a DequantizeLinear and feeding a
    QuantizeLinear on its own; the exporter's Clip guard keeps a layer chosen float float."""
    calib, test = data
    build = build_qdq(net, uniform(net, 8, 8), [calib], float_layers=["expand"])
    proto = build.proto()
    index = LayerIndex.from_source(proto, build.builder.node_of)
    kernels = index.kernels(optimized_model(proto.SerializeToString()).graph)
    assert all(op not in INTEGER_OPS for _, op in kernels["expand"]), kernels["expand"]
    assert "/expand/float_guard" in {n.name for n in proto.graph.node}
    assert all(op in INTEGER_OPS for _, op in kernels["dw"])
    with build.reference(requantize=True) as ref, torch.no_grad():
        want = ref(test).numpy()
    assert np.abs(_run(proto, test) - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    unguarded = [n for n in build_qdq(net, uniform(net, 8, 8), [calib]).proto().graph.node
                 if n.op_type == "Clip"]
    assert unguarded == []  # no guard where no layer is float


def test_int4_storage_on_opset_21(net, data) -> None:
    calib, test = data
    build = build_qdq(net, QuantPolicy({n: (4, 8) for n in uniform(net, 8, 8).layer_names}),
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


def test_bad_policies_and_float_layers(net, data) -> None:
    with pytest.raises(UserError, match="ghost"):
        build_qdq(net, QuantPolicy({"ghost": (8, 8)}), [data[0]])
    with pytest.raises(UserError, match="cannot keep layer 'ghost'"):
        build_qdq(net, uniform(net, 8, 8), [data[0]], float_layers=["ghost"])
    build = build_qdq(net, uniform(net, 8, 8), [data[0]], float_layers=["dw"])
    assert build.policy["dw"] == (32, 32) and build.searched_policy["dw"] == (8, 8)
    assert "dw" not in build.integer_layers()
    with pytest.raises(UserError, match="no such quantizable layer"):
        build.proto(extra_float=["ghost"])


def test_profile_attributes_time_to_layers(net, data) -> None:
    build = build_qdq(net, uniform(net, 8, 8), [data[0]])
    proto = build.proto()
    index = LayerIndex.from_source(proto, build.builder.node_of)
    prof = profile_model(proto.SerializeToString(), batch=4, runs=3, warmup=1)
    per_layer = index.attribute(prof.optimized.graph, prof.node_ms)
    assert all(per_layer.get(n, 0.0) > 0 for n in build.integer_layers())
    assert sum(per_layer.values()) == pytest.approx(prof.total_ms)
    fp32 = float_proto(net, data[0][:1])
    findex = LayerIndex.from_source(fp32, map_layer_nodes(fp32, build.policy.layer_names))
    fprof = profile_model(fp32.SerializeToString(), batch=4, runs=3, warmup=1)
    assert set(findex.anchors(fprof.optimized.graph).values()) == set(build.policy.layer_names)


def test_device_policy_properties_and_speedup_table() -> None:
    speeds = [LayerSpeed("a", "pointwise", 2.0, 1.0), LayerSpeed("b", "depthwise", 1.0, 2.0)]
    slower = DevicePolicy("cpu-ort-1t", 1, 1, ["b"], fp32_ms=1.0, fp32_p95_ms=1.1,
                          uniform_ms=1.5, chosen_ms=1.2, chosen_p95_ms=1.3,
                          chosen_label="profile", layers=speeds)
    assert not slower.quantized_faster and slower.speedup == pytest.approx(1 / 1.2)
    assert slower.speedup_table() == {"a": 2.0, "b": 0.5}
    from hwnas.supernet.layers import Layer

    layers = [Layer("a", "conv", 8, 8, 1, 1, 1, 4, 4), Layer("b", "conv", 8, 8, 3, 1, 8, 4, 4)]
    assert slower.speedup_table(layers) == {"a": 2.0, "b": 0.5}
    assert ProfiledLayerTimer({s.layer: s for s in speeds})(layers[0], True) == 1.0
    assert slower.as_dict()["quantized_faster"] is False
    lucky = DevicePolicy("cpu-ort-1t", 1, 1, [], fp32_ms=1.0, fp32_p95_ms=1.1, uniform_ms=0.9,
                         chosen_ms=0.9, chosen_p95_ms=1.0, chosen_label="all-int8",
                         faster_twice=False)
    assert not lucky.quantized_faster  # faster in one timing only


def test_choice_survives_a_rejected_refinement_among_the_finalists(monkeypatch) -> None:
    """A greedy step that lost its own timing can still rank among the two fastest candidates
    when the machine's speed drifts between timings; the final timing must still be able to
    run it (it once raised KeyError), and the truly fastest model wins there."""
    import hwnas.export.device_policy as dp

    def build(float_layers):  # noqa: ANN001, ANN202 - fake model bytes naming the float layers
        return ("q:" + ",".join(sorted(float_layers))).encode()

    def base_ms(blob: bytes) -> float:  # FP32 10 ms; int8 8 ms + 1 ms per float layer
        text = blob.decode()
        return 10.0 if text == "fp32" else 8.0 + len([x for x in text[2:].split(",") if x])

    calls: list[int] = []

    def fake_time(models, **kw):  # noqa: ANN001, ANN202 - the 2nd timing runs at twice the speed
        calls.append(len(models))
        factor = 0.5 if len(calls) == 2 else 1.0
        return {label: (base_ms(b) * factor, base_ms(b) * factor) for label, b in models.items()}

    def fake_per_layer(index, model, **kw):  # noqa: ANN001, ANN202 - layer c loses in int8
        return ({"a": 1.0, "b": 1.0, "c": 1.0} if model == b"fp32"
                else {"a": 0.5, "b": 0.5, "c": 2.0})

    monkeypatch.setattr(dp, "time_models", fake_time)
    monkeypatch.setattr(dp, "_per_layer", fake_per_layer)
    choice = dp.choose_float_layers(build, b"fp32", ["a", "b", "c"], {}, fp32_index=None,
                                    qdq_index=None, refine=1)
    labels = {c.label: c for c in choice.candidates}
    assert labels["profile"].float_layers == ["c"] and labels["refine-0"].float_layers == ["a"]
    assert labels["refine-0"].median_ms == 4.5  # rejected (4.5 > all-int8's 4.0 beside it)
    assert len(calls) == 3 and calls[-1] == 3  # final: fp32, refine-0, all-int8
    assert choice.chosen_label == "all-int8" and choice.float_layers == []
    assert choice.chosen_ms == 8.0 and choice.fp32_ms == 10.0 and choice.quantized_faster


def _export(net, data, tmp_path, **kw):
    calib, test = data
    settings = ExportSettings(**FAST, **kw.pop("settings", {}))
    return export_model(net, name="m", out_dir=tmp_path, example=test[:1], test_images=test,
                        policy=kw.pop("policy", uniform(net, 8, 8)), calibration=[calib],
                        arch="tiny", accuracy=42.0, settings=settings, **kw)


def test_export_model_writes_verified_files(net, data, tmp_path) -> None:
    result = _export(net, data, tmp_path, devices={"cpu-ort-1t": 1},
                     predicted_latency={"cpu-ort-1t": 0.5, "fpga-zcu102-est": 0.1})
    assert result.status == "ok", result.errors
    files = {f.path: f for f in result.files}
    assert set(files) == {"m.onnx", "qdq/m.onnx", "qdq-cpu-ort-1t/m.onnx"}
    for rel, report in files.items():
        assert report.ok and report.written and (tmp_path / rel).is_file()
        assert report.latency_ms["cpu-ort-1t"] > 0  # from the device's paired timing
    assert files["m.onnx"].max_abs_diff <= 1e-4
    assert files["qdq/m.onnx"].top1_agreement >= 0.99
    assert [i.split(" ")[0] for i in files["qdq/m.onnx"].float_islands] == ["stem", "dw", "project"]
    assert files["qdq-cpu-ort-1t/m.onnx"].float_islands == []
    meta = read_metadata(onnx.load(tmp_path / "qdq-cpu-ort-1t/m.onnx"))
    assert meta["arch"] == "tiny" and meta["accuracy"] == 42.0
    assert meta["predicted_latency_ms"] == {"cpu-ort-1t": 0.5, "fpga-zcu102-est": 0.1}
    assert meta["target_device"] == "cpu-ort-1t" and meta["searched_policy"]["layers"]
    devices = {d.device: d for d in result.devices}
    cpu = devices["cpu-ort-1t"]
    assert cpu.measured and isinstance(cpu.quantized_faster, bool) and cpu.runtime == "onnxruntime"
    timed = {c["label"]: c["median_ms"] for c in cpu.candidates}
    assert set(timed) >= {"m.onnx", "qdq-cpu-ort-1t/m.onnx"} and timed["m.onnx"] == cpu.fp32_ms
    assert timed[cpu.recommended] == cpu.recommended_ms <= cpu.fp32_ms  # never slower than FP32
    assert cpu.quantized_faster == (cpu.recommended != "m.onnx")
    fpga = devices["fpga-zcu102-est"]
    assert not fpga.measured and fpga.quantized_faster is None and fpga.predicted_latency_ms == 0.1


class _Drift(nn.Module):
    """Traced with its (class-wide) call counter as a constant, then run with another value:
    its export cannot match it."""

    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return self.fc(x.flatten(1)) + float(type(self).calls)


def test_parity_failure_is_reported_and_not_written(data, tmp_path) -> None:
    result = export_model(_Drift().eval(), name="bad", out_dir=tmp_path, example=data[1][:1],
                          test_images=data[1], settings=ExportSettings(**FAST))
    assert result.status == "failed"
    report = result.files[0]
    assert not report.ok and not report.written and "FP32 parity failed" in report.error
    assert not (tmp_path / "bad.onnx").exists() and not list(tmp_path.glob(".*tmp"))


def test_export_settings_validation() -> None:
    with pytest.raises(UserError, match="opset"):
        ExportSettings(opset=13).validate()
    with pytest.raises(UserError, match="min_agreement"):
        ExportSettings(min_agreement=1.5).validate()
    with pytest.raises(UserError, match="policy_batch"):
        ExportSettings(policy_batch=0).validate()


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
