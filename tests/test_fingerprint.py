"""Tests for supernet.fingerprint: checkpoints record their training images, and a search's
validation split stays disjoint from them whatever copy of the dataset it reads (a reordered
npz, the CIFAR pickle directory, a subset), or is refused in one line."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hwnas.supernet.checkpoints import CIFAR10_CLASSES, SHIPPED, shipped_candidates
from hwnas.supernet.data import DatasetSplits, load_dataset
from hwnas.supernet.fingerprint import (
    RECORD_FORMAT,
    dataset_fingerprint,
    disjoint_validation,
    image_hashes,
    read_record,
    training_record,
)
from PIL import Image

from hwnas.core.errors import UserError

CLASSES = ["cat", "dog", "emu"]


def _blobs(n: int, size: int, seed: int) -> tuple[list[bytes], np.ndarray]:
    """``n`` random JPEG images and labels cycling through the classes."""
    rng = np.random.default_rng(seed)
    blobs = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
            buf, format="JPEG", quality=90)
        blobs.append(buf.getvalue())
    return blobs, (np.arange(n) % len(CLASSES)).astype(np.uint8)


def _part(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    return np.frombuffer(b"".join(blobs), dtype=np.uint8).copy(), offsets


def _npz(path: Path, train, test, classes=CLASSES) -> Path:
    arrays = {"classes": np.array(classes)}
    for prefix, (blobs, labels) in (("train", train), ("test", test)):
        arrays[f"{prefix}_jpeg"], arrays[f"{prefix}_offsets"] = _part(blobs)
        arrays[f"{prefix}_labels"] = np.asarray(labels, dtype=np.uint8)
    np.savez(path, **arrays)
    return path


def _select(part, idx) -> tuple[list[bytes], np.ndarray]:
    blobs, labels = part
    return [blobs[i] for i in idx], labels[np.asarray(idx)]


def _decoded_hashes(blobs: list[bytes]) -> np.ndarray:
    arr = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs])
    return image_hashes(torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous())


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> dict:
    """Dataset A (60 training, 12 test images of 32x32) and the record of a supernet trained
    on its seed-0 training split."""
    root = tmp_path_factory.mktemp("fp")
    train, test = _blobs(60, 32, seed=0), _blobs(12, 32, seed=1)
    path = _npz(root / "a.npz", train, test)
    data = load_dataset(str(path), seed=0)
    return {"root": root, "train": train, "test": test, "path": path, "data": data,
            "payload": {"data_record": training_record(data)}}


def _all_hashes(data: DatasetSplits, *splits: str) -> np.ndarray:
    return np.sort(np.concatenate([image_hashes(getattr(data, s).images) for s in splits]))


def _assert_disjoint(out: DatasetSplits, payload: dict, before: DatasetSplits) -> None:
    trained = read_record(payload, "x").train_hashes
    assert not np.isin(image_hashes(out.val.images), trained).any()
    assert not np.isin(image_hashes(out.test.images), trained).any()
    # nothing lost or duplicated: train + val hold the same images as before
    assert np.array_equal(_all_hashes(out, "train", "val"), _all_hashes(before, "train", "val"))
    assert len(out.val) == len(before.val)
    assert np.array_equal(np.bincount(out.val.labels.numpy(), minlength=3),
                          np.bincount(before.val.labels.numpy(), minlength=3))


# -- hashes, fingerprint, record ---------------------------------------------------------------

def test_hashes_follow_content_not_position():
    images = torch.randint(0, 256, (5, 3, 4, 4), dtype=torch.uint8)
    h = image_hashes(images)
    assert h.dtype == np.uint64 and len(set(h.tolist())) == 5
    assert np.array_equal(image_hashes(images.flip(0)), h[::-1])
    changed = images.clone()
    changed[2, 0, 0, 0] ^= 1
    assert (image_hashes(changed) != h).tolist() == [False, False, True, False, False]


def test_fingerprint_ignores_order_and_seed_not_content(source):
    a = source["data"]
    assert dataset_fingerprint(load_dataset(str(source["path"]), seed=3)) == dataset_fingerprint(a)
    relabelled = DatasetSplits(a.name, a.train, a.val, a.test, ["ant", "bee", "cow"], a.mean,
                               a.std, a.augment)
    assert dataset_fingerprint(relabelled) != dataset_fingerprint(a)


def test_record_in_checkpoint_round_trip(tmp_path: Path, source):
    from hwnas.supernet.spaces import get_space
    from hwnas.supernet.train import load_checkpoint, save_checkpoint

    space = get_space("mbv3-tiny", in_channels=3, image_size=32, num_classes=3)
    path = save_checkpoint(tmp_path / "sn.pt", space.build_supernet(), space, dataset="a.npz",
                           data_record=source["payload"]["data_record"])
    _, _, payload = load_checkpoint(path)  # weights_only load reads the record
    record = read_record(payload, str(path))
    assert record.classes == tuple(CLASSES) and record.dataset == "a.npz"
    assert np.array_equal(record.train_hashes, _all_hashes(source["data"], "train"))
    assert payload["data_record"]["format"] == RECORD_FORMAT


@pytest.mark.parametrize("record, what", [
    ({"format": "other"}, "expected a dict tagged"),
    ({"format": RECORD_FORMAT, "classes": "cat", "dataset": "a", "fingerprint": "f",
      "train_hashes": torch.zeros(1, dtype=torch.int64), "train_images": 1}, "list of strings"),
    ({"format": RECORD_FORMAT, "classes": ["a", "b"], "dataset": "a", "fingerprint": "f",
      "train_hashes": [1, 2], "train_images": 2}, "int64 tensor"),
    ({"format": RECORD_FORMAT, "classes": ["a", "b"], "dataset": "a", "fingerprint": "f",
      "train_hashes": torch.zeros(2, dtype=torch.int64), "train_images": 5}, "counts 5"),
])
def test_malformed_record_is_one_clear_error(record, what):
    with pytest.raises(UserError, match=f"checkpoint c.pt has a malformed data_record.*{what}"):
        read_record({"data_record": record}, "c.pt")


# -- copies of the training data ------------------------------------------------------------

def test_same_copy_and_split_is_left_alone(source):
    data = source["data"]
    assert disjoint_validation(data, source["payload"], "sn.pt", log=pytest.fail) is data


def test_reordered_npz_gets_a_disjoint_validation(source):
    order = np.random.default_rng(5).permutation(60)
    path = _npz(source["root"] / "reordered.npz", _select(source["train"], order), source["test"])
    data = load_dataset(str(path), seed=0)
    trained = read_record(source["payload"], "x").train_hashes
    assert np.isin(image_hashes(data.val.images), trained).any()  # the leak without the check
    lines = []
    out = disjoint_validation(data, source["payload"], "sn.pt", log=lines.append)
    _assert_disjoint(out, source["payload"], data)
    assert len(lines) == 1 and lines[0].startswith("validation: checkpoint sn.pt trained on")
    again = disjoint_validation(data, source["payload"], "sn.pt", log=lambda _: None)
    assert torch.equal(again.val.images, out.val.images)  # seeded: every worker agrees


def test_cifar_pickle_directory_of_the_same_images(tmp_path: Path, source):
    """The python-pickle layout (read with the loader's numpy-only unpickler) holding the same
    pixels in another order: same fingerprint, and validation kept disjoint."""
    a = source["data"]
    pool = torch.cat([a.val.images, a.train.images]).reshape(60, -1).numpy()
    labels = torch.cat([a.val.labels, a.train.labels]).tolist()
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    for i in range(5):
        with (d / f"data_batch_{i + 1}").open("wb") as f:
            pickle.dump({b"data": pool[12 * i:12 * (i + 1)], b"labels": labels[12 * i:12 * (i + 1)]}, f)
    with (d / "test_batch").open("wb") as f:
        pickle.dump({b"data": a.test.images.reshape(12, -1).numpy(),
                     b"labels": a.test.labels.tolist()}, f)
    with (d / "batches.meta").open("wb") as f:
        pickle.dump({b"label_names": [c.encode() for c in CLASSES]}, f)
    data = load_dataset(str(d), seed=0)
    assert dataset_fingerprint(data) == source["payload"]["data_record"]["fingerprint"]
    out = disjoint_validation(data, source["payload"], "sn.pt", log=lambda _: None)
    _assert_disjoint(out, source["payload"], data)


def test_subset_keeping_unseen_images_is_accepted(source):
    seen = np.isin(_decoded_hashes(source["train"][0]), read_record(source["payload"], "x").train_hashes)
    unseen = np.flatnonzero(~seen)
    assert unseen.size == 6  # the supernet's validation share of A
    keep = np.sort(np.concatenate([unseen, np.flatnonzero(seen)[::2]]))
    path = _npz(source["root"] / "subset.npz", _select(source["train"], keep), source["test"])
    data = load_dataset(str(path), seed=1)
    assert dataset_fingerprint(data) != source["payload"]["data_record"]["fingerprint"]
    out = disjoint_validation(data, source["payload"], "sn.pt", log=lambda _: None)
    _assert_disjoint(out, source["payload"], data)


def test_subset_of_training_images_only_is_refused(source):
    seen = np.isin(_decoded_hashes(source["train"][0]), read_record(source["payload"], "x").train_hashes)
    path = _npz(source["root"] / "seen.npz", _select(source["train"], np.flatnonzero(seen)),
                source["test"])
    data = load_dataset(str(path), seed=0)
    with pytest.raises(UserError, match=r"^validation would overlap the supernet's training "
                                        r"images: checkpoint sn.pt trained on \d+ of the \d+ "
                                        r"validation images") as err:
        disjoint_validation(data, source["payload"], "sn.pt")
    assert "\n" not in str(err.value)


def test_test_images_the_supernet_trained_on_are_dropped():
    """A dataset split here from one pool (digits) under another seed puts training images of
    the supernet into test and validation: both are cleaned, training keeps the rest."""
    trained = load_dataset("digits", seed=0)
    other = load_dataset("digits", seed=1)
    payload = {"data_record": training_record(trained)}
    lines = []
    out = disjoint_validation(other, payload, "sn.pt", seed=1, log=lines.append)
    assert [line.split(":")[0] for line in lines] == ["test", "validation"]
    _assert_disjoint(out, payload, other)
    assert 0 < len(out.test) < len(other.test)


# -- another dataset, an old checkpoint ------------------------------------------------------

def test_other_classes_are_refused(source):
    for classes, extra in ((["ant", "bee", "cow"], ""), (["dog", "cat", "emu"], " in another order")):
        a = source["data"]
        data = DatasetSplits("b", a.train, a.val, a.test, classes, a.mean, a.std, a.augment)
        with pytest.raises(UserError, match=f"trained on 'a.npz' with classes cat, dog, emu; "
                                            f"dataset 'b' has classes {', '.join(classes)}{extra}:"):
            disjoint_validation(data, source["payload"], "sn.pt")


def test_other_dataset_of_the_same_shape_is_refused(source):
    path = _npz(source["root"] / "other.npz", _blobs(60, 32, seed=7), _blobs(12, 32, seed=8))
    data = load_dataset(str(path), seed=0)
    with pytest.raises(UserError, match="another dataset with the same classes: none of its 54 "
                                        "training images is among the 72 images of 'other.npz'"):
        disjoint_validation(data, source["payload"], "sn.pt")


def test_old_checkpoint_warns_once_and_keeps_the_data(source):
    lines = []
    data = source["data"]
    assert disjoint_validation(data, {"format": "hwnas-supernet-1"}, "old.pt", log=lines.append) is data
    assert len(lines) == 1 and lines[0].startswith("warning: checkpoint old.pt does not record")


# -- through the command line ----------------------------------------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    """8x8 dataset A, a (untrained) mbv3-tiny checkpoint recording A's seed-0 training split."""
    from hwnas.supernet.spaces import get_space
    from hwnas.supernet.train import save_checkpoint

    root = tmp_path_factory.mktemp("cli")
    train, test = _blobs(60, 8, seed=10), _blobs(12, 8, seed=11)
    path = _npz(root / "a.npz", train, test)
    space = get_space("mbv3-tiny", in_channels=3, image_size=8, num_classes=3)
    ckpt = save_checkpoint(root / "sn.pt", space.build_supernet(), space, dataset="a.npz",
                           data_record=training_record(load_dataset(str(path), seed=0)))
    return {"root": root, "train": train, "test": test, "ckpt": ckpt}


def _search(dataset: Path, ckpt: Path, out: Path) -> list[str]:
    return ["search", "--dataset", str(dataset), "--supernet", str(ckpt), "--trials", "2",
            "--no-bits", "--objectives", "accuracy,size", "--devices", "edgetpu-est",
            "--calib-batches", "1", "--out", str(out), "--name", "r", "--quiet"]


def test_search_on_a_reordered_copy_validates_on_unseen_images(small, capsys, one_torch_thread):
    from hwnas.supernet.train import load_checkpoint

    from hwnas.cli import main

    order = np.random.default_rng(3).permutation(60)
    path = _npz(small["root"] / "b.npz", _select(small["train"], order), small["test"])
    assert main(_search(path, small["ckpt"], small["root"] / "runs")) == 0
    out = capsys.readouterr().out
    assert "validation: checkpoint" in out and "none seen by the supernet" in out
    _, _, payload = load_checkpoint(small["root"] / "runs" / "r" / "supernet.pt")
    assert torch.equal(payload["data_record"]["train_hashes"],
                       torch.load(small["ckpt"], weights_only=True)["data_record"]["train_hashes"])


def test_search_with_a_supernet_of_another_dataset_is_refused(small, capsys):
    from hwnas.cli import main

    path = _npz(small["root"] / "c.npz", _blobs(60, 8, seed=20), _blobs(12, 8, seed=21))
    assert main(_search(path, small["ckpt"], small["root"] / "refused")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hwnas: error: checkpoint ") and "fingerprint" in err[0]
    assert not (small["root"] / "refused").exists()


# -- what writes a record --------------------------------------------------------------------

def test_training_writes_the_record_of_its_training_split(tmp_path: Path, one_torch_thread):
    from hwnas.supernet.spaces import get_space
    from hwnas.supernet.train import load_checkpoint, sandwich_config, train_supernet

    data = load_dataset("digits", seed=0)
    space = get_space("mbv3-tiny")
    train_supernet(space.build_supernet(), space, data, sandwich_config(1, batch_size=64),
                   progress=False, checkpoint_path=tmp_path / "sn.pt", max_steps=1)
    _, _, payload = load_checkpoint(tmp_path / "sn.pt")
    record = read_record(payload, "sn.pt")
    assert np.array_equal(record.train_hashes, _all_hashes(data, "train"))
    assert record.fingerprint == dataset_fingerprint(data) and record.dataset == "digits"


_SHIPPED_FILES = {p.name: p for space, classes in SHIPPED for p in shipped_candidates(space, classes)}


@pytest.mark.parametrize("name", sorted(_SHIPPED_FILES))
def test_shipped_cifar10_supernet_records_its_seed0_split(name):
    """Each shipped checkpoint's record is the seed-0 split of the shared npz it was trained
    on: a sample of that split's training images is in it, of its validation images is not.
    mbv3's and vit's own files must be there; another (cct_cifar10.pt) is checked once it is."""
    from hwnas.supernet.data import shared_data_dir
    from hwnas.supernet.data.splits import _rng, _stratified_take

    path = _SHIPPED_FILES[name]
    if not path.is_file() and name not in ("mbv3_cifar10.pt", "vit_cifar10.pt"):
        pytest.skip(f"{name} is not shipped")
    assert path.is_file() and path.stat().st_size < 20 * 2**20
    record = read_record(torch.load(path, map_location="cpu", weights_only=True), str(path))
    assert record is not None and record.classes == CIFAR10_CLASSES
    assert record.train_hashes.shape == (45000,) and np.unique(record.train_hashes).size == 45000
    base = shared_data_dir()
    npz = base / "cifar10" / "cifar10-jpeg.npz" if base else None
    if npz is None or not npz.is_file():
        pytest.skip("shared data (cifar10/cifar10-jpeg.npz) not found: set HWNAS_SHARED_DATA")
    with np.load(npz) as z:
        jpeg, offsets = z["train_jpeg"], z["train_offsets"]
        labels = z["train_labels"].astype(np.int64)
    # the split load_dataset(npz, seed=0) makes, from the labels alone
    rest, val = _stratified_take(labels, 5000, _rng(0, 1))
    rng = np.random.default_rng(0)
    for idx, inside in ((rng.choice(rest, 100, replace=False), True),
                        (rng.choice(val, 100, replace=False), False)):
        blobs = [jpeg[offsets[i]:offsets[i + 1]].tobytes() for i in idx]
        assert np.isin(_decoded_hashes(blobs), record.train_hashes).all() == inside
        assert np.isin(_decoded_hashes(blobs), record.train_hashes).any() == inside
