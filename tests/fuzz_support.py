"""Shared by tests/test_fuzz_*.py: run the CLI in-process on a bad input and check that it ends
the way the README promises (one ``hwnas...: error:`` line, exit status 2, no traceback, the
file tree unchanged)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hwnas.cli import main

from hwnas.core.errors import UserError

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


def assert_clean_api_error(call, message: str, *roots: Path, kind: type = UserError) -> None:
    """``call()`` raises ``kind`` (by default hwnas.UserError, never a library's own exception)
    with a one-line message containing ``message``, and leaves every path under ``roots`` as it
    was."""
    before = snapshot(*roots)
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the type is the assertion
        assert type(exc) is kind or isinstance(exc, kind), f"{type(exc).__name__}: {exc}"
        text = str(exc)
        assert len(text.strip().splitlines()) == 1, text
        assert message in text, text
    else:
        raise AssertionError(f"no {kind.__name__} raised")
    assert snapshot(*roots) == before


def _mount(*args: str) -> str | None:
    """Run ``mount ARGS``: None when it worked, else why not (not root, no mount command, a
    container that forbids it)."""
    if os.geteuid() != 0:
        return "mounting needs root"
    try:
        done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"mount failed: {exc}"
    return None if done.returncode == 0 else f"mount {' '.join(args)}: {done.stderr.strip()}"


@contextlib.contextmanager
def small_disk(path: Path, size_kib: int):
    """``path`` as a tmpfs of ``size_kib`` KiB (a full disk on demand); the test is skipped,
    saying why, where this machine cannot mount one."""
    path.mkdir(parents=True, exist_ok=True)
    why = _mount("-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path))
    if why:
        pytest.skip(f"no small tmpfs here ({why})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path, leave_kib: int) -> None:
    """Fill the filesystem of ``path`` until ``leave_kib`` KiB are left (a file ``filler``)."""
    free = shutil.disk_usage(path).free - leave_kib * 1024
    if free > 0:
        (path / "filler").write_bytes(b"\0" * free)


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` read-only: a read-only bind mount as root (root ignores permissions), else
    ``chmod -w``; skipped, saying why, where neither can be had."""
    if os.geteuid() == 0:
        why = _mount("--bind", str(path), str(path))
        if why:
            pytest.skip(f"no read-only bind mount here ({why})")
        why = _mount("-o", "remount,bind,ro", str(path))
        if why:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
            pytest.skip(f"no read-only bind mount here ({why})")
        try:
            yield path
        finally:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        return
    modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")] if p.is_dir()}
    for p in modes:
        p.chmod(modes[p] & ~0o222)
    try:
        yield path
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
