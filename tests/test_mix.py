"""supernet.data.mix: MixUp and CutMix of a training batch, and training with them."""

from __future__ import annotations

import math

import pytest
import torch
from hwnas.supernet.data.mix import mix_batch
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import TrainConfig, TrainStage, default_config, train_supernet

from hwnas.core.errors import UserError


def _batch(n: int = 6, side: int = 8):
    """Images whose every pixel is the sample's index, and labels 0..n-1."""
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, side, side).clone()
    return x, torch.arange(n)


def test_off_returns_the_batch_and_one_hot_targets():
    x, y = _batch()
    out, target = mix_batch(x, y, 6, mixup=0.0, cutmix=0.0, seed=0, step=3)
    assert out is x
    assert torch.equal(target, torch.eye(6))


def test_mixup_blends_each_image_with_its_pair_in_the_targets_proportion():
    x, y = _batch()
    out, target = mix_batch(x, y, 6, mixup=0.8, cutmix=0.0, seed=0, step=1)
    lam = float(target[0, 0])
    assert 0.0 < lam < 1.0 and target[0, 5].item() == pytest.approx(1.0 - lam)
    assert torch.allclose(target.sum(1), torch.ones(6))
    assert torch.allclose(out, lam * x + (1.0 - lam) * x.flip(0))


def test_cutmix_pastes_a_box_whose_area_sets_the_targets():
    x, y = _batch(side=16)
    for step in range(20):
        out, target = mix_batch(x, y, 6, mixup=0.0, cutmix=1.0, seed=4, step=step)
        pasted = (out[0, 0] == 5).float().mean().item()  # sample 0's pair is sample 5
        assert torch.all((out[0] == 0) | (out[0] == 5))
        assert target[0, 0].item() == pytest.approx(1.0 - pasted)
        assert target[0, 5].item() == pytest.approx(pasted)
        assert torch.allclose(target.sum(1), torch.ones(6))
    assert torch.equal(x, _batch(side=16)[0])


def test_the_mix_is_a_function_of_seed_and_step():
    x, y = _batch()
    a = mix_batch(x, y, 6, mixup=0.8, cutmix=1.0, seed=0, step=7)
    b = mix_batch(x, y, 6, mixup=0.8, cutmix=1.0, seed=0, step=7)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    others = [mix_batch(x, y, 6, mixup=0.8, cutmix=1.0, seed=0, step=s)[1][0, 0].item()
              for s in range(8, 16)]
    assert len(set(others)) > 1


def test_both_on_use_mixup_and_cutmix():
    x, y = _batch(side=16)
    kinds = set()
    for step in range(40):
        out, _ = mix_batch(x, y, 6, mixup=0.8, cutmix=1.0, seed=0, step=step)
        pure = bool(torch.all((out[0] == 0) | (out[0] == 5)))
        kinds.add("cutmix" if pure else "mixup")
    assert kinds == {"cutmix", "mixup"}


def test_negative_alphas_are_refused():
    x, y = _batch()
    with pytest.raises(ValueError, match="alphas"):
        mix_batch(x, y, 6, mixup=-1.0, cutmix=0.0, seed=0, step=0)
    with pytest.raises(UserError, match="mixup"):
        TrainConfig(stages=[TrainStage("s", 1)], mixup=-0.5).validate()


def test_mixing_is_off_unless_asked_for():
    for name in ("vit", "mbv3-tiny"):
        config = default_config(get_space(name), 10)
        assert (config.mixup, config.cutmix) == (0.0, 0.0), name
    asked = default_config(get_space("vit"), 10, mixup=0.8, cutmix=1.0)
    assert (asked.mixup, asked.cutmix) == (0.8, 1.0)


def test_a_supernet_trains_with_mixed_batches(digits):
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    net = space.build_supernet()
    config = TrainConfig(stages=[TrainStage("full", 2, sandwich=False)], mixup=0.8, cutmix=1.0,
                         batch_size=128)
    result = train_supernet(net, space, digits, config, progress=False)
    losses = [h["loss_largest"] for h in result.history]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
