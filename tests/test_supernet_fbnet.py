"""Tests for the FBNet weight-sharing supernet (supernet.nn.fbnet): extraction, weight
sharing, the layer list against the static model, ONNX parity, train/evaluate smoke test."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.supernet.spaces import FBNetArch, FBNetSpace, get_space
from hwnas.supernet.spaces.fbnet import FBNET_BLOCKS

from hwnas.core.errors import UserError

N_LAYERS = 22


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def space() -> FBNetSpace:
    return get_space("fbnet")


# --------------------------------------------------------------------------------------------
# the weight-sharing supernet (torch)
# --------------------------------------------------------------------------------------------

ATOL = 1e-5


def _model_check_archs(space) -> list[FBNetArch]:
    rng = np.random.default_rng(3)
    every_block = FBNetArch(tuple(FBNET_BLOCKS[i % 9] for i in range(N_LAYERS)))
    shifted = FBNetArch(tuple(FBNET_BLOCKS[(i + 4) % 9] for i in range(N_LAYERS)))
    return [space.largest(), space.smallest(), every_block, shifted, *(space.sample(rng) for _ in range(3))]


@pytest.fixture(scope="module")
def trained(space):
    """A supernet whose BN statistics, BN affine terms and kernel transforms are far from their
    initial values, so extraction bugs cannot hide behind identities."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = space.build_supernet()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "transforms" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    rng = np.random.default_rng(0)
    net.train()
    with torch.no_grad():
        for arch in [space.largest(), space.smallest(), *_model_check_archs(space)[2:4],
                     *(space.sample(rng) for _ in range(2))]:
            net.set_active(arch)
            net(torch.randn(8, *space.input_shape, generator=gen) * 2 + 0.5)
    net.set_active(space.largest())
    return net.eval()


@pytest.fixture(scope="module")
def x(space):
    torch = pytest.importorskip("torch")
    return torch.randn(3, *space.input_shape, generator=torch.Generator().manual_seed(2))


def test_extract_matches_supernet(trained, space, x):
    import torch
    from hwnas.supernet.nn.fbnet import FBNetNet

    outputs = []
    for arch in _model_check_archs(space):
        model = trained.extract(arch)
        assert isinstance(model, FBNetNet) and not model.training
        trained.set_active(arch)
        with torch.no_grad():
            expected, got = trained(x), model(x)
        assert got.shape == (3, 100)
        assert torch.allclose(got, expected, atol=ATOL), space.to_string(arch)
        outputs.append(expected)
    trained.set_active(space.largest())
    assert not torch.allclose(outputs[0], outputs[1], atol=1e-3)


def test_extract_keeps_active_arch_and_copies(trained, space, x):
    import torch

    arch = _model_check_archs(space)[2]
    trained.set_active(space.to_string(arch))
    assert trained.active_arch() == arch
    with torch.no_grad():
        before = trained(x)
        assert torch.allclose(trained.extract()(x), before, atol=ATOL)
        model = trained.extract(space.smallest())
        assert trained.active_arch() == arch
        for p in model.parameters():
            p.add_(1.0)
        assert torch.equal(trained(x), before)
    with pytest.raises(UserError, match="layer 0"):
        trained.set_active("-".join(["k7_e1"] + ["skip"] * 21))
    assert trained.active_arch() == arch
    trained.set_active(space.largest())


def test_weight_sharing(trained, space):
    """e1/e3/e6 slice one expand/project weight, k3 is the transformed centre of k5, the grouped
    blocks share their own weights."""
    import torch

    def block(text, i=1):
        return trained.extract(FBNetArch((text,) * N_LAYERS)).blocks[i]

    big, small, k3 = block("k5_e6"), block("k5_e1"), block("k3_e3")
    assert torch.equal(small.expand_conv.weight, big.expand_conv.weight[:16])
    assert torch.equal(k3.expand_conv.weight, big.expand_conv.weight[:48])
    assert torch.equal(k3.project_conv.weight, big.project_conv.weight[:, :48])
    assert torch.equal(small.expand_bn.running_mean, big.expand_bn.running_mean[:16])
    layer = trained.blocks[1]
    assert torch.equal(big.dw_conv.weight, layer.dw_conv.weight)
    centre = layer.dw_conv.weight[:48, :, 1:4, 1:4].reshape(48, 9) @ layer.dw_conv.transforms["3"].T
    assert torch.allclose(k3.dw_conv.weight, centre.reshape(48, 1, 3, 3), atol=1e-6)
    g3, g5 = block("k3_e1_g2"), block("k5_e1_g2")
    assert g3.expand_conv.groups == 2 and torch.equal(g3.expand_conv.weight, g5.expand_conv.weight)
    assert torch.equal(g3.project_conv.weight, g5.project_conv.weight)
    assert torch.equal(g3.dw_conv.weight,
                       layer.g_dw_conv.active_weight(16, 3).detach())


def test_only_active_weights_get_gradients(space):
    torch = pytest.importorskip("torch")
    net = space.build_supernet().train()
    net.set_active(FBNetArch(("k3_e3", "k3_e1_g2", "skip") + ("skip",) * 19))
    net(torch.randn(2, *space.input_shape)).square().sum().backward()
    first, second, third = net.blocks[0], net.blocks[1], net.blocks[2]
    assert torch.count_nonzero(first.expand_conv.weight.grad[48:]) == 0
    assert first.expand_conv.weight.grad[:48].abs().sum() > 0
    assert torch.count_nonzero(first.dw_conv.weight.grad[:, :, 0, :]) == 0  # 3x3: centre only
    assert first.g_expand_conv.weight.grad is None
    assert second.g_expand_conv.weight.grad.abs().sum() > 0
    assert second.expand_conv.weight.grad is None
    assert third.expand_conv.weight.grad is None  # identity skip: nothing trained


def test_channel_shuffle():
    torch = pytest.importorskip("torch")
    from hwnas.supernet.nn.fbnet import channel_shuffle

    x = torch.arange(6.0).reshape(1, 6, 1, 1)
    assert channel_shuffle(x, 2).flatten().tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]


def test_layer_names_and_shapes_match_static_model(trained, space):
    from torch import nn

    for arch in _model_check_archs(space):
        model = trained.extract(arch)
        modules = {n: m for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
        layers = [la for la in space.layers(arch) if la.op in ("conv", "linear")]
        assert [la.name for la in layers] == list(modules)
        for la in layers:
            m = modules[la.name]
            if la.op == "conv":
                assert (m.in_channels, m.out_channels, m.groups) == (la.in_channels, la.out_channels, la.groups)
                assert m.kernel_size == (la.kernel,) * 2 and m.stride == (la.stride,) * 2
                assert m.padding == (la.kernel // 2,) * 2
                assert m.weight.numel() == la.weight_count and la.bias  # every conv has a BN
            else:
                assert (m.in_features, m.out_features) == (la.in_channels, la.out_channels)
        adds = [la.name for la in space.layers(arch) if la.op == "add"]
        residual = [f"blocks.{i}.add" for i, b in enumerate(model.blocks) if getattr(b, "residual", False)]
        assert adds == residual


def test_layer_flops_match_forward_hooks(trained, space):
    import torch
    from torch import nn

    for arch in _model_check_archs(space)[:4]:
        model = trained.extract(arch)
        measured: dict[str, tuple[int, tuple, tuple]] = {}

        def hook(module, inputs, output, name):
            out = output[0].numel()
            if isinstance(module, nn.Conv2d):
                macs = out * (module.in_channels // module.groups) * module.kernel_size[0] * module.kernel_size[1]
            else:
                macs = out * module.in_features
            measured[name] = (macs, tuple(inputs[0].shape[2:]), tuple(output.shape[2:]))

        handles = [m.register_forward_hook(lambda mod, i, o, name=name: hook(mod, i, o, name))
                   for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        with torch.no_grad():
            model(torch.randn(2, *space.input_shape))
        for h in handles:
            h.remove()
        layers = {la.name: la for la in space.layers(arch) if la.op in ("conv", "linear")}
        assert set(layers) == set(measured)
        for name, la in layers.items():
            macs, in_hw, out_hw = measured[name]
            assert la.macs == macs, name
            if la.op == "conv":
                assert in_hw == (la.in_h, la.in_w) and out_hw == (la.out_h, la.out_w), name
        assert space.flops(arch) == 2 * sum(m for m, _, _ in measured.values())


def test_onnx_export_parity(trained, space, x):
    pytest.importorskip("onnxruntime")
    from hwnas.export.onnx_export import check_parity, onnx_bytes

    model = trained.extract(space.smallest())  # includes grouped blocks and projecting skips
    report = check_parity(onnx_bytes(model, x[:1]), model, x)
    assert report.passed, report


def test_train_evaluate_checkpoint_smoke(tmp_path):
    """A few sandwich steps on tiny random 16x16 data change the weights, and evaluate_subnet
    runs on the result."""
    torch = pytest.importorskip("torch")
    from hwnas.supernet.data import DatasetSplits, ImageSplit
    from hwnas.supernet.evaluate import evaluate_subnet
    from hwnas.supernet.train import (
        TrainConfig,
        TrainStage,
        load_checkpoint,
        save_checkpoint,
        train_supernet,
    )

    space = get_space("fbnet", image_size=16, num_classes=10)
    gen = torch.Generator().manual_seed(0)

    def split(n):
        return ImageSplit(torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8, generator=gen),
                          torch.randint(0, 10, (n,), generator=gen))

    data = DatasetSplits("random", split(32), split(16), split(16), [str(i) for i in range(10)],
                         (0.5,) * 3, (0.25,) * 3, "crop_flip")
    net = space.build_supernet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    config = TrainConfig(stages=[TrainStage("s", 1, num_random=1)], batch_size=16, warmup_epochs=0)
    result = train_supernet(net, space, data, config, progress=False)
    assert result.epochs == 1 and np.isfinite(result.history[0]["loss_largest"])
    changed = {k for k, v in net.state_dict().items() if not torch.equal(v, before[k])}
    assert {"blocks.0.expand_conv.weight", "stem.conv.weight", "classifier.weight"} <= changed
    acc, model = evaluate_subnet(net, space.smallest(), data, split="val", calib_batches=2)
    assert 0.0 <= acc <= 100.0 and not model.training
    # a checkpoint rebuilds the same space and supernet
    path = save_checkpoint(tmp_path / "supernet.pt", net, space, dataset="random")
    space2, net2, _ = load_checkpoint(path)
    assert space2.name == space.name and space2.config() == space.config()
    x = torch.randn(2, *space.input_shape, generator=gen)
    with torch.no_grad():
        assert torch.equal(net2.extract(space.smallest())(x), net.extract(space.smallest())(x))
