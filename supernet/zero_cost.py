"""A zero-cost accuracy prior: NASWOT (Mellor et al., "Neural Architecture Search without
Training", ICML 2021).

One batch through the *untrained* network; each rectified unit gives every image a binary code
(active or not); two images whose codes agree on many units are hard for the network to tell
apart. The score is ``log|K|`` of the Hamming-agreement kernel ``K = C C^T + (1-C)(1-C)^T``:
high when the untrained network already separates the images. It ranks NAS-Bench-201 cells by
their trained CIFAR-100 accuracy at Spearman 0.80 (the paper's figure; 0.80 on 500 cells here,
``benchmarks/search_nb201.md``), before any training, so the search can use it as a guess of
accuracy for every candidate (``ScreeningSampler(accuracy_prior=...)``).

All candidates share one seeded supernet (``set_active`` picks the candidate): the paper
initialises each network afresh; a shared draw keeps the ranking free of one more source of
noise and costs one model. Units are the outputs of the network's activation modules
(``nn.ReLU``, ``nn.ReLU6``, ``nn.Hardswish``, ``nn.GELU``, ``nn.SiLU``), active where > 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from hwnas.core.errors import UserError

__all__ = ["naswot_scores"]

_ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.GELU, nn.SiLU)


def _batch(images: torch.Tensor | np.ndarray) -> torch.Tensor:
    x = torch.as_tensor(images, dtype=torch.float32)
    if x.ndim != 4 or x.shape[0] < 2:
        raise UserError(f"zero-cost scores need a batch of images N x C x H x W with N >= 2, "
                        f"got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise UserError("zero-cost scores: the images hold NaN or infinite values")
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    std = x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return (x - mean) / std  # per-channel standardised, as a trained pipeline would feed them


def naswot_scores(space: Any, archs: Sequence[Any], images: torch.Tensor | np.ndarray, *,
                  seed: int = 0, device: str = "cpu",
                  progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """NASWOT score of each of ``archs`` (higher: more accurate once trained, expected).

    ``space`` builds the supernet (``space.build_supernet()``, seeded by ``seed``), whose
    ``set_active`` selects each candidate; ``images`` is one batch (N x C x H x W, standardised
    per channel here). Candidates whose kernel is singular (e.g. a cell whose output does not
    depend on its input, so every image gets the same codes) get the lowest finite score of
    the call less 1, or 0 when none is finite. ``progress(done, total)`` is called after each.
    """
    if not archs:
        return np.zeros(0)
    build = getattr(space, "build_supernet", None)
    if not callable(build):
        raise UserError(f"space {getattr(space, 'name', space)!r} builds no supernet; "
                        "zero-cost scores need one (space.build_supernet())")
    x = _batch(images).to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        net = build()
    net = net.to(device).train()  # batch statistics, as the untrained network has no others
    n = x.shape[0]
    kernel = torch.zeros(n, n, dtype=torch.float64, device=device)

    def hook(_m: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        c = (out.detach().flatten(1) > 0).to(torch.float64)
        kernel.add_(c @ c.T).add_((1 - c) @ (1 - c).T)

    handles = [m.register_forward_hook(hook) for m in net.modules()
               if isinstance(m, _ACTIVATIONS)]
    out = np.empty(len(archs))
    try:
        with torch.no_grad():
            for i, arch in enumerate(archs):
                kernel.zero_()
                net.set_active(arch)
                net(x)
                sign, logdet = torch.linalg.slogdet(kernel)
                out[i] = float(logdet) if float(sign) > 0 else -np.inf
                if progress is not None:
                    progress(i + 1, len(archs))
    finally:
        for h in handles:
            h.remove()
    finite = np.isfinite(out)
    floor = float(out[finite].min()) - 1.0 if finite.any() else 0.0
    out[~finite] = floor
    return out
