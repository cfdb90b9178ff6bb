"""Datasets that would give meaningless accuracies are refused in one line: a training split
lacking classes (a class-sorted subset), a single class, a class with no training images (npz,
pickle directory, ImageFolder alike) and duplicate class names."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
from hwnas.supernet.data import load_dataset
from PIL import Image

from hwnas.core.errors import UserError


def _part(labels: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    blobs = []
    for _ in labels:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, format="JPEG")
        blobs.append(buf.getvalue())
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    return {"jpeg": np.frombuffer(b"".join(blobs), dtype=np.uint8).copy(), "offsets": offsets,
            "labels": np.asarray(labels, dtype=np.uint8)}


def _npz(path: Path, classes: list[str], train: list[int], test: list[int]) -> str:
    arrays = {"classes": np.array(classes)}
    for prefix, labels in (("train", train), ("test", test)):
        arrays.update({f"{prefix}_{k}": v for k, v in _part(labels).items()})
    np.savez(path, **arrays)
    return str(path)


def _pickle_dir(root: Path, names: list[bytes], labels: list[int]) -> str:
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(1, 6):
        with (d / f"data_batch_{i}").open("wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8),
                         b"labels": labels}, f)
    with (d / "test_batch").open("wb") as f:
        pickle.dump({b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8),
                     b"labels": [0, 1, 0]}, f)
    with (d / "batches.meta").open("wb") as f:
        pickle.dump({b"label_names": names}, f)
    return str(d)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert text and "\n" not in text
    return text


def test_class_sorted_subset_lacking_classes_is_refused(tmp_path: Path):
    """The first 40 % of a class-sorted training set holds 4 of the 10 classes."""
    classes = [f"c{i}" for i in range(10)]
    train = sorted([i % 10 for i in range(100)])[:40]
    path = _npz(tmp_path / "sorted.npz", classes, train, list(range(10)))
    with pytest.raises(UserError) as err:
        load_dataset(path)
    assert "the train part has no images of 6 of the 10 classes (c4, c5, c6, c7, c8, c9)" in _one_line(err)


def test_npz_class_without_training_images_is_refused(tmp_path: Path):
    path = _npz(tmp_path / "gap.npz", ["cat", "dog", "emu"], [0, 2] * 6, [0, 1, 2])
    with pytest.raises(UserError, match=r"no images of 1 of the 3 classes \(dog\); every class "
                                        r"needs at least one training image"):
        load_dataset(path)


def test_training_split_must_keep_every_class(tmp_path: Path):
    """A class with a single training image: validation's share may take it, and then the
    split is refused rather than training a head with a class it never sees."""
    path = _npz(tmp_path / "rare.npz", ["cat", "dog"], [0] * 10 + [1], [0, 1])
    with pytest.raises(UserError, match="the training split of 'rare.npz' has no images of 1 of "
                                        "the 2 classes .dog.; a class needs at least two images"):
        load_dataset(path, val_fraction=0.5)


def test_single_class_npz_is_refused(tmp_path: Path):
    path = _npz(tmp_path / "one.npz", ["cat"], [0] * 6, [0, 0])
    with pytest.raises(UserError, match="'classes' names 1 class.*at least 2 classes"):
        load_dataset(path)


@pytest.mark.parametrize("classes, shown", [
    (["cat", "dog", "cat"], "names class 'cat' twice; expected distinct class names"),
    (["cat", "Dog", "dog "], "names class 'dog ' twice \\(as 'Dog' and 'dog '\\)"),
])
def test_duplicate_class_names_in_npz_are_refused(tmp_path: Path, classes, shown):
    path = _npz(tmp_path / "dup.npz", classes, [0, 1, 2] * 3, [0, 1, 2])
    with pytest.raises(UserError, match=shown) as err:
        load_dataset(path)
    _one_line(err)


def test_pickle_directory_duplicates_single_class_and_missing_class(tmp_path: Path):
    with pytest.raises(UserError, match="label_names names class 'cat' twice"):
        load_dataset(_pickle_dir(tmp_path / "a", [b"cat", b"cat"], [0, 1]))
    with pytest.raises(UserError, match="label_names names 1 class"):
        load_dataset(_pickle_dir(tmp_path / "b", [b"cat"], [0, 0]))
    with pytest.raises(UserError, match=r"\(data_batch_1..5\) has no images of 1 of the 3 "
                                        r"classes \(emu\)"):
        load_dataset(_pickle_dir(tmp_path / "c", [b"cat", b"dog", b"emu"], [0, 1, 0, 1]))


def test_single_class_image_folder_is_refused(tmp_path: Path):
    root = tmp_path / "pets"
    (root / "cat").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(np.full((8, 8, 3), 40 * i, dtype=np.uint8)).save(root / "cat" / f"{i}.png")
    with pytest.raises(UserError, match="the class folders names 1 class"):
        load_dataset(str(root))


def test_command_line_refuses_in_one_line_and_writes_nothing(tmp_path: Path, capsys):
    from hwnas.cli import main

    path = _npz(tmp_path / "one.npz", ["cat"], [0] * 6, [0, 0])
    assert main(["search", "--dataset", path, "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hwnas: error: ") and "at least 2 classes" in err[0]
    assert not (tmp_path / "runs").exists()
