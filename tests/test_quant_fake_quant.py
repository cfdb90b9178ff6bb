"""BN folding and fake quantization: exactness of folding, levels per channel, STE and LSQ
gradients, shared residual-add quantizers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hwnas.quant.fake_quant import (
    FakeQuantize,
    QuantConv2d,
    SharedAddQuant,
    quantizers,
    reference_fake_quant,
)
from hwnas.quant.fold import fold_bn
from hwnas.quant.policy import uniform
from hwnas.quant.ptq import PTQConfig, ptq, quantize_model
from hwnas.supernet.spaces import get_space
from torch import nn

from hwnas.core.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _randomise_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g))
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.3)
                m.weight.copy_(torch.randn(m.num_features, generator=g))
                m.bias.copy_(torch.randn(m.num_features, generator=g))
    return model


@pytest.fixture(scope="module")
def mbv3_subnet():
    torch.manual_seed(0)
    space = get_space("mbv3-tiny")
    return _randomise_bn(space.build_supernet().extract(space.largest()))


def test_fold_bn_is_exact_on_an_mbv3_subnet(mbv3_subnet):
    x = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    folded = fold_bn(mbv3_subnet)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    assert isinstance(folded.get_submodule("blocks.0.dw_bn"), nn.Identity)
    assert folded.get_submodule("blocks.0.dw_conv").bias is not None
    with torch.no_grad():
        ref, got = mbv3_subnet.eval()(x), folded(x)
    assert torch.allclose(ref, got, atol=1e-5, rtol=1e-5)
    # the original still has its BatchNorms
    assert isinstance(mbv3_subnet.get_submodule("blocks.0.dw_bn"), nn.BatchNorm2d)


class _Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = self.bn(self.conv(x))
        if y.sum() > -1e9:
            y = F.relu(y)
        return self.fc(y.mean((2, 3)))


def test_fold_bn_falls_back_to_hooks_for_untraceable_models():
    model = _randomise_bn(_Untraceable()).eval()
    x = torch.randn(4, 2, 5, 5)
    with pytest.raises(UserError, match="pass an example input"):
        fold_bn(model)
    folded = fold_bn(model, example_input=x)
    assert isinstance(folded.bn, nn.Identity)
    with torch.no_grad():
        assert torch.allclose(model(x), folded(x), atol=1e-5)


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
def test_weight_fake_quant_has_at_most_2_pow_b_levels_per_channel(bits):
    w = torch.randn(8, 4, 3, 3, generator=torch.Generator().manual_seed(bits))
    q = FakeQuantize(bits, "weight", channels=8)
    q.set_qparams(w.abs().amax((1, 2, 3)) / (2 ** (bits - 1) - 1))
    out = q(w)
    for c in range(8):
        levels = torch.unique(out[c])
        assert len(levels) <= 2 ** bits
        assert len(levels) >= min(2 ** bits - 1, 3)  # it really quantizes, but not to nothing
        # symmetric grid on this channel's scale: every value is an integer multiple of it
        ratio = out[c] / q.scale[c]
        assert torch.allclose(ratio, ratio.round(), atol=1e-4)
    assert (out - w).abs().max() <= q.scale.max() / 2 + 1e-6


def test_float_bits_is_the_identity_and_uncalibrated_refuses():
    x = torch.randn(3, 5)
    assert torch.equal(FakeQuantize(32, "act")(x), x)
    with pytest.raises(RuntimeError, match="before calibration"):
        FakeQuantize(8, "act")(x)


def test_ste_gradient_passes_inside_the_range_and_stops_outside():
    q = FakeQuantize(4, "act")
    q.set_qparams(0.1, 3)  # range [-0.3, 1.2]
    x = torch.tensor([-1.0, -0.2, 0.0, 0.55, 1.1, 5.0], requires_grad=True)
    q(x).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("kind", ["weight", "act"])
def test_fused_kernels_match_the_reference_values_and_lsq_gradients(kind):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 5, generator=g) * 2
    if kind == "weight":
        q = FakeQuantize(4, "weight", channels=4)
        q.set_qparams(torch.rand(4, generator=g) * 0.2 + 0.1)
        shape = (4, 1, 1, 1)
    else:
        q = FakeQuantize(6, "act")
        q.set_qparams(0.07, 20)
        shape = (1, 1, 1, 1)
    q.grad_scale = 0.05
    q.scale.requires_grad_(True)
    weights = torch.arange(x.numel(), dtype=torch.float32).view_as(x) / x.numel()
    x1 = x.clone().requires_grad_(True)
    (q(x1) * weights).sum().backward()
    s2 = q.scale.detach().clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    ref = reference_fake_quant(x2, s2.view(shape), q.zero_point.view(shape), q.qmin, q.qmax, 0.05)
    (ref * weights).sum().backward()
    assert torch.allclose(q(x), ref, atol=1e-6)
    assert torch.allclose(q.scale.grad, s2.grad, rtol=1e-4, atol=1e-5)
    assert torch.allclose(x1.grad, x2.grad)


def test_quant_conv_matches_float_conv_at_32_bits():
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1, groups=1)
    qconv = QuantConv2d.from_float(conv, 32, 32)
    x = torch.randn(2, 3, 9, 9)
    assert torch.allclose(conv(x), qconv(x))
    assert (qconv.w_bits, qconv.a_bits) == (32, 32)


def test_shared_add_quant_is_inserted_at_the_layer_list_names(mbv3_subnet):
    space = get_space("mbv3-tiny")
    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    policy = uniform(mbv3_subnet, 8, 8)
    qmodel = ptq(mbv3_subnet, policy, [(x, None)], PTQConfig(residual="shared", bias_correction=False))
    adds = {n for n, m in qmodel.named_modules() if isinstance(m, SharedAddQuant)}
    expected = {layer.name for layer in space.layers(space.largest()) if layer.op == "add"}
    assert adds == expected and adds
    add = qmodel.get_submodule(sorted(adds)[0])
    assert add.input_quant.calibrated
    # both inputs share one grid: each quantized input is an integer multiple of the one scale
    a, b = torch.randn(10) * 0.3, torch.randn(10) * 0.3
    s, z = float(add.input_quant.scale), float(add.input_quant.zero_point)
    qa, qb = add.input_quant(a), add.input_quant(b)
    assert torch.allclose(qa / s, (qa / s).round(), atol=1e-4)
    assert torch.allclose(qb / s, (qb / s).round(), atol=1e-4)
    # the quantized network still computes nearly the float outputs at 8 bits
    with torch.no_grad():
        ref, got = mbv3_subnet(x), qmodel(x)
    assert (ref - got).abs().max() < 0.1 * ref.abs().max()
    assert all(q.calibrated for _, q in quantizers(qmodel) if not q.is_float)
    assert z == round(z)


def test_quantize_model_refuses_an_already_quantized_model(mbv3_subnet):
    qmodel = quantize_model(mbv3_subnet, uniform(mbv3_subnet, 8, 8))
    with pytest.raises(UserError, match="already quantized"):
        quantize_model(qmodel, uniform(qmodel, 8, 8))


@pytest.mark.parametrize("space_name", ["mbv3-tiny", "mbv3", "nb201", "fbnet", "vit"])
def test_int8_ptq_on_a_subnet_of_every_space(space_name):
    """Works on any nn.Module: the subnets of every registered space quantize, their policies
    join the space's layer list, and int8 keeps the outputs close."""
    import numpy as np
    from hwnas.supernet.spaces import available_spaces

    if space_name not in available_spaces():
        pytest.skip(f"space {space_name} is not registered in this checkout")
    space = get_space(space_name)
    torch.manual_seed(0)
    arch = space.sample(np.random.default_rng(3))
    model = space.build_supernet().extract(arch)
    policy = uniform(model, 8, 8)
    policy.validate(space.layers(arch))
    x = torch.randn(8, *space.input_shape, generator=torch.Generator().manual_seed(0))
    qmodel = ptq(model, policy, [(x, None)], PTQConfig(bias_correction=False))
    with torch.no_grad():
        ref, got = model(x), qmodel(x)
    assert (ref - got).abs().max() <= 0.05 * ref.abs().max() + 1e-6
