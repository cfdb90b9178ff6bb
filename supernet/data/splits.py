"""Train/validation/test splitting of an in-memory dataset, and the containers it fills.

Every split is stratified and seeded, so a seed fully determines which image lands where;
per-channel statistics come from the training split only, so evaluation stays honest. The
readers (:mod:`.cifar`, :mod:`.image_folder`, :mod:`.sources`) decode images and hand them here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from hwnas.core.errors import UserError

__all__ = [
    "DatasetSplits",
    "ImageSplit",
    "check_class_names",
    "require_every_class",
    "split_from_train",
    "subsample_eval",
    "split_single_pool",
]


@dataclass
class ImageSplit:
    """One split of a dataset: raw images and their class labels.

    ``images`` stay ``uint8`` (normalisation happens per batch in :class:`BatchLoader`) so a
    split costs one byte per pixel and channel wherever it lives.
    """

    images: torch.Tensor  # uint8, (N, C, H, W)
    labels: torch.Tensor  # int64, (N,)

    def __post_init__(self) -> None:
        # Internal invariants, not user input: a violation here is a bug in a loader.
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise ValueError(
                f"ImageSplit.images must be uint8 (N, C, H, W), got {self.images.dtype} "
                f"{tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.dim() != 1:
            raise ValueError(
                f"ImageSplit.labels must be int64 (N,), got {self.labels.dtype} "
                f"{tuple(self.labels.shape)}"
            )
        if self.labels.shape[0] != self.images.shape[0]:
            raise ValueError(
                f"ImageSplit has {self.images.shape[0]} images but {self.labels.shape[0]} labels"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class DatasetSplits:
    """A dataset ready for training: train/val/test splits plus what a model needs to know.

    ``mean``/``std`` are per-channel statistics of the *train* images scaled to [0, 1] (never
    of val/test, so evaluation stays honest). ``augment`` names the training augmentation that
    suits the data (see :func:`augment_batch`): ``"shift"`` for the tiny digits, where a flip
    would turn one digit into another, ``"crop_flip"`` for natural images.
    """

    name: str
    train: ImageSplit
    val: ImageSplit
    test: ImageSplit
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: str

    @property
    def num_classes(self) -> int:
        """Number of classes (the width of a classifier head)."""
        return len(self.classes)

    @property
    def in_channels(self) -> int:
        """Channels per image: 1 for grayscale, 3 for RGB."""
        return int(self.train.images.shape[1])

    @property
    def image_size(self) -> tuple[int, int]:
        """``(H, W)`` of every image."""
        return int(self.train.images.shape[2]), int(self.train.images.shape[3])



def check_class_names(classes: Sequence[str], where: str) -> None:
    """:class:`UserError` unless there are at least two classes with distinct names.

    One class makes every accuracy 100 %; two classes of one name (case and surrounding
    spaces aside) cannot be told apart by whoever reads the labels."""
    if len(classes) < 2:
        raise UserError(f"{where} names {len(classes)} class(es) ({', '.join(classes)}); "
                        "a classification dataset needs at least 2 classes")
    seen: dict[str, str] = {}
    for name in classes:
        key = name.strip().lower()
        if key in seen:
            raise UserError(f"{where} names class {name!r} twice"
                            + ("" if seen[key] == name else f" (as {seen[key]!r} and {name!r})")
                            + "; expected distinct class names")
        seen[key] = name


def require_every_class(labels: np.ndarray | torch.Tensor, classes: Sequence[str], where: str,
                        hint: str = "every class needs at least one training image") -> None:
    """:class:`UserError` naming the classes of ``classes`` that ``labels`` never uses.

    A class without training images cannot be learned, yet still counts in the head and in
    accuracy (a class-sorted subset holding 4 of 10 classes scores far too low in silence)."""
    labels = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    counts = np.bincount(labels.astype(np.int64), minlength=len(classes))
    missing = [classes[i] for i in np.flatnonzero(counts[:len(classes)] == 0)]
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10
                                           else "")
        raise UserError(f"{where} has no images of {len(missing)} of the {len(classes)} "
                        f"classes ({shown}); {hint}")



def _rng(seed: int, stream: int) -> np.random.Generator:
    """Independent random stream ``stream`` for ``seed`` (e.g. test vs. val draws)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, stream]))


def _stratified_take(labels: np.ndarray, count: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pick ``count`` indices with class proportions as close as possible to ``labels``'.

    Returns ``(rest, taken)``, both sorted. Quotas are allocated by largest remainder, so the
    total is exact even for tiny datasets where per-class rounding would miss it.
    """
    n = labels.shape[0]
    classes, counts = np.unique(labels, return_counts=True)
    quotas = counts * (count / n)
    take = np.floor(quotas).astype(np.int64)
    short = count - int(take.sum())
    if short > 0:
        order = np.argsort(-(quotas - take), kind="stable")
        take[order[:short]] += 1
    taken = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take)]
    taken_idx = np.sort(np.concatenate(taken)) if taken else np.empty(0, np.int64)
    mask = np.ones(n, dtype=bool)
    mask[taken_idx] = False
    return np.flatnonzero(mask), taken_idx


def subsample_eval(data: DatasetSplits, count: int, *, seed: int) -> DatasetSplits:
    """``data`` with its validation and test splits cut to at most ``count`` images each
    (stratified, seeded; training untouched): a CPU-sized budget for scoring many candidates.
    ``count`` 0 keeps every image."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise UserError(f"eval_images must be a non-negative integer (0: every image), "
                        f"got {count!r}")

    def cut(split: ImageSplit, stream: int) -> ImageSplit:
        if count == 0 or len(split) <= count:
            return split
        labels = split.labels.numpy()
        _, idx = _stratified_take(labels, count, _rng(seed, stream))
        return _make_split(split.images, labels, idx)

    return replace(data, val=cut(data.val, 11), test=cut(data.test, 12))


def _holdout_count(n: int, fraction: float, what: str, pool: str) -> int:
    """``round(fraction * n)``, kept to at least one held-out and one remaining image."""
    if n < 2:
        raise UserError(f"too few images to split off a {what} set: {pool} has {n} image(s)")
    return min(max(int(round(fraction * n)), 1), n - 1)


def _make_split(images: torch.Tensor, labels: np.ndarray, idx: np.ndarray | None = None,
                ) -> ImageSplit:
    if idx is None:
        return ImageSplit(images.contiguous(), torch.from_numpy(np.ascontiguousarray(labels)))
    t = torch.from_numpy(idx)
    return ImageSplit(images[t].contiguous(), torch.from_numpy(labels[idx].copy()))


def split_from_train(train_images: torch.Tensor, train_labels: np.ndarray,
                      test_images: torch.Tensor, test_labels: np.ndarray, *, name: str,
                      classes: list[str], seed: int, val_fraction: float, augment: str,
                      image_size: int | None) -> DatasetSplits:
    """Datasets with their own test set: validation is a stratified share of train."""
    if image_size is not None:
        train_images = _resize_uint8(train_images, image_size)
        test_images = _resize_uint8(test_images, image_size)
    n = len(train_labels)
    rest, val = _stratified_take(train_labels, _holdout_count(n, val_fraction, "validation",
                                                              "the train set"), _rng(seed, 1))
    return _finish(name, classes, augment,
                   _make_split(train_images, train_labels, rest),
                   _make_split(train_images, train_labels, val),
                   _make_split(test_images, test_labels))


def split_single_pool(images: torch.Tensor, labels: np.ndarray, *, name: str,
                       classes: list[str], seed: int, test_fraction: float,
                       val_fraction: float, augment: str,
                       image_size: int | None) -> DatasetSplits:
    """Datasets without a test set: take test first (seed only), then val, stratified."""
    if image_size is not None:
        images = _resize_uint8(images, image_size)
    n = len(labels)
    if test_fraction + val_fraction >= 1.0:
        raise UserError(
            f"val_fraction {val_fraction} leaves no training data for {name!r}: test takes "
            f"{test_fraction:g} of all images, so val_fraction must be below {1 - test_fraction:g}"
        )
    if n < 3:
        raise UserError(f"{name!r} has {n} image(s); need at least 3 to split train/val/test")
    rest, test = _stratified_take(labels, _holdout_count(n, test_fraction, "test", name),
                                  _rng(seed, 0))
    n_val = min(max(int(round(val_fraction * n)), 1), len(rest) - 1)
    rest_labels = labels[rest]
    keep, val = _stratified_take(rest_labels, n_val, _rng(seed, 1))
    return _finish(name, classes, augment,
                   _make_split(images, labels, rest[keep]),
                   _make_split(images, labels, rest[val]),
                   _make_split(images, labels, test))


def _finish(name: str, classes: list[str], augment: str, train: ImageSplit, val: ImageSplit,
            test: ImageSplit) -> DatasetSplits:
    require_every_class(train.labels, classes, f"the training split of {name!r}",
                        "a class needs at least two images, so that one stays in training "
                        "when validation takes its share")
    mean, std = _channel_stats(train.images)
    return DatasetSplits(name=name, train=train, val=val, test=test, classes=list(classes),
                         mean=mean, std=std, augment=augment)


def _channel_stats(images: torch.Tensor, chunk: int = 4096,
                   ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std of uint8 images scaled to [0, 1].

    Accumulated in float64 over chunks, so 50k CIFAR images never need a full float copy.
    A constant channel gets std 1.0 instead of 0 so normalisation cannot divide by zero.
    """
    c = images.shape[1]
    total = torch.zeros(c, dtype=torch.float64)
    total_sq = torch.zeros(c, dtype=torch.float64)
    for start in range(0, images.shape[0], chunk):
        x = images[start:start + chunk].to(torch.float64) / 255.0
        total += x.sum(dim=(0, 2, 3))
        total_sq += (x * x).sum(dim=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    var = (total_sq / count - mean * mean).clamp_min(0.0)
    std = var.sqrt()
    std = torch.where(std > 1e-8, std, torch.ones_like(std))
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def _resize_uint8(images: torch.Tensor, size: int, chunk: int = 4096) -> torch.Tensor:
    """Bilinear (antialiased) resize of uint8 ``(N, C, H, W)`` to ``size`` x ``size``."""
    if tuple(images.shape[2:]) == (size, size):
        return images
    out = torch.empty((images.shape[0], images.shape[1], size, size), dtype=torch.uint8)
    for start in range(0, images.shape[0], chunk):
        x = images[start:start + chunk].float()
        y = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False,
                          antialias=True)
        out[start:start + chunk] = y.round_().clamp_(0, 255).to(torch.uint8)
    return out
