"""Loading a dataset by name or path: :func:`load_dataset` picks the reader.

``"digits"`` (scikit-learn's bundled 8x8 digits, no download) and ``"cifar10"`` (the shared
cifar10-jpeg npz) are names; anything else is a path to a ``.npz`` file, a CIFAR-10 pickle
directory or an ImageFolder. Bad input raises :class:`UserError`; loading never writes files.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from hwnas.supernet.data.cifar import (
    NPZ_KEYS,
    is_cifar_pickle_dir,
    load_cifar_pickle,
    load_npz,
)
from hwnas.supernet.data.image_folder import (
    class_dirs,
    load_image_folder_flat,
    load_image_folder_split,
)
from hwnas.supernet.data.splits import DatasetSplits, split_single_pool

from hwnas.core.errors import UserError
from hwnas.core.paths import SHARED_DATA_ENV, shared_data_candidate, shared_data_dir

__all__ = ["SHARED_DATA_ENV", "load_dataset", "shared_data_dir"]


def load_dataset(
    spec: str,
    *,
    seed: int = 0,
    val_fraction: float | None = None,
    image_size: int | None = None,
) -> DatasetSplits:
    """Load a dataset by name or path and split it into train/val/test.

    Args:
        spec: ``"digits"``, ``"cifar10"`` (the shared npz), or a path to a cifar10-jpeg
            ``.npz`` file, a CIFAR-10 pickle directory, or an ImageFolder directory. The two
            names take precedence over same-named paths; write ``./cifar10`` for a path.
        seed: Seeds every split; the same seed always gives the same splits.
        val_fraction: Share held out for validation. For datasets that come with a test set
            (npz, pickle, ImageFolder with ``train/``+``test/``) it is a fraction of the train
            set (default 0.1). For datasets split here from one pool it is a fraction of *all*
            images, taken after the fixed test share, so the test split depends on the seed
            only: digits default 0.2 (60/20/20), a flat ImageFolder default 0.1 (80/10/10).
        image_size: Resize images to this square size (bilinear). ImageFolders default to 32;
            other sources keep their native size unless this is given.

    Raises:
        UserError: for an unknown name, a missing path, a malformed file or an empty folder.

    Examples:
        >>> from hwnas.supernet import load_dataset
        >>> data = load_dataset("digits", seed=0)      # scikit-learn's 8x8 digits, no download
        >>> data.name, len(data.classes), tuple(data.train.images.shape[1:])
        ('digits', 10, (1, 8, 8))
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"dataset must be a non-empty name or path, got {spec!r}")
    if val_fraction is not None and not (0.0 < float(val_fraction) < 1.0):
        raise UserError(f"val_fraction must be strictly between 0 and 1, got {val_fraction}")
    if image_size is not None and (
        isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1
    ):
        raise UserError(f"image_size must be a positive integer, got {image_size!r}")

    key = spec.strip().lower()
    if key == "digits":
        return _load_digits(seed=seed, val_fraction=val_fraction, image_size=image_size)
    if key == "cifar10":
        return _load_shared_cifar10(seed=seed, val_fraction=val_fraction, image_size=image_size)

    path = Path(spec).expanduser()
    if not path.exists():
        if _looks_like_path(spec):
            raise UserError(
                f"dataset path {spec!r} does not exist (resolved to {path.resolve()}); expected "
                "a .npz file, a CIFAR-10 pickle directory or an ImageFolder directory"
            )
        raise UserError(
            f"unknown dataset {spec!r}: expected 'digits', 'cifar10', or a path to a "
            "cifar10-jpeg .npz file, a CIFAR-10 pickle directory (cifar-10-batches-py) or an "
            "ImageFolder directory"
        )
    if path.is_file():
        if path.suffix.lower() != ".npz":
            raise UserError(
                f"dataset file {path} is not a .npz file; expected a cifar10-jpeg .npz file "
                f"(keys {', '.join(NPZ_KEYS)}) or a directory"
            )
        return load_npz(path, name=path.name, seed=seed, val_fraction=val_fraction,
                         image_size=image_size)
    if path.is_dir():
        return _load_directory(path, seed=seed, val_fraction=val_fraction, image_size=image_size)
    raise UserError(f"dataset path {path} is neither a regular file nor a directory")


def _looks_like_path(spec: str) -> bool:
    """Whether a missing ``spec`` was meant as a path (so the error talks about the path)."""
    return (
        "/" in spec
        or os.sep in spec
        or spec.startswith((".", "~"))
        or Path(spec).suffix != ""
    )


def _load_digits(*, seed: int, val_fraction: float | None,
                 image_size: int | None) -> DatasetSplits:
    """scikit-learn's 8x8 digits (0..16 ink levels), scaled to uint8, split 60/20/20."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    raw = np.asarray(bunch.images, dtype=np.float64)  # (1797, 8, 8), values 0..16
    images = np.floor(raw * (255.0 / 16.0) + 0.5).clip(0, 255).astype(np.uint8)[:, None]
    labels = np.asarray(bunch.target, dtype=np.int64)
    classes = [str(c) for c in range(10)]
    return split_single_pool(
        torch.from_numpy(images),
        labels,
        name="digits",
        classes=classes,
        seed=seed,
        test_fraction=0.2,
        val_fraction=0.2 if val_fraction is None else val_fraction,
        augment="shift",
        image_size=image_size,
    )


def _load_shared_cifar10(*, seed: int, val_fraction: float | None,
                         image_size: int | None) -> DatasetSplits:
    """CIFAR-10 from the shared reference data (``cifar10/cifar10-jpeg.npz``)."""
    base, origin = shared_data_candidate()
    path = base / "cifar10" / "cifar10-jpeg.npz"
    if not path.is_file():
        raise UserError(
            f"dataset 'cifar10' not found: looked for {path} (shared data dir from {origin}); "
            f"set {SHARED_DATA_ENV} to the directory holding cifar10/cifar10-jpeg.npz, or pass "
            "the path of the .npz file itself"
        )
    return load_npz(path, name="cifar10", seed=seed, val_fraction=val_fraction,
                     image_size=image_size)



def _load_directory(path: Path, *, seed: int, val_fraction: float | None,
                    image_size: int | None) -> DatasetSplits:
    """Detect what a directory holds and load it."""
    if is_cifar_pickle_dir(path):
        return load_cifar_pickle(path, name=path.name, seed=seed, val_fraction=val_fraction,
                                  image_size=image_size)
    nested = path / "cifar-10-batches-py"
    if nested.is_dir() and is_cifar_pickle_dir(nested):
        return load_cifar_pickle(nested, name=path.name, seed=seed, val_fraction=val_fraction,
                                  image_size=image_size)
    train_dir, test_dir = path / "train", path / "test"
    if train_dir.is_dir() and test_dir.is_dir() and (
        class_dirs(train_dir) or class_dirs(test_dir)
    ):
        return load_image_folder_split(path, seed=seed, val_fraction=val_fraction,
                                        image_size=image_size)
    if class_dirs(path):
        return load_image_folder_flat(path, seed=seed, val_fraction=val_fraction,
                                       image_size=image_size)
    raise UserError(
        f"{path} is neither a CIFAR-10 pickle directory (data_batch_1..5, test_batch, "
        "batches.meta) nor an ImageFolder (one sub-folder per class holding images, "
        "optionally under train/ and test/): it has no class sub-folders"
    )
