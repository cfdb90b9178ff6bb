"""Tests for the NAS-Bench-201 weight-sharing supernet (supernet.nn.nb201): extraction, only
active ops trained, the layer list against the static model, ONNX parity, train/evaluate
smoke test."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.supernet.spaces import NB201Arch, NB201Space, get_space

from hwnas.core.errors import UserError

EXAMPLE = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def space() -> NB201Space:
    return get_space("nb201")


# --------------------------------------------------------------------------------------------
# the weight-sharing supernet (torch)
# --------------------------------------------------------------------------------------------

ATOL = 1e-5
#: nodes 1 and 2 are zero tensors (no active input), yet node 3 reads them through convs
ZERO_NODE = NB201Arch(("none", "none", "none", "avg_pool_3x3", "nor_conv_1x1", "nor_conv_3x3"))


def _model_check_archs(space) -> list[NB201Arch]:
    rng = np.random.default_rng(3)
    return [space.largest(), space.smallest(), ZERO_NODE, NB201Arch(("none",) * 6),
            space.from_string(EXAMPLE), *(space.sample(rng) for _ in range(4))]


@pytest.fixture(scope="module")
def trained(space):
    """A supernet whose BN statistics and affine terms are far from their initial values (a few
    train-mode passes over several cells), so extraction bugs cannot hide behind identities."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = space.build_supernet()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    rng = np.random.default_rng(0)
    net.train()
    with torch.no_grad():
        for arch in [space.largest(), space.smallest(), *(space.sample(rng) for _ in range(3))]:
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
    from hwnas.supernet.nn.nb201 import NB201Net

    outputs = {}
    for arch in _model_check_archs(space):
        model = trained.extract(arch)
        assert isinstance(model, NB201Net) and not model.training
        trained.set_active(arch)
        with torch.no_grad():
            expected, got = trained(x), model(x)
        assert got.shape == (3, 100)
        assert torch.allclose(got, expected, atol=ATOL), space.to_string(arch)
        outputs[arch] = expected
    trained.set_active(space.largest())
    # different cells compute different functions; an unconnected cell gives a constant output
    assert not torch.allclose(outputs[space.largest()], outputs[space.smallest()], atol=1e-3)
    dead = outputs[NB201Arch(("none",) * 6)]
    assert torch.allclose(dead, dead[:1].expand_as(dead), atol=1e-6)


def test_extract_keeps_active_arch_and_copies(trained, space, x):
    import torch

    arch = space.from_string(EXAMPLE)
    trained.set_active(arch)
    with torch.no_grad():
        before = trained(x)
        assert torch.allclose(trained.extract()(x), before, atol=ATOL)  # default: the active one
        model = trained.extract(space.largest())
        assert trained.active_arch() == arch
        assert torch.equal(trained(x), before)
        for p in model.parameters():
            p.add_(1.0)
        assert torch.equal(trained(x), before)  # the copy is independent
    with pytest.raises(UserError, match="edge"):
        trained.set_active("|conv~0|+|none~0|none~1|+|none~0|none~1|none~2|")
    assert trained.active_arch() == arch
    trained.set_active(space.largest())


def test_only_active_ops_get_gradients(space):
    torch = pytest.importorskip("torch")
    net = space.build_supernet().train()
    arch = NB201Arch(("nor_conv_1x1", "none", "nor_conv_3x3", "skip_connect", "none", "avg_pool_3x3"))
    net.set_active(space.to_string(arch))
    net(torch.randn(2, *space.input_shape)).square().sum().backward()
    cell = net.cells[0]
    assert cell.edges["e1_0"]["nor_conv_1x1"].conv.weight.grad.abs().sum() > 0
    assert cell.edges["e1_0"]["nor_conv_3x3"].conv.weight.grad is None
    assert cell.edges["e2_1"]["nor_conv_3x3"].conv.weight.grad.abs().sum() > 0
    assert cell.edges["e2_0"]["nor_conv_3x3"].conv.weight.grad is None
    assert net.cells[5].conv_a.conv.weight.grad is not None  # shared reduction block


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
                assert m.weight.numel() == la.weight_count
                # BN folds into every conv except the reduction shortcut's
                assert la.bias == (not la.name.endswith("shortcut_conv")), la.name
            else:
                assert (m.in_features, m.out_features) == (la.in_channels, la.out_channels)
        pools = {n: m for n, m in model.named_modules() if isinstance(m, nn.AvgPool2d)}
        pool_layers = [la for la in space.layers(arch) if la.op == "pool"]
        assert [la.name for la in pool_layers] == list(pools)
        for la in pool_layers:
            assert (pools[la.name].kernel_size, pools[la.name].stride) == (la.kernel, la.stride)


def test_layer_flops_match_forward_hooks(trained, space):
    import torch
    from torch import nn

    for arch in [space.largest(), space.smallest(), ZERO_NODE, space.from_string(EXAMPLE)]:
        model = trained.extract(arch)
        measured: dict[str, tuple[int, tuple, tuple]] = {}

        def hook(module, inputs, output, name):
            out = output[0].numel()
            if isinstance(module, nn.Conv2d):
                macs = out * (module.in_channels // module.groups) * module.kernel_size[0] * module.kernel_size[1]
            elif isinstance(module, nn.Linear):
                macs = out * module.in_features
            else:
                macs = 0
            measured[name] = (macs, tuple(inputs[0].shape[2:]), tuple(output.shape[2:]))

        handles = [m.register_forward_hook(lambda mod, i, o, name=name: hook(mod, i, o, name))
                   for name, m in model.named_modules()
                   if isinstance(m, (nn.Conv2d, nn.Linear, nn.AvgPool2d))]
        with torch.no_grad():
            model(torch.randn(2, *space.input_shape))
        for h in handles:
            h.remove()
        layers = {la.name: la for la in space.layers(arch) if la.op in ("conv", "linear", "pool")}
        assert set(layers) == set(measured)
        for name, la in layers.items():
            macs, in_hw, out_hw = measured[name]
            assert la.macs == macs, name
            if la.op != "linear":
                assert in_hw == (la.in_h, la.in_w) and out_hw == (la.out_h, la.out_w), name
        assert space.flops(arch) == 2 * sum(m for m, _, _ in measured.values())


def test_onnx_export_parity(trained, space, x):
    pytest.importorskip("onnxruntime")
    from hwnas.export.onnx_export import check_parity, onnx_bytes

    model = trained.extract(ZERO_NODE)
    report = check_parity(onnx_bytes(model, x[:1]), model, x)
    assert report.passed, report


def test_train_evaluate_checkpoint_smoke(tmp_path):
    """A few sandwich steps on tiny random data change the weights, and evaluate_subnet runs on
    the result (a 16x16, 10-class, one-cell-per-stage space keeps it fast)."""
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

    space = get_space("nb201", image_size=16, num_classes=10,
                      config={**get_space("nb201").config(), "cells_per_stage": 1})
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
    changed = [k for k, v in net.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("cells.0.edges.e1_0.nor_conv_3x3.conv") for k in changed)
    assert "stem.conv.weight" in changed
    acc, model = evaluate_subnet(net, space.smallest(), data, split="val", calib_batches=2)
    assert 0.0 <= acc <= 100.0 and not model.training
    # a checkpoint rebuilds the same space and supernet
    path = save_checkpoint(tmp_path / "supernet.pt", net, space, dataset="random")
    space2, net2, _ = load_checkpoint(path)
    assert space2.name == space.name and space2.config() == space.config()
    x = torch.randn(2, *space.input_shape, generator=gen)
    with torch.no_grad():
        assert torch.equal(net2.extract(space.smallest())(x), net.extract(space.smallest())(x))
