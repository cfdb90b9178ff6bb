"""Evaluating subnets: BatchNorm recalibration and top-1 accuracy.

A subnet taken from a supernet inherits running statistics that were accumulated over many
different subnets; they are wrong for it. Recalibrating them on a few training batches (as
Once-for-All does) is what makes supernet accuracies meaningful, so every evaluation here does
it on a standalone copy, leaving the supernet untouched, on augmented training batches (see
:func:`bn_calibration_loader`).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from hwnas.supernet.data.loader import BatchLoader
from hwnas.supernet.data.splits import DatasetSplits, ImageSplit
from torch import nn


@torch.no_grad()
def recalibrate_bn(model: nn.Module, batches: Iterable, max_batches: int = 20) -> nn.Module:
    """Reset every BatchNorm's running statistics and re-estimate them as the exact average over
    up to ``max_batches`` batches (``(x, y)`` pairs, ``y`` ignored). Returns the model in eval
    mode. A model without BatchNorm (a transformer's LayerNorm keeps no statistics) is returned
    as is, without a forward pass."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return model.eval()
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
    """Top-1 accuracy in percent over all ``(x, y)`` batches.

    Examples:
        >>> from hwnas.supernet import get_space, load_dataset
        >>> data = load_dataset("digits", seed=0)
        >>> space = get_space("mbv3-tiny")
        >>> from hwnas.supernet import accuracy, eval_loader
        >>> model = space.build_supernet().extract(space.smallest()).eval()
        >>> 0 <= accuracy(model, eval_loader(data, data.val)) <= 100
        True
    """
    model.eval()
    correct, total = None, 0  # counted on the model's device: one host read, not one per batch
    for x, y in batches:
        hits = (model(x).argmax(1) == y).sum()
        correct = hits if correct is None else correct + hits
        total += y.numel()
    if total == 0:
        raise ValueError("no samples to evaluate")
    return 100.0 * int(correct) / total


def calibration_loader(data: DatasetSplits, *, batch_size: int = 64, seed: int = 0,
                       device: str | torch.device = "cpu") -> BatchLoader:
    """Training images without augmentation, shuffled with a fixed seed: what quantization
    observers calibrate activation ranges on (the images a deployed model will see).

    Examples:
        >>> from hwnas.supernet import get_space, load_dataset
        >>> data = load_dataset("digits", seed=0)
        >>> space = get_space("mbv3-tiny")
        >>> from hwnas.supernet import calibration_loader
        >>> x, y = next(iter(calibration_loader(data, batch_size=32)))
        >>> tuple(x.shape), x.dtype
        ((32, 1, 8, 8), torch.float32)
    """
    return BatchLoader(data.train, batch_size=batch_size, mean=data.mean, std=data.std,
                       shuffle=True, seed=seed, device=device)


def bn_calibration_loader(data: DatasetSplits, *, batch_size: int = 64, seed: int = 0,
                          device: str | torch.device = "cpu") -> BatchLoader:
    """Training images *with the training augmentation*, shuffled with a fixed seed, for BN
    recalibration.

    The weights were trained against BatchNorm statistics of augmented batches (CIFAR's crops
    pad with zeros, which shifts every layer's mean and variance), and a standalone network
    evaluates with running statistics of such batches too. Statistics of clean images do not
    match them: run 4's mbv3 CIFAR-10 supernet's largest subnet scored 89.2 % with clean and
    93.0 % with augmented statistics (20 batches of 64, the same 2,000 test images)."""
    return BatchLoader(data.train, batch_size=batch_size, mean=data.mean, std=data.std,
                       shuffle=True, augment=data.augment, seed=seed, device=device)


def eval_loader(data: DatasetSplits, split: ImageSplit, *, batch_size: int = 256,
                device: str | torch.device = "cpu") -> BatchLoader:
    """Normalised ``(x, y)`` batches of ``split`` in order, without augmentation (for scoring).

    Examples:
        >>> from hwnas.supernet import get_space, load_dataset
        >>> data = load_dataset("digits", seed=0)
        >>> space = get_space("mbv3-tiny")
        >>> from hwnas.supernet import eval_loader
        >>> sum(len(y) for _, y in eval_loader(data, data.test)) == len(data.test)
        True
    """
    return BatchLoader(split, batch_size=batch_size, mean=data.mean, std=data.std, device=device)


def bn_calibration_batches(data: DatasetSplits, calib_batches: int, *,
                           batch_size: int = 64, seed: int = 0,
                           device: str | torch.device = "cpu") -> list[tuple]:
    """The first ``calib_batches`` batches of :func:`bn_calibration_loader`, drawn once: a
    seeded loader gives every subnet the same batches, so many subnets recalibrated on this
    list (``recalibrated_subnet(..., batches=)``) get exactly what their own loaders give."""
    loader = bn_calibration_loader(data, batch_size=batch_size, seed=seed, device=device)
    out = []
    for batch in loader:
        if len(out) >= calib_batches:
            break
        out.append(batch)
    return out


def recalibrated_subnet(supernet: nn.Module, arch, data: DatasetSplits, *,
                        calib_batches: int = 20, calib_batch_size: int = 64,
                        seed: int = 0, batches: Sequence | None = None) -> nn.Module:
    """Extract ``arch`` from ``supernet`` and recalibrate its BatchNorm on ``calib_batches``
    augmented training batches of ``calib_batch_size`` (:func:`bn_calibration_loader`, shuffled
    with ``seed``), on the supernet's device. ``batches``: those batches drawn once for many
    subnets (:func:`bn_calibration_batches`, on the supernet's device)."""
    device = next(supernet.parameters()).device
    model = supernet.extract(arch)
    if batches is None:
        batches = bn_calibration_loader(data, batch_size=calib_batch_size, seed=seed,
                                        device=device)
    recalibrate_bn(model, batches, calib_batches)
    return model


def evaluate_subnet(supernet: nn.Module, arch, data: DatasetSplits, *, split: str = "val",
                    calib_batches: int = 20, calib_batch_size: int = 64, batch_size: int = 256,
                    seed: int = 0) -> tuple[float, nn.Module]:
    """:func:`recalibrated_subnet` and its top-1 accuracy in percent on ``split``:
    (accuracy, the recalibrated standalone model).

    Examples:
        >>> from hwnas.supernet import get_space, load_dataset
        >>> data = load_dataset("digits", seed=0)
        >>> space = get_space("mbv3-tiny")
        >>> from hwnas.supernet import evaluate_subnet
        >>> supernet = space.build_supernet()
        >>> acc, model = evaluate_subnet(supernet, space.smallest(), data)   # an untrained supernet
        >>> 0 <= acc <= 100, type(model).__name__
        (True, 'MBV3Net')
    """
    device = next(supernet.parameters()).device
    model = recalibrated_subnet(supernet, arch, data, calib_batches=calib_batches,
                                calib_batch_size=calib_batch_size, seed=seed)
    acc = accuracy(model, eval_loader(data, getattr(data, split), batch_size=batch_size, device=device))
    return acc, model
