"""Evaluating subnets: BatchNorm recalibration and top-1 accuracy.

A subnet taken from a supernet inherits running statistics that were accumulated over many
different subnets; they are wrong for it. Recalibrating them on a few training batches (as
Once-for-All does) is what makes supernet accuracies meaningful, so every evaluation here does
it on a standalone copy, leaving the supernet untouched.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from supernet.data import BatchLoader, DatasetSplits, ImageSplit


@torch.no_grad()
def recalibrate_bn(model: nn.Module, batches: Iterable, max_batches: int = 20) -> nn.Module:
    """Reset every BatchNorm's running statistics and re-estimate them as the exact average over
    up to ``max_batches`` batches (``(x, y)`` pairs, ``y`` ignored). Returns the model in eval
    mode."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average = exact mean over the batches seen
    model.train()
    try:
        for i, (x, _) in enumerate(batches):
            if i >= max_batches:
                break
            model(x)
    finally:
        for m, momentum in zip(bns, saved):
            m.momentum = momentum
        model.eval()
    return model


@torch.no_grad()
def accuracy(model: nn.Module, batches: Iterable) -> float:
    """Top-1 accuracy in percent over all ``(x, y)`` batches."""
    model.eval()
    correct = total = 0
    for x, y in batches:
        correct += (model(x).argmax(1) == y).sum().item()
        total += y.numel()
    if total == 0:
        raise ValueError("no samples to evaluate")
    return 100.0 * correct / total


def calibration_loader(data: DatasetSplits, *, batch_size: int = 64, seed: int = 0,
                       device: str | torch.device = "cpu") -> BatchLoader:
    """Training images without augmentation, shuffled with a fixed seed, for BN recalibration."""
    return BatchLoader(data.train, batch_size=batch_size, mean=data.mean, std=data.std,
                       shuffle=True, seed=seed, device=device)


def eval_loader(data: DatasetSplits, split: ImageSplit, *, batch_size: int = 256,
                device: str | torch.device = "cpu") -> BatchLoader:
    return BatchLoader(split, batch_size=batch_size, mean=data.mean, std=data.std, device=device)


def recalibrated_subnet(supernet: nn.Module, arch, data: DatasetSplits, *,
                        calib_batches: int = 20, seed: int = 0) -> nn.Module:
    """Extract ``arch`` from ``supernet`` and recalibrate its BatchNorm on ``calib_batches``
    training batches (shuffled with ``seed``), on the supernet's device."""
    device = next(supernet.parameters()).device
    model = supernet.extract(arch)
    recalibrate_bn(model, calibration_loader(data, seed=seed, device=device), calib_batches)
    return model


def evaluate_subnet(supernet: nn.Module, arch, data: DatasetSplits, *, split: str = "val",
                    calib_batches: int = 20, batch_size: int = 256, seed: int = 0) -> tuple[float, nn.Module]:
    """:func:`recalibrated_subnet` and its top-1 accuracy in percent on ``split``:
    (accuracy, the recalibrated standalone model)."""
    device = next(supernet.parameters()).device
    model = recalibrated_subnet(supernet, arch, data, calib_batches=calib_batches, seed=seed)
    acc = accuracy(model, eval_loader(data, getattr(data, split), batch_size=batch_size, device=device))
    return acc, model
