"""supernet.evaluate: BatchNorm recalibration and accuracy."""


from __future__ import annotations

import pytest
import torch
from hwnas.supernet.evaluate import (
    accuracy,
    bn_calibration_loader,
    calibration_loader,
    recalibrate_bn,
    recalibrated_subnet,
)
from hwnas.supernet.spaces import get_space
from torch import nn

# --------------------------------------------------------------------------------------------
# recalibrate_bn
# --------------------------------------------------------------------------------------------


def _conv_bn(momentum: float = 0.3) -> nn.Sequential:
    conv = nn.Conv2d(1, 2, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([2.0, -1.0]).view(2, 1, 1, 1))
    bn = nn.BatchNorm2d(2, momentum=momentum)
    with torch.no_grad():  # stale statistics that must be thrown away
        bn.running_mean.fill_(5.0)
        bn.running_var.fill_(7.0)
        bn.num_batches_tracked.fill_(10)
    return nn.Sequential(conv, bn)


def test_recalibrate_bn_computes_exact_mean_over_batches():
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(4, 1, 3, 3, generator=g)
    x2 = torch.randn(4, 1, 3, 3, generator=g) * 2 + 3
    x3 = torch.full((4, 1, 3, 3), 100.0)  # beyond max_batches: must be ignored
    model = _conv_bn().eval()
    out = recalibrate_bn(model, [(x1, None), (x2, None), (x3, None)], max_batches=2)
    assert out is model

    bn = model[1]
    bn_inputs = [torch.cat([2 * x, -x], dim=1) for x in (x1, x2)]  # what the BN saw
    expected_mean = torch.cat(bn_inputs).mean(dim=(0, 2, 3))  # equal batch sizes
    expected_var = torch.stack([t.var(dim=(0, 2, 3), unbiased=True) for t in bn_inputs]).mean(0)
    assert torch.allclose(bn.running_mean, expected_mean, atol=1e-5)
    assert torch.allclose(bn.running_var, expected_var, atol=1e-5)
    assert int(bn.num_batches_tracked) == 2
    assert bn.momentum == 0.3  # restored
    assert not model.training
    assert not any(m.training for m in model.modules())


def test_recalibrate_bn_restores_state_on_error():
    model = _conv_bn(momentum=0.2)

    def batches():
        yield torch.randn(4, 1, 3, 3), None
        raise RuntimeError("loader failed")

    with pytest.raises(RuntimeError, match="loader failed"):
        recalibrate_bn(model, batches())
    assert model[1].momentum == 0.2
    assert not model.training


def test_recalibrate_bn_on_supernet_matches_extracted_subnet():
    """Recalibrating the supernet with a subnet active gives the same statistics as
    recalibrating the extracted subnet (the sliced BatchNorm must honour momentum=None)."""
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    net = space.build_supernet()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 1, 8, 8, generator=g) * 2 + 1, None) for _ in range(3)]
    arch = space.smallest()
    model = recalibrate_bn(net.extract(arch), batches)
    net.set_active(arch)
    recalibrate_bn(net, batches)
    x = batches[0][0]
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4)
        assert torch.allclose(net.extract(arch)(x), model(x), atol=1e-4)


def test_bn_recalibration_uses_training_augmentation(digits):
    """Subnets are recalibrated on augmented training batches (the statistics their weights
    were trained against); quantization calibration stays on clean images."""
    assert bn_calibration_loader(digits).augment == digits.augment != "none"
    assert calibration_loader(digits).augment == "none"
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    net = space.build_supernet()
    arch = space.smallest()
    got = recalibrated_subnet(net, arch, digits, calib_batches=3, calib_batch_size=32, seed=4)
    aug = recalibrate_bn(net.extract(arch), bn_calibration_loader(digits, batch_size=32, seed=4), 3)
    clean = recalibrate_bn(net.extract(arch), calibration_loader(digits, batch_size=32, seed=4), 3)

    def means(m):
        return torch.cat([b.running_mean for b in m.modules() if isinstance(b, nn.BatchNorm2d)])

    assert torch.equal(means(got), means(aug))
    assert not torch.allclose(means(got), means(clean))
# --------------------------------------------------------------------------------------------
# accuracy
# --------------------------------------------------------------------------------------------


class _FirstPixelClassifier(nn.Module):
    """Predicts the class written in the first pixel of each image."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(x[:, 0, 0, 0].long(), 3).float()


def _images(classes: list[int]) -> torch.Tensor:
    x = torch.zeros(len(classes), 1, 2, 2)
    x[:, 0, 0, 0] = torch.tensor(classes, dtype=torch.float32)
    return x


def test_accuracy_counts_samples_not_batches():
    model = _FirstPixelClassifier().train()
    batches = [
        (_images([0, 1, 2, 1]), torch.tensor([0, 1, 2, 1])),  # 4/4 right
        (_images([2]), torch.tensor([0])),                     # 0/1 right
    ]
    assert accuracy(model, batches) == pytest.approx(80.0)  # per-batch averaging would give 50
    assert not model.training
    assert accuracy(model, [(_images([1, 2]), torch.tensor([0, 0]))]) == 0.0
    assert accuracy(model, [(_images([1, 2]), torch.tensor([1, 2]))]) == 100.0


def test_accuracy_without_samples_raises():
    with pytest.raises(ValueError, match="no samples"):
        accuracy(_FirstPixelClassifier(), [])


def test_a_model_without_batchnorm_needs_no_calibration_pass() -> None:
    """A vit subnet (LayerNorm only) is returned in eval mode without reading a batch."""
    from hwnas.supernet.spaces import ViTConfig, ViTSpace

    space = ViTSpace(ViTConfig(tokenizer_channels=(4,), embed_choices=(8,), depth_choices=(1,),
                               heads_choices=(1,), mlp_ratio_choices=(1.0,), head_dim=4))
    model = space.build_supernet().extract(space.largest()).train()

    def never():
        raise AssertionError("a calibration batch was read")
        yield

    assert recalibrate_bn(model, never(), 40) is model and not model.training

