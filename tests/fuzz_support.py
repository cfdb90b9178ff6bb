"""Shared by tests/test_fuzz_*.py: run the CLI in-process on a bad input and check that it ends
the way the README promises (one ``hwnas...: error:`` line, exit status 2, no traceback, the
file tree unchanged)."""

from __future__ import annotations

import re
from pathlib import Path

from hwnas.cli import main

ERROR_LINE = re.compile(r"^hwnas( [a-z]+)*: error: \S")


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``roots``: (size, mtime in ns) of files, (-1, 0) of folders."""
    out: dict[str, tuple[int, int]] = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")):
            st = p.lstat()
            out[str(p)] = (-1, 0) if p.is_dir() else (st.st_size, st.st_mtime_ns)
    return out


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of ``hwnas ARGS`` run in this process."""
    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    return code, capsys.readouterr().err


def assert_clean_refusal(args: list[str], message: str, capsys, *roots: Path) -> None:
    """``hwnas ARGS`` exits 2 with one error line containing ``message``, no traceback, and
    leaves every path under ``roots`` as it was."""
    before = snapshot(*roots)
    code, err = run_cli(args, capsys)
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]), err
    assert message in lines[0], lines[0]
    assert code == 2, (code, err)
    assert snapshot(*roots) == before
