"""Fuzz suite, command-line flags: every bad flag of search, train and latency ends in one
error line, exit status 2, no traceback, nothing written (tests/fuzz_support.py)."""

from __future__ import annotations

import pytest
import torch
from fuzz_support import assert_clean_refusal

SEARCH = ["search", "--devices", "edgetpu-est", "--no-bits", "--objectives", "accuracy,size",
          "--trials", "2", "--quiet", "--out", "runs"]

CASES = [
    (["--seed", "-1"], "expected a seed from 0"),
    (["--seed", "4294967296"], "expected a seed from 0"),
    (["--seed", "x"], "expected an integer seed"),
    (["--device", "cpuu"], "is not a torch device"),
    (["--device", "cuda:0"], "CUDA is not available"),
    (["--out", "a_file"], "is a file"),
    (["--out", "/proc/x"], "cannot write in /proc"),
    (["--out", "a_file/sub"], "is a file, not a directory"),
    (["--epochs", "1" + "0" * 30], "up to 100000"),
    (["--epochs", "1e30"], "expected a positive integer"),
    (["--epochs", "0"], "expected a positive integer"),
    (["--trials", "-1"], "expected a positive integer"),
    (["--calib-batches", "0"], "expected a positive integer"),
    (["--bit-choices", "4"], "--no-bits searches float models only"),
    (["--constraint", "size<=1KiB"], "rules out every candidate"),
    (["--constraint", "latency:edgetpu-est<=1us"], "rules out every candidate"),
    (["--constraint", "flops>=1G"], "rules out every candidate"),
    (["--constraint", "latency:edgetpu-est<=-1ms"], "cannot be met"),
    (["--constraint", "accuracy>=200"], "cannot be met"),
    (["--constraint", "size<=100KiB", "--constraint", "size>=200KiB"], "cannot both be met"),
    (["--constraint", "size<=200KiB", "--constraint", "size <= 200KiB"], "given twice"),
    (["--constraint", "size<=1e999"], "not a finite number"),
    (["--constraint", "size<=3parsecs"], "unknown unit"),
    (["--constraint", "speed<=3"], "unknown constraint metric"),
    (["--objectives", ""], "no objectives given"),
    (["--objectives", "accuracy,latency:toaster"], "unknown device 'toaster'"),
    (["--name", "../x"], "must be a plain directory name"),
    (["--name", ".hidden"], "must be a plain directory name"),
    (["--sampler", "annealing"], "invalid choice"),
    (["--space", "nope"], "unknown space"),
    (["--accuracy", "predictor", "--predictor-samples", "3"], "at least 8"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("mine\n")
    return tmp_path


@pytest.mark.parametrize("extra, message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_search_flags(extra, message, workdir, fuzz_checkpoint, capsys):
    if "cuda" in " ".join(extra) and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    args = [*SEARCH, "--supernet", str(fuzz_checkpoint), *extra]
    assert_clean_refusal(args, message, capsys, workdir, fuzz_checkpoint.parent)


TRAIN_CASES = [
    (["--out", "/proc/x.pt"], "cannot write in /proc"),
    (["--out", "model.txt"], "ending in .pt"),
    (["--out", "a_file"], "already exists"),
    (["--out", ".", "--resume"], "holds no run (no run.json)"),  # a directory: a run directory
    (["--out", "a_file/m.pt"], "is a file, not a directory"),
    (["--out", "m.pt", "--device", "cpuu"], "is not a torch device"),
    (["--out", "m.pt", "--seed", "-1"], "expected a seed from 0"),
    (["--out", "m.pt", "--epochs", "9" * 31], "up to 100000"),
    (["--out", "m.pt", "--dataset", "/does/not/exist"], "does not exist"),
]


@pytest.mark.parametrize("extra, message", TRAIN_CASES, ids=[" ".join(c[0]) for c in TRAIN_CASES])
def test_bad_train_flags(extra, message, workdir, capsys):
    assert_clean_refusal(["train", "--quiet", *extra], message, capsys, workdir)


def test_a_case_that_is_not_refused_would_fail_the_suite(workdir, fuzz_checkpoint, capsys):
    """The checker itself: a valid search does not pass as a clean refusal."""
    with pytest.raises(AssertionError):
        assert_clean_refusal([*SEARCH, "--supernet", str(fuzz_checkpoint)], "", capsys, workdir)
