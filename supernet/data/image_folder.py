"""ImageFolder datasets: one sub-folder per class holding image files, either flat (split
here 80/10/10) or under ``train/`` and ``test/``. Images are resized to one square size, and
stay one channel when every image is grayscale.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from hwnas.supernet.data.splits import (
    DatasetSplits,
    check_class_names,
    require_every_class,
    split_from_train,
    split_single_pool,
)

from hwnas.core.errors import UserError

__all__ = ["IMAGE_EXTENSIONS", "class_dirs", "load_image_folder_flat", "load_image_folder_split"]

#: File suffixes (lower case) that count as images in an ImageFolder.
IMAGE_EXTENSIONS: frozenset[str] = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"})

_DEFAULT_IMAGE_FOLDER_SIZE = 32
# Pillow modes that hold a single grey channel (possibly with alpha).
_GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})


def class_dirs(root: Path) -> list[Path]:
    """Visible sub-directories of ``root``, sorted by name (the class order)."""
    try:
        return sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                      key=lambda p: p.name)
    except OSError as exc:
        raise UserError(f"cannot list directory {root}: {exc}") from exc


def _image_files(folder: Path) -> list[Path]:
    """Image files directly inside ``folder`` (by suffix, case-insensitive), sorted."""
    try:
        return sorted(
            p for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
        )
    except OSError as exc:
        raise UserError(f"cannot list directory {folder}: {exc}") from exc


def _scan_image_folder(root: Path, classes: list[str] | None = None,
                       ) -> tuple[list[str], list[Path], np.ndarray]:
    """Files and labels of one ImageFolder.

    ``classes`` (the train folder's) fixes the label order when given; such a folder (a test
    set) may lack some classes or leave some empty. Without it, every class folder must hold
    at least one image, since a class with no training images cannot be learned.
    """
    fixed_classes = classes
    dirs = class_dirs(root)
    if not dirs:
        raise UserError(
            f"ImageFolder {root} has no class sub-folders; expected one sub-folder per class "
            "holding images"
        )
    if classes is None:
        classes = [d.name for d in dirs]
        check_class_names(classes, f"ImageFolder {root}: the class folders")
    else:
        extra = [d.name for d in dirs if d.name not in classes]
        if extra:
            raise UserError(
                f"ImageFolder {root} has class folder(s) {', '.join(extra)} that the train "
                f"folder lacks (train classes: {', '.join(classes)})"
            )
    index = {c: i for i, c in enumerate(classes)}
    files: list[Path] = []
    labels: list[int] = []
    empty: list[str] = []
    for d in dirs:
        found = _image_files(d)
        if not found:
            empty.append(d.name)
        files.extend(found)
        labels.extend([index[d.name]] * len(found))
    exts = "/".join(sorted(e.lstrip(".") for e in IMAGE_EXTENSIONS))
    if not files:
        raise UserError(
            f"ImageFolder {root} has class sub-folders but no images in them; expected image "
            f"files ({exts}) directly inside each class folder"
        )
    if fixed_classes is None:
        require_every_class(labels, classes, f"ImageFolder {root}",
                            f"class folder(s) {', '.join(empty)} hold no images ({exts}); every "
                            "class needs at least one image (remove the folder or add images)")
    return classes, files, np.asarray(labels, dtype=np.int64)


def _read_images(files: Sequence[Path], size: int) -> torch.Tensor:
    """Decode and resize image files into uint8 ``(N, C, size, size)``.

    C is 1 when every image is grayscale (so a grayscale dataset stays one channel), else 3.
    """
    from PIL import Image
    from tqdm.auto import tqdm

    out = np.empty((len(files), size, size, 3), dtype=np.uint8)
    all_gray = True
    for i, f in enumerate(tqdm(files, desc="reading images", unit="img", disable=None,
                               leave=False)):
        try:
            with Image.open(f) as im:
                gray = im.mode in _GRAY_MODES
                all_gray &= gray
                img = im.convert("L" if gray else "RGB")
                if img.size != (size, size):
                    img = img.resize((size, size), Image.Resampling.BILINEAR)
                arr = np.asarray(img)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise UserError(f"cannot read image {f}: {exc}") from exc
        out[i] = arr[..., None] if arr.ndim == 2 else arr
    tensor = torch.from_numpy(out).permute(0, 3, 1, 2)
    if all_gray:
        tensor = tensor[:, :1]
    return tensor.contiguous()


def load_image_folder_flat(path: Path, *, seed: int, val_fraction: float | None,
                            image_size: int | None) -> DatasetSplits:
    """One ImageFolder, split here 80/10/10 (stratified, seeded)."""
    classes, files, labels = _scan_image_folder(path)
    size = image_size or _DEFAULT_IMAGE_FOLDER_SIZE
    return split_single_pool(
        _read_images(files, size), labels,
        name=path.name, classes=classes, seed=seed,
        test_fraction=0.1, val_fraction=0.1 if val_fraction is None else val_fraction,
        augment="crop_flip", image_size=None,
    )


def load_image_folder_split(path: Path, *, seed: int, val_fraction: float | None,
                             image_size: int | None) -> DatasetSplits:
    """``train/`` and ``test/`` ImageFolders; validation is drawn from train."""
    classes, train_files, train_labels = _scan_image_folder(path / "train")
    _, test_files, test_labels = _scan_image_folder(path / "test", classes)
    size = image_size or _DEFAULT_IMAGE_FOLDER_SIZE
    train_images = _read_images(train_files, size)
    test_images = _read_images(test_files, size)
    # Grayscale only if *all* images (train and test) are; otherwise both become RGB.
    if train_images.shape[1] != test_images.shape[1]:
        train_images, test_images = (t.expand(-1, 3, -1, -1).contiguous()
                                     for t in (train_images, test_images))
    return split_from_train(
        train_images, train_labels, test_images, test_labels,
        name=path.name, classes=classes, seed=seed,
        val_fraction=0.1 if val_fraction is None else val_fraction,
        augment="crop_flip", image_size=None,
    )
