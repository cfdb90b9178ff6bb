"""Quantization of ``vit`` subnets: int8 PTQ of the linear layers and the attention products,
LSQ QAT and Hessian sensitivity, the QDQ export running the linear layers as integer kernels,
the per-layer int8 timer."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

# -- quantization --------------------------------------------------------------------------------

def test_int8_ptq_quantizes_linear_layers_and_attention_and_keeps_the_rest_float(vit_tiny) -> None:
    from hwnas.quant.fake_quant import QuantConv2d, QuantLinear, QuantMatMul, SharedAddQuant
    from hwnas.quant.policy import apply_to_layers, uniform
    from hwnas.quant.ptq import PTQConfig, ptq

    torch.manual_seed(0)
    arch = vit_tiny.largest()
    model = vit_tiny.build_supernet().extract(arch)
    layers = vit_tiny.layers(arch)
    policy = uniform(layers, 8, 8)
    policy.validate(model)  # the layer list names the model's quantizable layers
    x = torch.randn(16, *vit_tiny.input_shape, generator=torch.Generator().manual_seed(0))
    # default PTQ (bias correction on: per output feature, on the last axis of token sequences)
    qmodel = ptq(model, policy, [(x, None)], PTQConfig(residual="shared"))
    q = dict(qmodel.named_modules())
    for la in layers:
        if la.op == "linear":
            assert isinstance(q[la.name], QuantLinear)
            assert q[la.name].weight_quant.scale.numel() == la.out_channels  # per channel
            assert q[la.name].input_quant.scale.numel() == 1  # per tensor
        elif la.op == "conv":
            assert isinstance(q[la.name], QuantConv2d)
        elif la.op == "add":  # residual adds are named as in the layer list
            assert isinstance(q[la.name], SharedAddQuant)
        elif la.op == "matmul":  # both activation inputs quantized (test_vit_integer_attention)
            assert isinstance(q[la.name], QuantMatMul)
        elif la.op in ("layernorm", "softmax", "gelu"):
            assert type(q[la.name]) in (nn.LayerNorm, nn.Softmax, nn.GELU)  # kept float
    with torch.no_grad():
        ref, got = model(x), qmodel(x)
    assert 0 < (ref - got).abs().max() <= 0.05 * ref.abs().max()
    priced = apply_to_layers(policy, layers)
    assert all(la.w_bits == 8 for la in priced if la.op == "linear")
    assert all(la.w_bits == 32 for la in priced if la.op == "layernorm")
    # the attention products follow their Q/K/V projection's activation bits
    assert all((la.w_bits, la.a_bits) == (8, 8) for la in priced if la.op == "matmul")


def test_lsq_qat_and_hessian_sensitivity_on_a_vit_subnet(vit_tiny) -> None:
    """W4A8 LSQ fine-tuning lowers the loss of a vit subnet; the Hessian sensitivity has one
    entry per conv/linear layer, larger at 4 bits than at 8."""
    from hwnas.quant.fake_quant import QuantLinear
    from hwnas.quant.policy import uniform
    from hwnas.quant.qat import QATConfig, qat
    from hwnas.quant.sensitivity import hessian_sensitivity

    torch.manual_seed(0)
    model = vit_tiny.build_supernet().extract(vit_tiny.largest())
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(32, *vit_tiny.input_shape, generator=gen), torch.randint(0, 10, (32,), generator=gen)
    result = qat(model, uniform(model, 4, 8), [(x, y)], [(x, y)],
                 QATConfig(epochs=4, lr=0.05, scale_lr=0.05, kd_weight=0.0, label_weight=1.0),
                 progress=False)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0]
    assert isinstance(result.model.get_submodule("blocks.0.attn.qkv"), QuantLinear)
    table = hessian_sensitivity(model, [(x, y)], [(4, 8), (8, 8)], n_samples=4)
    names = {la.name for la in vit_tiny.layers(vit_tiny.largest()) if la.op in ("conv", "linear")}
    assert set(table.values) == names
    assert all(v[(4, 8)] > v[(8, 8)] > 0 for v in table.values.values())


def test_qdq_export_runs_the_linear_layers_as_integer_kernels(vit_tiny) -> None:
    """QDQ ONNX of an int8 vit subnet: onnxruntime computes what the deployed reference
    computes, and every linear layer runs as an integer kernel (LayerNorm/Softmax/GELU stay
    float; the attention products: tests/test_vit_integer_attention.py)."""
    pytest.importorskip("onnxruntime")
    import onnx
    from hwnas.export.ort_profile import LayerIndex, integer_kernel_check
    from hwnas.export.qdq import build_qdq
    from hwnas.latency.onnx_measure import make_session
    from hwnas.quant.policy import uniform

    torch.manual_seed(0)
    model = vit_tiny.build_supernet().extract(vit_tiny.largest())
    x = torch.randn(16, *vit_tiny.input_shape, generator=torch.Generator().manual_seed(2))
    build = build_qdq(model, uniform(model, 8, 8), [x])
    proto = build.proto(requantize=True)
    onnx.checker.check_model(proto, full_check=True)
    session = make_session(proto.SerializeToString(), threads=1)
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with build.reference(requantize=True) as ref, torch.no_grad():
        want = ref(x).numpy()
    assert np.abs(got - want).max() < 1e-5
    index = LayerIndex.from_source(proto, build.builder.node_of)
    integer, islands = integer_kernel_check(proto.SerializeToString(), index, build.integer_layers())
    linear = {la.name for la in vit_tiny.layers(vit_tiny.largest()) if la.op == "linear"}
    assert islands == [] and linear <= set(integer)
    assert {"Softmax", "LayerNormalization"} <= {n.op_type for n in proto.graph.node}


def test_layer_timer_runs_a_token_wise_linear_layer(vit_tiny) -> None:
    pytest.importorskip("onnxruntime")
    from hwnas.export.layer_timer import OrtLayerTimer

    fc1 = next(la for la in vit_tiny.layers(vit_tiny.largest()) if la.name == "blocks.0.mlp.fc1")
    timer = OrtLayerTimer(repeats=3, warmup=1)
    _, shape = timer._model_bytes(fc1)
    assert shape == (1, fc1.in_h, fc1.in_channels)
    assert timer(fc1, False) > 0 and timer(fc1, True) > 0


def test_the_reference_adds_each_bias_as_the_file_does(vit_tiny) -> None:
    """A linear layer on a token sequence exports as MatMul + Add: onnxruntime adds its bias in
    float after the integer product, so the reference keeps that bias float; a Gemm's bias
    (the classifier, on pooled features) is stored as int32 and the reference rounds it the same
    way. Compared: the bias each reference layer adds against the file's initializers."""
    import onnx
    from hwnas.export.qdq import build_qdq
    from hwnas.quant.policy import uniform
    from onnx import numpy_helper

    torch.manual_seed(0)
    model = vit_tiny.build_supernet().extract(vit_tiny.largest())
    with torch.no_grad():  # biases off the int32 grid, as after training
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.bias.uniform_(-0.3, 0.3)
    x = torch.randn(16, *vit_tiny.input_shape, generator=torch.Generator().manual_seed(2))
    build = build_qdq(model, uniform(model, 8, 8), [x])
    proto = build.proto(requantize=False)
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    ops = {build.builder.node_of[n]: n for n in build.integer_layers()}
    kinds = {ops[n.name]: n.op_type for n in proto.graph.node if n.name in ops}
    assert {"MatMul", "Gemm"} <= set(kinds.values())
    with build.reference(requantize=False) as ref:
        for name, op in kinds.items():
            want = (inits[f"{name}.bias"] if op == "MatMul"  # the float Add after the MatMul
                    else inits[f"{name}.bias_quantized"] * inits[f"{name}.bias_scale"])
            got = ref.get_submodule(name).bias.detach().numpy()
            assert np.abs(got - want).max() <= 1e-7 * np.abs(want).max(), (name, op)
