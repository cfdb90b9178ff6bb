"""AutoAugment's CIFAR-10 policy (Cubuk et al., CVPR 2019), vectorised over a uint8 image batch
on its device.

Why: the figures of CCT's README that ``cct`` must reproduce (CCT-7/3x2 93.83 %, CCT-2/3x2
89.17 % at 200 epochs) come from CCT's first training script, whose augmentation is this
policy followed by a padded random crop and a horizontal flip (``benchmarks/supernet_cifar10.md``,
"Session 30"). torchvision, which has the policy, is no dependency of hwnas, and its transform
draws one sub-policy per call (per batch when given a batch); here every image draws its own.

Per image: one of the 25 sub-policies uniformly; each of its two operations applied with the
sub-policy's probability at its magnitude (bin 0-9 of AutoAugment's ranges), the signed ones
with a random sign. The operations are those of :mod:`hwnas.supernet.trivial_augment`
(:func:`apply_scaled`; invert is solarize at threshold 0); the geometric ones fill with grey
:data:`FILL` as CCT's PIL code does (torchvision's default is 0). Checked op by op against
torchvision's and CCT's definitions (benchmarks/supernet_cifar10.md, "Session 34"); left
different: CCT rotates one way only, here (as in torchvision and the paper) either way.
"""

from __future__ import annotations

import torch
from hwnas.supernet.host_sync import to_device
from hwnas.supernet.trivial_augment import OPS, apply_scaled

__all__ = ["CIFAR10_POLICY", "FILL", "autoaugment", "draw_autoaugment", "policy_tensors"]

#: Grey level left where shear, translate and rotate move the image away (CCT's ``fillcolor``).
FILL = 128

#: The 25 sub-policies: two (operation, probability, magnitude bin 0-9) each, in the paper's
#: (and torchvision's ``AutoAugmentPolicy.CIFAR10``) order.
CIFAR10_POLICY: tuple[tuple[tuple[str, float, int], tuple[str, float, int]], ...] = (
    (("invert", 0.1, 7), ("contrast", 0.2, 6)),
    (("rotate", 0.7, 2), ("translate_x", 0.3, 9)),
    (("sharpness", 0.8, 1), ("sharpness", 0.9, 3)),
    (("shear_y", 0.5, 8), ("translate_y", 0.7, 9)),
    (("autocontrast", 0.5, 8), ("equalize", 0.9, 2)),
    (("shear_y", 0.2, 7), ("posterize", 0.3, 7)),
    (("color", 0.4, 3), ("brightness", 0.6, 7)),
    (("sharpness", 0.3, 9), ("brightness", 0.7, 9)),
    (("equalize", 0.6, 5), ("equalize", 0.5, 1)),
    (("contrast", 0.6, 7), ("sharpness", 0.6, 5)),
    (("color", 0.7, 7), ("translate_x", 0.5, 8)),
    (("equalize", 0.3, 7), ("autocontrast", 0.4, 8)),
    (("translate_y", 0.4, 3), ("sharpness", 0.2, 6)),
    (("brightness", 0.9, 6), ("color", 0.2, 8)),
    (("solarize", 0.5, 2), ("invert", 0.0, 3)),
    (("equalize", 0.2, 0), ("autocontrast", 0.6, 0)),
    (("equalize", 0.2, 8), ("equalize", 0.6, 4)),
    (("color", 0.9, 9), ("equalize", 0.6, 6)),
    (("autocontrast", 0.8, 4), ("solarize", 0.2, 8)),
    (("brightness", 0.1, 3), ("color", 0.7, 0)),
    (("solarize", 0.4, 5), ("autocontrast", 0.9, 3)),
    (("translate_y", 0.9, 9), ("translate_y", 0.7, 9)),
    (("autocontrast", 0.9, 2), ("solarize", 0.8, 3)),
    (("equalize", 0.8, 8), ("invert", 0.1, 3)),
    (("translate_y", 0.7, 9), ("autocontrast", 0.9, 1)),
)
_SIGNED = ("shear_x", "shear_y", "translate_x", "translate_y", "rotate", "brightness", "color",
           "contrast", "sharpness")


def _scaled(name: str, m: int) -> float:
    """AutoAugment's magnitude of bin ``m`` as a fraction of :func:`apply_scaled`'s range."""
    t = m / 9
    if name in ("shear_x", "shear_y"):
        return 0.3 * t / 0.99  # shear 0 ... 0.3 of 0.99
    if name in ("translate_x", "translate_y"):
        return 150 / 331 * t  # 0 ... 150/331 of the image side, of 1 side
    if name == "rotate":
        return 30.0 * t / 135.0  # 0 ... 30 degrees of 135
    if name in ("brightness", "color", "contrast", "sharpness"):
        return 0.9 * t / 0.99  # enhance factor 1 ± 0 ... 0.9 of 0.99
    if name == "posterize":
        return (8 - round(8 - 4 * t)) / 6  # 8 ... 4 bits kept, of 8 ... 2
    if name == "solarize":
        return 1.0 - (256 - 256 * t) / 255  # threshold 256 ... 0, of 255 ... 0
    if name == "invert":
        return 1.0  # solarize at threshold 0
    return 0.0  # autocontrast, equalize: no magnitude


def policy_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(operation index, probability, magnitude fraction, signed?) of each sub-policy's two
    operations, each ``(25, 2)``; operation indices into :data:`OPS` (invert as solarize)."""
    ops = [[OPS.index("solarize" if n == "invert" else n) for n, _, _ in sp] for sp in CIFAR10_POLICY]
    prob = [[p for _, p, _ in sp] for sp in CIFAR10_POLICY]
    mag = [[_scaled(n, m) for n, _, m in sp] for sp in CIFAR10_POLICY]
    signed = [[n in _SIGNED for n, _, _ in sp] for sp in CIFAR10_POLICY]
    return (torch.tensor(ops), torch.tensor(prob), torch.tensor(mag, dtype=torch.float32),
            torch.tensor(signed))


_POLICY = policy_tensors()


def draw_autoaugment(batch: int, generator: torch.Generator) -> list[torch.Tensor]:
    """The random numbers of :func:`autoaugment` for ``batch`` images, on the CPU: one sub-policy
    per image, then per operation whether it applies and its sign; returned as the two
    operations' (operation index, signed magnitude fraction) columns, 0 (identity) where an
    operation does not apply."""
    gdev = generator.device
    ops, prob, mag, signed = _POLICY
    k = torch.randint(0, len(CIFAR10_POLICY), (batch,), generator=generator, device=gdev).cpu()
    cols = []
    for j in range(2):
        apply = torch.rand(batch, generator=generator, device=gdev).cpu() < prob[k, j]
        sign = torch.where(torch.rand(batch, generator=generator, device=gdev).cpu() < 0.5, -1.0, 1.0)
        cols.append(torch.where(apply, ops[k, j], torch.zeros_like(k)))  # 0: identity
        cols.append(mag[k, j] * torch.where(signed[k, j], sign, torch.ones_like(sign)))
    return cols


def autoaugment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One random sub-policy of :data:`CIFAR10_POLICY` per image of a uint8 ``(B, 3, H, W)``
    batch; random numbers from ``generator`` (:func:`draw_autoaugment`, moved to the images'
    device afterwards)."""
    op1, scale1, op2, scale2 = draw_autoaugment(images.shape[0], generator)
    dev = images.device
    for op, scale in ((op1, scale1), (op2, scale2)):
        images = apply_scaled(images, to_device(op, dev), to_device(scale, dev), fill=FILL)
    return images
