"""Small datasets written to disk for the data tests (test_data*.py): a cifar10-jpeg npz,
CIFAR-10 pickles and ImageFolders of random images, and the checks every loaded dataset meets."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import torch
from hwnas.supernet.data import DatasetSplits
from PIL import Image

CLASSES = ["cat", "dog", "emu"]


def random_images(rng: np.random.Generator, n: int, h: int = 8, w: int = 8,
                   c: int = 3) -> np.ndarray:
    """Smooth-ish random HWC uint8 images (JPEG-friendly)."""
    return rng.integers(0, 256, size=(n, h, w, c), dtype=np.uint8)


def jpeg_bytes(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def jpeg_part(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blobs = [jpeg_bytes(im) for im in images]
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    return np.frombuffer(b"".join(blobs), dtype=np.uint8).copy(), offsets


def write_npz(path: Path, n_train: int = 20, n_test: int = 10, drop: str | None = None,
               seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for prefix, n in (("train", n_train), ("test", n_test)):
        jpeg, offsets = jpeg_part(random_images(rng, n))
        arrays[f"{prefix}_jpeg"] = jpeg
        arrays[f"{prefix}_offsets"] = offsets
        arrays[f"{prefix}_labels"] = (np.arange(n) % len(CLASSES)).astype(np.uint8)
    arrays["classes"] = np.array(CLASSES)
    if drop is not None:
        del arrays[drop]
    np.savez(path, **arrays)
    return arrays


def write_cifar_pickles(root: Path, per_batch: int = 6, n_test: int = 6) -> Path:
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(1)
    names = [b"airplane", b"automobile", b"bird"]
    for i in range(1, 6):
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [j % 3 for j in range(per_batch)]
        with (d / f"data_batch_{i}").open("wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, f)
    test = rng.integers(0, 256, size=(n_test, 3072), dtype=np.uint8)
    with (d / "test_batch").open("wb") as f:
        pickle.dump({b"data": test, b"labels": [j % 3 for j in range(n_test)]}, f)
    with (d / "batches.meta").open("wb") as f:
        pickle.dump({b"label_names": names, b"num_cases_per_batch": per_batch}, f)
    return d


def write_folder(root: Path, counts: dict[str, int], size: int = 12, mode: str = "RGB",
                  ext: str = ".png", seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for cls, n in counts.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            c = 3 if mode == "RGB" else 1
            arr = rng.integers(0, 256, size=(size, size, c), dtype=np.uint8)
            img = Image.fromarray(arr[..., 0] if c == 1 else arr, mode=mode)
            img.save(root / cls / f"img{i}{ext}")


def check_splits(ds: DatasetSplits) -> None:
    for split in (ds.train, ds.val, ds.test):
        assert split.images.dtype == torch.uint8
        assert split.labels.dtype == torch.int64
        assert split.images.dim() == 4
        assert split.images.shape[0] == split.labels.shape[0] == len(split)
        assert int(split.labels.min()) >= 0 and int(split.labels.max()) < ds.num_classes
    assert len(ds.mean) == len(ds.std) == ds.in_channels
    assert all(s > 0 for s in ds.std)
