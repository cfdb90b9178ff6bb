"""The CIFAR benchmark's harness (benchmarks/cifar_tools.py): decoding a dataset for
``hwnas train`` and ranking a run's subnets against ground truth (Kendall tau)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hwnas.supernet.decoded import is_decoded, load_decoded, load_training_data
from hwnas.supernet.spaces import get_space

from benchmarks import cifar_tools
from hwnas.cli import main as hwnas_main


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "digits-decoded.npz"
    assert cifar_tools.main(["prepare", "--source", "digits", "--out", str(path)]) == 0
    return path


def test_prepare_round_trip(decoded, digits):
    data = load_decoded(decoded)
    assert is_decoded(decoded) and not is_decoded(decoded.with_suffix(".pt"))
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(data, split).images, getattr(digits, split).images)
        assert torch.equal(getattr(data, split).labels, getattr(digits, split).labels)
    assert (data.classes, data.mean, data.std, data.augment, data.name) == (
        digits.classes, digits.mean, digits.std, digits.augment, digits.name)
    small = load_training_data(str(decoded), limit_train=100, limit_eval=50)
    assert len(small.train) == 100 and len(small.test) == 50 and len(small.val) == 50
    assert len(set(small.train.labels.tolist())) == 10  # a random subset, not the first 100


def test_prepare_refuses_other_names(tmp_path, capsys):
    assert cifar_tools.main(["prepare", "--source", "digits", "--out", str(tmp_path / "d.pt")]) == 2
    assert "ending in .npz" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_kendall_tau_is_scipys():
    from scipy.stats import kendalltau

    rng = np.random.default_rng(0)
    a = rng.integers(0, 6, 30).astype(float)  # with ties
    b = a + rng.normal(0, 2, 30)
    assert cifar_tools.kendall_tau(a, b) == pytest.approx(kendalltau(a, b)[0])
    assert cifar_tools.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(cifar_tools.kendall_tau([1, 1, 1], [1, 2, 3]))


def test_rank_a_trained_run(decoded, tmp_path, capsys, one_torch_thread):
    out = tmp_path / "run"
    assert hwnas_main(["train", "--dataset", str(decoded), "--space", "mbv3-tiny",
                       "--limit-train", "128", "--limit-eval", "64", "--batch-size", "64",
                       "--epochs", "1", "--out", str(out), "--quiet"]) == 0
    space = get_space("mbv3-tiny")
    rng = np.random.default_rng(7)
    archs = {space.to_string(a) for a in (space.sample(rng) for _ in range(200))}
    truth = tmp_path / "truth.csv"
    truth.write_text("arch_idx,arch,acc\n" + "".join(
        f"{i},{a},{space.flops(space.from_string(a)) / 1e6}\n" for i, a in enumerate(sorted(archs))))
    args = ["rank", "--out", str(out), "--truth", str(truth), "--num", "4", "--seed", "7",
            "--calib-batches", "1", "--device", "cpu"]
    assert cifar_tools.main(args) == 0
    assert "Kendall tau" in capsys.readouterr().out
    report = json.loads((out / "rank.json").read_text())
    assert report["num"] == 4 and report["truth_column"] == "acc"
    assert len({r["arch"] for r in report["subnets"]}) == 4
    for r in report["subnets"]:
        assert r["truth"] == pytest.approx(space.flops(space.from_string(r["arch"])) / 1e6)
        assert 0.0 <= r["supernet_top1"] <= 100.0
    assert report["kendall_tau"] == pytest.approx(cifar_tools.kendall_tau(
        [r["supernet_top1"] for r in report["subnets"]], [r["truth"] for r in report["subnets"]]),
        nan_ok=True)
    # a table of other architectures is one clear error
    truth.write_text("arch,acc\nnot-an-arch,1.0\n")
    assert cifar_tools.main(args) == 2
    assert "lacks 4 of the sampled architectures" in capsys.readouterr().err


def _jpeg_npz(path, per_class: int, classes=("a", "b", "c")):
    """A cifar10-jpeg-style .npz of per_class 32x32 JPEGs per class in each split."""
    import io

    from PIL import Image

    arrays = {"classes": np.asarray(classes)}
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        labels = np.tile(np.arange(len(classes), dtype=np.uint8), per_class)
        blobs = []
        for _ in labels:
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
            blobs.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
        arrays[f"{split}_jpeg"] = np.concatenate(blobs)
        arrays[f"{split}_offsets"] = np.concatenate([[0], np.cumsum([len(b) for b in blobs])])
        arrays[f"{split}_labels"] = labels
    np.savez(path, **arrays)
    return arrays


def test_subset_keeps_the_first_images_of_each_class(tmp_path, capsys):
    from hwnas.supernet.data import load_dataset

    src = _jpeg_npz(tmp_path / "src.npz", per_class=20)
    out = tmp_path / "small.npz"
    assert cifar_tools.main(["subset", "--source", str(tmp_path / "src.npz"), "--per-class", "10",
                             "--out", str(out)]) == 0
    with np.load(out) as z:
        assert np.bincount(z["train_labels"]).tolist() == [10, 10, 10]
        assert np.bincount(z["test_labels"]).tolist() == [1, 1, 1]
        first = z["train_jpeg"][: z["train_offsets"][1]]  # image 0 of the source comes first
        assert np.array_equal(first, src["train_jpeg"][: src["train_offsets"][1]])
    data = load_dataset(str(out), seed=0)
    assert len(data.train) + len(data.val) == 30 and len(data.test) == 3
    assert cifar_tools.main(["subset", "--source", str(tmp_path / "src.npz"), "--per-class", "21",
                             "--out", str(tmp_path / "big.npz")]) == 2
    assert "has 20 images of class 0" in capsys.readouterr().err
    assert not (tmp_path / "big.npz").exists()
    (tmp_path / "bad.npz").write_bytes(b"not an npz")
    assert cifar_tools.main(["subset", "--source", str(tmp_path / "bad.npz"),
                             "--out", str(tmp_path / "x.npz")]) == 2
    assert "not a cifar10-jpeg .npz" in capsys.readouterr().err
