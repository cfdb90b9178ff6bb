"""The ``vit`` space beyond the SearchSpace contract: its layer list against the static model
(shapes and FLOPs measured with forward hooks), weight entanglement, extraction, ONNX export
with onnxruntime parity, int8 fake quantization, and one epoch of ``hwnas train``."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.supernet.layers import Layer
from hwnas.supernet.spaces import ViTArch, ViTConfig, ViTSpace, get_space

from hwnas.core.errors import UserError

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402


@pytest.fixture(scope="module")
def space() -> ViTSpace:
    return get_space("vit")


@pytest.fixture(scope="module")
def tiny() -> ViTSpace:
    """A small member of the family, for the slower checks (ONNX, training, quantization)."""
    return ViTSpace(ViTConfig(tokenizer_channels=(8,), embed_choices=(16, 24),
                              depth_choices=(1, 2), heads_choices=(1, 2),
                              mlp_ratio_choices=(1.0, 2.0), head_dim=8))


@pytest.fixture(scope="module")
def supernet(space):
    torch.manual_seed(0)
    return space.build_supernet().eval()


# -- declaration ---------------------------------------------------------------------------------

def test_string_form_and_tokens(space) -> None:
    assert space.cfg.num_tokens == 64  # 32 -> 16 -> 8
    arch = space.from_string("e224_h4m2-h3m1.5-h2m1-h4m2-h4m1")
    assert arch == ViTArch(224, ((4, 2.0), (3, 1.5), (2, 1.0), (4, 2.0), (4, 1.0)))
    assert space.to_string(arch) == "e224_h4m2-h3m1.5-h2m1-h4m2-h4m1"
    assert space.from_string("e224_h4m2.0-h3m1.5-h2m1-h4m2-h4m1") == arch  # same ratio
    assert space.to_string(space.smallest()) == "e192_" + "-".join(["h2m1"] * 5)


@pytest.mark.parametrize(("text", "what"), [
    ("e200_h4m2-h4m2-h4m2-h4m2-h4m2", "embedding dimension"),
    ("e192_h4m2-h4m2", "depth"),
    ("e192_h5m2-h4m2-h4m2-h4m2-h4m2", "heads of block 0"),
    ("e192_h4m2-h4m3-h4m2-h4m2-h4m2", "mlp ratio of block 1"),
    ("h4m2-h4m2-h4m2-h4m2-h4m2", "malformed architecture"),
    ("e192_h4m2-k3e4-h4m2-h4m2-h4m2", "malformed block"),
])
def test_bad_architectures_name_the_problem(space, text: str, what: str) -> None:
    with pytest.raises(UserError, match=what):
        space.from_string(text)


def test_bad_configuration_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown ViT space setting"):
        get_space("vit", config={"embed": 3})
    with pytest.raises(UserError, match="sorted and unique"):
        get_space("vit", config={"heads_choices": [4, 2]})
    with pytest.raises(UserError, match="must be integers"):
        get_space("vit", config={"embed_choices": [192.5]})


def test_restrict_gives_a_sub_space(space) -> None:
    sub = space.restrict({"embed": [256], "mlp_ratio": [2]})
    arch = sub.sample(np.random.default_rng(0))
    assert arch.embed == 256 and all(r == 2.0 for _, r in arch.blocks)
    assert space.parse(sub.to_string(arch)) == arch
    with pytest.raises(UserError, match="not a non-empty subset"):
        space.restrict({"heads": [5]})
    with pytest.raises(UserError, match="unknown dimension"):
        space.restrict({"kernel": [3]})


def test_progressive_schedule_opens_the_vit_dimensions(space) -> None:
    from hwnas.supernet.train import progressive_config

    config = progressive_config(space, 14)
    assert [s.name for s in config.stages][:2] == ["full", "mlp_ratio"]
    assert not any(s.sort_channels for s in config.stages)
    last = space.restrict(config.stages[-1].choices)
    assert last.elastic_choices() == space.elastic_choices()  # the whole space at the end
    first = space.restrict(config.stages[0].choices)
    assert first.smallest() == first.largest() == space.largest()


def test_the_space_asks_for_delayed_shrinking(space) -> None:
    from hwnas.supernet.train import default_config, sandwich_config

    config = default_config(space, 10, seed=3)
    assert [(s.name, s.epochs, s.sandwich) for s in config.stages] == [
        ("full", 5, False), ("shrink", 5, True)]
    assert config.lr == 0.01 and config.seed == 3
    assert default_config(space, 10, lr=0.02).lr == 0.02  # the caller's setting wins
    mbv3 = get_space("mbv3-tiny")  # the convolutional spaces keep the plain sandwich
    assert default_config(mbv3, 4, seed=1) == sandwich_config(4, seed=1)


def test_attention_layers_by_hand(space) -> None:
    """Q·Kᵀ of h heads of width d over n tokens: n·n·d·h MACs; its second operand is K."""
    arch = space.from_string("e192_h3m1.5-h2m1-h2m1-h2m1-h2m1")
    layers = {la.name: la for la in space.layers(arch)}
    n, d = 64, 64
    qk, av = layers["blocks.0.attn.qk"], layers["blocks.0.attn.av"]
    assert qk.macs == av.macs == 3 * n * n * d
    assert qk.second_operand == av.second_operand == 3 * n * d
    assert layers["blocks.0.attn.qkv"].macs == n * 192 * 3 * 3 * d
    assert layers["blocks.0.mlp.fc1"].out_channels == 288  # 192 × 1.5
    assert layers["blocks.0.norm1"].params == 2 * 192 and layers["blocks.0.norm1"].macs == 0
    assert layers["classifier"].macs == 192 * 10  # on the pooled vector
    ops = {la.op for la in space.layers(arch)}
    assert {"matmul", "layernorm", "softmax", "gelu"} <= ops


# -- layer list against the static model ---------------------------------------------------------

def _measure(model: nn.Module, x: torch.Tensor) -> dict[str, dict]:
    """Per module: input shapes, output shape and MACs of one image, from forward hooks."""
    from hwnas.supernet.nn.vit import MatMul

    found: dict[str, dict] = {}

    def hook(name):
        def fn(module, inputs, output):
            b = output.shape[0]
            ins = [tuple(t.shape) for t in inputs]
            macs = 0
            if isinstance(module, nn.Conv2d):
                k = module.kernel_size[0] * module.kernel_size[1]
                macs = output.numel() // b * (module.in_channels // module.groups) * k
            elif isinstance(module, nn.Linear):
                macs = inputs[0].numel() // b * module.out_features
            elif isinstance(module, MatMul):
                macs = output.numel() // b * inputs[0].shape[-1]
            params = sum(p.numel() for p in module.parameters(recurse=False))
            found[name] = {"in": ins, "out": tuple(output.shape), "macs": macs, "params": params,
                           "type": type(module)}
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n
               and isinstance(m, (nn.Conv2d, nn.Linear, nn.MaxPool2d, nn.LayerNorm, nn.Softmax,
                                  nn.GELU, MatMul))]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return found


def _expected(layer: Layer, b: int) -> tuple[tuple, int]:
    """The input shape (first operand) and output element count a layer record implies."""
    if layer.op in ("conv", "pool"):
        return (b, layer.in_channels, layer.in_h, layer.in_w), layer.out_channels * layer.out_h * layer.out_w
    if layer.op == "matmul":
        g = layer.groups
        return (b, g, layer.in_h, layer.in_channels // g), layer.out_channels * layer.in_h
    if layer.in_h * layer.in_w == 1:
        return (b, layer.in_channels), layer.out_channels
    shape = (b, layer.in_h, layer.in_channels)
    if layer.op in ("softmax",):  # (B, heads, rows, cols): rows × (heads · cols) per image
        return None, layer.out_channels * layer.in_h
    return shape, layer.out_channels * layer.in_h


@pytest.mark.parametrize("which", ["smallest", "largest", "random"])
def test_layer_list_matches_the_static_model(space, supernet, which) -> None:
    arch = {"smallest": space.smallest(), "largest": space.largest(),
            "random": space.sample(np.random.default_rng(7))}[which]
    model = supernet.extract(arch)
    b = 2
    found = _measure(model, torch.randn(b, *space.input_shape))
    layers = space.layers(arch)
    modules = [la for la in layers if la.op not in ("add", "avgpool")]
    assert {la.name for la in modules} == set(found)  # every module is a layer and vice versa
    for la in modules:
        got = found[la.name]
        shape, out_numel = _expected(la, b)
        if shape is not None:
            assert got["in"][0] == shape, la.name
        assert int(np.prod(got["out"])) // b == out_numel, la.name
        assert got["macs"] == la.macs, la.name
        assert got["params"] == la.params, la.name
        if la.op == "matmul":
            assert int(np.prod(got["in"][1])) // b == la.second_operand, la.name
    # FLOPs = 2 × MACs measured on the model; parameters = every parameter of the model
    assert 2 * sum(f["macs"] for f in found.values()) == space.flops(arch)
    assert sum(p.numel() for p in model.parameters()) == space.params(arch)
    # the quantizable modules are exactly the layer list's conv/linear layers
    quantizable = {n for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    assert quantizable == {la.name for la in layers if la.op in ("conv", "linear")}


# -- weight entanglement and extraction ----------------------------------------------------------

def test_supernet_holds_exactly_the_largest_subnet(space, supernet) -> None:
    n_super = sum(p.numel() for p in supernet.parameters())
    assert n_super == space.params(space.largest())


def test_subnets_share_the_leading_slices(space, supernet) -> None:
    big = supernet.extract(space.largest())
    small = supernet.extract("e192_h2m1-h3m1.5-h2m1-h2m1-h2m1")
    d = space.cfg.head_dim
    qkv_big = big.blocks[1].attn.qkv.weight.view(3, 4 * d, 256)
    qkv_small = small.blocks[1].attn.qkv.weight.view(3, 3 * d, 192)
    torch.testing.assert_close(qkv_small, qkv_big[:, : 3 * d, :192])  # Q, K and V sliced apart
    torch.testing.assert_close(small.blocks[1].mlp.fc1.weight, big.blocks[1].mlp.fc1.weight[:288, :192])
    torch.testing.assert_close(small.tokenizer[1].conv.weight, big.tokenizer[1].conv.weight[:192])
    torch.testing.assert_close(small.norm.weight, big.norm.weight[:192])
    qkv = supernet.blocks[1].qkv
    saved = qkv.bias.detach().clone()
    with torch.no_grad():
        qkv.bias.copy_(torch.arange(saved.numel(), dtype=saved.dtype))
    try:
        bias = supernet.extract("e192_h2m1-h3m1.5-h2m1-h2m1-h2m1").blocks[1].attn.qkv.bias
        want = torch.arange(3 * 4 * d, dtype=saved.dtype).view(3, 4 * d)[:, : 3 * d]
        assert torch.equal(bias.view(3, 3 * d), want)
    finally:
        with torch.no_grad():
            qkv.bias.copy_(saved)
    # one shared parameter: changing it changes every subnet that uses its slice
    x = torch.randn(1, *space.input_shape)
    supernet.set_active(space.smallest())
    with torch.no_grad():
        before = supernet(x)
        supernet.blocks[0].fc2.weight[0, 0] += 1.0
        try:
            assert not torch.allclose(supernet(x), before)
            again = supernet.extract(space.smallest())
            assert again.blocks[0].mlp.fc2.weight[0, 0] == supernet.blocks[0].fc2.weight[0, 0]
        finally:
            supernet.blocks[0].fc2.weight[0, 0] -= 1.0
            supernet.set_active(space.largest())


def test_extract_is_a_copy_and_leaves_the_active_subnet(space, supernet) -> None:
    supernet.set_active(space.largest())
    arch = space.sample(np.random.default_rng(11))
    model = supernet.extract(arch)
    assert supernet.active_arch() == space.largest()
    assert all(p.data_ptr() not in {q.data_ptr() for q in supernet.parameters()}
               for p in model.parameters())
    x = torch.randn(3, *space.input_shape)
    supernet.set_active(arch)
    try:
        with torch.no_grad():
            torch.testing.assert_close(model(x), supernet(x), rtol=1e-4, atol=1e-5)
    finally:
        supernet.set_active(space.largest())


# -- ONNX ----------------------------------------------------------------------------------------

def test_onnx_export_matches_onnxruntime(tiny) -> None:
    pytest.importorskip("onnxruntime")
    import onnx
    from hwnas.export.onnx_export import check_parity
    from hwnas.supernet.onnx import onnx_bytes

    torch.manual_seed(0)
    model = tiny.build_supernet().extract(tiny.largest())
    x = torch.randn(4, *tiny.input_shape, generator=torch.Generator().manual_seed(1))
    data = onnx_bytes(model, x[:1])
    ops = {node.op_type for node in onnx.load_from_string(data).graph.node}
    assert {"Conv", "MatMul", "Softmax", "LayerNormalization", "MaxPool"} <= ops
    report = check_parity(data, model, x, atol=1e-4)
    assert report.passed and report.top1_agreement == 1.0 and report.n == 4


# -- quantization --------------------------------------------------------------------------------

def test_int8_ptq_quantizes_linear_layers_and_attention_and_keeps_the_rest_float(tiny) -> None:
    from hwnas.quant.fake_quant import QuantConv2d, QuantLinear, QuantMatMul, SharedAddQuant
    from hwnas.quant.policy import apply_to_layers, uniform
    from hwnas.quant.ptq import PTQConfig, ptq

    torch.manual_seed(0)
    arch = tiny.largest()
    model = tiny.build_supernet().extract(arch)
    layers = tiny.layers(arch)
    policy = uniform(layers, 8, 8)
    policy.validate(model)  # the layer list names the model's quantizable layers
    x = torch.randn(16, *tiny.input_shape, generator=torch.Generator().manual_seed(0))
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


def test_lsq_qat_and_hessian_sensitivity_on_a_vit_subnet(tiny) -> None:
    """W4A8 LSQ fine-tuning lowers the loss of a vit subnet; the Hessian sensitivity has one
    entry per conv/linear layer, larger at 4 bits than at 8."""
    from hwnas.quant.fake_quant import QuantLinear
    from hwnas.quant.policy import uniform
    from hwnas.quant.qat import QATConfig, qat
    from hwnas.quant.sensitivity import hessian_sensitivity

    torch.manual_seed(0)
    model = tiny.build_supernet().extract(tiny.largest())
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(32, *tiny.input_shape, generator=gen), torch.randint(0, 10, (32,), generator=gen)
    result = qat(model, uniform(model, 4, 8), [(x, y)], [(x, y)],
                 QATConfig(epochs=4, lr=0.05, scale_lr=0.05, kd_weight=0.0, label_weight=1.0),
                 progress=False)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0]
    assert isinstance(result.model.get_submodule("blocks.0.attn.qkv"), QuantLinear)
    table = hessian_sensitivity(model, [(x, y)], [(4, 8), (8, 8)], n_samples=4)
    names = {la.name for la in tiny.layers(tiny.largest()) if la.op in ("conv", "linear")}
    assert set(table.values) == names
    assert all(v[(4, 8)] > v[(8, 8)] > 0 for v in table.values.values())


def test_qdq_export_runs_the_linear_layers_as_integer_kernels(tiny) -> None:
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
    model = tiny.build_supernet().extract(tiny.largest())
    x = torch.randn(16, *tiny.input_shape, generator=torch.Generator().manual_seed(2))
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
    linear = {la.name for la in tiny.layers(tiny.largest()) if la.op == "linear"}
    assert islands == [] and linear <= set(integer)
    assert {"Softmax", "LayerNormalization"} <= {n.op_type for n in proto.graph.node}


# -- training ------------------------------------------------------------------------------------

def _digits_folder(root) -> None:
    """scikit-learn's digits, three classes, as 32×32 RGB PNGs (an ImageFolder)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    bunch = load_digits()
    for cls in range(3):
        (root / str(cls)).mkdir(parents=True)
        images = bunch.images[bunch.target == cls][:30]
        for i, img in enumerate(images):
            gray = np.kron(img / 16.0 * 255.0, np.ones((4, 4))).astype(np.uint8)  # 8 -> 32
            rgb = np.stack([gray, 255 - gray, gray // 2], axis=-1)
            Image.fromarray(rgb, mode="RGB").save(root / str(cls) / f"{i}.png")


def test_hwnas_train_space_vit_one_epoch(tmp_path, monkeypatch) -> None:
    from hwnas.supernet.train import load_checkpoint

    from hwnas.cli import main

    _digits_folder(tmp_path / "digits32")
    # the registered vit preset, shrunk through its config so that one CPU epoch is quick
    small = ViTConfig(tokenizer_channels=(8,), embed_choices=(16, 32), depth_choices=(1, 2),
                      heads_choices=(1, 2), mlp_ratio_choices=(1.0, 2.0), head_dim=8)
    from hwnas.supernet import spaces

    def factory(*, in_channels=None, image_size=None, num_classes=None, config=None):
        from dataclasses import replace

        cfg = ViTConfig.from_dict(config) if config else small
        given = {"in_channels": in_channels, "image_size": image_size, "num_classes": num_classes}
        return ViTSpace(replace(cfg, **{k: v for k, v in given.items() if v is not None}),
                        name="vit")

    monkeypatch.setitem(spaces._FACTORIES, "vit", factory)
    out = tmp_path / "vit.pt"
    assert main(["train", "--space", "vit", "--dataset", str(tmp_path / "digits32"),
                 "--epochs", "1", "--out", str(out), "--quiet"]) == 0
    space, supernet, payload = load_checkpoint(out)
    assert space.name == "vit" and payload["space_config"]["embed_choices"] == [16, 32]
    assert space.input_shape == (3, 32, 32) and space.num_classes == 3
    trained = payload["train_config"]  # the space's own recipe: delayed shrinking at lr 0.01
    assert [s["name"] for s in trained["stages"]] == ["full", "shrink"] and trained["lr"] == 0.01
    x = torch.randn(2, 3, 32, 32)
    for arch in (space.smallest(), space.largest()):
        supernet.set_active(arch)
        assert torch.isfinite(supernet.eval()(x)).all()


def test_reinitialize_resets_layernorm_of_a_vit_subnet(tiny) -> None:
    from hwnas.supernet.train import reinitialize

    torch.manual_seed(0)
    model = tiny.build_supernet().extract(tiny.largest())
    with torch.no_grad():
        model.norm.weight.mul_(3.0).add_(1.0)
    reinitialize(model, seed=0)
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))
    assert torch.equal(model.blocks[0].norm1.bias, torch.zeros_like(model.blocks[0].norm1.bias))


def test_layer_timer_runs_a_token_wise_linear_layer(tiny) -> None:
    pytest.importorskip("onnxruntime")
    from hwnas.export.layer_timer import OrtLayerTimer

    fc1 = next(la for la in tiny.layers(tiny.largest()) if la.name == "blocks.0.mlp.fc1")
    timer = OrtLayerTimer(repeats=3, warmup=1)
    _, shape = timer._model_bytes(fc1)
    assert shape == (1, fc1.in_h, fc1.in_channels)
    assert timer(fc1, False) > 0 and timer(fc1, True) > 0
