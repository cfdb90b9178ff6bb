"""The two CIFAR-10 file formats: a cifar10-jpeg ``.npz`` (JPEG bytes, offsets, labels and
class names for train and test) and the python-pickle release (``cifar-10-batches-py``).

Both come with their own test set; validation is drawn from train. The pickles are read by an
unpickler that rebuilds numpy arrays only, so a dataset file never executes code.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import torch
from hwnas.supernet.data.splits import (
    DatasetSplits,
    check_class_names,
    require_every_class,
    split_from_train,
)

from hwnas.core.errors import UserError

__all__ = ["NPZ_KEYS", "is_cifar_pickle_dir", "load_cifar_pickle", "load_npz"]

#: The arrays a cifar10-jpeg ``.npz`` must hold.
NPZ_KEYS = (
    "train_jpeg",
    "train_offsets",
    "train_labels",
    "test_jpeg",
    "test_offsets",
    "test_labels",
    "classes",
)
_PICKLE_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))


# --------------------------------------------------------------------------------------------
# cifar10-jpeg .npz
# --------------------------------------------------------------------------------------------


def load_npz(path: Path, *, name: str, seed: int, val_fraction: float | None,
              image_size: int | None) -> DatasetSplits:
    """A cifar10-jpeg ``.npz``: JPEG bytes + offsets + labels for train and test, and classes."""
    arrays = _read_npz(path)
    classes = _npz_classes(arrays["classes"], path)
    parts = {}
    for prefix in ("train", "test"):
        jpeg, offsets, labels = (arrays[f"{prefix}_{k}"] for k in ("jpeg", "offsets", "labels"))
        labels = _check_npz_part(path, prefix, jpeg, offsets, labels, len(classes))
        if prefix == "train":  # before decoding: a subset lacking classes fails at once
            require_every_class(labels, classes, f"{path}: the train part")
        images = _decode_jpegs(jpeg, offsets, path=path, prefix=prefix, image_size=image_size)
        parts[prefix] = (images, labels)
    train_images, train_labels = parts["train"]
    test_images, test_labels = parts["test"]
    if train_images.shape[1:] != test_images.shape[1:]:
        raise UserError(
            f"{path}: train images are {tuple(train_images.shape[2:])} but test images are "
            f"{tuple(test_images.shape[2:])}; pass image_size to resize both to one size"
        )
    return split_from_train(
        train_images, train_labels, test_images, test_labels,
        name=name, classes=classes, seed=seed,
        val_fraction=0.1 if val_fraction is None else val_fraction,
        augment="crop_flip", image_size=None,  # already resized while decoding
    )


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Read every expected key of a cifar10-jpeg npz into memory, or raise a UserError."""
    import zipfile

    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a single .npy array named .npz
            raise UserError(
                f"{path} holds a single numpy array, not a .npz archive; expected keys "
                f"{', '.join(NPZ_KEYS)}"
            )
        with loaded as npz:
            missing = [k for k in NPZ_KEYS if k not in npz.files]
            if missing:
                raise UserError(
                    f"{path} is not a cifar10-jpeg .npz: missing key(s) {', '.join(missing)}; "
                    f"expected keys {', '.join(NPZ_KEYS)} (found {', '.join(npz.files) or 'none'})"
                )
            return {k: npz[k] for k in NPZ_KEYS}
    except UserError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise UserError(
            f"cannot read {path} as a cifar10-jpeg .npz ({exc}); expected a numpy .npz archive "
            f"with keys {', '.join(NPZ_KEYS)} and no pickled objects"
        ) from exc


def _npz_classes(classes: np.ndarray, path: Path) -> list[str]:
    """The class names of an npz, as plain strings."""
    if classes.ndim != 1 or classes.size == 0 or classes.dtype.kind not in "US":
        raise UserError(
            f"{path}: 'classes' must be a non-empty 1-D array of strings, got dtype "
            f"{classes.dtype} shape {classes.shape}"
        )
    names = [c.decode() if isinstance(c, bytes) else str(c) for c in classes.tolist()]
    check_class_names(names, f"{path}: 'classes'")
    return names


def _check_npz_part(path: Path, prefix: str, jpeg: np.ndarray, offsets: np.ndarray,
                    labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Validate one split's arrays of an npz; return its labels as int64."""
    where = f"{path}: {prefix}_"
    if jpeg.dtype != np.uint8 or jpeg.ndim != 1:
        raise UserError(f"{where}jpeg must be a 1-D uint8 array, got {jpeg.dtype} {jpeg.shape}")
    if offsets.dtype.kind not in "iu" or offsets.ndim != 1 or offsets.size < 1:
        raise UserError(
            f"{where}offsets must be a 1-D integer array of n+1 offsets, got {offsets.dtype} "
            f"{offsets.shape}"
        )
    if labels.dtype.kind not in "iu" or labels.ndim != 1:
        raise UserError(
            f"{where}labels must be a 1-D integer array, got {labels.dtype} {labels.shape}"
        )
    n = labels.shape[0]
    if offsets.shape[0] != n + 1:
        raise UserError(
            f"{where}offsets has {offsets.shape[0]} entries but {prefix}_labels has {n}; "
            "expected len(offsets) == len(labels) + 1"
        )
    if n == 0:
        raise UserError(f"{where}labels is empty; expected at least one {prefix} image")
    offsets = offsets.astype(np.int64, copy=False)
    if offsets[0] < 0 or offsets[-1] > jpeg.shape[0] or np.any(np.diff(offsets) <= 0):
        raise UserError(
            f"{where}offsets must increase strictly from >= 0 to <= len({prefix}_jpeg) "
            f"({jpeg.shape[0]}), so each image has at least one byte"
        )
    labels = labels.astype(np.int64)
    if labels.min() < 0 or labels.max() >= num_classes:
        raise UserError(
            f"{where}labels must lie in [0, {num_classes}) for the {num_classes} classes, got "
            f"values {labels.min()}..{labels.max()}"
        )
    return labels


def _decode_jpegs(jpeg: np.ndarray, offsets: np.ndarray, *, path: Path, prefix: str,
                  image_size: int | None) -> torch.Tensor:
    """Decode concatenated JPEG bytes into a uint8 ``(N, 3, H, W)`` tensor.

    A plain loop into one preallocated array: Pillow decodes a 32x32 JPEG in tens of
    microseconds, so 60k images take a few seconds, and worker threads or processes would
    cost more in overhead than they win.
    """
    from PIL import Image
    from tqdm.auto import tqdm

    n = offsets.shape[0] - 1
    offsets = offsets.astype(np.int64, copy=False).tolist()
    buf = memoryview(jpeg)
    out: np.ndarray | None = None
    size: tuple[int, int] | None = (image_size, image_size) if image_size else None
    step = 1000
    with tqdm(total=n, desc=f"decoding {prefix} images", unit="img", disable=None,
              leave=False) as bar:
        for i in range(n):
            try:
                with Image.open(io.BytesIO(buf[offsets[i]:offsets[i + 1]])) as im:
                    rgb = im if im.mode == "RGB" else im.convert("RGB")
                    if size is None:
                        size = rgb.size
                    if rgb.size != size:
                        if image_size is None:
                            raise UserError(
                                f"{path}: {prefix} image {i} is {rgb.size[0]}x{rgb.size[1]} but "
                                f"image 0 is {size[0]}x{size[1]}; pass image_size to resize "
                                "all images to one size"
                            )
                        rgb = rgb.resize(size, Image.Resampling.BILINEAR)
                    if out is None:
                        out = np.empty((n, size[1], size[0], 3), dtype=np.uint8)
                    out[i] = np.asarray(rgb)
            except UserError:
                raise
            except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
                raise UserError(
                    f"{path}: {prefix} image {i} (bytes {offsets[i]}..{offsets[i + 1]} of "
                    f"{prefix}_jpeg) is not a decodable image: {exc}"
                ) from exc
            if (i + 1) % step == 0 or i + 1 == n:
                bar.update((i % step) + 1)
    assert out is not None  # n >= 1 was checked
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


# --------------------------------------------------------------------------------------------
# CIFAR-10 python pickles
# --------------------------------------------------------------------------------------------


def is_cifar_pickle_dir(path: Path) -> bool:
    return (path / "batches.meta").is_file() or (path / "data_batch_1").is_file()


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays and plain Python containers.

    The CIFAR-10 batches are pickles; a general unpickler runs whatever code a file names, so
    anything beyond numpy's array reconstruction is refused.
    """

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("codecs", "encode"),
    }

    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle protocol
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset pickle")


def _read_pickle(path: Path) -> dict:
    """Load one CIFAR pickle file as a dict, or raise a UserError naming it."""
    if not path.is_file():
        raise UserError(
            f"CIFAR-10 pickle directory {path.parent} lacks {path.name}; expected "
            "data_batch_1..5, test_batch and batches.meta"
        )
    try:
        with path.open("rb") as f:
            obj = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, ImportError) as exc:
        raise UserError(f"cannot read CIFAR-10 pickle {path}: {exc}") from exc
    if not isinstance(obj, dict):
        raise UserError(f"CIFAR-10 pickle {path} holds a {type(obj).__name__}, expected a dict")
    return obj


def _pickle_get(d: dict, key: str, path: Path):  # noqa: ANN202 - heterogeneous
    for k in (key.encode(), key):
        if k in d:
            return d[k]
    raise UserError(f"CIFAR-10 pickle {path} has no {key!r} entry (keys: {list(d)})")


def _read_pickle_batch(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 batch: ``data`` (N, 3072) channel-major -> (N, 3, 32, 32), labels int64."""
    d = _read_pickle(path)
    try:
        data = np.asarray(_pickle_get(d, "data", path))
        labels = np.asarray(_pickle_get(d, "labels", path), dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise UserError(f"CIFAR-10 pickle {path}: malformed data or labels ({exc})") from exc
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise UserError(
            f"CIFAR-10 pickle {path}: 'data' must be uint8 of shape (N, 3072), got "
            f"{data.dtype} {data.shape}"
        )
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise UserError(
            f"CIFAR-10 pickle {path}: {data.shape[0]} images but labels of shape {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise UserError(
            f"CIFAR-10 pickle {path}: labels must lie in [0, {num_classes}), got "
            f"{labels.min()}..{labels.max()}"
        )
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar_pickle(path: Path, *, name: str, seed: int, val_fraction: float | None,
                       image_size: int | None) -> DatasetSplits:
    """The standard ``cifar-10-batches-py`` release: five train batches and one test batch."""
    meta = _read_pickle(path / "batches.meta")
    raw_names = _pickle_get(meta, "label_names", path / "batches.meta")
    try:
        classes = [n.decode() if isinstance(n, bytes) else str(n) for n in raw_names]
    except (TypeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path / 'batches.meta'}: malformed label_names ({exc})") from exc
    check_class_names(classes, f"{path / 'batches.meta'}: label_names")
    batches = [_read_pickle_batch(path / b, len(classes)) for b in _PICKLE_TRAIN_BATCHES]
    train_images = np.concatenate([b[0] for b in batches])
    train_labels = np.concatenate([b[1] for b in batches])
    test_images, test_labels = _read_pickle_batch(path / "test_batch", len(classes))
    if len(train_labels) == 0 or len(test_labels) == 0:
        raise UserError(f"CIFAR-10 pickle directory {path} has no train or no test images")
    require_every_class(train_labels, classes, f"CIFAR-10 pickle directory {path} (data_batch_1..5)")
    return split_from_train(
        torch.from_numpy(train_images), train_labels,
        torch.from_numpy(test_images), test_labels,
        name=name, classes=classes, seed=seed,
        val_fraction=0.1 if val_fraction is None else val_fraction,
        augment="crop_flip", image_size=image_size,
    )
