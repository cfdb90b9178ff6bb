"""hwnas.supernet.trivial_augment: each operation does what it names, per image, on a whole batch;
and the ``trivial_crop_flip_cutout`` augmentation of supernet.data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hwnas.supernet.data import BatchLoader, ImageSplit, augment_batch
from hwnas.supernet.train import TrainConfig, TrainStage
from hwnas.supernet.trivial_augment import NUM_BINS, OPS, apply_ops, trivial_augment

from hwnas.core.errors import UserError


def _images(n: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    x[: n // 4] = x[: n // 4] // 4 + 60  # low-contrast images: 60 ... 123
    x[-1] = 77  # a flat image
    return x


def _apply(x: torch.Tensor, name: str, level: int, sign: float = 1.0) -> torch.Tensor:
    n = x.shape[0]
    return apply_ops(x, torch.full((n,), OPS.index(name)), torch.full((n,), level),
                     torch.full((n,), sign))


def test_fourteen_operations_and_identity() -> None:
    assert len(OPS) == 14 and NUM_BINS == 31
    x = _images()
    for level in (0, 30):
        assert torch.equal(_apply(x, "identity", level), x)
    for name in ("shear_x", "shear_y", "translate_x", "translate_y", "rotate", "brightness",
                 "color", "contrast", "sharpness", "posterize"):
        assert torch.equal(_apply(x, name, 0), x), f"{name} at magnitude 0 changed the image"


def test_translate_moves_by_whole_pixels_and_fills_zero() -> None:
    x = _images()
    right = _apply(x, "translate_x", 15)  # 16 pixels of 32
    assert torch.equal(right[..., 16:], x[..., :16]) and not right[..., :16].any()
    up = _apply(x, "translate_y", 15, -1.0)
    assert torch.equal(up[..., :16, :], x[..., 16:, :]) and not up[..., 16:, :].any()
    assert not _apply(x, "translate_x", 30).any()  # 32 pixels: nothing left


def test_rotate_by_90_degrees_is_rot90() -> None:
    x = _images()
    out = _apply(x, "rotate", 20)  # 20 / 30 of 135 degrees
    assert torch.equal(out, torch.rot90(x, 1, (2, 3))) or torch.equal(out, torch.rot90(x, -1, (2, 3)))
    assert not torch.equal(_apply(x, "rotate", 20, -1.0), out)


def test_shear_x_shifts_each_row_as_a_whole() -> None:
    x = _images(4)
    out = _apply(x, "shear_x", 30)
    shifts = set()
    for i in range(x.shape[0]):
        for r in range(32):
            row, src = out[i, :, r], x[i, :, r]
            found = [d for d in range(-32, 33) if torch.equal(row, _shift_row(src, d))]
            assert found, f"image {i} row {r} is not a shifted copy of the input row"
            shifts.add(found[0])
    assert len(shifts) > 20  # the shift grows with the distance from the top row


def _shift_row(row: torch.Tensor, d: int) -> torch.Tensor:
    out = torch.zeros_like(row)
    if d >= 0:
        out[:, d:] = row[:, : row.shape[1] - d]
    else:
        out[:, :d] = row[:, -d:]
    return out


def test_enhance_operations() -> None:
    x = _images()
    xf = x.float()
    dark = _apply(x, "brightness", 30, -1.0)  # factor 0.01
    assert int(dark.max()) <= 2
    bright = _apply(x, "brightness", 30, 1.0)  # factor 1.99
    assert torch.equal(bright, torch.floor((1.99 * xf).clamp(0, 255)).to(torch.uint8))
    grey = _apply(x, "color", 30, -1.0).int()  # almost no saturation
    assert int((grey - grey[:, :1]).abs().max()) <= 3
    flat = _apply(x, "contrast", 30, -1.0).int()  # almost no contrast
    spread = flat.amax(dim=(1, 2, 3)) - flat.amin(dim=(1, 2, 3))
    assert int(spread.max()) <= 3
    sharp = _apply(x, "sharpness", 30, 1.0)
    assert torch.equal(sharp[..., 0, :], x[..., 0, :]) and torch.equal(sharp[..., :, -1], x[..., :, -1])
    assert not torch.equal(sharp, x)


def test_posterize_solarize_autocontrast() -> None:
    x = _images()
    two_bits = _apply(x, "posterize", 30)
    assert set(two_bits.unique().tolist()) <= {0, 64, 128, 192}
    assert torch.equal(two_bits, x & 0xC0)
    assert torch.equal(_apply(x, "solarize", 30), 255 - x)  # threshold 0: every pixel
    top = _apply(x, "solarize", 0)  # threshold 255: only the white pixels
    assert torch.equal(top, torch.where(x == 255, torch.zeros_like(x), x))
    stretched = _apply(x, "autocontrast", 0)
    low = x[:4]  # 60 ... 123 per channel before
    assert (stretched[:4].amin(dim=(2, 3)) == 0).all() and (stretched[:4].amax(dim=(2, 3)) == 255).all()
    assert not torch.equal(stretched[:4], low)
    assert torch.equal(stretched[-1], x[-1])  # flat: unchanged


def _equalize_reference(channel: np.ndarray) -> np.ndarray:
    """PIL.ImageOps.equalize on one uint8 channel, written with a loop."""
    hist = np.bincount(channel.ravel(), minlength=256)
    nonzero = hist[hist > 0]
    step = (nonzero[:-1].sum()) // 255
    if step == 0:
        return channel
    lut, n = [], step // 2
    for count in hist:
        lut.append(min(255, n // step))
        n += count
    return np.asarray(lut, dtype=np.uint8)[channel]


def test_equalize_matches_a_reference() -> None:
    x = _images(8)
    out = _apply(x, "equalize", 0).numpy()
    for i in range(x.shape[0]):
        for c in range(3):
            np.testing.assert_array_equal(out[i, c], _equalize_reference(x[i, c].numpy()))


def test_ops_are_chosen_per_image() -> None:
    x = _images(6)
    names = ["identity", "translate_x", "posterize", "solarize", "brightness", "rotate"]
    op = torch.tensor([OPS.index(n) for n in names])
    level = torch.tensor([30, 15, 30, 30, 30, 20])
    out = apply_ops(x, op, level, torch.ones(6))
    for i, name in enumerate(names):
        single = _apply(x[i:i + 1], name, int(level[i]))
        assert torch.equal(out[i:i + 1], single), name


def test_trivial_augment_is_seeded_and_varied() -> None:
    x = _images(256, seed=1)
    a = trivial_augment(x, torch.Generator().manual_seed(3))
    b = trivial_augment(x, torch.Generator().manual_seed(3))
    c = trivial_augment(x, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.uint8 and a.shape == x.shape
    unchanged = (a == x).flatten(1).all(1).float().mean().item()
    assert 0.02 < unchanged < 0.3  # identity (1/14) and magnitude-0 draws leave some as they are
    with pytest.raises(ValueError, match="uint8"):
        trivial_augment(x.float(), torch.Generator())


def test_trivial_crop_flip_cutout_in_the_loader() -> None:
    x = _images(32)
    y = augment_batch(x, "trivial_crop_flip_cutout", torch.Generator().manual_seed(0), fill=(1, 2, 3))
    assert y.shape == x.shape and y.dtype == torch.uint8
    blank = (y == torch.tensor([1, 2, 3], dtype=torch.uint8).view(1, 3, 1, 1)).all(1)
    assert (blank.flatten(1).sum(1) >= 64).all()  # every image has its cutout square
    split = ImageSplit(x, torch.arange(32))
    loader = BatchLoader(split, batch_size=16, mean=(0.5,) * 3, std=(0.25,) * 3,
                         augment="trivial_crop_flip_cutout", shuffle=True, seed=2)
    first = [xb for xb, _ in loader]
    loader.set_epoch(0)
    again = [xb for xb, _ in loader]
    assert all(torch.equal(p, q) for p, q in zip(first, again))
    grey = ImageSplit(x[:, :1].contiguous(), torch.arange(32))
    with pytest.raises(UserError, match="needs RGB images; this split has 1 channel"):
        BatchLoader(grey, batch_size=16, mean=(0.5,), std=(0.25,), augment="trivial_crop_flip_cutout")
    with pytest.raises(UserError, match="needs RGB images"):
        augment_batch(x[:, :1], "trivial_crop_flip_cutout", torch.Generator())
    config = TrainConfig(stages=[TrainStage("s", 1)], augment="trivial_crop_flip_cutout")
    assert TrainConfig.from_dict(config.to_dict()).augment == "trivial_crop_flip_cutout"
