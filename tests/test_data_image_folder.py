"""Tests for supernet.data.image_folder: flat and train/test ImageFolders, grayscale and
mixed modes, and the refusals of empty, unknown or corrupt folders."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from data_support import check_splits, write_folder
from hwnas.supernet.data import load_dataset

from hwnas.core.errors import UserError

# --------------------------------------------------------------------------------------------
# ImageFolder
# --------------------------------------------------------------------------------------------


def test_image_folder_flat(tmp_path: Path) -> None:
    root = tmp_path / "pets"
    write_folder(root, {"b_dog": 10, "a_cat": 10, "c_emu": 10}, ext=".PNG")
    (root / "a_cat" / "notes.txt").write_text("not an image")
    ds = load_dataset(str(root), seed=0)
    check_splits(ds)
    assert ds.name == "pets"
    assert ds.classes == ["a_cat", "b_dog", "c_emu"]
    assert ds.image_size == (32, 32) and ds.in_channels == 3
    assert ds.augment == "crop_flip"
    assert (len(ds.train), len(ds.val), len(ds.test)) == (24, 3, 3)
    assert sorted(Counter(ds.test.labels.tolist()).values()) == [1, 1, 1]
    small = load_dataset(str(root), seed=0, image_size=8)
    assert small.image_size == (8, 8)
    assert torch.equal(small.test.labels, ds.test.labels)


def test_image_folder_grayscale(tmp_path: Path) -> None:
    root = tmp_path / "gray"
    write_folder(root, {"x": 5, "y": 5}, mode="L", ext=".jpg")
    ds = load_dataset(str(root), image_size=10)
    assert ds.in_channels == 1 and ds.image_size == (10, 10)


def test_image_folder_mixed_modes_become_rgb(tmp_path: Path) -> None:
    root = tmp_path / "mixed"
    write_folder(root, {"x": 5}, mode="L")
    write_folder(root, {"y": 5}, mode="RGB", seed=1)
    ds = load_dataset(str(root))
    assert ds.in_channels == 3


def test_image_folder_train_test(tmp_path: Path) -> None:
    root = tmp_path / "split"
    write_folder(root / "train", {"cat": 10, "dog": 10})
    write_folder(root / "test", {"cat": 3, "dog": 2}, seed=5)
    ds = load_dataset(str(root), seed=0, image_size=16)
    check_splits(ds)
    assert ds.classes == ["cat", "dog"]
    assert (len(ds.train), len(ds.val), len(ds.test)) == (18, 2, 5)
    assert ds.test.labels.tolist() == [0, 0, 0, 1, 1]
    assert ds.image_size == (16, 16)


def test_image_folder_test_class_unknown(tmp_path: Path) -> None:
    root = tmp_path / "split"
    write_folder(root / "train", {"cat": 4, "dog": 4})
    write_folder(root / "test", {"cow": 2})
    with pytest.raises(UserError, match="cow"):
        load_dataset(str(root))


def test_empty_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError) as err:
        load_dataset(str(empty))
    msg = str(err.value)
    assert "CIFAR-10 pickle" in msg and "ImageFolder" in msg and "train/ and test/" in msg


def test_image_folder_without_images(tmp_path: Path) -> None:
    root = tmp_path / "noimg"
    (root / "cat").mkdir(parents=True)
    (root / "dog").mkdir()
    (root / "dog" / "readme.txt").write_text("x")
    with pytest.raises(UserError, match="no images"):
        load_dataset(str(root))


def test_image_folder_empty_class(tmp_path: Path) -> None:
    root = tmp_path / "partial"
    write_folder(root, {"cat": 4})
    (root / "dog").mkdir()
    with pytest.raises(UserError, match="dog.*hold no images"):
        load_dataset(str(root))


def test_image_folder_corrupt_image(tmp_path: Path) -> None:
    root = tmp_path / "corrupt"
    write_folder(root, {"cat": 4, "dog": 4})
    (root / "dog" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(UserError, match="broken.png"):
        load_dataset(str(root))
