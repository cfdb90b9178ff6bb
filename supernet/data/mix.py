"""MixUp and CutMix of a normalised training batch: the images of each pair blended or pasted,
the targets mixed in the same proportion (class probabilities instead of labels).

Vision transformers trained on small datasets memorise them despite strong per-image
augmentation; DeiT and the compact-transformer recipes mix pairs of images against it. The
mixing is a handful of tensor operations on the batch's device, with its random numbers drawn
from a seed and the step, so a resumed run mixes exactly as the uninterrupted one would.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["mix_batch"]


def mix_batch(x: torch.Tensor, y: torch.Tensor, num_classes: int, *, mixup: float,
              cutmix: float, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, target probabilities)`` of a float ``(B, C, H, W)`` batch and its labels.

    Each image is paired with the batch's reversed order. ``mixup`` / ``cutmix`` are the alphas
    of the Beta distribution of the mixing weight λ (0 = that kind off); with both on, each step
    is one or the other with equal chance (as timm's ``Mixup`` does per batch). MixUp blends
    ``λ x + (1 - λ) x_pair``; CutMix pastes a box of area ``1 - λ`` from the pair at a random
    centre (clipped at the border) and λ becomes the unpasted share. Targets are
    ``λ one_hot(y) + (1 - λ) one_hot(y_pair)``. Random numbers: NumPy seeded by
    ``(seed, step)``. Both off: the batch and its one-hot targets unchanged.
    """
    if mixup < 0 or cutmix < 0:
        raise ValueError(f"mixup and cutmix alphas must be >= 0, got {mixup} and {cutmix}")
    rng = np.random.default_rng([int(seed), int(step), 0x6D6978])
    onehot = F.one_hot(y, num_classes).to(torch.float32)
    if not (mixup > 0 or cutmix > 0) or len(x) < 2:
        return x, onehot
    use_cutmix = cutmix > 0 and (mixup <= 0 or rng.random() < 0.5)
    lam = float(rng.beta(cutmix, cutmix) if use_cutmix else rng.beta(mixup, mixup))
    pair = x.flip(0)
    if use_cutmix:
        h, w = x.shape[-2:]
        cut = math.sqrt(1.0 - lam)
        ch, cw = round(h * cut), round(w * cut)
        cy, cx = int(rng.integers(h)), int(rng.integers(w))
        y0, y1 = max(cy - ch // 2, 0), min(cy + ch - ch // 2, h)
        x0, x1 = max(cx - cw // 2, 0), min(cx + cw - cw // 2, w)
        x = x.clone()
        x[..., y0:y1, x0:x1] = pair[..., y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / float(h * w)
    else:
        x = x * lam + pair * (1.0 - lam)
    return x, onehot * lam + onehot.flip(0) * (1.0 - lam)
