"""Tests for supernet.data: dataset loaders, splits, augmentation and batching."""

from __future__ import annotations

import io
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hwnas.supernet.data import (
    DatasetSplits,
    load_dataset,
    shared_data_dir,
)
from PIL import Image

from hwnas.core.errors import UserError

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

CLASSES = ["cat", "dog", "emu"]


def _random_images(rng: np.random.Generator, n: int, h: int = 8, w: int = 8,
                   c: int = 3) -> np.ndarray:
    """Smooth-ish random HWC uint8 images (JPEG-friendly)."""
    return rng.integers(0, 256, size=(n, h, w, c), dtype=np.uint8)


def _jpeg_bytes(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _jpeg_part(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blobs = [_jpeg_bytes(im) for im in images]
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    return np.frombuffer(b"".join(blobs), dtype=np.uint8).copy(), offsets


def _write_npz(path: Path, n_train: int = 20, n_test: int = 10, drop: str | None = None,
               seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for prefix, n in (("train", n_train), ("test", n_test)):
        jpeg, offsets = _jpeg_part(_random_images(rng, n))
        arrays[f"{prefix}_jpeg"] = jpeg
        arrays[f"{prefix}_offsets"] = offsets
        arrays[f"{prefix}_labels"] = (np.arange(n) % len(CLASSES)).astype(np.uint8)
    arrays["classes"] = np.array(CLASSES)
    if drop is not None:
        del arrays[drop]
    np.savez(path, **arrays)
    return arrays


def _write_cifar_pickles(root: Path, per_batch: int = 6, n_test: int = 6) -> Path:
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


def _write_folder(root: Path, counts: dict[str, int], size: int = 12, mode: str = "RGB",
                  ext: str = ".png", seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for cls, n in counts.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            c = 3 if mode == "RGB" else 1
            arr = rng.integers(0, 256, size=(size, size, c), dtype=np.uint8)
            img = Image.fromarray(arr[..., 0] if c == 1 else arr, mode=mode)
            img.save(root / cls / f"img{i}{ext}")


def _check_splits(ds: DatasetSplits) -> None:
    for split in (ds.train, ds.val, ds.test):
        assert split.images.dtype == torch.uint8
        assert split.labels.dtype == torch.int64
        assert split.images.dim() == 4
        assert split.images.shape[0] == split.labels.shape[0] == len(split)
        assert int(split.labels.min()) >= 0 and int(split.labels.max()) < ds.num_classes
    assert len(ds.mean) == len(ds.std) == ds.in_channels
    assert all(s > 0 for s in ds.std)


# --------------------------------------------------------------------------------------------
# digits
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> DatasetSplits:
    return load_dataset("digits", seed=0)


def test_digits_sizes_and_types(digits: DatasetSplits) -> None:
    _check_splits(digits)
    assert digits.name == "digits"
    assert (len(digits.train), len(digits.val), len(digits.test)) == (1079, 359, 359)
    assert digits.num_classes == 10 and digits.classes == [str(i) for i in range(10)]
    assert digits.in_channels == 1 and digits.image_size == (8, 8)
    assert digits.augment == "shift"
    assert int(digits.train.images.max()) == 255 and int(digits.train.images.min()) == 0
    # mean/std are those of the train images in [0, 1]
    x = digits.train.images.double() / 255
    assert digits.mean[0] == pytest.approx(x.mean().item(), rel=1e-9)
    assert digits.std[0] == pytest.approx(x.std(unbiased=False).item(), rel=1e-9)


def test_digits_scaling_matches_sklearn(digits: DatasetSplits) -> None:
    from sklearn.datasets import load_digits

    raw = load_digits().images
    expected = {int(round(v * 255 / 16)) for v in np.unique(raw)}
    assert set(torch.unique(digits.train.images).tolist()) <= expected


def test_digits_stratified(digits: DatasetSplits) -> None:
    from sklearn.datasets import load_digits

    total = Counter(load_digits().target.tolist())
    for split, frac in ((digits.train, 0.6), (digits.val, 0.2), (digits.test, 0.2)):
        counts = Counter(split.labels.tolist())
        for c, n in total.items():
            assert abs(counts[c] - n * frac) <= 1.0, (c, counts[c], n * frac)


def test_digits_splits_partition_the_data(digits: DatasetSplits) -> None:
    all_images = torch.cat([digits.train.images, digits.val.images, digits.test.images])
    assert all_images.shape[0] == 1797
    from sklearn.datasets import load_digits

    ref = np.floor(load_digits().images * 255 / 16 + 0.5).astype(np.uint8)
    ours = sorted(map(bytes, all_images.reshape(1797, -1).numpy()))
    theirs = sorted(map(bytes, ref.reshape(1797, -1)))
    assert ours == theirs


def test_digits_deterministic_and_seed_dependent(digits: DatasetSplits) -> None:
    again = load_dataset("digits", seed=0)
    for a, b in ((digits.train, again.train), (digits.val, again.val), (digits.test, again.test)):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    other = load_dataset("digits", seed=1)
    assert not torch.equal(digits.test.images, other.test.images)
    assert not torch.equal(digits.train.images, other.train.images)


def test_digits_test_split_fixed_for_seed_whatever_val_fraction(digits: DatasetSplits) -> None:
    smaller_val = load_dataset("digits", seed=0, val_fraction=0.1)
    assert torch.equal(digits.test.images, smaller_val.test.images)
    assert len(smaller_val.val) == round(0.1 * 1797)
    assert len(smaller_val.train) == 1797 - len(smaller_val.val) - len(smaller_val.test)


def test_digits_image_size_resizes() -> None:
    ds = load_dataset("digits", image_size=16)
    assert ds.image_size == (16, 16) and ds.in_channels == 1


# --------------------------------------------------------------------------------------------
# cifar10-jpeg npz
# --------------------------------------------------------------------------------------------


def test_npz_loader(tmp_path: Path) -> None:
    path = tmp_path / "tiny.npz"
    arrays = _write_npz(path)
    ds = load_dataset(str(path), seed=3)
    _check_splits(ds)
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
    _write_npz(path)
    ds = load_dataset(str(path), image_size=4)
    assert ds.image_size == (4, 4)


def test_npz_missing_key(tmp_path: Path) -> None:
    path = tmp_path / "broken.npz"
    _write_npz(path, drop="train_offsets")
    with pytest.raises(UserError, match="missing key.*train_offsets"):
        load_dataset(str(path))


def test_npz_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "garbage.npz"
    path.write_bytes(b"this is not a zip file")
    with pytest.raises(UserError, match="cannot read .*garbage.npz"):
        load_dataset(str(path))


def test_npz_corrupt_jpeg(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    arrays = _write_npz(path)
    arrays["train_jpeg"] = np.zeros_like(arrays["train_jpeg"])
    np.savez(path, **arrays)
    with pytest.raises(UserError, match="train image 0 .*not a decodable image"):
        load_dataset(str(path))


def test_npz_bad_labels(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    arrays = _write_npz(path)
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
    d = _write_cifar_pickles(tmp_path)
    ds = load_dataset(str(d), seed=0)
    _check_splits(ds)
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
    d = _write_cifar_pickles(tmp_path)
    (d / "data_batch_3").unlink()
    with pytest.raises(UserError, match="lacks data_batch_3"):
        load_dataset(str(d))


def test_cifar_pickle_refuses_code(tmp_path: Path) -> None:
    d = _write_cifar_pickles(tmp_path)
    with (d / "batches.meta").open("wb") as f:
        pickle.dump({b"label_names": [Path("x")]}, f)
    with pytest.raises(UserError, match="refusing to load"):
        load_dataset(str(d))


# --------------------------------------------------------------------------------------------
# ImageFolder
# --------------------------------------------------------------------------------------------


def test_image_folder_flat(tmp_path: Path) -> None:
    root = tmp_path / "pets"
    _write_folder(root, {"b_dog": 10, "a_cat": 10, "c_emu": 10}, ext=".PNG")
    (root / "a_cat" / "notes.txt").write_text("not an image")
    ds = load_dataset(str(root), seed=0)
    _check_splits(ds)
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
    _write_folder(root, {"x": 5, "y": 5}, mode="L", ext=".jpg")
    ds = load_dataset(str(root), image_size=10)
    assert ds.in_channels == 1 and ds.image_size == (10, 10)


def test_image_folder_mixed_modes_become_rgb(tmp_path: Path) -> None:
    root = tmp_path / "mixed"
    _write_folder(root, {"x": 5}, mode="L")
    _write_folder(root, {"y": 5}, mode="RGB", seed=1)
    ds = load_dataset(str(root))
    assert ds.in_channels == 3


def test_image_folder_train_test(tmp_path: Path) -> None:
    root = tmp_path / "split"
    _write_folder(root / "train", {"cat": 10, "dog": 10})
    _write_folder(root / "test", {"cat": 3, "dog": 2}, seed=5)
    ds = load_dataset(str(root), seed=0, image_size=16)
    _check_splits(ds)
    assert ds.classes == ["cat", "dog"]
    assert (len(ds.train), len(ds.val), len(ds.test)) == (18, 2, 5)
    assert ds.test.labels.tolist() == [0, 0, 0, 1, 1]
    assert ds.image_size == (16, 16)


def test_image_folder_test_class_unknown(tmp_path: Path) -> None:
    root = tmp_path / "split"
    _write_folder(root / "train", {"cat": 4, "dog": 4})
    _write_folder(root / "test", {"cow": 2})
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
    _write_folder(root, {"cat": 4})
    (root / "dog").mkdir()
    with pytest.raises(UserError, match="dog.*hold no images"):
        load_dataset(str(root))


def test_image_folder_corrupt_image(tmp_path: Path) -> None:
    root = tmp_path / "corrupt"
    _write_folder(root, {"cat": 4, "dog": 4})
    (root / "dog" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(UserError, match="broken.png"):
        load_dataset(str(root))


# --------------------------------------------------------------------------------------------
# names, paths and arguments
# --------------------------------------------------------------------------------------------


def test_unknown_name() -> None:
    with pytest.raises(UserError, match="unknown dataset 'mnist'.*'digits', 'cifar10'"):
        load_dataset("mnist")


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "data.npz"
    with pytest.raises(UserError, match="does not exist") as err:
        load_dataset(str(missing))
    assert str(missing) in str(err.value)


def test_bad_arguments() -> None:
    with pytest.raises(UserError, match="val_fraction"):
        load_dataset("digits", val_fraction=1.5)
    with pytest.raises(UserError, match="image_size"):
        load_dataset("digits", image_size=0)
    with pytest.raises(UserError, match="val_fraction .* below 0.8"):
        load_dataset("digits", val_fraction=0.85)


def test_shared_cifar10_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWNAS_SHARED_DATA", str(tmp_path))
    assert shared_data_dir() == tmp_path
    with pytest.raises(UserError) as err:
        load_dataset("cifar10")
    msg = str(err.value)
    assert str(tmp_path / "cifar10" / "cifar10-jpeg.npz") in msg and "HWNAS_SHARED_DATA" in msg
    monkeypatch.setenv("HWNAS_SHARED_DATA", str(tmp_path / "absent"))
    assert shared_data_dir() is None


def test_shared_cifar10_via_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cifar10").mkdir()
    _write_npz(tmp_path / "cifar10" / "cifar10-jpeg.npz")
    monkeypatch.setenv("HWNAS_SHARED_DATA", str(tmp_path))
    ds = load_dataset("cifar10")
    assert ds.name == "cifar10" and len(ds.test) == 10


def test_shared_data_dir_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWNAS_SHARED_DATA", raising=False)
    from hwnas import supernet

    expected = Path(supernet.__file__).resolve().parent.parent.parent / "shared" / "data"
    assert shared_data_dir() == (expected if expected.is_dir() else None)


def test_real_shared_cifar10(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real CIFAR-10 npz: slowest test here (decoding 60k JPEGs takes ~5 s), not skipped."""
    base = shared_data_dir()
    if base is None or not (base / "cifar10" / "cifar10-jpeg.npz").is_file():
        pytest.skip("shared data cifar10/cifar10-jpeg.npz not found (set HWNAS_SHARED_DATA)")
    ds = load_dataset("cifar10", seed=0)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (45000, 5000, 10000)
    assert ds.num_classes == 10 and ds.in_channels == 3 and ds.image_size == (32, 32)
    assert sorted(Counter(ds.val.labels.tolist()).values()) == [500] * 10
    assert ds.mean == pytest.approx((0.491, 0.482, 0.447), abs=0.01)
