"""Tests for the weight-sharing MobileNetV3 supernet: extraction, weight sharing, gradients."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hwnas.supernet.nn.mbv3 import MBV3Net, MBV3Supernet
from hwnas.supernet.spaces import get_space
from torch import nn

from hwnas.core.errors import UserError

ATOL = 1e-5


@pytest.fixture(scope="module")
def space():
    return get_space("mbv3-tiny")


def _perturbed_supernet(space, batch: int = 16, n_random: int = 4) -> MBV3Supernet:
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
        archs = [space.largest(), space.smallest(), *(space.sample(rng) for _ in range(n_random))]
        for arch in archs:
            net.set_active(arch)
            for _ in range(2):
                net(torch.randn(batch, *space.input_shape, generator=gen) * 2 + 0.5)
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


# --------------------------------------------------------------------------------------------
# the "mbv3" space (OFA's MobileNetV3: SE, first block, feature-mix layer)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ofa_space():
    return get_space("mbv3")


@pytest.fixture(scope="module")
def ofa_net(ofa_space) -> MBV3Supernet:
    return _perturbed_supernet(ofa_space, batch=4, n_random=1)


@pytest.fixture(scope="module")
def ofa_x(ofa_space) -> torch.Tensor:
    return torch.randn(2, *ofa_space.input_shape, generator=torch.Generator().manual_seed(2))


def test_ofa_extract_matches_supernet(ofa_net, ofa_space, ofa_x):
    rng = np.random.default_rng(3)
    archs = [ofa_space.largest(), ofa_space.smallest(), *(ofa_space.sample(rng) for _ in range(3))]
    outputs = []
    for arch in archs:
        model = ofa_net.extract(arch)
        assert isinstance(model, MBV3Net) and model.first_block is not None
        assert sum(blk.se is not None for blk in model.blocks) == sum(arch.depths[s] for s in (1, 3, 4))
        with torch.no_grad():
            expected = _run(ofa_net, arch, ofa_x)
            got = model(ofa_x)
        assert got.shape == (2, 10)
        assert torch.allclose(got, expected, atol=ATOL), ofa_space.to_string(arch)
        outputs.append(expected)
    assert not torch.allclose(outputs[0], outputs[1], atol=1e-3)
    ofa_net.set_active(ofa_space.largest())


def test_ofa_se_follows_expanded_channels(ofa_net, ofa_space):
    model = ofa_net.extract(ofa_space.smallest())
    block = model.blocks[2]  # stage 1, first block: SE on 24*3 -> 72 channels
    assert block.dw_conv.out_channels == 72
    # make_divisible(72 // 4 = 18, 8) = 24 (16 would drop below 90% of 18)
    assert (block.se.reduce.in_channels, block.se.reduce.out_channels) == (72, 24)
    sup = ofa_net.stages[1][0].se
    assert sup.reduce.weight.shape[:2] == (40, 144)  # max: 24 * 6 = 144 -> 36 -> 40
    assert torch.equal(block.se.reduce.weight, sup.reduce.weight[:24, :72])
    assert torch.equal(block.se.expand.bias, sup.expand.bias[:72])


# --------------------------------------------------------------------------------------------
# channel sorting (OFA's re-organization)
# --------------------------------------------------------------------------------------------


def _expand_outputs(net, space, x, expand):
    """Outputs of a few subnets that all use expand ratio ``expand`` in every block."""
    rng = np.random.default_rng(11)
    archs = [space.largest()]
    for _ in range(1):
        a = space.sample(rng)
        archs.append(type(a)(tuple(tuple((k, expand) for k, _ in st) for st in a.stages)))
    archs[0] = type(archs[0])(tuple(tuple((k, expand) for k, _ in st) for st in archs[0].stages))
    return [_run(net, a, x) for a in archs]


@pytest.mark.parametrize("name", ["mbv3-tiny", "mbv3"])
def test_sort_channels_keeps_largest_width_function(name, request):
    space = get_space(name)
    net = copy.deepcopy(request.getfixturevalue("trained" if name == "mbv3-tiny" else "ofa_net"))
    x = torch.randn(2, *space.input_shape, generator=torch.Generator().manual_seed(5))
    big = space.cfg.expand_choices[-1]
    small_e = space.cfg.expand_choices[0]
    before = _expand_outputs(net, space, x, big)
    before_small = _expand_outputs(net, space, x, small_e)
    net.sort_channels()
    for b, a in zip(before, _expand_outputs(net, space, x, big)):
        assert torch.allclose(a, b, atol=1e-5)
    # smaller widths now use other (more important) channels
    assert any(not torch.allclose(a, b, atol=1e-4)
               for a, b in zip(before_small, _expand_outputs(net, space, x, small_e)))
    for stage in net.stages:
        for block in stage:
            imp = block.project_conv.weight.abs().sum(dim=(0, 2, 3))
            assert torch.all(imp[:-1] >= imp[1:])  # most important first
            if block.se is not None:
                imp_se = block.se.expand.weight.abs().sum(dim=(0, 2, 3))
                assert torch.all(imp_se[:-1] >= imp_se[1:])
    # sorting twice changes nothing
    state = {k: v.clone() for k, v in net.state_dict().items()}
    net.sort_channels()
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())


def test_sort_channels_keeps_trained_widths(ofa_net, ofa_space):
    space, net = ofa_space, copy.deepcopy(ofa_net)
    x = torch.randn(2, *space.input_shape, generator=torch.Generator().manual_seed(6))
    block = net.stages[1][0]
    w4 = space.block_channels(block.in_ch, 4)
    prefix_before = {tuple(r.tolist()) for r in block.expand_conv.weight[:w4, :, 0, 0]}
    before4 = _expand_outputs(net, space, x, 4)
    net.sort_channels(trained={"expand": [4, 6]})
    prefix_after = {tuple(r.tolist()) for r in block.expand_conv.weight[:w4, :, 0, 0]}
    assert prefix_after == prefix_before  # the e4 channel set stays, only reordered
    for b, a in zip(before4, _expand_outputs(net, space, x, 4)):
        assert torch.allclose(a, b, atol=1e-5)
    imp = block.project_conv.weight.abs().sum(dim=(0, 2, 3))
    assert torch.all(imp[: w4 - 1] >= imp[1:w4]) and torch.all(imp[w4:-1] >= imp[w4 + 1:])


def test_sort_channels_permutes_optimizer_state():
    """Sorting in the middle of training (momentum included) gives the same function as not
    sorting: the permutation commutes with the SGD step."""
    space = get_space("mbv3-tiny")
    a = _perturbed_supernet(space).train()
    b = copy.deepcopy(a)
    opts = [torch.optim.SGD(n.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3) for n in (a, b)]
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(8, *space.input_shape, generator=gen) for _ in range(3)]

    def step(net, opt, x):
        opt.zero_grad()
        net.set_active(space.largest())
        net(x).square().mean().backward()
        opt.step()

    for n, o in zip((a, b), opts):
        step(n, o, xs[0])
    a.sort_channels(optimizer=opts[0])
    for x in xs[1:]:
        for n, o in zip((a, b), opts):
            step(n, o, x)
    a.eval(), b.eval()
    with torch.no_grad():
        assert torch.allclose(a(xs[0]), b(xs[0]), atol=1e-5)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("stride,kernel", [(1, 3), (2, 5)])
def test_native_depthwise_equals_conv2d(channels_last, stride, kernel):
    """The GPU path of the supernets' depthwise convolutions (PyTorch's kernels, cuDNN off;
    forced here on the CPU) gives F.conv2d's outputs and gradients, in float and under
    autocast, where it casts as F.conv2d would."""
    import torch.nn.functional as F
    from hwnas.supernet.nn.dynamic_ops import depthwise_conv2d

    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(4, 8, 9, 9).to(memory_format=fmt).requires_grad_()
    w = torch.randn(8, 1, kernel, kernel, requires_grad=True)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y = depthwise_conv2d(x, w, stride, kernel // 2, native=True)
    ref = F.conv2d(x2, w2, None, stride, kernel // 2, 1, 8)
    g = torch.randn_like(ref)
    y.backward(g)
    ref.backward(g)
    assert torch.equal(y, ref) and torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = depthwise_conv2d(x, w, stride, kernel // 2, native=True)
        ref = F.conv2d(x, w, None, stride, kernel // 2, 1, 8)
    assert y.dtype == ref.dtype == torch.bfloat16 and torch.equal(y, ref)
    x.grad = None
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32


def test_native_depthwise_is_twice_differentiable():
    """The sensitivity seeds' Hessian-vector products run through the supernets' depthwise
    convolutions: the GPU path's double backward equals F.conv2d's."""
    from hwnas.supernet.nn.dynamic_ops import depthwise_conv2d

    torch.manual_seed(0)
    x = torch.randn(2, 6, 7, 7, requires_grad=True)
    w = torch.randn(6, 1, 3, 3, requires_grad=True)
    v = torch.randn_like(w)

    def hvp(native):
        loss = (depthwise_conv2d(x, w, 1, 1, native=native).tanh() ** 2).sum()
        g, = torch.autograd.grad(loss, w, create_graph=True)
        return torch.autograd.grad((g * v).sum(), (w, x))

    for a, b in zip(hvp(True), hvp(False)):
        assert torch.allclose(a, b, atol=1e-5)
