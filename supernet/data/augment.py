"""Random augmentation of a uint8 image batch on whatever device it lives (GPU included).

The kinds and their checks are data of :mod:`hwnas.supernet.train_options`; random numbers come
from a CPU generator, so a run is reproducible across devices.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from hwnas.supernet.auto_augment import autoaugment
from hwnas.supernet.host_sync import to_device
from hwnas.supernet.train_options import check_augment
from hwnas.supernet.trivial_augment import trivial_augment

__all__ = ["CUTOUT_SIZE", "augment_batch"]

#: Side of the square that ``crop_flip_cutout`` blanks (DeVries & Taylor 2017 use 16 on CIFAR-10).
CUTOUT_SIZE = 16


def augment_batch(images: torch.Tensor, kind: str, generator: torch.Generator,
                  fill: Sequence[int] | None = None) -> torch.Tensor:
    """Randomly augment a uint8 ``(B, C, H, W)`` batch on whatever device it lives.

    * ``"shift"``: zero-pad 1 and crop back to H x W at a random offset per sample, i.e. shift
      each image by dx, dy in {-1, 0, 1} (no flip: a mirrored digit is another symbol).
    * ``"crop_flip"``: zero-pad 4, random crop per sample, and a horizontal flip for a random
      half of the samples (the standard CIFAR recipe).
    * ``"crop_flip_cutout"``: ``crop_flip``, then cutout (DeVries & Taylor 2017): a
      :data:`CUTOUT_SIZE` square at a uniformly random centre per sample (clipped at the
      border) is set to ``fill`` (per-channel uint8 values; default 0; :class:`BatchLoader`
      passes the training mean, which normalises to zero as in the paper).
    * ``"trivial_crop_flip_cutout"``: one TrivialAugment operation per image
      (:mod:`hwnas.supernet.trivial_augment`; RGB images only), then ``crop_flip_cutout``: the
      TrivialAugment paper's CIFAR recipe.
    * ``"autoaugment_crop_flip"``: AutoAugment's CIFAR-10 policy, one sub-policy per image
      (:mod:`hwnas.supernet.auto_augment`; RGB only), then ``crop_flip``: the recipe of CCT's
      200-epoch CIFAR-10 figures.
    * ``"none"``: the input, unchanged.

    Vectorised: one padded copy and one gather with per-sample row/column indices, no Python
    loop over samples. Random numbers come from ``generator`` (normally on the CPU, so runs are
    reproducible across devices) and are then moved to ``images.device``.
    """
    if images.dim() != 4:
        raise ValueError(f"augment_batch expects (B, C, H, W) images, got {tuple(images.shape)}")
    check_augment(kind, int(images.shape[1]))
    if kind == "none" or images.shape[0] == 0:
        return images
    if kind.startswith("trivial_"):
        images = trivial_augment(images, generator)
        kind = kind.removeprefix("trivial_")
    elif kind.startswith("autoaugment_"):
        images = autoaugment(images, generator)
        kind = kind.removeprefix("autoaugment_")
    pad = 1 if kind == "shift" else 4
    b, c, h, w = images.shape
    gdev = generator.device
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=gdev)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=gdev)
    dev = images.device
    rows = to_device(dy, dev)[:, None] + torch.arange(h, device=dev)  # (B, H) padded-image rows
    cols = to_device(dx, dev)[:, None] + torch.arange(w, device=dev)  # (B, W)
    if kind.startswith("crop_flip"):
        flip = torch.rand(b, generator=generator, device=gdev) < 0.5
        cols = torch.where(to_device(flip, dev)[:, None], cols.flip(1), cols)
    padded = F.pad(images, (pad, pad, pad, pad))
    bi = torch.arange(b, device=dev)[:, None, None, None]
    ci = torch.arange(c, device=dev)[None, :, None, None]
    out = padded[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]
    if kind == "crop_flip_cutout":
        cy = to_device(torch.randint(0, h, (b,), generator=generator, device=gdev), dev)
        cx = to_device(torch.randint(0, w, (b,), generator=generator, device=gdev), dev)
        half = CUTOUT_SIZE // 2
        ys = torch.arange(h, device=dev)[None, :] - cy[:, None]  # (B, H) offsets from the centre
        xs = torch.arange(w, device=dev)[None, :] - cx[:, None]
        mask = (((ys >= -half) & (ys < half))[:, :, None]
                & ((xs >= -half) & (xs < half))[:, None, :])  # (B, H, W)
        value = to_device(torch.tensor([0] * c if fill is None else list(fill), dtype=out.dtype,
                                       device="cpu"), dev)  # not on the default device
        out = torch.where(mask[:, None], value.view(1, c, 1, 1), out)
    return out
