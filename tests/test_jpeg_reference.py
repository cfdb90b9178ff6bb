"""benchmarks/jpeg_reference.py: ResNet-20 on (re-encoded) JPEG CIFAR-10 resumes bit for bit,
re-encodes at the quality asked, and refuses to resume another run's checkpoint."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks.jpeg_reference import CHECKPOINT, RESULT, ResNetCifar, main, reencode


def _npz(path, n_train=40, n_test=20, seed=0):
    """A tiny cifar10-jpeg npz of random 32x32 images (JPEG quality 75, 4:2:0)."""
    rng = np.random.default_rng(seed)
    parts = {}
    for prefix, n in (("train", n_train), ("test", n_test)):
        blobs = []
        for _ in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                buf, "JPEG", quality=75, subsampling=2)
            blobs.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
        parts[f"{prefix}_jpeg"] = np.concatenate(blobs)
        parts[f"{prefix}_offsets"] = np.concatenate([[0], np.cumsum([len(b) for b in blobs])])
        parts[f"{prefix}_labels"] = (np.arange(n) % 10).astype(np.uint8)
    np.savez(path, classes=np.array([f"c{i}" for i in range(10)]), **parts)
    return str(path)


def _args(npz, out, *extra):
    return ["--dataset", npz, "--out", str(out), "--batch-size", "16", "--iterations", "3",
            "--checkpoint-every-s", "1e9", *extra]


def _state(out):
    return torch.load(out / CHECKPOINT, weights_only=False)


def test_resume_equals_an_uninterrupted_run(tmp_path, capsys):
    npz = _npz(tmp_path / "tiny.npz")
    assert main(_args(npz, tmp_path / "whole")) == 0  # 36 training images: 2 steps an epoch
    for stop in ("1", "2"):  # the second part resumes mid-epoch, the third across an epoch
        assert main(_args(npz, tmp_path / "parts", "--max-steps", stop)) == 0
        assert _state(tmp_path / "parts")["step"] == int(stop)
        assert not (tmp_path / "parts" / RESULT).exists()
    assert main(_args(npz, tmp_path / "parts")) == 0
    whole, parts = _state(tmp_path / "whole"), _state(tmp_path / "parts")
    assert whole["step"] == parts["step"] == 3 and len(parts["parts"]) == 3
    for name, value in whole["model"].items():
        assert torch.equal(value, parts["model"][name]), name
    for key, value in whole["optimizer"]["state"].items():
        assert torch.equal(value["momentum_buffer"],
                           parts["optimizer"]["state"][key]["momentum_buffer"])
    assert whole["scheduler"] == parts["scheduler"]
    assert whole["history"][0]["loss"] == parts["history"][0]["loss"]
    result = json.loads((tmp_path / "parts" / RESULT).read_text())
    assert result["completed"] and 0 <= result["test_top1"] <= 100
    assert result["params"] == sum(p.numel() for p in ResNetCifar(20).parameters())
    # another quality is another run: its checkpoint is refused
    assert main(_args(npz, tmp_path / "q", "--max-steps", "1")) == 0
    capsys.readouterr()
    assert main(_args(npz, tmp_path / "q", "--quality", "50")) == 2
    assert "other settings (quality" in capsys.readouterr().err
    # the same images at another path (another machine) resume; other images are refused
    moved = tmp_path / "elsewhere.npz"
    moved.write_bytes((tmp_path / "tiny.npz").read_bytes())
    assert main(_args(str(moved), tmp_path / "q", "--max-steps", "2")) == 0
    assert _state(tmp_path / "q")["step"] == 2
    capsys.readouterr()
    assert main(_args(_npz(tmp_path / "other.npz", seed=1), tmp_path / "q")) == 2
    assert "other images" in capsys.readouterr().err


def test_reencode_and_the_network():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    low, size_low = reencode(images, 30)
    high, size_high = reencode(images, 95)
    assert low.shape == images.shape and low.dtype == torch.uint8
    err = [float((images.float() - x.float()).abs().mean()) for x in (high, low)]
    assert 0 < err[0] < err[1] and size_low < size_high
    model = ResNetCifar(20)
    # the paper's 0.27 M: convolutions 267,696, BN 1,376, classifier 650 (option A shortcuts)
    assert sum(p.numel() for p in model.parameters()) == 269722
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(Exception, match="6n\\+2"):
        ResNetCifar(21)
