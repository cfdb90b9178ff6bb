"""End-to-end tests of the ``hwnas`` command line on tiny budgets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest

from search.cli import main


def hwnas(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would."""
    return subprocess.run([sys.executable, "-m", "search.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "supernet.pt"
    assert main(["train", "--epochs", "1", "--out", str(path), "--quiet"]) == 0
    return path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A full ``hwnas run`` (training included) with a tiny budget, through a real subprocess."""
    out = tmp_path_factory.mktemp("runs")
    proc = hwnas("run", "--epochs", "1", "--trials", "6", "--out", str(out), "--name", "tiny",
                 "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "Pareto-optimal models" in proc.stdout
    return out / "tiny"


def non_dominated(frame: pd.DataFrame) -> set[int]:
    """Trials not dominated in (max accuracy, min flops, min latency), recomputed by brute force."""
    v = np.stack([-frame["accuracy"], frame["flops"], frame["latency_ms"]], axis=1)
    keep = set()
    for i in range(len(v)):
        dominated = np.any(np.all(v <= v[i], axis=1) & np.any(v < v[i], axis=1))
        if not dominated:
            keep.add(int(frame["trial"].iloc[i]))
    return keep


def test_run_writes_everything(tiny_run: Path):
    for name in ("config.json", "supernet.pt", "study.db", "trials.csv", "pareto.csv",
                 "pareto.png", "train_history.json", "models/manifest.json"):
        assert (tiny_run / name).is_file(), name
    trials = pd.read_csv(tiny_run / "trials.csv")
    assert len(trials) == 6
    for col in ("arch", "accuracy", "flops", "latency_ms", "size_bytes", "pareto"):
        assert trials[col].notna().all(), col
    assert trials["accuracy"].between(0, 100).all()
    assert (trials["latency_ms"] > 0).all()
    assert (tiny_run / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tiny_run.glob(".*")), "temporary files left behind"


def test_pareto_is_the_non_dominated_set(tiny_run: Path):
    trials = pd.read_csv(tiny_run / "trials.csv")
    pareto = pd.read_csv(tiny_run / "pareto.csv")
    front = non_dominated(trials)
    # repeats of one architecture appear once in pareto.csv
    front_archs = set(trials[trials["trial"].isin(front)]["arch"])
    assert set(pareto["arch"]) == front_archs
    assert len(pareto) == len(front_archs)
    assert set(trials[trials["pareto"]]["arch"]) == front_archs


def test_exported_models_match_pytorch(tiny_run: Path):
    pareto = pd.read_csv(tiny_run / "pareto.csv")
    manifest = json.loads((tiny_run / "models" / "manifest.json").read_text())
    assert len(manifest) == len(pareto) > 0
    assert (pareto["onnx_max_abs_diff"] <= 1e-4).all()
    for row in pareto.itertuples():
        path = tiny_run / row.onnx
        model = onnx.load(path)
        onnx.checker.check_model(model)
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta["arch"] == row.arch
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        out = sess.run(None, {"input": np.zeros((3, 1, 8, 8), np.float32)})[0]
        assert out.shape == (3, 10)


def test_existing_run_is_refused_and_untouched(tiny_run: Path):
    before = (tiny_run / "trials.csv").read_bytes()
    proc = hwnas("run", "--epochs", "1", "--trials", "2", "--out", str(tiny_run.parent),
                 "--name", "tiny", "--quiet")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0  # one line
    assert "already holds a run" in proc.stderr and "--resume" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tiny_run / "trials.csv").read_bytes() == before


def test_resume_continues_and_overwrite_replaces(tmp_path: Path, checkpoint: Path):
    args = ["run", "--supernet", str(checkpoint), "--out", str(tmp_path), "--name", "r",
            "--quiet"]
    assert main([*args, "--trials", "3"]) == 0
    first = pd.read_csv(tmp_path / "r" / "trials.csv")
    assert main([*args, "--trials", "5", "--resume"]) == 0
    second = pd.read_csv(tmp_path / "r" / "trials.csv")
    assert len(second) == 5
    # the first trials are kept as they were (not re-run, not duplicated)
    pd.testing.assert_frame_equal(first[["trial", "arch", "accuracy", "flops"]],
                                  second[["trial", "arch", "accuracy", "flops"]].head(3))
    assert sorted(second["trial"]) == list(range(5))
    assert main([*args, "--trials", "2", "--overwrite"]) == 0
    assert len(pd.read_csv(tmp_path / "r" / "trials.csv")) == 2


def test_resume_refuses_other_settings(tmp_path: Path, checkpoint: Path):
    args = ["run", "--supernet", str(checkpoint), "--out", str(tmp_path), "--name", "r",
            "--quiet", "--trials", "2"]
    assert main(args) == 0
    proc = hwnas(*args, "--resume", "--seed", "5")
    assert proc.returncode == 2 and "settings differ" in proc.stderr and "seed" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--dataset", "nope"], "unknown dataset"),
        (["run", "--space", "nope"], "unknown space"),
        (["run", "--trials", "0"], "positive integer"),
        (["run", "--epochs", "-3"], "positive integer"),
        (["run", "--threads", "0"], "positive integer"),
        (["run", "--dataset", "/does/not/exist"], "does not exist"),
        (["run", "--supernet", "/does/not/exist.pt"], "does not exist"),
        (["run", "--sampler", "annealing"], "invalid choice"),
        (["train", "--out", "model.txt"], "ending in .pt"),
        ([], "required"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args, message):
    proc = hwnas(*args, *(["--out", str(tmp_path / "o")] if args and args[0] == "run" else []),
                 cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_malformed_checkpoint_is_rejected(tmp_path: Path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    proc = hwnas("run", "--supernet", str(bad), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "cannot read supernet checkpoint" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_checkpoint_for_other_data_is_rejected(tmp_path: Path):
    from supernet.spaces import get_space
    from supernet.train import save_checkpoint

    space = get_space("mbv3-tiny", in_channels=3, image_size=8, num_classes=10)
    path = save_checkpoint(tmp_path / "rgb.pt", space.build_supernet(), space, dataset="x")
    proc = hwnas("run", "--supernet", str(path), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "was built for input (3, 8, 8)" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_spaces_lists_the_default():
    proc = hwnas("spaces")
    assert proc.returncode == 0 and "mbv3-tiny" in proc.stdout
