"""Fuzz suite, the Python API and settings files (issue 50): ``hwnas.load_run`` and ``Run`` on
broken run files raise hwnas.UserError with one line (never pyarrow's, pandas' or the codec's
own exception), and deeply nested settings files end in one error line, not a RecursionError;
nothing is written (tests/fuzz_support.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fuzz_support import assert_clean_api_error, assert_clean_refusal

import hwnas


@pytest.fixture
def run(tmp_path, small_run) -> Path:
    """A copy of the session's finished run, to break."""
    copy = tmp_path / "small"
    shutil.copytree(small_run, copy, symlinks=True)
    return copy


def _corrupt_parquet(run: Path) -> None:
    (run / "trials.parquet").write_bytes(b"PAR1" + b"\x00garbage" * 20 + b"PAR1")


def _binary_csv(run: Path) -> None:
    (run / "trials.parquet").unlink(missing_ok=True)
    (run / "trials.csv").write_bytes(b"\xff\xfe\x00\x01" * 50)


def _not_a_trials_table(run: Path) -> None:
    (run / "trials.parquet").unlink(missing_ok=True)
    (run / "trials.csv").write_text("a,b\n1,2\n")


def _latin1_front(run: Path) -> None:
    next(run.glob("pareto_*.csv")).write_bytes("arch,accuracy\ncaf\xe9,1\n".encode("latin-1"))


def _empty_front(run: Path) -> None:
    next(run.glob("pareto_*.csv")).write_bytes(b"")


def _no_trials(run: Path) -> None:
    (run / "trials.parquet").unlink(missing_ok=True)
    (run / "trials.csv").unlink()


API = {
    "trials-corrupt-parquet": (_corrupt_parquet, lambda r: r.trials, "cannot read"),
    "trials-binary-csv": (_binary_csv, lambda r: r.trials, "cannot read"),
    "trials-other-table": (_not_a_trials_table, lambda r: r.trials, "lacks the columns"),
    "trials-missing": (_no_trials, lambda r: r.trials, "has its search finished"),
    "fronts-not-utf8": (_latin1_front, lambda r: r.fronts, "cannot read"),
    "fronts-empty-file": (_empty_front, lambda r: r.fronts, "cannot read"),
    "row-not-a-number": (lambda r: None, lambda r: r.row("0"), "trial must be a trial number"),
    "row-missing": (lambda r: None, lambda r: r.row(99999), "no completed trial 99999"),
}


@pytest.mark.parametrize("case", list(API))
def test_run_api_on_broken_files(case, run):
    breaks, read, message = API[case]
    breaks(run)
    assert_clean_api_error(lambda: read(hwnas.load_run(run)), message, run)


LOAD = {
    "missing": (lambda r: shutil.rmtree(r), "does not exist"),
    "config-not-json": (lambda r: (r / "config.json").write_bytes(b"\xff{"), "not valid JSON"),
    "config-a-list": (lambda r: (r / "config.json").write_text("[1]"),
                      "not an hwnas run configuration"),
    "supernet-symlink": (lambda r: ((r / "supernet.pt").unlink(),
                                    (r / "supernet.pt").symlink_to("/etc/passwd")),
                         "is a symbolic link"),
    "no-supernet": (lambda r: (r / "supernet.pt").unlink(), "has no supernet.pt"),
}


@pytest.mark.parametrize("case", list(LOAD))
def test_load_run_of_a_broken_directory(case, run, tmp_path):
    breaks, message = LOAD[case]
    breaks(run)
    assert_clean_api_error(lambda: hwnas.load_run(run), message, tmp_path)


def _deep(kind: str) -> str:
    if kind == "toml":
        return "a = " + "[" * 50000 + "]" * 50000 + "\n"
    return "[" * 50000 + "]" * 50000


@pytest.mark.parametrize("command, kind", [("search", "toml"), ("export", "json"),
                                           ("train", "toml"), ("run", "json")])
def test_a_deeply_nested_settings_file(command, kind, tmp_path, monkeypatch, small_run, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"deep.{kind}").write_text(_deep(kind))
    args = [command, *([str(small_run)] if command == "export" else []), "--config",
            f"deep.{kind}"]
    assert_clean_refusal(args, "nested too deeply", capsys, tmp_path, small_run)
