"""hwnas.supernet.auto_augment: AutoAugment's CIFAR-10 policy per image, on the operations of
trivial_augment, and the ``autoaugment_crop_flip`` augmentation of supernet.data."""

from __future__ import annotations

import pytest
import torch
from hwnas.supernet.auto_augment import CIFAR10_POLICY, FILL, autoaugment, policy_tensors
from hwnas.supernet.data import augment_batch
from hwnas.supernet.trivial_augment import OPS, apply_scaled

from hwnas.core.errors import UserError


def _images(n: int = 64) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(0),
                         dtype=torch.uint8)


def test_policy_magnitudes_are_autoaugments_ranges() -> None:
    ops, prob, mag, signed = policy_tensors()
    assert ops.shape == prob.shape == mag.shape == (25, 2) and len(CIFAR10_POLICY) == 25
    # sub-policy 2: rotate bin 2 = 30 * 2/9 degrees (of 135), translate x bin 9 = 150/331 of
    # the side; sub-policy 6: posterize bin 7 keeps round(8 - 4 * 7/9) = 5 bits (of 8 ... 2)
    assert mag[1, 0].item() == pytest.approx(30 * 2 / 9 / 135)
    assert mag[1, 1].item() == pytest.approx(150 / 331)
    assert mag[5, 1].item() == pytest.approx(0.5) and bool(signed[1, 0]) and not signed[5, 1]
    assert OPS[int(ops[0, 0])] == "solarize" and mag[0, 0].item() == 1.0  # invert
    assert prob[22, 1].item() == pytest.approx(0.8)


def test_invert_is_solarize_at_threshold_zero_and_posterize_keeps_bits() -> None:
    x = _images(4)
    solarize = torch.full((4,), OPS.index("solarize"))
    assert torch.equal(apply_scaled(x, solarize, torch.ones(4)), 255 - x)
    posterize = torch.full((4,), OPS.index("posterize"))
    assert torch.equal(apply_scaled(x, posterize, torch.full((4,), 0.5)), x & 0b11111000)


def test_each_image_draws_its_own_sub_policy_reproducibly() -> None:
    x = _images()
    a = autoaugment(x, torch.Generator().manual_seed(3))
    b = autoaugment(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.dtype == torch.uint8 and a.shape == x.shape
    changed = (a != x).flatten(1).any(1)
    assert 0.3 < changed.float().mean().item() < 1.0  # some images untouched, most changed
    out = augment_batch(x, "autoaugment_crop_flip", torch.Generator().manual_seed(3))
    assert out.shape == x.shape and not torch.equal(out, a)
    with pytest.raises(UserError, match="RGB"):
        augment_batch(x[:, :1], "autoaugment_crop_flip", torch.Generator())


def test_shear_is_about_the_top_left_corner_as_pil_and_torchvision_shear() -> None:
    """PIL's ``(1, m, 0, 0, 1, 0)`` affine and torchvision's ``center=[0, 0]``: the top row
    (shear x) or left column (shear y) stays, the far side moves by up to m × 31 pixels."""
    x = _images(8)
    for name, keep in (("shear_x", (slice(None), slice(None), 0, slice(None))),
                       ("shear_y", (slice(None), slice(None), slice(None), 0))):
        for sign in (1.0, -1.0):
            out = apply_scaled(x, torch.full((8,), OPS.index(name)), torch.full((8,), sign * 0.3))
            assert torch.equal(out[keep], x[keep]), f"{name} {sign} moved its origin line"
            assert not torch.equal(out, x)


def test_autoaugment_fills_where_the_image_moved_with_ccts_grey() -> None:
    """On black images the colour operations give 0 or 255 (invert); 128 comes only from
    shear, translate and rotate leaving CCT's grey fill behind."""
    x = torch.zeros(256, 3, 32, 32, dtype=torch.uint8)
    out = autoaugment(x, torch.Generator().manual_seed(0))
    assert FILL == 128 and bool((out == FILL).any())
    assert set(out.unique().tolist()) <= {0, FILL, 255}
    moved = apply_scaled(x, torch.full((256,), OPS.index("translate_x")), torch.full((256,), 0.5),
                         fill=FILL)
    assert bool((moved[..., :16] == FILL).all()) and not moved[..., 16:].any()
