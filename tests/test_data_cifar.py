"""Tests for supernet.data.cifar: the cifar10-jpeg npz and the CIFAR-10 pickle readers."""

from __future__ import annotations

import io
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from data_support import CLASSES, check_splits, write_cifar_pickles, write_npz
from hwnas.supernet.data import load_dataset
from PIL import Image

from hwnas.core.errors import UserError

# --------------------------------------------------------------------------------------------
# cifar10-jpeg npz
# --------------------------------------------------------------------------------------------


def test_npz_loader(tmp_path: Path) -> None:
    path = tmp_path / "tiny.npz"
    arrays = write_npz(path)
    ds = load_dataset(str(path), seed=3)
    check_splits(ds)
    assert ds.name == "tiny.npz"
    assert ds.classes == CLASSES and ds.num_classes == 3
    assert ds.in_channels == 3 and ds.image_size == (8, 8)
    assert ds.augment == "crop_flip"
    assert (len(ds.train), len(ds.val), len(ds.test)) == (18, 2, 10)
    # test split is the file's test set, in order, decoded exactly as Pillow decodes it
    assert ds.test.labels.tolist() == arrays["test_labels"].astype(int).tolist()
    o = arrays["test_offsets"]
    first = np.array(Image.open(io.BytesIO(arrays["test_jpeg"][o[0]:o[1]].tobytes())))
    assert torch.equal(ds.test.images[0], torch.from_numpy(first).permute(2, 0, 1))
    # val is drawn from train, stratified: 2 images of 2 different classes
    assert len(set(ds.val.labels.tolist())) == 2
    again = load_dataset(str(path), seed=3)
    assert torch.equal(ds.val.images, again.val.images)


def test_npz_image_size(tmp_path: Path) -> None:
    path = tmp_path / "tiny.npz"
    write_npz(path)
    ds = load_dataset(str(path), image_size=4)
    assert ds.image_size == (4, 4)


def test_npz_missing_key(tmp_path: Path) -> None:
    path = tmp_path / "broken.npz"
    write_npz(path, drop="train_offsets")
    with pytest.raises(UserError, match="missing key.*train_offsets"):
        load_dataset(str(path))


def test_npz_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "garbage.npz"
    path.write_bytes(b"this is not a zip file")
    with pytest.raises(UserError, match="cannot read .*garbage.npz"):
        load_dataset(str(path))


def test_npz_corrupt_jpeg(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    arrays = write_npz(path)
    arrays["train_jpeg"] = np.zeros_like(arrays["train_jpeg"])
    np.savez(path, **arrays)
    with pytest.raises(UserError, match="train image 0 .*not a decodable image"):
        load_dataset(str(path))


def test_npz_bad_labels(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    arrays = write_npz(path)
    arrays["test_labels"] = arrays["test_labels"] + 5
    np.savez(path, **arrays)
    with pytest.raises(UserError, match=r"test_labels must lie in \[0, 3\)"):
        load_dataset(str(path))


def test_non_npz_file(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("a,b\n")
    with pytest.raises(UserError, match="not a .npz file"):
        load_dataset(str(path))


# --------------------------------------------------------------------------------------------
# CIFAR-10 pickles
# --------------------------------------------------------------------------------------------


def test_cifar_pickle_loader(tmp_path: Path) -> None:
    d = write_cifar_pickles(tmp_path)
    ds = load_dataset(str(d), seed=0)
    check_splits(ds)
    assert ds.name == "cifar-10-batches-py"
    assert ds.classes == ["airplane", "automobile", "bird"]
    assert ds.image_size == (32, 32) and ds.in_channels == 3
    assert ds.augment == "crop_flip"
    assert (len(ds.train), len(ds.val), len(ds.test)) == (27, 3, 6)
    assert sorted(Counter(ds.val.labels.tolist()).values()) == [1, 1, 1]
    # channel-major rows reshape to (3, 32, 32): compare the test set exactly
    with (d / "test_batch").open("rb") as f:
        raw = pickle.load(f, encoding="bytes")
    assert torch.equal(ds.test.images, torch.from_numpy(raw[b"data"].reshape(-1, 3, 32, 32)))
    # the parent directory of cifar-10-batches-py works too
    parent = load_dataset(str(tmp_path), seed=0)
    assert torch.equal(parent.train.images, ds.train.images)


def test_cifar_pickle_missing_batch(tmp_path: Path) -> None:
    d = write_cifar_pickles(tmp_path)
    (d / "data_batch_3").unlink()
    with pytest.raises(UserError, match="lacks data_batch_3"):
        load_dataset(str(d))


def test_cifar_pickle_refuses_code(tmp_path: Path) -> None:
    d = write_cifar_pickles(tmp_path)
    with (d / "batches.meta").open("wb") as f:
        pickle.dump({b"label_names": [Path("x")]}, f)
    with pytest.raises(UserError, match="refusing to load"):
        load_dataset(str(d))
