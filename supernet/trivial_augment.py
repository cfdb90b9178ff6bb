"""TrivialAugment (Müller & Hutter 2021), vectorised over a uint8 image batch on its device.

Why: the CIFAR-10 networks of ``benchmarks/supernet_cifar10.md`` were limited by over-fitting,
and TrivialAugment needs no policy search yet matched or beat the searched policies (AutoAugment,
RandAugment) on CIFAR-10 in its paper; what it gained here is that file's run 7.

Per image it draws one of the 14 operations of TrivialAugment "Wide" (torchvision's
``TrivialAugmentWide``; :func:`apply_ops`) and one of 31 magnitude bins, uniformly, and a
random sign for the signed operations. Every operation is computed for the whole batch and
selected per image with a mask, so there is no Python loop over images and no host
synchronisation: on a GPU the batch costs a few dozen element-wise kernels and one
``grid_sample``. Random numbers come from ``generator`` (on the CPU in
:class:`hwnas.supernet.data.BatchLoader`, so a run is reproducible across devices).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hwnas.supernet.host_sync import to_device

__all__ = ["OPS", "NUM_BINS", "apply_ops", "apply_scaled", "draw_trivial", "trivial_augment"]

#: Operation names, in the order of their indices for :func:`apply_ops`.
OPS: tuple[str, ...] = (
    "identity", "shear_x", "shear_y", "translate_x", "translate_y", "rotate", "brightness",
    "color", "contrast", "sharpness", "posterize", "solarize", "autocontrast", "equalize",
)
#: Magnitude bins of TrivialAugment Wide.
NUM_BINS = 31
_GEOMETRIC = ("shear_x", "shear_y", "translate_x", "translate_y", "rotate")
_SIGNED = _GEOMETRIC + ("brightness", "color", "contrast", "sharpness")


def draw_trivial(batch: int, generator: torch.Generator) -> list[torch.Tensor]:
    """The random numbers of :func:`trivial_augment` for ``batch`` images, on the CPU: the
    operation index and its signed magnitude fraction (:func:`apply_scaled`'s ``signed``), from
    an operation, a magnitude bin and a sign per image drawn uniformly."""
    gdev = generator.device
    op = torch.randint(0, len(OPS), (batch,), generator=generator, device=gdev)
    level = torch.randint(0, NUM_BINS, (batch,), generator=generator, device=gdev)
    sign = torch.where(torch.rand(batch, generator=generator, device=gdev) < 0.5, -1.0, 1.0)
    return [op.cpu(), _signed(level.cpu(), sign.cpu())]


def _signed(level: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    return level.to(torch.float32) / (NUM_BINS - 1) * sign.to(torch.float32)  # 0 ... 1 along the bins


def trivial_augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One random TrivialAugment operation per image of a uint8 ``(B, 3, H, W)`` batch."""
    op, signed = draw_trivial(images.shape[0], generator)
    dev = images.device
    return apply_scaled(images, to_device(op, dev), to_device(signed, dev))


def apply_ops(images: torch.Tensor, op: torch.Tensor, level: torch.Tensor,
              sign: torch.Tensor) -> torch.Tensor:
    """Apply operation ``OPS[op[i]]`` at magnitude bin ``level[i]`` (0 ... ``NUM_BINS - 1``) with
    sign ``sign[i]`` (±1, for the signed operations) to image ``i`` of a uint8 ``(B, 3, H, W)``
    batch; returns a uint8 batch of the same shape.

    =================  ==============================================================
    identity           the image
    shear x / y        shear factor up to ±0.99 (about the top-left corner, as PIL and
                       torchvision shear: the top row / left column stays)
    translate x / y    up to ±32 pixels (of a 32-pixel image; scaled with its size)
    rotate             up to ±135 degrees about the centre
    brightness         blend with black, factor 1 ± up to 0.99
    color              blend with the grey image (saturation), factor 1 ± up to 0.99
    contrast           blend with the image's mean grey level, factor 1 ± up to 0.99
    sharpness          blend with a 3 × 3 smoothed image, factor 1 ± up to 0.99
    posterize          keep the top 8 ... 2 bits
    solarize           invert the pixels at or above a threshold 255 ... 0
    autocontrast       stretch each channel to 0 ... 255
    equalize           histogram-equalise each channel
    =================  ==============================================================

    Geometric operations sample with nearest neighbours and fill with 0, as torchvision does
    (:func:`apply_scaled` takes another fill);
    the colour operations compute what torchvision's functional ops compute on uint8 images
    (``PIL.ImageEnhance`` / ``PIL.ImageOps`` semantics), to within one grey level.
    """
    return apply_scaled(images, op, _signed(level, sign))


def apply_scaled(images: torch.Tensor, op: torch.Tensor, signed: torch.Tensor,
                 fill: int = 0) -> torch.Tensor:
    """:func:`apply_ops` with each image's magnitude given as a signed fraction ``signed[i]``
    (-1 ... 1) of its operation's largest one (the table of :func:`apply_ops`); posterize and
    solarize take its absolute value. Other policies (AutoAugment's) map their magnitudes
    onto these ranges. ``fill``: the grey level (0 ... 255) the geometric operations leave
    where the image moved away."""
    if images.dim() != 4 or images.shape[1] != 3 or images.dtype != torch.uint8:
        raise ValueError(f"trivial_augment expects a uint8 (B, 3, H, W) batch, got "
                         f"{images.dtype} {tuple(images.shape)}")
    b, _, h, w = images.shape
    signed = signed.to(torch.float32)
    frac = signed.abs()
    x = images.to(torch.float32)
    out = _geometric(x, op, signed, h, w, float(fill))
    is_op = {name: (op == i).view(b, 1, 1, 1) for i, name in enumerate(OPS)}
    factor = (1.0 + 0.99 * signed).view(b, 1, 1, 1)  # enhance factors 0.01 ... 1.99
    grey = _grey(x)
    out = torch.where(is_op["brightness"], _blend(x, torch.zeros_like(x), factor), out)
    out = torch.where(is_op["color"], _blend(x, grey, factor), out)
    out = torch.where(is_op["contrast"], _blend(x, grey.mean(dim=(1, 2, 3), keepdim=True),
                                                factor), out)
    out = torch.where(is_op["sharpness"], _blend(x, _smooth(x), factor), out)
    bits = 8 - torch.round(frac * 6)  # 8 ... 2 bits kept
    step = torch.pow(2.0, 8 - bits).view(b, 1, 1, 1)
    out = torch.where(is_op["posterize"], torch.floor(x / step) * step, out)
    threshold = (255.0 * (1 - frac)).view(b, 1, 1, 1)  # 255 ... 0
    out = torch.where(is_op["solarize"], torch.where(x >= threshold, 255.0 - x, x), out)
    out = torch.where(is_op["autocontrast"], _autocontrast(x), out)
    out = torch.where(is_op["equalize"], _equalize(images).to(torch.float32), out)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _geometric(x: torch.Tensor, op: torch.Tensor, signed: torch.Tensor, h: int,
               w: int, fill: float = 0.0) -> torch.Tensor:
    """The geometric operations as one per-image affine map (the identity for the others),
    sampled with nearest neighbours, ``fill`` outside."""
    b = x.shape[0]
    # theta maps output to input coordinates, both normalised to [-1, 1] (align_corners=False)
    theta = torch.zeros(b, 2, 3, device=x.device)
    theta[:, 0, 0] = 1.0
    theta[:, 1, 1] = 1.0
    index = {name: OPS.index(name) for name in _GEOMETRIC}
    shear = 0.99 * signed
    sx = op == index["shear_x"]
    sy = op == index["shear_y"]
    # shear x: x_in = x_out + s * y_out in pixels from the top-left corner (PIL's and
    # torchvision's origin), i.e. X_in = X_out + s (h / w) (Y_out + 1) in normalised units
    theta[:, 0, 1] = torch.where(sx, shear * (h / w), theta[:, 0, 1])
    theta[:, 1, 0] = torch.where(sy, shear * (w / h), theta[:, 1, 0])
    theta[:, 0, 2] = torch.where(sx, shear * (h / w), theta[:, 0, 2])
    theta[:, 1, 2] = torch.where(sy, shear * (w / h), theta[:, 1, 2])
    shift = signed * 32.0 * (max(h, w) / 32.0)  # pixels, 32 for a 32-pixel image
    tx = op == index["translate_x"]
    ty = op == index["translate_y"]
    theta[:, 0, 2] = torch.where(tx, -2.0 * shift / w, theta[:, 0, 2])
    theta[:, 1, 2] = torch.where(ty, -2.0 * shift / h, theta[:, 1, 2])
    rot = op == index["rotate"]
    angle = signed * (135.0 * math.pi / 180.0)
    cos, sin = torch.cos(angle), torch.sin(angle)
    # rotation about the centre in pixel units, expressed in normalised coordinates
    theta[:, 0, 0] = torch.where(rot, cos, theta[:, 0, 0])
    theta[:, 0, 1] = torch.where(rot, -sin * (h / w), theta[:, 0, 1])
    theta[:, 1, 0] = torch.where(rot, sin * (w / h), theta[:, 1, 0])
    theta[:, 1, 1] = torch.where(rot, cos, theta[:, 1, 1])
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    moved = F.grid_sample(x - fill, grid, mode="nearest", padding_mode="zeros",
                          align_corners=False) + fill
    geometric = (sx | sy | tx | ty | rot).view(b, 1, 1, 1)
    return torch.where(geometric, moved, x)


def _blend(image: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``other + factor * (image - other)`` clipped to 0 ... 255 and truncated (PIL's
    ``Image.blend`` behind ``ImageEnhance``); exact where ``image == other``."""
    return torch.floor((other + factor * (image - other)).clamp(0, 255))


def _grey(x: torch.Tensor) -> torch.Tensor:
    """Luma (torchvision's ``rgb_to_grayscale``), truncated as a uint8 image stores it, on 3
    channels."""
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    return torch.floor(0.2989 * r + 0.587 * g + 0.114 * b).expand_as(x)


def _smooth(x: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH filter (3 × 3, centre weight 5 of 13) on the interior; the border pixels
    stay as they are, as in PIL and torchvision's ``adjust_sharpness``."""
    c = x.shape[1]
    kernel = torch.ones(3, 3, device=x.device, dtype=x.dtype)
    kernel[1, 1] = 5.0
    kernel = (kernel / kernel.sum()).expand(c, 1, 3, 3)
    inner = F.conv2d(x, kernel, groups=c).round()
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = inner
    return out


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    """Each channel of each image stretched linearly to 0 ... 255 (unchanged where flat)."""
    low = x.amin(dim=(2, 3), keepdim=True)
    high = x.amax(dim=(2, 3), keepdim=True)
    span = high - low
    scale = torch.where(span > 0, 255.0 / span.clamp(min=1e-6), torch.ones_like(span))
    low = torch.where(span > 0, low, torch.zeros_like(low))
    return torch.floor(((x - low) * scale).clamp(0, 255))


def _equalize(images: torch.Tensor) -> torch.Tensor:
    """Histogram equalisation of each channel of each uint8 image, as torchvision's
    ``equalize`` (PIL.ImageOps.equalize): a look-up table from the cumulative histogram with
    the last occupied level left out; a channel with a single level is unchanged."""
    b, c, h, w = images.shape
    flat = images.reshape(b * c, h * w).to(torch.int64)
    hist = torch.zeros(b * c, 256, dtype=torch.int64, device=images.device)
    hist.scatter_add_(1, flat, torch.ones_like(flat))
    levels = torch.arange(256, device=images.device)
    last = torch.where(hist > 0, levels, torch.full_like(levels, -1)).amax(dim=1, keepdim=True)
    step = (h * w - hist.gather(1, last)) // 255  # (N, 1)
    safe = step.clamp(min=1)
    lut = (torch.cumsum(hist, dim=1) + safe // 2) // safe
    lut = F.pad(lut, (1, 0))[:, :-1].clamp(0, 255)
    mapped = lut.gather(1, flat)
    out = torch.where(step > 0, mapped, flat)
    return out.reshape(b, c, h, w).to(torch.uint8)
