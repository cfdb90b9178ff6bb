"""End-to-end tests of ``hwnas run`` / ``hwnas search`` on tiny budgets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import torch
from fuzz_support import run_cli
from hwnas.supernet.train import load_checkpoint

from hwnas.cli import main

DEVICES = "cpu-ort-1t,edgetpu-est"
# a model's failure line when one of its quantized files (QDQ, INT4, uint8-input QDQ) failed
QUANTIZED_FAILURE = re.compile(r"^trial_\d{4}: failed: (qdq|int4|uint8-qdq)[^/]*/trial_\d{4}\.onnx: "
                               r"(quantized parity failed|the ONNX model's test accuracy)")


def hwnas(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "hwnas.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def checkpoint(digits_checkpoint) -> Path:
    """The session's one-epoch digits supernet (``hwnas train --epochs 1``, tests/conftest.py):
    the searches here only read it."""
    return digits_checkpoint


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A full ``hwnas run`` (training, search, export) with a tiny budget, in a subprocess."""
    out = tmp_path_factory.mktemp("runs")
    # nearest rounding: the export's default AdaRound would add about a minute of CPU time for
    # the W4/W6 models here (benchmarks/quant_peers.md, Session 37); test_export_run.py and
    # test_quant_adaround.py test the default
    proc = hwnas("run", "--epochs", "1", "--trials", "8", "--devices", DEVICES, "--out", str(out),
                 "--name", "tiny", "--rounding", "nearest", "--quiet")
    # exit 1 = some exported file failed its verification: allowed only for the quantized files
    # of this barely trained supernet (near-tied logits: int8 flips them, and which ones flip
    # differs between CPUs), and then reported one line per model naming the quantized file and
    # which of its checks failed (parity with the fake-quant model, or test accuracy against it)
    assert proc.returncode in (0, 1), proc.stderr
    if proc.returncode == 1:
        lines = proc.stderr.strip().splitlines()
        assert lines and all(QUANTIZED_FAILURE.match(line) for line in lines), proc.stderr
    assert "Pareto front on edgetpu-est" in proc.stdout
    assert "Pareto-optimal models to" in proc.stdout
    assert re.search(r"wall time: \d+ s \(search \d+ s, export \d+ s\)", proc.stdout), proc.stdout
    # each stage's seconds, so that a run on another machine says where its time went
    assert re.search(r"search stages \(s\): data, run directory and study start \(sensitivity "
                     r"seeds included\) [\d.]+, supernet [\d.]+, trials [\d.]+, test scores and "
                     r"outputs [\d.]+", proc.stdout), proc.stdout
    assert re.search(r"export stages \(s\): prepare [\d.]+, (workers ready after [\d.]+, )?"
                     r"models [\d.]+ \(timings alone [\d.]+(, waited for [\d.]+)?\), "
                     r"finish [\d.]+", proc.stdout)
    assert re.search(r"model stages summed over \d+ model\(s\) \(s\): .*fp32 [\d.]+", proc.stdout)
    assert "no supernet checkpoint for space mbv3-tiny" in proc.stdout  # said before training
    assert "training one first, 1 epoch on cpu" in proc.stdout
    return out / "tiny"


def test_search_stages_add_up_to_the_search() -> None:
    from types import SimpleNamespace

    from hwnas.cli import search_stages

    result = SimpleNamespace(seconds=60.0, timings={"supernet_s": 2.0, "search_s": 39.0,
                                                    "outputs_s": 4.0})
    assert search_stages(result) == ("search stages (s): data, run directory and study start "
                                     "(sensitivity seeds included) 15.0, supernet 2.0, trials "
                                     "39.0, test scores and outputs 4.0")


def test_run_exports_every_front_model_verified(tiny_run: Path):
    manifest = json.loads((tiny_run / "export" / "manifest.json").read_text())
    fronts = pd.concat([pd.read_csv(tiny_run / f"pareto_{d}.csv", keep_default_na=False)
                        for d in DEVICES.split(",")])
    assert {m["name"] for m in manifest["models"]} == {f"trial_{t:04d}" for t in set(fronts["trial"])}
    for m in manifest["models"]:
        fp32 = [f for f in m["files"] if f["precision"] == "fp32"]
        assert fp32 and all(f["status"] == "ok" and f["max_abs_diff"] <= 1e-4 for f in fp32)
        for f in m["files"]:
            assert (tiny_run / "export" / f["path"]).is_file() == (f["status"] == "ok")


def non_dominated(frame: pd.DataFrame, columns: list[str], maximize: set[str]) -> set[int]:
    """Trials not dominated in ``columns`` (first of repeated (arch, policy) only), brute force."""
    frame = frame[~frame.duplicated(subset=["arch", "policy"])]
    v = np.stack([-frame[c] if c in maximize else frame[c] for c in columns], axis=1)
    keep = set()
    for i in range(len(v)):
        if not np.any(np.all(v <= v[i], axis=1) & np.any(v < v[i], axis=1)):
            keep.add(int(frame["trial"].iloc[i]))
    return keep


def test_run_writes_everything(tiny_run: Path):
    for name in ("config.json", "supernet.pt", "study.db", "trials.csv", "trials.parquet",
                 "pareto_cpu-ort-1t.csv", "pareto_edgetpu-est.csv", "hypervolume.csv",
                 "fronts.png", "devices.png", "hypervolume.png", "train_history.json"):
        assert (tiny_run / name).is_file(), name
    trials = pd.read_csv(tiny_run / "trials.csv", keep_default_na=False)
    pd.testing.assert_frame_equal(pd.read_parquet(tiny_run / "trials.parquet")[["trial", "arch"]],
                                  trials[["trial", "arch"]])
    assert len(trials) == 8
    for col in ("arch", "accuracy", "size_bytes", "bops", "latency_ms:cpu-ort-1t",
                "latency_ms:edgetpu-est", "pareto", "feasible"):
        assert (trials[col] != "").all(), col
    assert trials["accuracy"].between(0, 100).all()
    assert (trials["latency_ms:edgetpu-est"] > 0).all()
    # the seeds come first: largest/smallest in float and int8, then the Hessian policies
    assert {"largest-float", "largest-int8", "smallest-float", "smallest-int8"} <= set(trials["seed"])
    assert {"param:bits:stem_conv", "param:s0_depth"} <= set(trials.columns)  # Optuna's params
    policies = [json.loads(p) for p in trials["policy"] if p]
    assert policies and all(isinstance(p, dict) for p in policies)
    config = json.loads((tiny_run / "config.json").read_text())
    assert config["devices"] == ["cpu-ort-1t", "edgetpu-est"] and config["bits"] is True
    assert (tiny_run / "fronts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the record of what the run wrote (hwnas.core.written), and no temporary file
    assert [p.name for p in tiny_run.glob(".*")] == [".hwnas-written.json"], "temporary files"


@pytest.mark.parametrize("device", ["cpu-ort-1t", "edgetpu-est"])
def test_each_device_front_is_its_non_dominated_set(tiny_run: Path, device: str):
    trials = pd.read_csv(tiny_run / "trials.csv", keep_default_na=False)
    front = pd.read_csv(tiny_run / f"pareto_{device}.csv", keep_default_na=False)
    expected = non_dominated(trials, ["accuracy", f"latency_ms:{device}", "size_bytes"],
                             {"accuracy"})
    assert set(front["trial"]) == expected
    assert front["test_accuracy"].between(0, 100).all()
    assert list(front[f"latency_ms:{device}"]) == sorted(front[f"latency_ms:{device}"])


def test_hypervolume_never_decreases(tiny_run: Path):
    hv = pd.read_csv(tiny_run / "hypervolume.csv")
    for _, h in hv.groupby("device"):
        assert (np.diff(h["hypervolume"]) >= -1e-12).all()
        assert h["hypervolume"].iloc[-1] > 0


def test_rerun_continues_and_overwrite_replaces(tmp_path: Path, checkpoint: Path):
    args = ["search", "--supernet", str(checkpoint), "--devices", "edgetpu-est",
            "--objectives", "accuracy,latency:edgetpu-est", "--out", str(tmp_path), "--name", "r",
            "--quiet"]
    assert main([*args, "--trials", "6"]) == 0
    first = pd.read_csv(tmp_path / "r" / "trials.csv")
    assert main([*args, "--trials", "8"]) == 0  # the same command with a larger budget
    second = pd.read_csv(tmp_path / "r" / "trials.csv")
    assert sorted(second["trial"]) == list(range(8))
    pd.testing.assert_frame_equal(first[["trial", "arch", "accuracy"]],
                                  second[["trial", "arch", "accuracy"]].head(6))
    assert main([*args, "--trials", "3", "--overwrite"]) == 0
    assert len(pd.read_csv(tmp_path / "r" / "trials.csv")) == 3
    # the run's copy of the supernet keeps the training configuration (and so its augmentation)
    recorded = [load_checkpoint(p)[2]["train_config"] for p in (checkpoint, tmp_path / "r" / "supernet.pt")]
    assert recorded[0] is not None and recorded[0] == recorded[1]


def test_overwrite_never_deletes_a_directory_hwnas_did_not_write(tmp_path: Path,
                                                                 checkpoint: Path, capsys):
    """Data loss, issue 26.2: a project folder with a config.json of its own is refused, with
    or without --overwrite, and left as it was."""
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "config.json").write_text('{"lr": 0.1}')
    (proj / "main.py").write_text("print(1)")
    (proj / "src" / "a.py").write_text("")
    before = sorted(p.relative_to(proj) for p in proj.rglob("*"))
    args = ["search", "--supernet", str(checkpoint), "--devices", "edgetpu-est", "--trials", "2",
            "--out", str(tmp_path), "--name", "proj", "--quiet"]
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        assert main([*args, *extra]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not an hwnas run directory" in err[0], err
        assert "None there" not in err[0]
    assert sorted(p.relative_to(proj) for p in proj.rglob("*")) == before
    assert (proj / "main.py").read_text() == "print(1)"


def test_a_trial_interrupted_by_a_kill_is_run_again(tmp_path: Path, checkpoint: Path):
    args = ["search", "--supernet", str(checkpoint), "--devices", "edgetpu-est", "--no-bits",
            "--objectives", "accuracy,latency:edgetpu-est", "--out", str(tmp_path), "--name", "k",
            "--quiet"]
    assert main([*args, "--trials", "5"]) == 0
    # a process killed mid-trial leaves a RUNNING trial in the storage
    url = f"sqlite:///{tmp_path / 'k' / 'study.db'}"
    study = optuna.load_study(study_name="k", storage=url)
    from hwnas.supernet.spaces import get_space

    space = get_space("mbv3-tiny")
    killed = study.ask()
    arch = space.suggest(killed)
    assert main([*args, "--trials", "7"]) == 0
    study = optuna.load_study(study_name="k", storage=url)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 7
    assert states.count(optuna.trial.TrialState.RUNNING) == 0
    done = pd.read_csv(tmp_path / "k" / "trials.csv")
    assert space.to_string(arch) in set(done["arch"])  # its parameters were evaluated after all


def test_accuracy_predictor_mode_scores_the_fronts_on_the_supernet(tmp_path: Path, checkpoint: Path):
    args = ["search", "--supernet", str(checkpoint), "--devices", "edgetpu-est", "--trials", "10",
            "--objectives", "accuracy,latency:edgetpu-est", "--accuracy", "predictor",
            "--predictor-samples", "8", "--out", str(tmp_path), "--name", "p", "--quiet"]
    assert main(args) == 0
    saved = json.loads((tmp_path / "p" / "accuracy_predictor.json").read_text())
    assert len(saved["samples"]) == 8 and -1 <= saved["report"]["spearman"] <= 1
    front = pd.read_csv(tmp_path / "p" / "pareto_edgetpu-est.csv")
    assert front["accuracy_supernet"].between(0, 100).all()
    proc = hwnas(*[a if a != "10" else "12" for a in args])  # same settings, larger budget
    assert proc.returncode == 0, proc.stderr
    assert len(pd.read_csv(tmp_path / "p" / "trials.csv")) == 12


def test_constraints_filter_the_fronts(tmp_path: Path, checkpoint: Path):
    args = ["search", "--supernet", str(checkpoint), "--devices", "edgetpu-est", "--trials", "8",
            "--objectives", "accuracy,size", "--constraint", "latency:edgetpu-est<=0.6ms",
            "--out", str(tmp_path), "--name", "c", "--quiet"]
    assert main(args) == 0
    trials = pd.read_csv(tmp_path / "c" / "trials.csv", keep_default_na=False)
    assert trials["feasible"].tolist() == (trials["latency_ms:edgetpu-est"] <= 0.6).tolist()
    front = pd.read_csv(tmp_path / "c" / "pareto_edgetpu-est.csv")
    assert (front["latency_ms:edgetpu-est"] <= 0.6).all()


def test_an_unmeetable_constraint_is_reported_with_the_closest_trials(tmp_path: Path, checkpoint: Path):
    # accuracy needs an evaluation: only the trials can tell (cheap metrics the whole space
    # rules out are refused at once, see tests/test_fuzz_cli.py)
    proc = hwnas("search", "--supernet", str(checkpoint), "--devices", "edgetpu-est", "--no-bits",
                 "--objectives", "size", "--constraint", "accuracy>=99.9",
                 "--trials", "3", "--out", str(tmp_path), "--name", "u", "--quiet")
    assert proc.returncode == 2
    assert "no trial meets accuracy>=99.9 after 3 trials; closest: trial" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (tmp_path / "u" / "trials.csv").is_file()  # what was learnt is kept


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--dataset", "nope"], "unknown dataset"),
        (["run", "--space", "nope"], "unknown space"),
        (["run", "--trials", "0"], "positive integer"),
        (["run", "--epochs", "-3"], "positive integer"),
        (["run", "--dataset", "/does/not/exist"], "does not exist"),
        (["run", "--supernet", "/does/not/exist.pt"], "does not exist"),
        (["run", "--sampler", "annealing"], "invalid choice"),
        (["search", "--objectives", ""], "no objectives given"),
        (["search", "--objectives", "accuracy,size,accuracy"], "named twice"),
        (["search", "--objectives", "accuracy,speed"], "unknown objective 'speed'"),
        (["search", "--objectives", "accuracy,latency"], "names no device"),
        (["search", "--objectives", "accuracy,latency:toaster"], "unknown device 'toaster'"),
        (["search", "--devices", "pixel3"], "has no latency for space 'mbv3-tiny'"),
        (["search", "--constraint", "latency:edgetpu-est<5"], "is not of the form"),
        (["search", "--constraint", "size<=3parsecs"], "unknown unit"),
        (["search", "--workers", "3"], "SQLite cannot be shared"),
        (["search", "--storage", "study.db"], "not a database URL"),
        (["search", "--bit-choices", "4,5"], "bit choices"),
        (["train", "--out", "model.txt"], "ending in .pt"),
        (["train", "--out", "m.pt", "--augment", "trivial_crop_flip_cutout"], "needs RGB images"),
        (["search", "--augment", "trivial_crop_flip_cutout"], "needs RGB images"),
        (["search", "--augment", "mixup"], "invalid choice: 'mixup'"),
        ([], "required"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args, message, monkeypatch,
                                                 capsys):
    """In this process (one interpreter start-up instead of one per case); the subprocess path
    a user takes is covered by the checkpoint and constraint refusals below."""
    monkeypatch.chdir(tmp_path)
    extra = ["--out", str(tmp_path / "o")] if args and args[0] in ("run", "search") else []
    code, err = run_cli([*args, *extra], capsys)
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_other_settings_are_refused_on_the_same_run(tmp_path: Path, checkpoint: Path):
    args = ["search", "--supernet", str(checkpoint), "--devices", "edgetpu-est", "--no-bits",
            "--objectives", "accuracy,latency:edgetpu-est", "--out", str(tmp_path), "--name", "s",
            "--quiet", "--trials", "2"]
    assert main(args) == 0
    proc = hwnas(*args, "--seed", "5")
    assert proc.returncode == 2 and "other settings" in proc.stderr and "seed" in proc.stderr


def test_augment_is_recorded_and_a_checkpoint_trained_otherwise_is_refused(tmp_path: Path,
                                                                          checkpoint: Path):
    path = tmp_path / "none.pt"
    assert main(["train", "--epochs", "1", "--augment", "none", "--limit-train", "128", "--out",
                 str(path), "--quiet"]) == 0
    assert torch.load(path, weights_only=False)["train_config"]["augment"] == "none"
    # the shared fixture was trained with the digits default (shifts)
    proc = hwnas("search", "--supernet", str(checkpoint), "--augment", "none", "--trials", "2",
                 "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "was trained with shift; pass --augment shift" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_malformed_checkpoint_is_rejected(tmp_path: Path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    proc = hwnas("run", "--supernet", str(bad), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "cannot read supernet checkpoint" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_checkpoint_for_other_data_is_rejected(tmp_path: Path):
    from hwnas.supernet.spaces import get_space
    from hwnas.supernet.train import save_checkpoint

    space = get_space("mbv3-tiny", in_channels=3, image_size=8, num_classes=10)
    path = save_checkpoint(tmp_path / "rgb.pt", space.build_supernet(), space, dataset="x")
    proc = hwnas("run", "--supernet", str(path), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "was built for input (3, 8, 8)" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_spaces_lists_the_default():
    proc = hwnas("spaces")
    assert proc.returncode == 0 and "mbv3-tiny" in proc.stdout


# -- several workers on PostgreSQL (CI starts a server: .ci/postgres.sh) ---------------------

POSTGRES = os.environ.get("HWNAS_TEST_POSTGRES_URL")


@pytest.mark.skipif(not POSTGRES, reason="HWNAS_TEST_POSTGRES_URL is not set (CI starts a "
                                         "PostgreSQL server with .ci/postgres.sh)")
def test_three_workers_share_one_postgres_study(tmp_path: Path, checkpoint: Path):
    name = f"w-{uuid.uuid4().hex[:8]}"
    proc = hwnas("search", "--supernet", str(checkpoint), "--storage", POSTGRES, "--workers", "3",
                 "--study-name", name, "--trials", "12", "--devices", "edgetpu-est",
                 "--objectives", "accuracy,latency:edgetpu-est,size", "--out", str(tmp_path),
                 "--name", "w", "--quiet")
    assert proc.returncode == 0, proc.stderr
    study = optuna.load_study(study_name=name, storage=POSTGRES)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 12
    assert len({t.number for t in complete}) == 12
    trials = pd.read_csv(tmp_path / "w" / "trials.csv", keep_default_na=False)
    assert sorted(trials["trial"]) == sorted(t.number for t in complete)
    front = pd.read_csv(tmp_path / "w" / "pareto_edgetpu-est.csv", keep_default_na=False)
    assert set(front["trial"]) == non_dominated(
        trials, ["accuracy", "latency_ms:edgetpu-est", "size_bytes"], {"accuracy"})


def test_calib_batches_flag_reaches_the_search_config():
    from hwnas.cli import build_parser, config_from_args

    parser = build_parser()
    assert config_from_args(parser.parse_args(["search"])).calib_batches == 10
    assert config_from_args(parser.parse_args(["search", "--calib-batches", "40"])).calib_batches == 40
    with pytest.raises(SystemExit):
        parser.parse_args(["search", "--calib-batches", "0"])
