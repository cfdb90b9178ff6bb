"""The second training entry point, supernet.train_cifar (CPU smoke runs)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hwnas.supernet import train_cifar
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import load_checkpoint, load_standalone


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "digits-decoded.npz"
    assert train_cifar.main(["prepare", "--source", "digits", "--out", str(path)]) == 0
    return path


def test_prepare_round_trip(decoded, digits):
    data = train_cifar.load_decoded(decoded)
    assert train_cifar.is_decoded(decoded)
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(data, split).images, getattr(digits, split).images)
        assert torch.equal(getattr(data, split).labels, getattr(digits, split).labels)
    assert (data.classes, data.mean, data.std, data.augment, data.name) == (
        digits.classes, digits.mean, digits.std, digits.augment, digits.name)
    small = train_cifar.load_data(str(decoded), limit_train=100, limit_eval=50)
    assert len(small.train) == 100 and len(small.test) == 50
    assert len(set(small.train.labels.tolist())) == 10  # a random subset, not the first 100


def _cli(*args: str) -> int:
    return train_cifar.main([*args, "--quiet"])


def test_entry_point_train_resume_eval(decoded, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "256",
            "--limit-eval", "100", "--batch-size", "64", "--out", str(out)]
    # a budget of ~nothing: one step, checkpointed, "not finished"
    assert _cli(*base, "--epochs", "2", "--max-minutes", "1e-6", "--eval") == 0
    text = capsys.readouterr().out
    assert "not finished" in text and "eval skipped" in text
    log = json.loads((out / "train_log.json").read_text())
    assert not log["completed"] and log["step"] == 1 and (out / "checkpoint.pt").is_file()
    # starting again without --resume is refused; --resume needs only --out
    assert _cli(*base, "--epochs", "2") == 2
    assert "already holds a run" in capsys.readouterr().err
    assert _cli("--out", str(out), "--resume", "--eval") == 0
    text = capsys.readouterr().out
    assert "images/s" in text and "largest" in text
    log = json.loads((out / "train_log.json").read_text())
    assert log["completed"] and log["step"] == log["total_steps"] == 8 and len(log["chunks"]) == 2
    assert [h["epoch"] for h in log["history"]] == [1, 2]
    result = json.loads((out / "eval.json").read_text())
    assert [r["role"] for r in result["subnets"]] == ["largest", "smallest", "random1", "random2",
                                                      "random3"]
    assert all(0.0 <= r["top1"] <= 100.0 for r in result["subnets"])
    assert result["images"] == 100 and result["bn_recalibration"]
    space, net, payload = load_checkpoint(out / "supernet.pt")
    assert space.name == "mbv3-tiny" and "train_state" not in payload
    # evaluating a finished run again trains nothing; it reads the final weights, so the
    # resumable checkpoint may be gone (a run directory downloaded without it)
    (out / "checkpoint.pt").unlink()
    (out / "eval.json").unlink()
    assert _cli("--out", str(out), "--resume", "--eval", "--calib-batches", "1",
                "--calib-batch-size", "16") == 0
    assert "already complete" in capsys.readouterr().out
    again = json.loads((out / "eval.json").read_text())
    assert again["bn_recalibration"] == {"batches": 1, "batch_size": 16, "augmented": True}


def test_entry_point_standalone_and_bench(decoded, tmp_path, capsys):
    out = tmp_path / "sa"
    assert _cli("--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--limit-eval", "100", "--batch-size", "64", "--epochs", "1", "--standalone",
                "random2", "--out", str(out), "--eval") == 0
    result = json.loads((out / "eval.json").read_text())
    space = get_space("mbv3-tiny")
    expected = train_cifar._eval_archs(space)[3][1]  # the same random2 as --eval reports
    assert result["subnets"][0]["arch"] == space.to_string(expected)
    assert not result["bn_recalibration"]
    _, arch, model, _ = load_standalone(out / "model.pt")
    assert arch == expected
    assert _cli("--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--batch-size", "32", "--bench-steps", "3") == 0
    assert "images/s" in capsys.readouterr().out
    assert _cli("--data", str(decoded), "--space", "mbv3-tiny", "--standalone", "k3e2",
                "--out", str(tmp_path / "bad")) == 2
    err = capsys.readouterr().err
    assert "--standalone 'k3e2'" in err and "space mbv3-tiny has 3" in err and "random1" in err
    assert _cli("--data", str(decoded), "--schedule", "progressive", "--space", "nope",
                "--out", str(tmp_path / "bad2")) == 2
    assert "unknown space 'nope'" in capsys.readouterr().err


def test_entry_point_needs_only_torch_and_numpy(decoded, tmp_path):
    """What the GPU machine may lack (pandas, sklearn, optuna, matplotlib, tqdm, Pillow) is not
    needed to train from a decoded file."""
    import subprocess
    import sys
    from pathlib import Path

    blocker = (  # a module set to None in sys.modules is one that is not installed
        "import sys\n"
        "for name in ('pandas', 'sklearn', 'optuna', 'matplotlib', 'tqdm', 'PIL', 'scipy'):\n"
        "    sys.modules[name] = None\n"
        "try:\n"
        "    import tqdm\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    sys.exit(3)\n"
        "from hwnas.supernet.train_cifar import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", blocker, "--data", str(decoded), "--space", "mbv3-tiny",
         "--limit-train", "128", "--limit-eval", "64", "--batch-size", "64", "--epochs", "1",
         "--out", str(tmp_path / "r"), "--eval"],
        capture_output=True, text=True, timeout=300, cwd=repo,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "largest" in proc.stdout
    assert "test top-1" in proc.stdout


def test_kendall_tau_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(5):
        a = rng.integers(0, 6, 30).astype(float)  # with ties
        b = a + rng.normal(0, 2, 30)
        assert train_cifar.kendall_tau(a, b) == pytest.approx(scipy_stats.kendalltau(a, b)[0])
    assert train_cifar.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(train_cifar.kendall_tau([1, 1, 1], [1, 2, 3]))


def test_entry_point_rank(decoded, tmp_path, capsys):
    out = tmp_path / "run"
    assert _cli("--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--limit-eval", "64", "--batch-size", "64", "--epochs", "1", "--out", str(out)) == 0
    space = get_space("mbv3-tiny")
    rng = np.random.default_rng(7)
    archs = {space.to_string(a) for a in (space.sample(rng) for _ in range(200))}
    truth = tmp_path / "truth.csv"
    truth.write_text("arch_idx,arch,acc\n" + "".join(
        f"{i},{a},{space.flops(space.from_string(a)) / 1e6}\n" for i, a in enumerate(sorted(archs))))
    args = ["rank", "--out", str(out), "--truth", str(truth), "--num", "4", "--seed", "7",
            "--calib-batches", "1", "--device", "cpu"]
    assert train_cifar.main(args) == 0
    assert "Kendall tau" in capsys.readouterr().out
    report = json.loads((out / "rank.json").read_text())
    assert report["num"] == 4 and report["truth_column"] == "acc"
    assert len({r["arch"] for r in report["subnets"]}) == 4
    for r in report["subnets"]:
        assert r["truth"] == pytest.approx(space.flops(space.from_string(r["arch"])) / 1e6)
        assert 0.0 <= r["supernet_top1"] <= 100.0
    assert report["kendall_tau"] == pytest.approx(train_cifar.kendall_tau(
        [r["supernet_top1"] for r in report["subnets"]], [r["truth"] for r in report["subnets"]]),
        nan_ok=True)
    # a table of other architectures is one clear error
    truth.write_text("arch,acc\nnot-an-arch,1.0\n")
    assert train_cifar.main(args) == 2
    assert "lacks 4 of the sampled architectures" in capsys.readouterr().err


def test_cudnn_autotuning_defaults_to_standalone_runs_only(tmp_path):
    """--cudnn-benchmark auto: on for a standalone network (one set of shapes), off for a
    supernet (every random subnet brings new shapes to tune), also when a run is resumed."""
    parse = train_cifar.build_parser().parse_args
    assert train_cifar._is_standalone(parse(["--standalone", "largest", "--out", str(tmp_path)]))
    assert not train_cifar._is_standalone(parse(["--out", str(tmp_path)]))
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"standalone": "smallest"}}))
    assert train_cifar._is_standalone(parse(["--out", str(tmp_path), "--resume"]))
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"standalone": None}}))
    assert not train_cifar._is_standalone(parse(["--out", str(tmp_path), "--resume"]))
    assert parse(["--out", "x"]).cudnn_benchmark == "auto"


def test_entry_point_augment_override(decoded, tmp_path, capsys, monkeypatch):
    """--augment replaces the dataset's augmentation for training and BN recalibration, is
    recorded in run.json, and a resumed run keeps it."""
    import hwnas.supernet.data.loader as data_module  # where BatchLoader looks it up

    seen = []
    real = data_module.augment_batch
    monkeypatch.setattr(data_module, "augment_batch",
                        lambda images, kind, generator, fill=None:
                        seen.append(kind) or real(images, kind, generator, fill))
    out = tmp_path / "cut"
    base = ("--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
            "--limit-eval", "50", "--batch-size", "64", "--out", str(out))
    assert _cli(*base, "--epochs", "2", "--augment", "crop_flip_cutout",
                "--max-minutes", "1e-6") == 0
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["augment"] == "crop_flip_cutout"
    assert seen and set(seen) == {"crop_flip_cutout"}
    seen.clear()
    assert _cli("--out", str(out), "--resume", "--eval", "--calib-batches", "1") == 0
    assert seen and set(seen) == {"crop_flip_cutout"}  # training and recalibration alike
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        _cli(*base, "--overwrite", "--augment", "rotate")
    assert exc.value.code == 2 and "--augment" in capsys.readouterr().err
