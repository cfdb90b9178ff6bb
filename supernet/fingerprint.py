"""What a supernet trained on, recorded in its checkpoint, and validation kept apart from it.

A supernet scores candidates on a validation split; if that split holds images the supernet
trained on, the search ranks models partly on memorised images. Split indices do not survive
another copy of a dataset (the CIFAR-10 pickle directory comes in another order than the npz; a
subset shifts every index), so a checkpoint records the *content* of its training images
(:func:`training_record`), and :func:`disjoint_validation` gives a search a validation split
with none of those images, or refuses in one line when the dataset cannot provide one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from hwnas.core.errors import UserError
from hwnas.supernet.data.splits import DatasetSplits, ImageSplit

__all__ = [
    "RECORD_FORMAT",
    "DataRecord",
    "dataset_fingerprint",
    "disjoint_validation",
    "image_hashes",
    "read_record",
    "training_record",
]

#: Tag of the ``data_record`` entry of a checkpoint.
RECORD_FORMAT = "hwnas-data-record-1"


def image_hashes(images: torch.Tensor) -> np.ndarray:
    """One 64-bit hash (``uint64``) per image of a uint8 ``(N, C, H, W)`` tensor.

    BLAKE2b over each image's pixel bytes, keyed with its shape, so equal images hash equal
    wherever they sit; 64 bits keep accidental collisions negligible at dataset sizes."""
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise ValueError(f"image_hashes expects uint8 (N, C, H, W), got {images.dtype} "
                         f"{tuple(images.shape)}")
    arr = np.ascontiguousarray(images.cpu().numpy()).reshape(images.shape[0], -1)
    shape = repr(tuple(images.shape[1:])).encode()
    out = np.empty(arr.shape[0], dtype=np.uint64)
    for i, row in enumerate(arr):
        out[i] = int.from_bytes(hashlib.blake2b(row, digest_size=8, person=b"hwnas-img",
                                                key=shape[:64]).digest(), "little")
    return out


def _split_hashes(data: DatasetSplits) -> dict[str, np.ndarray]:
    return {name: image_hashes(getattr(data, name).images) for name in ("train", "val", "test")}


def dataset_fingerprint(data: DatasetSplits, hashes: dict[str, np.ndarray] | None = None) -> str:
    """A hex digest of every image of ``data`` with its label and of its class names.

    Independent of the order of the images and of how they are split, so any seed of one copy
    gives one fingerprint; a subset or another dataset gives another."""
    hashes = hashes or _split_hashes(data)
    h = np.concatenate([hashes[s] for s in ("train", "val", "test")])
    y = np.concatenate([getattr(data, s).labels.numpy() for s in ("train", "val", "test")])
    order = np.lexsort((y, h))
    digest = hashlib.blake2b(digest_size=16, person=b"hwnas-data")
    digest.update("\x1f".join(c.strip().lower() for c in data.classes).encode())
    digest.update(h[order].astype("<u8").tobytes())
    digest.update(y[order].astype("<i8").tobytes())
    return digest.hexdigest()


def training_record(data: DatasetSplits, hashes: dict[str, np.ndarray] | None = None,
                    ) -> dict[str, Any]:
    """The ``data_record`` a checkpoint keeps of training on ``data.train`` (plain types and
    one int64 tensor, so ``torch.load(weights_only=True)`` reads it):

    * ``train_hashes``: a sorted array of 64-bit BLAKE2b hashes, one per training image, of its
      decoded pixels (uint8, C x H x W; :func:`image_hashes`), so the same image matches
      whatever its position or container (npz JPEG bytes, pickle rows, image files decode to
      the same pixels); an image re-encoded with other pixels (JPEG against the original PNGs)
      is another image here;
    * ``classes`` and ``fingerprint`` (:func:`dataset_fingerprint`), to tell another dataset of
      the same shape from a copy of this one.
    """
    hashes = hashes or _split_hashes(data)
    train = np.sort(hashes["train"])
    return {
        "format": RECORD_FORMAT,
        "dataset": data.name,
        "classes": list(data.classes),
        "fingerprint": dataset_fingerprint(data, hashes),
        "train_images": int(train.shape[0]),
        "train_hashes": torch.from_numpy(train.view(np.int64).copy()),
    }


@dataclass(frozen=True)
class DataRecord:
    """A checked ``data_record``: what a checkpoint's weights were trained on."""

    dataset: str
    classes: tuple[str, ...]
    fingerprint: str
    train_hashes: np.ndarray  # uint64, sorted


def read_record(payload: dict[str, Any], source: str) -> DataRecord | None:
    """The checked record of a checkpoint's payload; ``None`` for a checkpoint written before
    checkpoints recorded one. A malformed record is a :class:`UserError` naming the file."""
    rec = payload.get("data_record")
    if rec is None:
        return None
    bad = f"checkpoint {source} has a malformed data_record"
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        raise UserError(f"{bad}: expected a dict tagged {RECORD_FORMAT!r}")
    classes, hashes = rec.get("classes"), rec.get("train_hashes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise UserError(f"{bad}: 'classes' must be a list of strings")
    if not isinstance(rec.get("fingerprint"), str) or not isinstance(rec.get("dataset"), str):
        raise UserError(f"{bad}: 'fingerprint' and 'dataset' must be strings")
    if not isinstance(hashes, torch.Tensor) or hashes.dtype != torch.int64 or hashes.dim() != 1:
        raise UserError(f"{bad}: 'train_hashes' must be a 1-D int64 tensor")
    train = np.sort(hashes.numpy().view(np.uint64))
    if rec.get("train_images") != train.shape[0]:
        raise UserError(f"{bad}: it counts {rec.get('train_images')!r} training images but holds "
                        f"{train.shape[0]} hashes")
    return DataRecord(rec["dataset"], tuple(classes), rec["fingerprint"], train)


def _names(classes) -> list[str]:
    return [c.strip().lower() for c in classes]


def _take(split: ImageSplit, idx: np.ndarray) -> ImageSplit:
    t = torch.from_numpy(np.sort(idx).astype(np.int64))
    return ImageSplit(split.images[t].contiguous(), split.labels[t].contiguous())


def _join(a: ImageSplit, b: ImageSplit) -> ImageSplit:
    return ImageSplit(torch.cat([a.images, b.images]), torch.cat([a.labels, b.labels]))


def _check_classes(record: DataRecord, data: DatasetSplits, source: str) -> None:
    """UserError unless the checkpoint's record names ``data``'s classes, in its order."""
    if _names(record.classes) != _names(data.classes):
        order = " in another order" if sorted(_names(record.classes)) == sorted(
            _names(data.classes)) else ""
        raise UserError(f"checkpoint {source} was trained on {record.dataset!r} with classes "
                        f"{', '.join(record.classes)}; dataset {data.name!r} has classes "
                        f"{', '.join(data.classes)}{order}: train a supernet on this dataset "
                        f"(hwnas train) or pass the dataset the checkpoint was trained on")


def disjoint_validation(data: DatasetSplits, payload: dict[str, Any], source: str, *,
                        seed: int = 0, log: Callable[[str], Any] = print) -> DatasetSplits:
    """``data`` with validation (and test) splits that hold none of the images the checkpoint
    ``payload`` (read from ``source``) trained on.

    Validation keeps its unseen images, hands the seen ones to the training split and, per
    class, is topped up to its former size from the unseen images of the training split
    (seeded, so every worker of a search gets the same split). Refused in one line: another dataset (other classes, or the same classes with
    another fingerprint and no image in common), a validation split that would keep fewer than
    half its images or lose a class, a test split of seen images only. A checkpoint without a
    record (an earlier version's) gives one warning line and ``data`` unchanged.
    """
    record = read_record(payload, source)
    if record is None:
        log(f"warning: checkpoint {source} does not record its training images (written by an "
            f"earlier hwnas); validation on {data.name!r} cannot be checked for overlap with them")
        return data
    _check_classes(record, data, source)
    hashes = _split_hashes(data)
    seen = {s: np.isin(h, record.train_hashes) for s, h in hashes.items()}
    n_seen = sum(int(m.sum()) for m in seen.values())
    if n_seen == 0:
        if dataset_fingerprint(data, hashes) != record.fingerprint:
            raise UserError(
                f"checkpoint {source} was trained on {record.dataset!r} (fingerprint "
                f"{record.fingerprint[:12]}), another dataset with the same classes: none of its "
                f"{record.train_hashes.shape[0]} training images is among the "
                f"{sum(h.shape[0] for h in hashes.values())} images of {data.name!r} (or they "
                f"were re-encoded); train a supernet on this dataset (hwnas train) or pass the "
                f"dataset the checkpoint was trained on")
        return data
    test = data.test
    if seen["test"].any():
        kept = np.flatnonzero(~seen["test"])
        if kept.size == 0:
            raise UserError(f"every one of the {len(data.test)} test images of {data.name!r} is a "
                            f"training image of checkpoint {source}; use a dataset whose test "
                            f"set the supernet never saw")
        test = _take(data.test, kept)
        log(f"test: dropped {int(seen['test'].sum())} of {len(data.test)} images that checkpoint "
            f"{source} trained on ({len(test)} left)")
    if not seen["val"].any():
        return data if test is data.test else replace(data, test=test)

    rng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, 7]))
    val_labels, train_labels = data.val.labels.numpy(), data.train.labels.numpy()
    quota = np.bincount(val_labels, minlength=data.num_classes)
    keep_val, move, lost = [], [], []
    for c in range(data.num_classes):
        clean_val = np.flatnonzero((val_labels == c) & ~seen["val"])
        clean_train = np.flatnonzero((train_labels == c) & ~seen["train"])
        need = max(int(quota[c]) - clean_val.size, 0)
        keep_val.append(clean_val)
        move.append(rng.permutation(clean_train)[:need])
        if quota[c] > 0 and clean_val.size + min(need, clean_train.size) == 0:
            lost.append(data.classes[c])
    keep_val, move = np.concatenate(keep_val), np.concatenate(move)
    size, target = keep_val.size + move.size, len(data.val)
    overlap = (f"checkpoint {source} trained on {int(seen['val'].sum())} of the {target} "
               f"validation images and {int(seen['train'].sum())} of the {len(data.train)} "
               f"training images of {data.name!r}")
    if size < math.ceil(target / 2) or lost:
        short = (f"no unseen image of class(es) {', '.join(lost)}" if lost else
                 f"only {size} unseen images for a validation split of {target}")
        raise UserError(f"validation would overlap the supernet's training images: {overlap}, "
                        f"leaving {short}; pass the copy and split it was trained on, or train "
                        f"a supernet on this dataset (hwnas train)")
    moved = np.zeros(len(data.train), dtype=bool)
    moved[move] = True
    val = _join(_take(data.val, keep_val), _take(data.train, move))
    train = _join(_take(data.train, np.flatnonzero(~moved)),
                  _take(data.val, np.flatnonzero(seen["val"])))  # seen images: training only
    log(f"validation: {overlap}; those moved to training and {move.size} unseen training images "
        f"took their place ({size} validation images, none seen by the supernet)")
    return replace(data, train=train, val=val, test=test)
