"""The ``vit`` supernet (supernet.nn.vit): its layer list against the static model (shapes and
FLOPs measured with forward hooks), weight entanglement, extraction, ONNX export with
onnxruntime parity, one epoch of ``hwnas train`` and re-initialisation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hwnas.supernet.layers import Layer
from hwnas.supernet.spaces import ViTConfig, ViTSpace, get_space

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402


@pytest.fixture(scope="module")
def space() -> ViTSpace:
    return get_space("vit")


@pytest.fixture(scope="module")
def supernet(space):
    torch.manual_seed(0)
    return space.build_supernet().eval()


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

def test_onnx_export_matches_onnxruntime(vit_tiny) -> None:
    pytest.importorskip("onnxruntime")
    import onnx
    from hwnas.export.onnx_export import check_parity
    from hwnas.supernet.onnx import onnx_bytes

    torch.manual_seed(0)
    model = vit_tiny.build_supernet().extract(vit_tiny.largest())
    x = torch.randn(4, *vit_tiny.input_shape, generator=torch.Generator().manual_seed(1))
    data = onnx_bytes(model, x[:1])
    ops = {node.op_type for node in onnx.load_from_string(data).graph.node}
    assert {"Conv", "MatMul", "Softmax", "LayerNormalization", "MaxPool"} <= ops
    report = check_parity(data, model, x, atol=1e-4)
    assert report.passed and report.top1_agreement == 1.0 and report.n == 4


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

    monkeypatch.setitem(spaces.SPACES._entries, "vit", factory)  # restored after the test
    run = tmp_path / "vit-run"
    assert main(["train", "--space", "vit", "--dataset", str(tmp_path / "digits32"),
                 "--epochs", "1", "--out", str(run), "--quiet", "--eval"]) == 0
    evaluated = json.loads((run / "eval.json").read_text())  # no BatchNorm: no recalibration
    assert evaluated["bn_recalibration"] is False and len(evaluated["subnets"]) == 5
    space, supernet, payload = load_checkpoint(run / "supernet.pt")
    assert space.name == "vit" and payload["space_config"]["embed_choices"] == [16, 32]
    assert space.input_shape == (3, 32, 32) and space.num_classes == 3
    trained = payload["train_config"]  # the space's own recipe: delayed shrinking with AdamW
    assert [s["name"] for s in trained["stages"]] == ["full", "shrink"]
    assert (trained["optimizer"], trained["lr"]) == ("adamw", 5e-4)
    assert trained["augment"] == "trivial_crop_flip_cutout"  # RGB 32x32 images
    x = torch.randn(2, 3, 32, 32)
    for arch in (space.smallest(), space.largest()):
        supernet.set_active(arch)
        assert torch.isfinite(supernet.eval()(x)).all()


def test_reinitialize_resets_layernorm_of_a_vit_subnet(vit_tiny) -> None:
    from hwnas.supernet.train import reinitialize

    torch.manual_seed(0)
    model = vit_tiny.build_supernet().extract(vit_tiny.largest())
    with torch.no_grad():
        model.norm.weight.mul_(3.0).add_(1.0)
    reinitialize(model, seed=0)
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))
    assert torch.equal(model.blocks[0].norm1.bias, torch.zeros_like(model.blocks[0].norm1.bias))


def test_training_attention_is_the_fused_kernel_with_the_same_maths(space, supernet) -> None:
    """Training runs attention through scaled_dot_product_attention (one fused kernel on a
    GPU); it computes what the evaluation path (the static model's operations) computes."""
    supernet.set_active(space.largest())
    x = torch.randn(4, *space.input_shape)
    try:
        supernet.train()
        with torch.no_grad():
            fused = supernet(x)
    finally:
        supernet.eval()
    with torch.no_grad():
        plain = supernet(x)
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-5)
