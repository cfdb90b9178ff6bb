"""What hwnas wrote in a directory, and replacing such a directory: the one rule of every writer.

Every command that fills a directory (``hwnas search``/``run``, ``export``, ``finetune``,
``latency reference``, ``latency adapt``, ``train``) keeps a record of the files it wrote there:
:data:`RECORD` (``.hwnas-written.json``, written atomically) names them. ``--overwrite`` replaces
a directory only when the record names everything in it: a user's file, folder or symbolic
link there (``notes.md``, a folder named like a model file, ``ref_99.onnx/``) makes it refuse,
naming them; a directory without a record (a project folder holding a copy of a run's
``config.json``) is never replaced, whatever it holds.

A directory is replaced whole: the new one is built in a hidden staging sibling
(:func:`make_staging`, recorded as the writer's while it fills), and :func:`replace_dir`
renames the old one aside, the new one in, and only then deletes the old one (checked once
more), so a failure at any point (a full disk) leaves the previous one as it was. No torch.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hwnas.core.errors import UserError, WriteError
from hwnas.core.io import pid_alive, write_failure, write_json

__all__ = ["RECORD", "check_replaceable", "foreign", "make_staging", "read_record",
           "record_files", "record_tree", "remove_stale", "replace_dir"]

#: the record of what hwnas wrote in a directory
RECORD = ".hwnas-written.json"
FORMAT = "hwnas-written-1"
#: a temporary file of write_atomic: ``.NAME.PID.HEX.tmp`` beside NAME
_ATOMIC_TMP = re.compile(r"^\.(?P<name>.+)\.[0-9]+\.[0-9a-f]{8}\.tmp$")


def read_record(directory: str | Path) -> dict[str, Any] | None:
    """The record of ``directory`` (``writer``, ``files``, ``dirs``, ``staging``), or None
    where it has none (or one that is not a plain, readable record of hwnas)."""
    path = Path(directory) / RECORD
    if path.is_symlink() or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    files, dirs = doc.get("files", []), doc.get("dirs", [])
    if not (isinstance(files, list) and isinstance(dirs, list)
            and all(isinstance(f, str) for f in files + dirs)):
        return None
    return {"writer": str(doc.get("writer")), "files": files, "dirs": dirs,
            "staging": doc.get("staging") is True}


def record_files(directory: str | Path, writer: str, files: Iterable[str] = (), *,
                 dirs: Sequence[str] = ()) -> None:
    """Add ``files`` (paths relative to ``directory``, ``/``-separated) to the record of
    ``directory`` (created with ``writer`` if missing). Call it before writing them: a name
    recorded and never written is harmless, a file written and not recorded would make the
    next ``--overwrite`` refuse. ``dirs``: patterns of sub-folders that other writers own
    (each holds a record of its own, or folders that do)."""
    directory = Path(directory)
    old = read_record(directory) or {"writer": writer, "files": [], "dirs": [], "staging": False}
    new_files = list(dict.fromkeys([*old["files"], *files]))
    new_dirs = list(dict.fromkeys([*old["dirs"], *dirs]))
    if new_files == old["files"] and new_dirs == old["dirs"] and (directory / RECORD).is_file():
        return
    write_json(directory / RECORD, {"format": FORMAT, "writer": old["writer"],
                                    "files": new_files, "dirs": new_dirs})


def record_tree(directory: str | Path, writer: str, *, dirs: Sequence[str] = ()) -> None:
    """Record every file under ``directory`` as ``writer``'s (a staging directory that this
    process created empty and filled), sub-folders matching ``dirs`` excepted."""
    directory = Path(directory)
    files = []
    for root, subdirs, names in os.walk(directory):
        rel_root = Path(root).relative_to(directory)
        subdirs[:] = [d for d in subdirs if not _matches((rel_root / d).as_posix(), dirs)]
        files += [(rel_root / n).as_posix() for n in names if not (rel_root == Path(".")
                                                                     and n == RECORD)]
    write_json(directory / RECORD, {"format": FORMAT, "writer": writer,
                                    "files": sorted(files), "dirs": list(dirs)})


def _matches(rel: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def foreign(directory: str | Path) -> list[str]:
    """What is in ``directory`` that no record names (relative paths; a folder ends in ``/``,
    a symbolic link in ``@``): everything, where it has no record. Symbolic links are never
    followed, and never hwnas's."""
    directory = Path(directory)
    record = read_record(directory)
    if record is None:
        return sorted(_label(p, p.name) for p in directory.iterdir())
    return _foreign(directory, record, "")


def _label(path: Path, rel: str) -> str:
    if path.is_symlink():
        return rel + "@"
    return rel + "/" if path.is_dir() else rel


def _foreign(directory: Path, record: dict[str, Any], prefix: str) -> list[str]:
    files = set(record["files"])
    owned_dirs = {p.as_posix() for f in files for p in Path(f).parents if p != Path(".")}
    out: list[str] = []

    def walk(folder: Path, rel_folder: str) -> None:
        for entry in sorted(folder.iterdir()):
            rel = f"{rel_folder}{entry.name}"
            if not rel_folder and entry.name == RECORD and not entry.is_symlink():
                continue
            if entry.is_symlink():
                out.append(prefix + rel + "@")
            elif entry.is_dir():
                if not rel_folder and _matches(rel, record["dirs"]):
                    out.extend(_owned_elsewhere(entry, prefix + rel + "/"))
                elif record["staging"] or rel in owned_dirs:
                    walk(entry, rel + "/")
                else:
                    out.append(prefix + rel + "/")
            elif not (record["staging"] or rel in files or _atomic_tmp_of(entry.name, rel_folder,
                                                                          files)):
                out.append(prefix + rel)
    walk(directory, "")
    return out


def _owned_elsewhere(folder: Path, prefix: str) -> list[str]:
    """A sub-folder the parent's record leaves to other writers: it holds a record of its own,
    or only folders that do (``finetune/`` holds one per trial)."""
    record = read_record(folder)
    if record is not None:
        return _foreign(folder, record, prefix)
    out = []
    for entry in sorted(folder.iterdir()):
        sub = read_record(entry) if entry.is_dir() and not entry.is_symlink() else None
        if sub is None:
            out.append(prefix + _label(entry, entry.name))
        else:
            out.extend(_foreign(entry, sub, f"{prefix}{entry.name}/"))
    return out


def _atomic_tmp_of(name: str, rel_folder: str, files: set[str]) -> bool:
    """Whether ``name`` is a temporary file that write_atomic left (a killed process) for a
    recorded file."""
    m = _ATOMIC_TMP.match(name)
    return bool(m) and f"{rel_folder}{m.group('name')}" in files


def _describe(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_replaceable(directory: str | Path, *, overwrite: bool, writers: Sequence[str],
                      what: str, flag: str = "--out", instead: str = "choose another directory",
                      ) -> bool:
    """Whether ``directory`` holds an earlier output to replace (False: it is new or empty).
    UserError (one line, before any work) for a file or link where a directory is needed, a
    directory without a record of hwnas (``what`` names the output expected), one holding
    anything its record does not name (named), an output of another command, and, without
    ``overwrite``, any earlier output. ``instead``: what the user may do instead."""
    directory = Path(directory)
    if directory.is_symlink():
        raise UserError(f"{flag} {directory} is a symbolic link; hwnas writes only into a real "
                        f"directory: {instead}")
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{flag} {directory} exists and is not a directory; {instead}")
    try:
        if not directory.exists() or not any(directory.iterdir()):
            return False
    except OSError as exc:
        raise UserError(f"{flag} {directory}: cannot read it ({exc.strerror or exc})") from None
    record = read_record(directory)
    if record is None:
        raise UserError(f"{flag} {directory} exists and is not {what} (no record of files hwnas "
                        f"wrote, {RECORD}; it holds {_describe(foreign(directory))}); hwnas never "
                        f"replaces it: {instead}")
    bad = foreign(directory)
    if bad:
        raise UserError(f"{flag} {directory} holds {_describe(bad)}, which hwnas did not write; "
                        f"--overwrite replaces only hwnas's own files: move them away or "
                        f"{instead}")
    if record["writer"] not in writers:
        raise UserError(f"{flag} {directory} holds the output of hwnas {record['writer']}, not "
                        f"{what}; {instead}")
    if not overwrite:
        raise UserError(f"{flag} {directory} already holds {what}; pass --overwrite to replace "
                        f"it or {instead}")
    return True


def make_staging(target: str | Path, writer: str) -> Path:
    """A new, empty hidden sibling of ``target`` (``.NAME.tmp-PID-HEX``) recorded as ``writer``'s
    while it fills (:func:`record_tree` records its files when it is complete)."""
    target = Path(target)
    staging = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        write_json(staging / RECORD, {"format": FORMAT, "writer": writer, "files": [],
                                      "dirs": [], "staging": True})
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        failure = write_failure(exc, staging)
        if failure is None:
            raise
        raise failure from None
    return staging


def discard(staging: str | Path) -> None:
    """Remove a staging directory of :func:`make_staging` (after a failure)."""
    shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def staged(target: str | Path, writer: str, *, flag: str = "--out", dirs: Sequence[str] = ()):
    """A staging directory for ``target`` (:func:`make_staging`), recorded whole
    (:func:`record_tree`) when the block ends; on any failure it is removed, and a write
    the system refused (a full disk) becomes one :class:`~hwnas.core.errors.WriteError` line
    naming ``target``. :func:`replace_dir` then moves it into place."""
    target = Path(target)
    staging = make_staging(target, writer)
    try:
        yield staging
        record_tree(staging, writer, dirs=dirs)
    except BaseException as exc:
        discard(staging)
        failure = write_failure(exc, getattr(exc, "filename", None) or staging)
        if failure is None or (isinstance(exc, UserError) and not isinstance(exc, WriteError)):
            raise
        name = Path(failure.filename or staging)
        inside = name.relative_to(staging) if name.is_relative_to(staging) else name
        raise WriteError(failure.errno, failure.strerror, str(target), message=(
            f"{flag} {target}: cannot write {inside}: {failure.strerror}; nothing was written "
            f"(what was there before is unchanged)")) from None


def replace_dir(staging: str | Path, target: str | Path, *, writers: Sequence[str] = (),
                what: str = "an hwnas output", flag: str = "--out") -> None:
    """Move the complete ``staging`` to ``target``. An earlier ``target`` is checked again
    (nothing foreign may have appeared in it meanwhile), renamed aside, and deleted only once
    the new one is in place; any failure puts it back and raises (a write failure as
    :class:`~hwnas.core.errors.WriteError`), the staging directory removed."""
    staging, target = Path(staging), Path(target)
    old = None
    try:
        if target.exists() or target.is_symlink():
            if check_replaceable(target, overwrite=True, writers=writers or
                                 [read_record(staging)["writer"]], what=what, flag=flag):
                old = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                os.rename(target, old)
            else:  # an empty directory
                target.rmdir()
        os.rename(staging, target)
    except BaseException as exc:
        if old is not None and not target.exists():
            os.rename(old, target)
            old = None
        discard(staging)
        failure = write_failure(exc, target)
        if failure is None or isinstance(exc, UserError):
            raise
        raise failure from None
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def remove_stale(target: str | Path) -> list[Path]:
    """Remove the staging (``.NAME.tmp-PID-*``) and replaced (``.NAME.old-PID-*``) directories
    that writers of ``target`` killed before they finished left beside it: those whose process
    is gone and that hold only what hwnas wrote. Returns what was removed."""
    target = Path(target)
    removed: list[Path] = []
    if not target.parent.is_dir():
        return removed
    for kind in ("tmp", "old"):
        for path in target.parent.glob(f".{glob.escape(target.name)}.{kind}-*"):
            pid = path.name.rsplit(f".{kind}-", 1)[-1].split("-", 1)[0]
            if (path.is_dir() and not path.is_symlink() and pid.isdigit()
                    and not pid_alive(int(pid)) and read_record(path) is not None
                    and not foreign(path)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed
