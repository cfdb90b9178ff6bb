"""Tests for the weight-sharing MobileNetV3 supernet: extraction, weight sharing, gradients."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from supernet.errors import UserError
from supernet.nn.mbv3 import MBV3Net, MBV3Supernet
from supernet.spaces import get_space

ATOL = 1e-5


@pytest.fixture(scope="module")
def space():
    return get_space("mbv3-tiny")


def _perturbed_supernet(space) -> MBV3Supernet:
    """A supernet whose BN statistics, BN affine terms and kernel transforms are all far from
    their initial values, so that extraction bugs cannot hide behind identities."""
    torch.manual_seed(0)
    net = space.build_supernet()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "transforms" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:  # BN affine terms and the classifier bias
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    rng = np.random.default_rng(0)
    net.train()
    with torch.no_grad():
        archs = [space.largest(), space.smallest(), *(space.sample(rng) for _ in range(4))]
        for arch in archs:
            net.set_active(arch)
            for _ in range(2):
                net(torch.randn(16, *space.input_shape, generator=gen) * 2 + 0.5)
    net.set_active(space.largest())
    return net.eval()


@pytest.fixture(scope="module")
def trained(space) -> MBV3Supernet:
    return _perturbed_supernet(space)


@pytest.fixture
def net(trained) -> MBV3Supernet:
    """A private copy for tests that modify the supernet."""
    return copy.deepcopy(trained)


@pytest.fixture(scope="module")
def x(space) -> torch.Tensor:
    return torch.randn(4, *space.input_shape, generator=torch.Generator().manual_seed(2))


def _run(net: MBV3Supernet, arch, x: torch.Tensor) -> torch.Tensor:
    net.set_active(arch)
    with torch.no_grad():
        return net(x)


def test_bn_statistics_are_nontrivial(trained):
    bn = trained.stages[0][0].expand_bn
    assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))


def test_extract_matches_supernet(trained, space, x):
    rng = np.random.default_rng(3)
    archs = [space.largest(), space.smallest(), *(space.sample(rng) for _ in range(10))]
    outputs = []
    for arch in archs:
        model = trained.extract(arch)
        assert isinstance(model, MBV3Net)
        assert not model.training
        with torch.no_grad():
            expected = _run(trained, arch, x)
            got = model(x)
        assert got.shape == (4, space.num_classes)
        assert torch.allclose(got, expected, atol=ATOL), space.to_string(arch)
        outputs.append(expected)
    # the archs really compute different functions (so the comparison above is not vacuous)
    assert not torch.allclose(outputs[0], outputs[1], atol=1e-3)
    trained.set_active(space.largest())


def test_extract_default_is_active_arch(trained, space, x):
    arch = space.sample(np.random.default_rng(4))
    trained.set_active(arch)
    try:
        with torch.no_grad():
            assert torch.allclose(trained.extract()(x), trained(x), atol=ATOL)
    finally:
        trained.set_active(space.largest())


def test_extract_leaves_active_arch_unchanged(net, space, x):
    rng = np.random.default_rng(5)
    active, other = space.sample(rng), space.smallest()
    net.set_active(active)
    with torch.no_grad():
        before = net(x)
    net.extract(other)
    net.extract(space.to_string(space.largest()))
    assert net.active_arch() == active
    with torch.no_grad():
        assert torch.equal(net(x), before)


def test_extracted_model_is_independent(net, space, x):
    arch = space.smallest()
    model = net.extract(arch)
    before_super = _run(net, arch, x)
    with torch.no_grad():
        before_model = model(x)
        for p in model.parameters():
            p.add_(1.0)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.add_(1.0)
    assert torch.equal(_run(net, arch, x), before_super)
    # and the other way round: changing the supernet does not change the extracted copy
    model2 = net.extract(arch)
    with torch.no_grad():
        out2 = model2(x)
        for p in net.parameters():
            p.mul_(0.5)
        assert torch.equal(model2(x), out2)
        assert not torch.allclose(model(x), before_model)


def test_kernel_transform_matters(net, space, x):
    small, large = space.smallest(), space.largest()  # k3 everywhere / k7 everywhere
    before_small, before_large = _run(net, small, x), _run(net, large, x)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "transforms" in name:
                p.add_(0.2 * torch.randn_like(p))
    after_small, after_large = _run(net, small, x), _run(net, large, x)
    assert not torch.allclose(after_small, before_small, atol=1e-4)
    assert torch.equal(after_large, before_large)
    # extraction uses the new transforms too
    assert torch.allclose(net.extract(small)(x), after_small, atol=ATOL)


def test_depthwise_kernel_is_transformed_centre(trained):
    dw = trained.stages[0][0].dw_conv
    w = dw.weight.detach()
    with torch.no_grad():
        k7 = dw.active_weight(8, 7)
        k5 = dw.active_weight(8, 5)
        k3 = dw.active_weight(8, 3)
    assert torch.equal(k7, w[:8])
    t5, t3 = dw.transforms["5"].detach(), dw.transforms["3"].detach()
    exp5 = (w[:8, :, 1:6, 1:6].reshape(8, 25) @ t5.T).reshape(8, 1, 5, 5)
    assert torch.allclose(k5, exp5, atol=1e-6)
    exp3 = (exp5[:, :, 1:4, 1:4].reshape(8, 9) @ t3.T).reshape(8, 1, 3, 3)
    assert torch.allclose(k3, exp3, atol=1e-6)


def test_weight_sharing(trained, space):
    small = trained.extract(space.smallest())
    large = trained.extract(space.largest())
    for i_small, i_large in ((0, 0), (1, 3), (2, 6)):  # first block of each stage
        bs, bl = small.blocks[i_small], large.blocks[i_large]
        mid = bs.expand_conv.out_channels
        assert mid < bl.expand_conv.out_channels
        assert torch.equal(bs.expand_conv.weight, bl.expand_conv.weight[:mid])
        assert torch.equal(bs.project_conv.weight, bl.project_conv.weight[:, :mid])
        assert torch.equal(bs.expand_bn.weight, bl.expand_bn.weight[:mid])
        assert torch.equal(bs.expand_bn.running_mean, bl.expand_bn.running_mean[:mid])
        assert torch.equal(bs.dw_bn.running_var, bl.dw_bn.running_var[:mid])
    assert torch.equal(small.stem_conv.weight, large.stem_conv.weight)
    assert torch.equal(small.classifier.weight, large.classifier.weight)
    # and the slices are of the supernet's own parameters
    sup = trained.stages[0][0].expand_conv.weight
    assert torch.equal(large.blocks[0].expand_conv.weight, sup)


def test_set_active_accepts_string(net, space, x):
    arch = space.sample(np.random.default_rng(6))
    text = space.to_string(arch)
    expected = _run(net, arch, x)
    net.set_active(space.largest())
    assert net.set_active(text) == arch
    assert net.active_arch() == arch
    with torch.no_grad():
        assert torch.equal(net(x), expected)
    with pytest.raises(UserError):
        net.set_active("k3e2_k3e2")
    assert net.active_arch() == arch  # a rejected string changes nothing


def test_gradients_flow_only_to_active_slice(net, space, x):
    net.train()
    net.zero_grad(set_to_none=True)
    net.set_active(space.smallest())
    net(x).square().sum().backward()
    block = net.stages[0][0]
    mid = space.block_channels(block.in_ch, space.cfg.expand_choices[0])
    assert mid < block.expand_conv.weight.shape[0]
    grad = block.expand_conv.weight.grad
    assert grad is not None
    assert grad[:mid].abs().sum() > 0
    assert torch.count_nonzero(grad[mid:]) == 0
    dw_grad = block.dw_conv.weight.grad
    assert dw_grad[:mid].abs().sum() > 0
    assert torch.count_nonzero(dw_grad[mid:]) == 0
    # a 3x3 kernel only touches the centre of the 7x7 weight
    assert torch.count_nonzero(dw_grad[:, :, 0, :]) == 0
    assert torch.count_nonzero(dw_grad[:, :, :, 6]) == 0
    assert torch.count_nonzero(block.project_conv.weight.grad[:, mid:]) == 0
    assert torch.count_nonzero(block.expand_bn.weight.grad[mid:]) == 0
    # both kernel transforms (7->5 and 5->3) are trained
    assert block.dw_conv.transforms["5"].grad.abs().sum() > 0
    assert block.dw_conv.transforms["3"].grad.abs().sum() > 0
    # inactive blocks (depth 1) get no gradient at all
    assert net.stages[0][1].expand_conv.weight.grad is None
    assert net.stages[2][2].project_conv.weight.grad is None
