"""benchmarks/results/supernet_cifar10/h200_vit.sh, the chunked vit CIFAR-10 run on one H200:
its flow (start, resume, a lost run started afresh), the data joined from parts, and what it
leaves in $OUT, with a stand-in for ``hwnas`` that records its arguments and writes the files a
run directory holds (a real CPU run of the script is in benchmarks/supernet_cifar10.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks/results/supernet_cifar10/h200_vit.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None,
                                reason="needs bash and tar")

# A stand-in for `hwnas train`: one line per call in calls.log; --resume finishes the run.
FAKE = """#!/usr/bin/env python3
import json, sys
from pathlib import Path
argv = sys.argv[1:]
out = Path(argv[argv.index("--out") + 1])
with open(out.parent / "calls.log", "a") as fh:
    fh.write(" ".join(argv) + "\\n")
out.mkdir(parents=True, exist_ok=True)
if "--bench-steps" in argv:  # sandwich steps at a third of the full-network rate
    rows = ([{"stage": "full", "images_per_s": 9000.0}, {"stage": "shrink", "images_per_s": 3000.0}]
            if "--standalone" not in argv else [{"stage": "standalone", "images_per_s": 9000.0}])
    (out / "bench.json").write_text(json.dumps({"stages": rows}))
    sys.exit(0)
done = "--resume" in argv
(out / "run.json").write_text("{}")
(out / "checkpoint.pt").write_bytes(b"resumable")
(out / "train_log.json").write_text(json.dumps({
    "total_steps": 20, "epochs": 2, "step": 20 if done else 10, "completed": done,
    "train_seconds": 5.0, "images_per_s": 100.0,
    "history": [{"stage": "full", "seconds": 1.0}, {"stage": "full", "seconds": 3.5}]}))
if done:
    name = "model.pt" if "--standalone" in argv else "supernet.pt"
    (out / name).write_bytes(b"weights")
"""


def _run(tmp_path: Path, phase, **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "fake_hwnas"
    fake.write_text(FAKE.replace("python3", sys.executable, 1))
    fake.chmod(0o755)
    out = tmp_path / f"out{phase}"
    out.mkdir()
    full = {**os.environ, "HWNAS": str(fake), "VIT_DATA": str(tmp_path / "c10.npz"),
            "VIT_RUNS": str(tmp_path / "runs"), "OUT": str(out), "SNAPSHOT": "0",
            "RUN": "t", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    minutes = full.pop("MINUTES", "2")
    return subprocess.run(["bash", str(SCRIPT), str(phase), minutes], env=full, check=False,
                          capture_output=True, text=True, timeout=60)


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "runs" / "calls.log").read_text().splitlines()


def test_start_resume_and_what_comes_back(tmp_path) -> None:
    (tmp_path / "c10.npz.part0").write_bytes(b"abc")  # carried by the probe's command
    probe = _run(tmp_path, "probe", VIT_PROBE_DATA=str(tmp_path / "c10.npz.part0"), JOBS="sn")
    assert probe.returncode == 0, probe.stderr
    (tmp_path / "c10.npz.part0").unlink()  # the next command carries only the other part
    (tmp_path / "c10.npz.part1").write_bytes(b"def")
    first = _run(tmp_path, 1)
    assert first.returncode == 0, first.stderr
    joined = tmp_path / "runs" / "data" / "c10.npz"
    assert joined.read_bytes() == b"abcdef"  # the parts, joined in order where runs are kept
    assert not (tmp_path / "c10.npz").exists()
    (tmp_path / "runs" / "calls.log").write_text(  # only the training phase's calls below
        "\n".join(c for c in _calls(tmp_path) if "--bench-steps" not in c) + "\n")
    calls = _calls(tmp_path)
    assert len(calls) == 4 and all("--overwrite" in c and "--resume" not in c for c in calls)
    assert all(f"--dataset {joined} " in c for c in calls)
    sn = next(c for c in calls if "--out " + str(tmp_path / "runs/sn") in c)
    assert "--schedule deps --full-fraction 0.4 --half-weights" in sn and "--compile" not in sn
    epochs = (tmp_path / "runs" / "epochs.txt").read_text().strip()  # the probe's choice
    assert f"--space vit --epochs {epochs} --batch-size 512" in sn
    for job in ("largest", "smallest", "random1"):
        assert sum(f"--standalone {job} --compile" in c for c in calls) == 1
    minutes = [float(c.split("--max-minutes ")[1].split()[0]) for c in calls]
    assert all(0.9 < m <= 1.4 for m in minutes)  # 2 minutes less the margins
    assert "epoch 1/2 running" in first.stdout and "full 2.50 s/epoch" in first.stdout
    out1 = sorted(p.name for p in (tmp_path / "out1").iterdir())
    assert out1 == ["vit_t_p1.tgz"]  # nothing finished; SNAPSHOT=0 skips the float16 copy

    shutil.rmtree(tmp_path / "runs" / "sa-smallest")  # as if the machine had been replaced
    second = _run(tmp_path, 2, LAST="1")
    assert second.returncode == 0, second.stderr
    calls = _calls(tmp_path)[4:]
    assert sum("--resume" in c for c in calls) == 3
    lost = next(c for c in calls if "sa-smallest" in c)
    assert "--overwrite" in lost and "--eval --eval-unfinished" in lost
    assert "sa-smallest holds no run" in (tmp_path / "runs" / "phases.log").read_text()
    out2 = tmp_path / "out2"
    assert sorted(p.name for p in out2.iterdir()) == [
        "sa-largest.pt", "sa-random1.pt", "vit_cifar10.pt", "vit_t_p2.tgz"]
    with tarfile.open(out2 / "vit_t_p2.tgz") as tar:
        names = tar.getnames()
    assert "runs/sn/train_log.json" in names and "runs/phases.log" in names
    assert not any(n.endswith((".pt", ".npz")) or ".part" in n for n in names)


def test_missing_data_stops_before_any_job(tmp_path) -> None:
    result = _run(tmp_path, 1)
    assert result.returncode == 2 and "no data" in result.stdout
    assert not (tmp_path / "runs" / "calls.log").exists()


def test_settings_reach_every_job(tmp_path) -> None:
    (tmp_path / "c10.npz").write_bytes(b"x")
    result = _run(tmp_path, 1, EPOCHS="7", BATCH="64", LR="0.002", JOBS="sn smallest",
                  COMPILE="", DEVICE="cpu", SMOKE="--limit-train 64")
    assert result.returncode == 0, result.stderr
    calls = _calls(tmp_path)
    assert len(calls) == 2
    for c in calls:
        assert "--device cpu" in c and "--epochs 7 --batch-size 64 --lr 0.002" in c
        assert c.count("--limit-train 64") == 1 and "--compile" not in c
    assert "jobs [sn smallest]" in (tmp_path / "runs" / "phases.log").read_text()


def test_the_probe_sizes_the_epochs_of_phase_one(tmp_path) -> None:
    """Four jobs at 45,000 images: 0.4 x 5 + 0.6 x 15 + 3 x 5 = 26 s per epoch; 3 commands of
    9.3 minutes less 1.2 each, x 0.9: 1,312 s -> 50.5 epochs, 50 in tens; phase 1 takes them."""
    (tmp_path / "probe.npz").write_bytes(b"x")
    probe = _run(tmp_path, "probe", VIT_PROBE_DATA=str(tmp_path / "probe.npz"), MINUTES="9.3")
    assert probe.returncode == 0, probe.stderr
    calls = _calls(tmp_path)
    assert len(calls) == 4 and all("--bench-steps 30" in c for c in calls)
    assert not any("--compile" in c for c in calls)  # eager: the slower, safe side
    assert "EPOCHS=50" in probe.stdout and "probe sn: full 9000 images/s" in probe.stdout
    assert (tmp_path / "runs" / "epochs.txt").read_text().strip() == "50"
    assert [p.name for p in (tmp_path / "outprobe").iterdir()] == ["vit_t_probe.tgz"]
    (tmp_path / "c10.npz").write_bytes(b"x")
    first = _run(tmp_path, 1)
    assert first.returncode == 0, first.stderr
    assert all("--epochs 50 " in c for c in _calls(tmp_path)[4:])


def test_snb_is_the_supernet_with_extra_flags_in_its_own_directory(tmp_path) -> None:
    (tmp_path / "c10.npz").write_bytes(b"x")
    result = _run(tmp_path, 1, EPOCHS="7", JOBS="sn snb", DEVICE="cpu",
                  SNB_FLAGS="--mixup 0.8 --cutmix 1.0")
    assert result.returncode == 0, result.stderr
    calls = _calls(tmp_path)
    assert len(calls) == 2
    plain = next(c for c in calls if "/sn " in c + " ")
    b = next(c for c in calls if "/snb" in c)
    assert "--schedule deps" in plain and "--schedule deps" in b
    assert "--mixup" not in plain and "--mixup 0.8 --cutmix 1.0" in b
    missing = _run(tmp_path, 2, EPOCHS="7", JOBS="snb", DEVICE="cpu")
    assert missing.returncode == 2 and "job snb needs SNB_FLAGS" in missing.stdout


def test_recipe_trials_are_standalone_jobs_with_their_own_flags(tmp_path) -> None:
    (tmp_path / "c10.npz").write_bytes(b"x")
    result = _run(tmp_path, 1, EPOCHS="7", JOBS="x0 x1", DEVICE="cpu", XARCH="smallest",
                  X1_FLAGS="--batch-size 128 --weight-decay 0.2")
    assert result.returncode == 0, result.stderr
    calls = _calls(tmp_path)
    assert len(calls) == 2
    x0 = next(c for c in calls if "/sa-x0" in c)
    x1 = next(c for c in calls if "/sa-x1" in c)
    assert "--standalone smallest" in x0 and "--standalone smallest" in x1
    assert "--weight-decay" not in x0
    # the trial's flags come after the common ones, so they win
    assert x1.index("--batch-size 128") > x1.index("--batch-size 512")
    assert "--weight-decay 0.2" in x1
    assert "sa-x0: epoch" in result.stdout and "sa-x1: epoch" in result.stdout
