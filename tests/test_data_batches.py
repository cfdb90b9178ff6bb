"""Tests for supernet.data's GPU-ready augmentation (augment_batch) and batching (BatchLoader)."""

from __future__ import annotations

import pytest
import torch
from hwnas.supernet.data import (
    BatchLoader,
    ImageSplit,
    augment_batch,
)

from hwnas.core.errors import UserError

# --------------------------------------------------------------------------------------------
# augment_batch
# --------------------------------------------------------------------------------------------


def _batch(b: int = 64, c: int = 3, h: int = 8, w: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(123)
    return torch.randint(1, 256, (b, c, h, w), generator=g, dtype=torch.uint8)


def _shifted(img: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``img`` moved by (dy, dx) — content at (r, c) goes to (r + dy, c + dx) — zero filled."""
    out = torch.zeros_like(img)
    h, w = img.shape[-2:]
    src_r = slice(max(0, -dy), h - max(0, dy))
    dst_r = slice(max(0, dy), h - max(0, -dy))
    src_c = slice(max(0, -dx), w - max(0, dx))
    dst_c = slice(max(0, dx), w - max(0, -dx))
    out[..., dst_r, dst_c] = img[..., src_r, src_c]
    return out


def _matching_shifts(x: torch.Tensor, y: torch.Tensor, pad: int) -> list[tuple[int, int]]:
    return [(dy, dx) for dy in range(-pad, pad + 1) for dx in range(-pad, pad + 1)
            if torch.equal(_shifted(x, dy, dx), y)]


@pytest.mark.parametrize("kind", ["shift", "crop_flip", "crop_flip_cutout", "none"])
def test_augment_shapes(kind: str) -> None:
    x = _batch(16, 1, 8, 10)
    y = augment_batch(x, kind, torch.Generator().manual_seed(0))
    assert y.shape == x.shape and y.dtype == torch.uint8 and y.device == x.device


def test_augment_none_identity() -> None:
    x = _batch()
    assert torch.equal(augment_batch(x, "none", torch.Generator().manual_seed(0)), x)


def test_augment_shift_is_a_real_shift() -> None:
    x = _batch(64)
    y = augment_batch(x, "shift", torch.Generator().manual_seed(0))
    seen = set()
    for i in range(x.shape[0]):
        shifts = _matching_shifts(x[i], y[i], 1)
        assert len(shifts) == 1, f"sample {i} is not a zero-filled shift by at most 1"
        seen.add(shifts[0])
    assert len(seen) >= 5  # offsets vary per sample (9 possible)


def test_augment_crop_flip() -> None:
    x = _batch(64)
    y = augment_batch(x, "crop_flip", torch.Generator().manual_seed(0))
    flipped = 0
    for i in range(x.shape[0]):
        plain = _matching_shifts(x[i], y[i], 4)
        mirrored = _matching_shifts(x[i].flip(-1), y[i], 4)
        assert len(plain) + len(mirrored) == 1, f"sample {i} is not a (flipped) crop"
        flipped += bool(mirrored)
    assert 0 < flipped < x.shape[0]


def test_augment_crop_flip_cutout() -> None:
    """The same crop and flip as crop_flip (same generator), then one square per sample, at
    most 16 x 16 and clipped at the border, set to the fill value."""
    x = _batch(64, 3, 32, 32)
    base = augment_batch(x, "crop_flip", torch.Generator().manual_seed(5))
    y = augment_batch(x, "crop_flip_cutout", torch.Generator().manual_seed(5), fill=(0, 7, 9))
    sizes = set()
    for i in range(x.shape[0]):
        blank = (y[i] == torch.tensor([0, 7, 9], dtype=torch.uint8).view(3, 1, 1)).all(0)
        rows, cols = blank.any(1).nonzero().flatten(), blank.any(0).nonzero().flatten()
        h, w = len(rows), len(cols)
        assert 8 <= h <= 16 and 8 <= w <= 16, f"sample {i}: blank region {h} x {w}"
        assert int(blank.sum()) == h * w  # a rectangle (a square clipped at the border)
        assert rows[-1] - rows[0] + 1 == h and cols[-1] - cols[0] + 1 == w
        assert torch.equal(y[i][:, ~blank], base[i][:, ~blank])  # untouched elsewhere
        sizes.add((h, w))
    assert (16, 16) in sizes and len(sizes) > 1  # mostly whole squares, some clipped
    zero = augment_batch(x, "crop_flip_cutout", torch.Generator().manual_seed(5))
    assert int((zero == 0).all(1).sum()) >= 64 * 64  # default fill 0: at least 8 x 8 each
    # the loader fills with the training mean, which normalises to (about) zero
    split = ImageSplit(x, torch.arange(64))
    loader = BatchLoader(split, batch_size=64, mean=(0.2, 0.5, 0.7), std=(0.25,) * 3,
                         augment="crop_flip_cutout", seed=1)
    xb, _ = next(iter(loader))
    assert int((xb.abs() < 0.01).all(1).sum()) >= 64 * 64


def test_augment_reproducible_and_unknown_kind() -> None:
    x = _batch()
    a = augment_batch(x, "crop_flip", torch.Generator().manual_seed(7))
    b = augment_batch(x, "crop_flip", torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    with pytest.raises(UserError, match="unknown augmentation 'rotate'"):
        augment_batch(x, "rotate", torch.Generator())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_augment_and_loader_on_cuda() -> None:
    x = _batch()
    cpu = augment_batch(x, "crop_flip", torch.Generator().manual_seed(3))
    gpu = augment_batch(x.cuda(), "crop_flip", torch.Generator().manual_seed(3))
    assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)
    split = ImageSplit(x, torch.arange(64))
    loader = BatchLoader(split, batch_size=16, mean=(0.5,) * 3, std=(0.25,) * 3, shuffle=True,
                         augment="crop_flip", device="cuda")
    xb, yb = next(iter(loader))
    assert xb.is_cuda and yb.is_cuda and xb.dtype == torch.float32


# --------------------------------------------------------------------------------------------
# BatchLoader
# --------------------------------------------------------------------------------------------


def _split(n: int = 50) -> ImageSplit:
    return ImageSplit(_batch(n, 3, 4, 4), torch.arange(n, dtype=torch.int64))


def test_loader_covers_every_sample_once() -> None:
    split = _split(50)
    for drop_last, expected_len in ((False, 4), (True, 3)):
        loader = BatchLoader(split, batch_size=16, mean=(0, 0, 0), std=(1, 1, 1), shuffle=True,
                             augment="crop_flip", drop_last=drop_last)
        assert len(loader) == expected_len
        for _ in range(2):
            batches = list(loader)
            assert len(batches) == expected_len
            seen = torch.cat([y for _, y in batches]).tolist()
            if drop_last:
                assert len(seen) == 48 and len(set(seen)) == 48
            else:
                assert sorted(seen) == list(range(50))
            assert all(x.shape[1:] == (3, 4, 4) for x, _ in batches)


def test_loader_normalization() -> None:
    split = _split(10)
    mean, std = (0.1, 0.5, 0.9), (0.2, 0.3, 0.4)
    loader = BatchLoader(split, batch_size=4, mean=mean, std=std)
    xs, ys = zip(*loader)
    x, y = torch.cat(xs), torch.cat(ys)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(y, split.labels)  # no shuffle: original order
    expected = (split.images.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(
        std).view(1, 3, 1, 1)
    torch.testing.assert_close(x, expected)


def test_loader_shuffle_epochs_reproducible() -> None:
    split = _split(40)

    def orders(seed: int, epochs: int = 3) -> list[list[int]]:
        loader = BatchLoader(split, batch_size=8, mean=(0,) * 3, std=(1,) * 3, shuffle=True,
                             seed=seed)
        return [torch.cat([y for _, y in loader]).tolist() for _ in range(epochs)]

    a, b = orders(0), orders(0)
    assert a == b
    assert a[0] != a[1] and a[1] != a[2]
    assert orders(1) != a
    # set_epoch repositions the sequence
    loader = BatchLoader(split, batch_size=8, mean=(0,) * 3, std=(1,) * 3, shuffle=True, seed=0)
    loader.set_epoch(2)
    assert torch.cat([y for _, y in loader]).tolist() == a[2]


def test_loader_augmentation_reproducible() -> None:
    split = _split(16)
    kw = dict(batch_size=16, mean=(0,) * 3, std=(1,) * 3, augment="crop_flip", seed=5)
    x1 = next(iter(BatchLoader(split, **kw)))[0]
    x2 = next(iter(BatchLoader(split, **kw)))[0]
    assert torch.equal(x1, x2)
    plain = next(iter(BatchLoader(split, batch_size=16, mean=(0,) * 3, std=(1,) * 3)))[0]
    assert not torch.equal(x1, plain)


def test_loader_rejects_bad_arguments() -> None:
    split = _split(4)
    with pytest.raises(UserError, match="batch_size"):
        BatchLoader(split, batch_size=0, mean=(0,) * 3, std=(1,) * 3)
    with pytest.raises(UserError, match="unknown augmentation"):
        BatchLoader(split, batch_size=2, mean=(0,) * 3, std=(1,) * 3, augment="mixup")
    with pytest.raises(ValueError, match="one value per channel"):
        BatchLoader(split, batch_size=2, mean=(0,), std=(1,))


def _coded_split(n: int) -> ImageSplit:
    """32x32 images whose channel 0 holds row + 1 and channel 1 column + 1 (0 only in the
    padding), labelled by index: a crop's offsets and flip read back from any output."""
    rows = torch.arange(1, 33, dtype=torch.uint8).view(32, 1).expand(32, 32)
    cols = torch.arange(1, 33, dtype=torch.uint8).view(1, 32).expand(32, 32)
    img = torch.stack([rows, cols, torch.full((32, 32), 9, dtype=torch.uint8)])
    return ImageSplit(img.expand(n, 3, 32, 32).contiguous(), torch.arange(n, dtype=torch.int64))


def _crop_params(x: torch.Tensor) -> tuple[int, int, bool]:
    """(top, left, flipped) of one augmented coded image in torchvision's terms: zero-pad 4,
    crop at (top, left) in the padded image, then mirror."""
    r, c = (x[0] > 0).nonzero()[0].tolist()
    top = int(x[0, r, c]) - 1 - r + 4
    cols = x[1, r][x[1, r] > 0]
    flipped = bool(cols[1] < cols[0])
    c0 = int((x[1, r] > 0).nonzero()[0])
    left = int(cols[0]) + 3 - ((31 - c0) if flipped else c0)
    return top, left, flipped


def test_crop_flip_matches_torchvision_distribution() -> None:
    """crop_flip is RandomCrop(32, padding=4) + RandomHorizontalFlip: each image of each epoch
    gets its own offsets, uniform over 0..8 in both axes, a zero-filled border and a flip with
    probability 1/2, redrawn every epoch (issue 44's audit of the data path)."""
    n, epochs = 2000, 2
    split = _coded_split(n)
    loader = BatchLoader(split, batch_size=250, mean=(0,) * 3, std=(1,) * 3, shuffle=True,
                         augment="crop_flip", seed=0)
    params = torch.empty(epochs, n, 3, dtype=torch.int64)
    for epoch in range(epochs):
        for x, y in loader:
            imgs = (x * 255).round().to(torch.uint8)
            for img, i in zip(imgs, y.tolist()):
                top, left, flipped = _crop_params(img)
                padded = torch.nn.functional.pad(split.images[i], (4, 4, 4, 4))
                ref = padded[:, top:top + 32, left:left + 32]
                assert torch.equal(img, ref.flip(-1) if flipped else ref)
                params[epoch, i] = torch.tensor([top, left, int(flipped)])
    expected = n * epochs / 9
    for axis in (0, 1):
        counts = torch.bincount(params[..., axis].flatten(), minlength=9)
        assert len(counts) == 9 and bool((counts > 0).all()), counts  # 0..8, both ends
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 26.1, counts  # chi-square, 8 dof, p = 0.001
    flips = params[..., 2].float()
    assert abs(float(flips.mean()) - 0.5) < 0.03
    # independent between epochs: an image's draws in epoch 1 do not follow from epoch 0's
    same = (params[0] == params[1]).all(1).float().mean()
    assert float(same) < 0.02  # 1 / (9 * 9 * 2) = 0.6 % by chance
