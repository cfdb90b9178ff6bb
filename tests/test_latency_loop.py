"""The loop a user runs to profile a new device, end to end on this CPU: ``hwnas latency
reference`` exports the models -> the standalone ``latency/ondevice.py`` measures them (a
subprocess, as on a device) -> ``hwnas latency adapt`` -> ``hwnas latency predict``, checked
against fresh measurements of 30 other architectures."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from hwnas.cli import main
from hwnas.latency.reference import ReferenceSet, export_reference
from hwnas.supernet.spaces import get_space

from hwnas.core.maths import spearman

ONDEVICE = Path(__file__).resolve().parent.parent / "latency" / "ondevice.py"


def ondevice(models: Path, out: Path) -> None:
    """Measure a folder of models with the on-device script, isolated from hwnas as on a device:
    1 thread, few repeats, and a cv limit that keeps every model (the shared test machine is
    noisy; the median copes)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-I", str(ONDEVICE), str(models), "--out", str(out),
                           "--threads", "1", "--repeats", "9", "--warmup", "2",
                           "--max-cv", "1000", "--quiet"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


def read_column(path: Path, column: str) -> dict[str, float]:
    with open(path, newline="") as fh:
        return {r["arch"]: float(r[column]) for r in csv.DictReader(fh)}


def test_reference_measure_adapt_predict(tmp_path, monkeypatch, capsys, nb201_sample,
                                         one_torch_thread):
    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(tmp_path / "profiles"))
    refs = tmp_path / "refs"
    assert main(["latency", "reference", "--space", "nb201", "--n", "10", "--export",
                 str(refs)]) == 0
    assert "ondevice.py" in capsys.readouterr().out
    assert len(list(refs.glob("*.onnx"))) == 10 and (refs / "archs.csv").is_file()

    ondevice(refs, tmp_path / "measurements.csv")  # the folder as written, archs.csv and all
    measured = read_column(tmp_path / "measurements.csv", "latency_ms")
    assert set(measured) == set(read_column(refs / "archs.csv", "order"))

    assert main(["latency", "adapt", "--device", "this-cpu", "--space", "nb201",
                 "--measurements", str(tmp_path / "measurements.csv")]) == 0
    out = capsys.readouterr().out
    assert "leave-one-out on the 10 measurements" in out and "Spearman" in out
    assert "more measurements would likely" in out or "too few" in out
    assert "not the predictor's reference architectures" not in out

    # 30 other architectures, exported and measured the same way, then predicted (a rank
    # correlation above 0.6 on 30 architectures is far from chance)
    _, candidates = nb201_sample(80, seed=7)
    others = [a for a in candidates if a not in measured][:30]
    fresh = tmp_path / "fresh"
    export_reference(get_space("nb201"), ReferenceSet(others, 0, "random"), fresh)
    ondevice(fresh, tmp_path / "fresh.csv")
    truth = read_column(tmp_path / "fresh.csv", "latency_ms")
    assert main(["latency", "predict", "--device", "this-cpu", "--space", "nb201", "--archs",
                 str(fresh / "archs.csv"), "--out", str(tmp_path / "pred.csv")]) == 0
    predicted = read_column(tmp_path / "pred.csv", "latency_ms")
    assert set(predicted) == set(others) == set(truth)
    rho = spearman(np.array([predicted[a] for a in others]), np.array([truth[a] for a in others]))
    # far below what the loop reaches even on a busy shared CPU, far above unrelated rankings
    assert rho > 0.6, f"Spearman of the predictions on 30 fresh measurements: {rho:.3f}"
