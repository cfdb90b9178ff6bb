"""Image datasets for supernet training and evaluation, and the batching that feeds them.

Everything is held in memory as ``uint8`` tensors of shape ``(N, C, H, W)``: the datasets this
toolkit trains on (8x8 digits, 32x32 CIFAR-10, small ImageFolders resized to ``image_size``)
fit easily, and keeping them as raw bytes (4x smaller than float) lets a whole split be moved to
the GPU once, where :func:`augment_batch` and :class:`BatchLoader` then do all per-batch work
without a CPU round trip or worker processes.

:func:`load_dataset` understands:

* ``"digits"`` -- scikit-learn's bundled 8x8 handwritten digits (no download; the default),
* ``"cifar10"`` -- ``cifar10/cifar10-jpeg.npz`` under :func:`shared_data_dir`,
* a path to a ``.npz`` file in that cifar10-jpeg format,
* a path to a CIFAR-10 python-pickle directory (``cifar-10-batches-py``),
* a path to an ImageFolder directory (one sub-folder per class, optionally under
  ``train/`` and ``test/``).

Every split is stratified and seeded, so a seed fully determines which image lands where. Bad
input (unknown name, missing or malformed file, empty folder...) raises :class:`UserError`.
Loading only reads; it never writes files.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hwnas.supernet.train_options import AUGMENT_KINDS, check_augment
from hwnas.supernet.trivial_augment import trivial_augment

from hwnas.core.errors import UserError

__all__ = [
    "AUGMENT_KINDS",
    "IMAGE_EXTENSIONS",
    "BatchLoader",
    "DatasetSplits",
    "ImageSplit",
    "augment_batch",
    "check_augment",
    "check_class_names",
    "load_dataset",
    "require_every_class",
    "shared_data_dir",
]

#: Side of the square that ``crop_flip_cutout`` blanks (DeVries & Taylor 2017 use 16 on CIFAR-10).
CUTOUT_SIZE = 16

#: File suffixes (lower case) that count as images in an ImageFolder.
IMAGE_EXTENSIONS: frozenset[str] = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"})

#: Environment variable that points at the shared reference-data directory.
SHARED_DATA_ENV = "HWNAS_SHARED_DATA"

_NPZ_KEYS = (
    "train_jpeg",
    "train_offsets",
    "train_labels",
    "test_jpeg",
    "test_offsets",
    "test_labels",
    "classes",
)
_PICKLE_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
_DEFAULT_IMAGE_FOLDER_SIZE = 32
# Pillow modes that hold a single grey channel (possibly with alpha).
_GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})


# --------------------------------------------------------------------------------------------
# Containers
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Locating data
# --------------------------------------------------------------------------------------------


def _shared_data_candidate() -> tuple[Path, str]:
    """The shared-data directory to look in, and a phrase saying where that choice came from."""
    env = os.environ.get(SHARED_DATA_ENV)
    if env:
        return Path(env).expanduser(), f"${SHARED_DATA_ENV}"
    repo_root = Path(__file__).resolve().parent.parent
    return repo_root.parent / "shared" / "data", "the default beside the checkout"


def shared_data_dir() -> Path | None:
    """The shared reference-data directory, or ``None`` if it does not exist.

    ``$HWNAS_SHARED_DATA`` when set, else ``<repo root>/../shared/data`` (repo root being the
    parent of the ``supernet`` package). Data is kept outside the checkout so it is never
    committed; callers and tests skip or explain when it is missing.
    """
    path, _ = _shared_data_candidate()
    return path if path.is_dir() else None


# --------------------------------------------------------------------------------------------
# load_dataset
# --------------------------------------------------------------------------------------------


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
                f"(keys {', '.join(_NPZ_KEYS)}) or a directory"
            )
        return _load_npz(path, name=path.name, seed=seed, val_fraction=val_fraction,
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
    return _split_single_pool(
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
    base, origin = _shared_data_candidate()
    path = base / "cifar10" / "cifar10-jpeg.npz"
    if not path.is_file():
        raise UserError(
            f"dataset 'cifar10' not found: looked for {path} (shared data dir from {origin}); "
            f"set {SHARED_DATA_ENV} to the directory holding cifar10/cifar10-jpeg.npz, or pass "
            "the path of the .npz file itself"
        )
    return _load_npz(path, name="cifar10", seed=seed, val_fraction=val_fraction,
                     image_size=image_size)


# --------------------------------------------------------------------------------------------
# cifar10-jpeg .npz
# --------------------------------------------------------------------------------------------


def _load_npz(path: Path, *, name: str, seed: int, val_fraction: float | None,
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
    return _split_from_train(
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
                f"{', '.join(_NPZ_KEYS)}"
            )
        with loaded as npz:
            missing = [k for k in _NPZ_KEYS if k not in npz.files]
            if missing:
                raise UserError(
                    f"{path} is not a cifar10-jpeg .npz: missing key(s) {', '.join(missing)}; "
                    f"expected keys {', '.join(_NPZ_KEYS)} (found {', '.join(npz.files) or 'none'})"
                )
            return {k: npz[k] for k in _NPZ_KEYS}
    except UserError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise UserError(
            f"cannot read {path} as a cifar10-jpeg .npz ({exc}); expected a numpy .npz archive "
            f"with keys {', '.join(_NPZ_KEYS)} and no pickled objects"
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
# Directories: CIFAR-10 pickles or ImageFolder
# --------------------------------------------------------------------------------------------


def _load_directory(path: Path, *, seed: int, val_fraction: float | None,
                    image_size: int | None) -> DatasetSplits:
    """Detect what a directory holds and load it."""
    if _is_cifar_pickle_dir(path):
        return _load_cifar_pickle(path, name=path.name, seed=seed, val_fraction=val_fraction,
                                  image_size=image_size)
    nested = path / "cifar-10-batches-py"
    if nested.is_dir() and _is_cifar_pickle_dir(nested):
        return _load_cifar_pickle(nested, name=path.name, seed=seed, val_fraction=val_fraction,
                                  image_size=image_size)
    train_dir, test_dir = path / "train", path / "test"
    if train_dir.is_dir() and test_dir.is_dir() and (
        _class_dirs(train_dir) or _class_dirs(test_dir)
    ):
        return _load_image_folder_split(path, seed=seed, val_fraction=val_fraction,
                                        image_size=image_size)
    if _class_dirs(path):
        return _load_image_folder_flat(path, seed=seed, val_fraction=val_fraction,
                                       image_size=image_size)
    raise UserError(
        f"{path} is neither a CIFAR-10 pickle directory (data_batch_1..5, test_batch, "
        "batches.meta) nor an ImageFolder (one sub-folder per class holding images, "
        "optionally under train/ and test/): it has no class sub-folders"
    )


def _is_cifar_pickle_dir(path: Path) -> bool:
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


def _load_cifar_pickle(path: Path, *, name: str, seed: int, val_fraction: float | None,
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
    return _split_from_train(
        torch.from_numpy(train_images), train_labels,
        torch.from_numpy(test_images), test_labels,
        name=name, classes=classes, seed=seed,
        val_fraction=0.1 if val_fraction is None else val_fraction,
        augment="crop_flip", image_size=image_size,
    )


def _class_dirs(root: Path) -> list[Path]:
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
    dirs = _class_dirs(root)
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


def _load_image_folder_flat(path: Path, *, seed: int, val_fraction: float | None,
                            image_size: int | None) -> DatasetSplits:
    """One ImageFolder, split here 80/10/10 (stratified, seeded)."""
    classes, files, labels = _scan_image_folder(path)
    size = image_size or _DEFAULT_IMAGE_FOLDER_SIZE
    return _split_single_pool(
        _read_images(files, size), labels,
        name=path.name, classes=classes, seed=seed,
        test_fraction=0.1, val_fraction=0.1 if val_fraction is None else val_fraction,
        augment="crop_flip", image_size=None,
    )


def _load_image_folder_split(path: Path, *, seed: int, val_fraction: float | None,
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
    return _split_from_train(
        train_images, train_labels, test_images, test_labels,
        name=path.name, classes=classes, seed=seed,
        val_fraction=0.1 if val_fraction is None else val_fraction,
        augment="crop_flip", image_size=None,
    )


# --------------------------------------------------------------------------------------------
# Splitting and statistics
# --------------------------------------------------------------------------------------------


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


def _split_from_train(train_images: torch.Tensor, train_labels: np.ndarray,
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


def _split_single_pool(images: torch.Tensor, labels: np.ndarray, *, name: str,
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


# --------------------------------------------------------------------------------------------
# Augmentation and batching
# --------------------------------------------------------------------------------------------


def augment_batch(images: torch.Tensor, kind: str, generator: torch.Generator,
                  fill: Sequence[int] | None = None) -> torch.Tensor:
    """Randomly augment a uint8 ``(B, C, H, W)`` batch on whatever device it lives.

    * ``"shift"``: zero-pad 1 and crop back to H x W at a random offset per sample, i.e. shift
      each image by dx, dy in {-1, 0, 1} (no flip: a mirrored digit is another symbol).
    * ``"crop_flip"``: zero-pad 4, random crop per sample, and a horizontal flip for a random
      half of the samples (the standard CIFAR recipe).
    * ``"crop_flip_cutout"``: ``crop_flip``, then cutout (DeVries & Taylor 2017): a
      :data:`CUTOUT_SIZE` square at a uniformly random centre per sample (clipped at the
      border) is set to ``fill`` (per-channel uint8 values; default 0; :class:`BatchLoader`
      passes the training mean, which normalises to zero as in the paper).
    * ``"trivial_crop_flip_cutout"``: one TrivialAugment operation per image
      (:mod:`hwnas.supernet.trivial_augment`; RGB images only), then ``crop_flip_cutout``: the
      TrivialAugment paper's CIFAR recipe.
    * ``"none"``: the input, unchanged.

    Vectorised: one padded copy and one gather with per-sample row/column indices, no Python
    loop over samples. Random numbers come from ``generator`` (normally on the CPU, so runs are
    reproducible across devices) and are then moved to ``images.device``.
    """
    if images.dim() != 4:
        raise ValueError(f"augment_batch expects (B, C, H, W) images, got {tuple(images.shape)}")
    check_augment(kind, int(images.shape[1]))
    if kind == "none" or images.shape[0] == 0:
        return images
    if kind.startswith("trivial_"):
        images = trivial_augment(images, generator)
        kind = kind.removeprefix("trivial_")
    pad = 1 if kind == "shift" else 4
    b, c, h, w = images.shape
    gdev = generator.device
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=gdev)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=gdev)
    dev = images.device
    rows = dy.to(dev)[:, None] + torch.arange(h, device=dev)  # (B, H) rows of the padded image
    cols = dx.to(dev)[:, None] + torch.arange(w, device=dev)  # (B, W)
    if kind.startswith("crop_flip"):
        flip = torch.rand(b, generator=generator, device=gdev) < 0.5
        cols = torch.where(flip.to(dev)[:, None], cols.flip(1), cols)
    padded = F.pad(images, (pad, pad, pad, pad))
    bi = torch.arange(b, device=dev)[:, None, None, None]
    ci = torch.arange(c, device=dev)[None, :, None, None]
    out = padded[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]
    if kind == "crop_flip_cutout":
        cy = torch.randint(0, h, (b,), generator=generator, device=gdev).to(dev)
        cx = torch.randint(0, w, (b,), generator=generator, device=gdev).to(dev)
        half = CUTOUT_SIZE // 2
        ys = torch.arange(h, device=dev)[None, :] - cy[:, None]  # (B, H) offsets from the centre
        xs = torch.arange(w, device=dev)[None, :] - cx[:, None]
        mask = (((ys >= -half) & (ys < half))[:, :, None]
                & ((xs >= -half) & (xs < half))[:, None, :])  # (B, H, W)
        value = torch.tensor([0] * c if fill is None else list(fill), dtype=out.dtype, device=dev)
        out = torch.where(mask[:, None], value.view(1, c, 1, 1), out)
    return out


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
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
        channels = int(split.images.shape[1])
        check_augment(augment, channels)  # here, so that training fails before it starts
        mean_t = torch.as_tensor(list(mean), dtype=torch.float32).flatten()
        std_t = torch.as_tensor(list(std), dtype=torch.float32).flatten()
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
            order = torch.randperm(n, generator=generator).to(self.device)
        else:
            order = torch.arange(n, device=self.device)
        for b in range(len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            images = self._images[idx]
            if self.augment != "none":
                images = augment_batch(images, self.augment, generator, fill=self._fill)
            x = images.float().div_(255.0).sub_(self._mean).div_(self._std)
            yield x, self._labels[idx]
