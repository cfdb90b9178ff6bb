"""Fuzz suite, what is on disk (issue 50): every writer replaces only what it wrote (a user's
file, folder or link in its directory makes --overwrite refuse, naming it); read-only
directories and full disks end in one line with the earlier output intact; two writers of one
run; bounds that used to run until killed. Each case: exit status 2 (or hwnas.UserError), one
line, no traceback, the file tree unchanged (tests/fuzz_support.py).

The full-disk cases mount a small tmpfs and the read-only ones a read-only bind mount as root
(root ignores permissions), ``chmod -w`` otherwise; each is skipped, saying why, where the
machine allows neither."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fuzz_support import (
    assert_clean_refusal,
    fill,
    read_only,
    run_cli,
    small_disk,
    snapshot,
)

from hwnas.core.written import RECORD, record_tree


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(tmp_path / "devices"))
    return tmp_path


def _copy_run(small_run: Path, where: Path) -> Path:
    """A copy of the session's finished run (its record comes along) at ``where/small``."""
    run = where / "small"
    shutil.copytree(small_run, run, symlinks=True)
    return run


def _search(run: Path, *extra: str, config: Path | None = None) -> list[str]:
    """``hwnas search`` with a run's settings (its config.json as --config; default ``run``'s
    own) into ``run``."""
    return ["search", "--config", str(config or run / "config.json"), "--out", str(run.parent),
            "--name", run.name, "--quiet", *extra]


# -- data loss: one rule for every writer -------------------------------------------------------

def test_search_overwrite_keeps_a_users_file_and_link_in_a_run(workdir, small_run, capsys):
    """Issue 50: --overwrite of a real run deleted notes.md and the symlink data_link."""
    run = _copy_run(small_run, workdir)
    (run / "notes.md").write_text("my notes")
    (workdir / "target").mkdir()
    (workdir / "target" / "data.txt").write_text("data")
    (run / "data_link").symlink_to(workdir / "target")
    assert_clean_refusal(_search(run, "--overwrite"), "holds data_link@, notes.md, which hwnas "
                         "did not write", capsys, workdir)


def test_search_never_replaces_a_project_with_a_copied_config(workdir, small_run, capsys):
    """Issue 50: a project folder holding a copy of a run's config.json lost README.md, main.py
    and src/lib.py to --overwrite: a config.json is not a run."""
    project = workdir / "P" / "proj"
    (project / "src").mkdir(parents=True)
    shutil.copy(small_run / "config.json", project / "config.json")
    for name in ("README.md", "main.py", "src/lib.py"):
        (project / name).write_text("mine")
    for extra in (["--overwrite"], []):
        assert_clean_refusal(_search(project, *extra), "is not an hwnas run directory", capsys,
                             workdir)


def test_export_keeps_a_users_folder_named_like_a_model(workdir, small_run, capsys):
    out = workdir / "exported"
    out.mkdir()
    (out / "trial_0000.onnx").write_bytes(b"onnx")
    (out / "manifest.json").write_text("{}")
    record_tree(out, "export")  # an earlier export, as it records itself
    (out / "trial_0001.onnx" / "chapter1").mkdir(parents=True)
    (out / "trial_0001.onnx" / "chapter1" / "draft.txt").write_text("mine")
    assert_clean_refusal(["export", str(small_run), "--out", str(out), "--quiet"],
                         "holds trial_0001.onnx/, which hwnas did not write", capsys, workdir,
                         small_run)


def test_finetune_overwrite_keeps_a_users_file(workdir, small_run, capsys):
    run = _copy_run(small_run, workdir)
    out = run / "finetune" / "trial_0000"
    out.mkdir(parents=True)
    (out / "model.pt").write_bytes(b"pt")
    record_tree(out, "finetune")
    (out / "notes.md").write_text("mine")
    assert_clean_refusal(["finetune", str(run), "--trial", "0", "--overwrite", "--quiet"],
                         "holds notes.md, which hwnas did not write", capsys, workdir)


def test_adapt_overwrite_keeps_a_users_file_in_a_profile(workdir, capsys):
    profile = workdir / "devices" / "board"
    profile.mkdir(parents=True)
    (profile / "profile.json").write_text("{}")
    record_tree(profile, "latency adapt")
    (profile / "notes.txt").write_text("mine")
    (workdir / "m.csv").write_text("arch,latency_ms\n")
    assert_clean_refusal(["latency", "adapt", "--device", "board", "--space", "nb201",
                          "--measurements", "m.csv", "--overwrite"],
                         "holds notes.txt, which hwnas did not write", capsys, workdir)


def test_reference_overwrite_keeps_a_users_folder_named_like_a_model(workdir, capsys):
    refs = workdir / "refs"
    refs.mkdir()
    (refs / "ref_01.onnx").write_bytes(b"onnx")
    (refs / "archs.csv").write_text("order,arch,file\n")
    record_tree(refs, "latency reference")
    (refs / "ref_99.onnx" / "chapter1").mkdir(parents=True)
    (refs / "ref_99.onnx" / "thesis.txt").write_text("years of work")
    assert_clean_refusal(["latency", "reference", "--space", "nb201", "--n", "2", "--export",
                          str(refs), "--overwrite"], "holds ref_99.onnx/", capsys, workdir)


def test_train_overwrite_keeps_a_users_file_and_never_fills_a_users_folder(workdir, capsys):
    out = workdir / "trained"
    out.mkdir()
    (out / "run.json").write_text("{}")
    record_tree(out, "train")
    (out / "notes.md").write_text("mine")
    assert_clean_refusal(["train", "--out", str(out), "--overwrite", "--quiet"],
                         "holds notes.md, which hwnas did not write", capsys, workdir)
    mine = workdir / "thesis"  # a user's folder given as a run directory: never written into
    mine.mkdir()
    (mine / "eval.json").write_text("my results")
    assert_clean_refusal(["train", "--out", str(mine), "--quiet"],
                         "is not a training run directory", capsys, workdir)


def test_one_writers_output_is_not_anothers(workdir, small_run, capsys):
    """A reference export given as a run's directory: all hwnas's files, but not a run."""
    refs = workdir / "runs" / "refs"
    refs.mkdir(parents=True)
    (refs / "ref_01.onnx").write_bytes(b"onnx")
    record_tree(refs, "latency reference")
    assert_clean_refusal(_search(refs, "--overwrite", config=small_run / "config.json"),
                         "is not an hwnas run directory", capsys, workdir)


# -- wrong results ------------------------------------------------------------------------------

def test_data_seed_in_a_config_file_is_checked_like_the_flag(workdir, small_run, capsys):
    (workdir / "s.toml").write_text("data_seed = -1\n")
    assert_clean_refusal(["search", "--config", "s.toml", "--supernet",
                          str(small_run / "supernet.pt"), "--out", "runs", "--quiet"],
                         "data_seed must be an integer from 0", capsys, workdir)


@pytest.mark.parametrize("trials", ["1" + "0" * 29, "1000001"])
def test_a_huge_trial_budget_is_refused_at_once(trials, workdir, small_run, capsys):
    assert_clean_refusal(["search", "--supernet", str(small_run / "supernet.pt"), "--trials",
                          trials, "--out", "runs", "--quiet"], "up to 1000000", capsys, workdir)


def test_a_huge_reference_count_is_refused_at_once(workdir, capsys):
    assert_clean_refusal(["latency", "reference", "--space", "mbv3-tiny", "--n", "100000",
                          "--export", "refs"], "at most 1000", capsys, workdir)


def test_overwrite_does_not_score_on_the_replaced_runs_supernet(small_run):
    """Issue 50: --overwrite --epochs 3 on a 1-epoch run kept the old supernet untrained."""
    from hwnas.search.config import SearchConfig
    from hwnas.search.supernet_source import checkpoint_source
    from hwnas.supernet.data.sources import load_dataset

    data = load_dataset("digits")
    cfg = SearchConfig(space="mbv3-tiny", epochs=3)
    own = str(small_run / "supernet.pt")
    assert checkpoint_source(cfg, data, small_run, continuing=True) == own
    assert checkpoint_source(cfg, data, small_run, continuing=False) != own


# -- the run's files, read back -----------------------------------------------------------------

def test_a_symlinked_supernet_says_what_is_wrong(workdir, small_run, capsys, tmp_path):
    """Issue 50: supernet.pt linked to /etc/passwd said "list index out of range"."""
    run = _copy_run(small_run, workdir)
    (run / "supernet.pt").unlink()
    (workdir / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (run / "supernet.pt").symlink_to(workdir / "passwd")
    assert_clean_refusal(["export", str(run), "--quiet"], "is a symbolic link", capsys, workdir)
    assert_clean_refusal(_search(run), "is a symbolic link", capsys, workdir)
    (workdir / "plain.pt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    assert_clean_refusal(["search", "--supernet", "plain.pt", "--out", "runs", "--quiet"],
                         "not a checkpoint", capsys, workdir)


def test_two_writers_of_one_run(workdir, small_run, capsys):
    from hwnas.core.io import LockFile

    run = _copy_run(small_run, workdir)
    lock = LockFile(run.with_name(f".{run.name}.lock"))
    try:
        assert lock.held
        assert_clean_refusal(_search(run), "another hwnas process is writing", capsys, run)
    finally:
        lock.release()


# -- read-only directories and full disks -------------------------------------------------------

def test_continuing_a_run_in_a_read_only_directory(workdir, small_run, capsys):
    run = _copy_run(small_run, workdir)
    with read_only(run):
        assert_clean_refusal(_search(run, "--trials", "5"), "Read-only file system"
                             if _is_root() else "Permission denied", capsys, run)


def test_outputs_into_a_read_only_directory(workdir, small_run, capsys):
    box = workdir / "box"
    box.mkdir()
    with read_only(box):
        for args in (["export", str(small_run), "--out", str(box / "e"), "--quiet"],
                     ["finetune", str(small_run), "--trial", "0", "--out", str(box / "f"),
                      "--quiet"],
                     ["latency", "reference", "--space", "nb201", "--n", "2", "--export",
                      str(box / "r")],
                     ["train", "--out", str(box / "t"), "--quiet"]):
            assert_clean_refusal(args, "cannot write in", capsys, box, small_run)


def _is_root() -> bool:
    import os

    return os.geteuid() == 0


def test_a_full_disk_during_overwrite_keeps_the_previous_run(workdir, small_run, capsys):
    """The new run's supernet cannot be written: one line, the old run as it was, nothing
    staged left behind."""
    disk = workdir / "disk"
    size = sum(p.stat().st_size for p in small_run.rglob("*") if p.is_file()) // 1024
    with small_disk(disk, size + 256):
        run = _copy_run(small_run, disk)
        fill(disk, 64)
        before = snapshot(run)
        code, err = run_cli(_search(run, "--overwrite"), capsys)
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "No space left on device" in err and "nothing was written" in err, err
        assert snapshot(run) == before
        assert sorted(p.name for p in disk.iterdir() if p.name.startswith(f".{run.name}.tmp")) == []


def test_a_full_disk_during_export_and_reference(workdir, small_run, capsys):
    with small_disk(workdir / "disk", 96) as disk:
        (disk / "keep").write_text("mine")
        fill(disk, 24)
        for args in (["export", str(small_run), "--out", str(disk / "e"), "--quiet"],
                     ["latency", "reference", "--space", "mbv3-tiny", "--n", "3", "--export",
                      str(disk / "r")]):
            before = snapshot(disk, small_run)
            code, err = run_cli(args, capsys)
            lines = [line for line in err.strip().splitlines() if "error" in line]
            assert code == 2 and "Traceback" not in err and len(lines) == 1, err
            assert "No space left on device" in lines[0], err
            assert snapshot(disk, small_run) == before


def test_the_record_is_never_a_users_file(workdir, small_run, capsys):
    """A record that is a symbolic link or not one of hwnas is no record: nothing is replaced."""
    run = _copy_run(small_run, workdir)
    real = json.loads((run / RECORD).read_text())
    (run / RECORD).unlink()
    (workdir / "fake.json").write_text(json.dumps(real))
    (run / RECORD).symlink_to(workdir / "fake.json")
    assert_clean_refusal(_search(run, "--overwrite"), "is not an hwnas run directory", capsys,
                         workdir)
