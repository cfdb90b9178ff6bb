"""Random augmentation of a uint8 image batch on whatever device it lives (GPU included).

The kinds and their checks are data of :mod:`hwnas.supernet.train_options`; random numbers come
from a CPU generator, so a run is reproducible across devices. A batch's random numbers are drawn
first, all of them (:func:`draw_augment`), and reach the device in one copy; what is done with
them (:func:`apply_augment`) is a pure tensor function, which :class:`BatchLoader` may
``torch.compile`` into a few kernels (on CUDA it is otherwise ~400 launches a batch for the
AutoAugment policy: ``benchmarks/train_step_overhead.md``, "Session 36").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from hwnas.supernet.auto_augment import FILL, draw_autoaugment
from hwnas.supernet.host_sync import to_device
from hwnas.supernet.train_options import check_augment
from hwnas.supernet.trivial_augment import apply_scaled, draw_trivial

__all__ = ["CUTOUT_SIZE", "apply_augment", "augment_batch", "draw_augment"]

#: Side of the square that ``crop_flip_cutout`` blanks (DeVries & Taylor 2017 use 16 on CIFAR-10).
CUTOUT_SIZE = 16


def augment_batch(images: torch.Tensor, kind: str, generator: torch.Generator,
                  fill: Sequence[int] | None = None,
                  apply: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
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
    reproducible across devices; :func:`draw_augment`) and are then moved to ``images.device``
    in one copy. ``apply``: what applies them (default :func:`apply_augment`; the loader passes
    its compiled version).
    """
    if images.dim() != 4:
        raise ValueError(f"augment_batch expects (B, C, H, W) images, got {tuple(images.shape)}")
    check_augment(kind, int(images.shape[1]))
    if kind == "none" or images.shape[0] == 0:
        return images
    dev = images.device
    params = to_device(draw_augment(kind, tuple(images.shape), generator), dev)
    value = None
    if kind.endswith("cutout"):
        c = images.shape[1]
        value = to_device(torch.tensor([0] * c if fill is None else list(fill),
                                       dtype=images.dtype, device="cpu"), dev)
    return (apply or apply_augment)(images, kind, params, value)


def draw_augment(kind: str, shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """Every random number of the augmentation ``kind`` of one ``(B, C, H, W)`` batch, drawn from
    ``generator`` in a fixed order, as a CPU float32 ``(B, columns)`` tensor for
    :func:`apply_augment`: the policy's (operation, signed magnitude) pairs
    (:func:`draw_trivial`, :func:`draw_autoaugment`), then the crop offsets dy, dx, the flip
    (0/1) and the cutout centre cy, cx as the kind has them. Integers and flags are exact in
    float32; the order is the one the operations drew in before they were split from it, so the
    augmentation of a seed is what it was."""
    batch, _, h, w = shape
    gdev = generator.device
    cols: list[torch.Tensor] = []
    if kind.startswith("trivial_"):
        cols += draw_trivial(batch, generator)
        kind = kind.removeprefix("trivial_")
    elif kind.startswith("autoaugment_"):
        cols += draw_autoaugment(batch, generator)
        kind = kind.removeprefix("autoaugment_")
    pad = 1 if kind == "shift" else 4
    cols.append(torch.randint(0, 2 * pad + 1, (batch,), generator=generator, device=gdev))  # dy
    cols.append(torch.randint(0, 2 * pad + 1, (batch,), generator=generator, device=gdev))  # dx
    if kind.startswith("crop_flip"):
        cols.append(torch.rand(batch, generator=generator, device=gdev) < 0.5)
    if kind == "crop_flip_cutout":
        cols.append(torch.randint(0, h, (batch,), generator=generator, device=gdev))  # cy
        cols.append(torch.randint(0, w, (batch,), generator=generator, device=gdev))  # cx
    return torch.stack([c.to(device="cpu", dtype=torch.float32) for c in cols], dim=1)


def apply_augment(images: torch.Tensor, kind: str, params: torch.Tensor,
                  fill: torch.Tensor | None = None) -> torch.Tensor:
    """Augment a uint8 ``(B, C, H, W)`` batch with the random numbers ``params`` that
    :func:`draw_augment` drew for ``kind`` (on the images' device); ``fill``: cutout's per-channel
    uint8 values (default 0). No random numbers and no host reads: a function ``torch.compile``
    can take whole."""
    ints = params.long()  # the integer columns, exact (one cast for all of them)
    col = 0
    if kind.startswith("trivial_"):
        images = apply_scaled(images, ints[:, 0], params[:, 1])
        col, kind = 2, kind.removeprefix("trivial_")
    elif kind.startswith("autoaugment_"):
        for j in range(2):
            images = apply_scaled(images, ints[:, 2 * j], params[:, 2 * j + 1], fill=FILL)
        col, kind = 4, kind.removeprefix("autoaugment_")
    pad = 1 if kind == "shift" else 4
    b, c, h, w = images.shape
    dev = images.device
    rows = ints[:, col, None] + torch.arange(h, device=dev)  # (B, H) padded-image rows
    cols = ints[:, col + 1, None] + torch.arange(w, device=dev)  # (B, W)
    if kind.startswith("crop_flip"):
        cols = torch.where(ints[:, col + 2, None].bool(), cols.flip(1), cols)
    padded = F.pad(images, (pad, pad, pad, pad))
    bi = torch.arange(b, device=dev)[:, None, None, None]
    ci = torch.arange(c, device=dev)[None, :, None, None]
    out = padded[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]
    if kind == "crop_flip_cutout":
        cy, cx = ints[:, col + 3], ints[:, col + 4]
        half = CUTOUT_SIZE // 2
        ys = torch.arange(h, device=dev)[None, :] - cy[:, None]  # (B, H) offsets from the centre
        xs = torch.arange(w, device=dev)[None, :] - cx[:, None]
        mask = (((ys >= -half) & (ys < half))[:, :, None]
                & ((xs >= -half) & (xs < half))[:, None, :])  # (B, H, W)
        value = torch.zeros(c, dtype=out.dtype, device=dev) if fill is None else fill
        out = torch.where(mask[:, None], value.view(1, c, 1, 1), out)
    return out
