"""Batches for training and evaluation: :class:`BatchLoader` moves a split to the device once
(as uint8) and indexes, augments and normalises there, with no worker processes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from hwnas.supernet.data.augment import apply_augment, augment_batch
from hwnas.supernet.data.splits import ImageSplit
from hwnas.supernet.host_sync import to_device
from hwnas.supernet.train_options import check_augment

from hwnas.core.errors import UserError

__all__ = ["BatchLoader"]


def _epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 63-bit seed for ``(seed, epoch)``, so nearby seeds give unrelated epochs."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch)]).generate_state(
        1, dtype=np.uint64)
    return int(state[0] & np.uint64(0x7FFFFFFFFFFFFFFF))


class BatchLoader:
    """Iterates ``(x, y)`` batches over an :class:`ImageSplit`.

    ``x`` is float32 ``(B, C, H, W)`` normalised per channel as
    ``(images / 255 - mean) / std``; ``y`` is int64 ``(B,)``. The split is moved to ``device``
    once (as uint8), and indexing, augmentation and normalisation all happen there.

    Each pass (``iter``) is one epoch with its own generator seeded from ``(seed, epoch)``:
    the order and augmentation change from epoch to epoch, yet two loaders with the same seed
    produce the same sequence of epochs, and an abandoned epoch does not shift later ones.
    :meth:`set_epoch` repositions the sequence (e.g. when resuming training).

    ``compile``: run the augmentation's tensor work (:func:`apply_augment`) and the
    normalisation through ``torch.compile`` (default mode, fixed shapes): the same random numbers,
    a few fused kernels instead of hundreds of launches per batch on a GPU. Off the CPU only the
    normalisation: on an H100 the compiled AutoAugment batch differed from the eager one in
    14 % of its pixels, by up to 86 levels (``cct_speed_probe.py``'s ``augment_check``,
    ``benchmarks/supernet_cifar10.md`` "Session 37"), while eager GPU, eager CPU and compiled
    CPU agree exactly; the training must see the recipe's images.
    """

    def __init__(
        self,
        split: ImageSplit,
        *,
        batch_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        shuffle: bool = False,
        augment: str = "none",
        seed: int = 0,
        device: str | torch.device = "cpu",
        drop_last: bool = False,
        compile: bool = False,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
        channels = int(split.images.shape[1])
        check_augment(augment, channels)  # here, so that training fails before it starts
        # host-side statistics, moved to the device below (never on the default device)
        mean_t = torch.as_tensor(list(mean), dtype=torch.float32, device="cpu").flatten()
        std_t = torch.as_tensor(list(std), dtype=torch.float32, device="cpu").flatten()
        if mean_t.numel() != channels or std_t.numel() != channels:
            raise ValueError(
                f"mean and std need one value per channel ({channels}), got {mean_t.numel()} "
                f"and {std_t.numel()}"
            )
        if not bool((std_t > 0).all()):
            raise ValueError(f"std must be positive, got {tuple(std_t.tolist())}")
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.augment = augment
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0
        self._images = split.images.to(self.device)
        self._labels = split.labels.to(self.device)
        self._mean = mean_t.to(self.device).view(1, -1, 1, 1)
        self._std = std_t.to(self.device).view(1, -1, 1, 1)
        self._fill = [int(round(255.0 * m)) for m in mean_t.tolist()]  # cutout: the mean pixel
        self._apply, self._normalise = apply_augment, _normalise
        if compile:
            if self.device.type == "cpu":
                self._apply = torch.compile(apply_augment, dynamic=False)
            self._normalise = torch.compile(_normalise, dynamic=False)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter`` produce epoch ``epoch`` (0-based) of this seed's sequence."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        n = int(self._labels.shape[0])
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch))
        self.epoch += 1
        return self._batches(generator)

    def _batches(self, generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = int(self._labels.shape[0])
        if self.shuffle:
            order = to_device(torch.randperm(n, generator=generator, device="cpu"), self.device)
        else:
            order = torch.arange(n, device=self.device)
        for b in range(len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            images = self._images[idx]
            if self.augment != "none":
                images = augment_batch(images, self.augment, generator, fill=self._fill,
                                       apply=self._apply)
            yield self._normalise(images, self._mean, self._std), self._labels[idx]


def _normalise(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 images as float32 ``(images / 255 - mean) / std``."""
    return images.float().div_(255.0).sub_(mean).div_(std)
