"""Tests of the standalone on-device script (latency/ondevice.py): what it imports, that it
runs in an isolated interpreter without hwnas, and its refusals."""

from __future__ import annotations

import ast
import subprocess
import sys

import pandas as pd
from latency_support import ONDEVICE, run_ondevice_without

# --------------------------------------------------------------------------------------------
# the standalone on-device script
# --------------------------------------------------------------------------------------------


def test_ondevice_imports_only_the_standard_library_numpy_and_onnxruntime():
    """Module-level imports: stdlib, numpy, onnxruntime; OpenVINO only inside functions
    (imported when --runtime openvino asks for it)."""
    tree = ast.parse(ONDEVICE.read_text())
    top, lazy = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        else:
            continue
        (top if node in tree.body else lazy).update(names)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert top - stdlib == {"numpy", "onnxruntime"}, top - stdlib
    assert lazy - stdlib <= {"openvino"}, lazy - stdlib


def test_ondevice_runs_isolated_and_writes_the_csv(onnx_models, tmp_path):
    d, archs = onnx_models
    out = tmp_path / "measurements.csv"
    proc = subprocess.run([sys.executable, "-I", str(ONDEVICE), str(d), "--out", str(out),
                           "--repeats", "5", "--warmup", "1", "--max-cv", "100", "--quiet"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    frame = pd.read_csv(out)
    assert list(frame.columns) == ["arch", "latency_ms", "p95_ms", "cv", "file"]
    assert sorted(frame["arch"]) == sorted(archs + ["plain_model"])
    assert (frame["latency_ms"] > 0).all() and (frame["p95_ms"] >= frame["latency_ms"]).all()
    assert "wrote 4 measurements" in proc.stdout


def test_ondevice_needs_no_hwnas_package(onnx_models, tmp_path):
    """Run the script with hwnas, torch and pandas made unimportable."""
    d, _ = onnx_models
    out = tmp_path / "m.csv"
    proc = run_ondevice_without(
        {"hwnas", "supernet", "latency", "search", "quant", "export", "torch", "pandas"},
        [d, "--out", out, "--repeats", "3", "--warmup", "0", "--max-cv", "100", "--quiet"],
        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(pd.read_csv(out)) == 4


def test_ondevice_refuses_unstable_and_bad_input(onnx_models, tmp_path):
    d, _ = onnx_models
    out = tmp_path / "m.csv"
    proc = subprocess.run([sys.executable, "-I", str(ONDEVICE), str(d), "--out", str(out),
                           "--repeats", "3", "--warmup", "0", "--max-cv", "1e-12", "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not out.exists()
    assert "all 4 models were unstable" in proc.stderr.splitlines()[-1]
    proc = subprocess.run([sys.executable, "-I", str(ONDEVICE), str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not a directory" in proc.stderr


def test_ondevice_warns_when_the_device_was_busy(onnx_models, tmp_path):
    """A load average above the cores: the CSV is written, with a warning on stderr."""
    d, _ = onnx_models
    out = tmp_path / "m.csv"
    code = ("import os, sys, runpy\n"
            "os.getloadavg = lambda: (99.0, 99.0, 99.0)\n"
            f"sys.argv = ['ondevice.py', {str(d)!r}, '--out', {str(out)!r}, '--repeats', '3', "
            "'--warmup', '0', '--max-cv', '100', '--quiet']\n"
            f"runpy.run_path({str(ONDEVICE)!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "ondevice.py: warning: the 1-minute load average is 99.0" in proc.stderr
    assert len(pd.read_csv(out)) == 4
