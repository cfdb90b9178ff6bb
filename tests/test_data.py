"""Tests for supernet.data's sources: load_dataset by name (digits, the shared CIFAR-10) or
path, its arguments, and the seeded, stratified splits it makes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from data_support import check_splits, write_npz
from hwnas.supernet.data import DatasetSplits, load_dataset, shared_data_dir

from hwnas.core.errors import UserError

# --------------------------------------------------------------------------------------------
# digits
# --------------------------------------------------------------------------------------------


def test_digits_sizes_and_types(digits: DatasetSplits) -> None:
    check_splits(digits)
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
    write_npz(tmp_path / "cifar10" / "cifar10-jpeg.npz")
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
