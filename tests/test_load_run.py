"""``hwnas.load_run``: a finished run from Python (trials, fronts, the models as the search
scored them, latency on any device, export), and the RunDir it reads through."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hwnas.export.model_export import ExportSettings
from hwnas.search.rundir import RUN_FORMAT, RunDir

import hwnas
from hwnas.core.errors import UserError

FAST = ExportSettings(warmup=1, rounds=1, runs=2, profile_runs=2)


def test_import_hwnas_stays_light() -> None:
    code = ("import sys, hwnas; assert callable(hwnas.__getattr__); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(hwnas.__version__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        hwnas.nothing  # noqa: B018


def test_rundir_names_and_reads_the_run(small_run: Path) -> None:
    rd = RunDir(small_run)
    assert rd.is_run() and json.loads(rd.config.read_text())["format"] == RUN_FORMAT
    assert rd.pareto("edgetpu-est") == small_run / "pareto_edgetpu-est.csv"
    assert list(rd.fronts()) == ["edgetpu-est"]
    assert rd.study_db.is_file() and rd.supernet.is_file() and rd.trials_parquet.is_file()
    assert len(rd.read_trials()) == 4 and set(rd.read_fronts()) == {"edgetpu-est"}
    assert not RunDir(small_run.parent).is_run()
    with pytest.raises(UserError, match="does not exist"):
        RunDir(small_run / "nope").read_config()


def test_trials_and_fronts(small_run: Path) -> None:
    run = hwnas.load_run(small_run)
    assert "mbv3-tiny" in repr(run)
    pd.testing.assert_frame_equal(
        run.trials[["trial", "arch", "accuracy"]],
        pd.read_csv(small_run / "trials.csv")[["trial", "arch", "accuracy"]])
    front = run.fronts["edgetpu-est"]
    assert list(front["trial"]) == list(pd.read_csv(small_run / "pareto_edgetpu-est.csv")["trial"])
    best = run.select("edgetpu-est", max_latency_ms=1e6)
    assert best["accuracy"] == front["accuracy"].max()
    assert "rank:edgetpu-est" in run.device_ranks()
    assert run.config.devices == ["edgetpu-est"] and run.config.trials == 4


def test_models_are_the_ones_the_search_scored(small_run: Path) -> None:
    """The rebuilt model's validation accuracy is the trial's recorded accuracy, float and
    quantized; its latency is the recorded one."""
    import torch

    run = hwnas.load_run(small_run)
    trials = run.trials.set_index("trial")
    quantized = [t for t, p in trials["policy"].items() if p]
    floats = [t for t, p in trials["policy"].items() if not p]
    assert quantized and floats
    for t in (floats[0], quantized[0]):
        assert run.accuracy(t, split="val") == pytest.approx(trials.loc[t, "accuracy"], abs=1e-9)
        assert run.latency(t, "edgetpu-est") == pytest.approx(
            trials.loc[t, "latency_ms:edgetpu-est"], rel=1e-9)
    model = run.model(quantized[0])
    assert isinstance(model, torch.nn.Module) and not model.training
    plain = run.model(quantized[0], quantized=False)
    assert {type(m).__name__ for m in model.modules()} != {type(m).__name__ for m in plain.modules()}
    assert run.latency(floats[0], "fpga-zcu102-est") > 0
    with pytest.raises(UserError, match="float model"):
        run.model(floats[0], quantized=True)
    with pytest.raises(UserError, match="no completed trial 99"):
        run.model(99)
    with pytest.raises(UserError, match="unknown device"):
        run.latency(floats[0], "toaster")
    with pytest.raises(UserError, match="no front for device"):
        run.select("fpga-zcu102-est", 1.0)


def test_export_from_the_api(small_run: Path, tmp_path: Path) -> None:
    run = hwnas.load_run(small_run)
    trial = int(run.fronts["edgetpu-est"]["trial"].iloc[0])
    result = run.export([trial], out=tmp_path / "export", settings=FAST)
    assert [m.name for m in result.models] == [f"trial_{trial:04d}"]
    assert (tmp_path / "export" / RunDir.MANIFEST).is_file()
    assert (tmp_path / "export" / f"trial_{trial:04d}.onnx").is_file()


def test_not_a_run_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not an hwnas run directory"):
        hwnas.load_run(tmp_path)
