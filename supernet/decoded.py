"""Datasets as pre-decoded ``.npz`` files (uint8 NCHW arrays, labels, class names, train
statistics), which load with numpy alone, so a GPU machine without Pillow trains from them;
and :func:`load_training_data`, which reads those or anything
:func:`hwnas.supernet.data.load_dataset` reads, optionally a seeded random subset (smoke runs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from hwnas.supernet.data import DatasetSplits, ImageSplit, load_dataset

from hwnas.core.errors import UserError
from hwnas.core.io import write_atomic

__all__ = ["DECODED_KEYS", "is_decoded", "load_decoded", "load_training_data", "save_decoded"]

#: Keys a decoded dataset file must hold.
DECODED_KEYS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test", "classes", "mean", "std")


def save_decoded(data: DatasetSplits, path: str | Path) -> Path:
    """Write ``data``'s splits as a decoded ``.npz`` (atomically) that :func:`load_decoded`
    reads without Pillow."""
    def save(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(
                fh,
                x_train=data.train.images.numpy(), y_train=data.train.labels.numpy(),
                x_val=data.val.images.numpy(), y_val=data.val.labels.numpy(),
                x_test=data.test.images.numpy(), y_test=data.test.labels.numpy(),
                classes=np.asarray(data.classes), mean=np.asarray(data.mean, dtype=np.float64),
                std=np.asarray(data.std, dtype=np.float64), name=np.asarray(data.name),
                augment=np.asarray(data.augment),
            )

    return write_atomic(path, save)


def is_decoded(path: str | Path) -> bool:
    """Whether ``path`` is a ``.npz`` written by :func:`save_decoded`."""
    path = Path(path)
    if not (path.is_file() and path.suffix.lower() == ".npz"):
        return False
    try:
        with np.load(path, allow_pickle=False) as npz:
            return "x_train" in npz.files
    except Exception:  # not a readable npz: load_dataset reports it
        return False


def load_decoded(path: str | Path) -> DatasetSplits:
    """The dataset of a file written by :func:`save_decoded` (numpy only, never unpickles)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in DECODED_KEYS if k not in npz.files]
            if missing:
                raise UserError(f"{path} is not a decoded dataset: missing key(s) {', '.join(missing)}")
            a = {k: npz[k] for k in npz.files}
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"cannot read decoded dataset {path}: {exc}") from None

    def split(x: str, y: str) -> ImageSplit:
        images, labels = a[x], a[y]
        if images.dtype != np.uint8 or images.ndim != 4 or labels.shape != (images.shape[0],):
            raise UserError(f"{path}: {x} must be uint8 (N, C, H, W) with {y} of length N, got "
                            f"{images.dtype} {images.shape} and {labels.shape}")
        return ImageSplit(torch.from_numpy(np.ascontiguousarray(images)),
                          torch.from_numpy(labels.astype(np.int64)))

    return DatasetSplits(
        name=str(a["name"]) if "name" in a else path.stem,
        train=split("x_train", "y_train"), val=split("x_val", "y_val"),
        test=split("x_test", "y_test"),
        classes=[str(c) for c in a["classes"].tolist()],
        mean=tuple(float(v) for v in a["mean"]), std=tuple(float(v) for v in a["std"]),
        augment=str(a["augment"]) if "augment" in a else "crop_flip",
    )


def load_training_data(spec: str, *, seed: int = 0, limit_train: int | None = None,
                       limit_eval: int | None = None) -> DatasetSplits:
    """A decoded ``.npz`` or anything :func:`hwnas.supernet.data.load_dataset` reads;
    optionally only ``limit_train`` training and ``limit_eval`` validation and test images, a
    random subset drawn with ``seed`` (files may be sorted by class, so not the first N)."""
    data = load_decoded(spec) if is_decoded(spec) else load_dataset(spec, seed=seed)

    def head(s: ImageSplit, n: int | None) -> ImageSplit:
        if n is None or n >= len(s):
            return s
        idx = torch.from_numpy(np.sort(np.random.default_rng(seed).permutation(len(s))[:n]))
        return ImageSplit(s.images[idx].contiguous(), s.labels[idx].contiguous())

    if limit_train is not None or limit_eval is not None:
        data = DatasetSplits(data.name, head(data.train, limit_train), head(data.val, limit_eval),
                             head(data.test, limit_eval), data.classes, data.mean, data.std,
                             data.augment)
    return data
