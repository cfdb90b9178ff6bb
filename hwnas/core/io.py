"""Atomic file writes: readers see the old file or the whole new one, never a part."""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import IO, Any, Callable


def write_atomic(path: str | Path, data: bytes | str | Callable[[Path], Any]) -> Path:
    """Write ``data`` (bytes, text, or a function that writes the given temporary path) to
    ``path``. The temporary file sits in the same directory (so ``os.replace`` is atomic), is
    created with the umask's permissions and removed on any failure, leaving ``path`` as it was.
    A write the system refuses (full disk, read-only filesystem, no permission) raises
    :class:`~hwnas.core.errors.WriteError`: one line naming ``path``."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(data):
            data(tmp)
        else:
            # os.open with 0o666 honours the umask, unlike tempfile's private 0o600 files.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data.encode() if isinstance(data, str) else data)
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        failure = write_failure(exc, path)  # before the partial file goes: is the disk full?
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if failure is None:
            raise
        raise failure from None
    return path


def write_failure(exc: BaseException, path: str | Path):  # -> WriteError | None
    """``exc`` raised while writing ``path`` as a :class:`~hwnas.core.errors.WriteError` (one
    line: the path and what the system said), or None when it is not a failed write. torch.save
    reports a full disk as a RuntimeError (from its C++ writer, worded in several ways): that
    counts when the filesystem has (almost) no space left."""
    from hwnas.core.errors import WriteError

    if isinstance(exc, WriteError):
        return exc
    if isinstance(exc, OSError) and exc.errno is not None:
        return WriteError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))
    if isinstance(exc, RuntimeError):
        folder = Path(path).parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        try:
            full = shutil.disk_usage(folder).free < (1 << 20)
        except OSError:
            full = False
        if full:
            return WriteError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return None


def file_sha256(path: str | Path) -> str:
    """The hex SHA-256 of a file's bytes (read in chunks): which file a record was made from,
    not only its name."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_json(path: str | Path, obj: Any) -> Path:
    """``obj`` as indented JSON (anything else as ``str``), atomically."""
    return write_atomic(path, json.dumps(obj, indent=1, default=str) + "\n")


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, else the exception's type name
    (some libraries raise with long or empty messages)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


class LockFile:
    """An exclusive, non-blocking lock on ``path`` (created if missing; the OS releases it when
    the process dies). ``held`` tells whether it was obtained. :meth:`release` with
    ``clean=True`` removes the lock file and the missing folders this lock created for it, for
    a command that fails before writing anything (the file tree is left as it was)."""

    def __init__(self, path: str | Path) -> None:
        import fcntl

        self.path = Path(path)
        parent = self.path.parent
        self._made = [d for d in reversed([parent, *parent.parents]) if not d.exists()]
        parent.mkdir(parents=True, exist_ok=True)
        self._new_file = not self.path.exists()
        self._handle = open(self.path, "w")
        try:
            fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.held = True
        except OSError:
            self._handle.close()
            self.held, self._new_file, self._made = False, False, []

    def release(self, clean: bool = False) -> None:
        if not self.held:
            return
        if clean and self._new_file:
            self.path.unlink(missing_ok=True)
        self._handle.close()
        self.held = False
        if clean:
            for d in reversed(self._made):
                try:
                    d.rmdir()
                except OSError:
                    break

    def close(self) -> None:
        self.release()


def check_writable(path: str | Path, what: str = "--out") -> None:
    """UserError unless ``path`` (a file or directory to create or replace) can be written:
    a probe folder is created (and removed at once) in ``path`` itself where it is a
    directory, else in the nearest existing folder above it, so an unwritable target (a
    read-only filesystem, no permission: root passes permission checks, not a read-only mount)
    fails before any work is done. (A file where a directory is needed is the caller's check.)"""
    from hwnas.core.errors import UserError

    path = Path(path)
    if path.exists() and not path.is_dir() and not os.access(path, os.W_OK):
        raise UserError(f"{what} {path}: not writable")
    if path.is_dir():
        ancestor = path
    else:
        ancestor = path.parent if path.parent != path else path
        while not ancestor.exists() and ancestor.parent != ancestor:
            ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"{what} {path}: {ancestor} is a file, not a directory")
    probe = ancestor / f".hwnas-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot write in {ancestor} "
                        f"({exc.strerror or first_line(exc)})") from None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_csv_rows(path: str | Path, what: str, expected: str, *, empty: str | None = None,
                  opener: Callable[[Path], IO[str]] | None = None) -> list[tuple[int, list[str]]]:
    """The non-blank rows of a CSV file with their line numbers (the header is line 1). One
    UserError line, naming the file as ``what`` and what was ``expected`` (``empty``: what to
    say of an empty file), when it is missing, a directory, unreadable or empty. ``opener``
    opens it as text (default: UTF-8, a byte-order mark skipped)."""
    from hwnas.core.errors import UserError

    path = Path(path)
    if not path.is_file():
        kind = "is a directory" if path.is_dir() else "does not exist"
        raise UserError(f"{what} {path} {kind}; {expected}")
    try:
        with (opener or _open_csv_text)(path) as fh:
            numbered = [(n, r) for n, r in enumerate(csv.reader(fh), start=1)
                        if any(cell.strip() for cell in r)]
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"cannot read {what} {path}: {exc}") from exc
    if not numbered:
        raise UserError(f"{what} {path} is empty; {empty or expected}")
    return numbered


def _open_csv_text(path: Path) -> IO[str]:
    return open(path, newline="", encoding="utf-8-sig")
