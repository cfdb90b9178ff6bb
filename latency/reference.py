"""The models a new device should measure first, written as ONNX files for the on-device script.

``hwnas latency reference --space S --n 10 --export DIR`` starts the loop that makes a device
profile: the predictor's reference architectures (those whose latencies tell it most about a
device: :attr:`~hwnas.latency.predictors.LatencyPredictor.reference_archs`, the first ``n``)
become ``DIR/ref_NN.onnx`` files, each carrying its architecture in the ``arch`` metadata entry,
plus ``DIR/archs.csv`` (``order,arch,file``). ``latency/ondevice.py DIR`` measures them on the
device and ``hwnas latency adapt`` turns its CSV into a profile.

A predictor without reference architectures (a space without a shipped meta predictor), or more
models than it has, is completed with the space's smallest and largest architectures and
seeded random ones, so the measurements span the space's range.

The directory is written whole or not at all: everything goes into a temporary sibling that is
renamed into place at the end. Latency does not depend on the weights, so the models are the
subnets of a freshly initialised supernet (torch is imported only here, on use).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hwnas.core.errors import UserError
from hwnas.core.io import check_writable, first_line, write_atomic

__all__ = ["ARCHS_FILE", "ReferenceSet", "choose_reference", "export_reference"]

#: The architecture list written beside the models.
ARCHS_FILE = "archs.csv"
_MODEL_NAME = re.compile(r"^ref_[0-9]+\.onnx$")


@dataclass(frozen=True)
class ReferenceSet:
    """The architectures to measure (canonical strings, in order) and how many of them are the
    predictor's reference architectures (the others are the range-spanning completion)."""

    archs: list[str]
    n_reference: int
    predictor: str


def choose_reference(space: Any, n: int, *, predictor: Any = None, seed: int = 0) -> ReferenceSet:
    """The first ``n`` reference architectures of ``predictor`` (default: the one ``hwnas
    latency adapt`` would adapt for ``space``), completed when it has fewer (module docstring)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UserError(f"the number of reference models must be an integer >= 1, got {n!r}")
    if predictor is None:
        from hwnas.latency.cli import default_predictor

        predictor = default_predictor(space)
    refs = list(predictor.reference_archs or [])[:n]
    chosen = list(dict.fromkeys(refs))
    seen = set(chosen)
    extra = [space.smallest(), space.largest()]
    rng = np.random.default_rng(seed)
    tries = 0
    while len(chosen) < n and tries < 100 * n + 2:
        arch = extra[tries] if tries < len(extra) else space.sample(rng)
        tries += 1
        key = space.to_string(arch)
        if key not in seen:
            seen.add(key)
            chosen.append(key)
    if len(chosen) < n:
        raise UserError(f"space {space.name} has only {len(chosen)} distinct architectures "
                        f"found; asked for {n} reference models")
    return ReferenceSet(chosen, len(refs), str(getattr(predictor, "name", type(predictor).__name__)))


def check_export_target(directory: Path, overwrite: bool, flag: str = "--export") -> None:
    """Refuse a directory (given as ``flag``) that could not take a reference export (a file,
    a folder of other files, a missing parent), before any work."""
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{flag} {directory} is a file; expected a directory for the models")
    if directory.is_dir() and any(directory.iterdir()):
        if not overwrite:
            how = "pass --overwrite to replace it or " if flag == "--export" else ""
            raise UserError(f"{flag} {directory} is not empty; {how}choose a new directory")
        others = sorted(p.name for p in directory.iterdir()
                        if not (p.name == ARCHS_FILE or _MODEL_NAME.match(p.name)))
        if others:  # --overwrite replaces a reference export, never a folder of other files
            raise UserError(f"{flag} {directory} holds files other than a reference export "
                            f"({others[0]!r}); --overwrite only replaces an earlier "
                            f"'hwnas latency reference' folder - choose a new directory")
    if not directory.parent.is_dir():
        raise UserError(f"{flag} {directory}: directory {directory.parent} does not exist")
    check_writable(directory, flag)


def export_reference(space: Any, reference: ReferenceSet, directory: str | Path, *,
                     overwrite: bool = False, flag: str = "--export") -> list[Path]:
    """Write ``ref_NN.onnx`` for each architecture of ``reference`` and ``archs.csv`` into
    ``directory`` (created; an existing non-empty one only with ``overwrite`` and only when it
    holds nothing but an earlier reference export, then replaced in one rename). Returns the
    model paths."""
    directory = Path(directory)
    check_export_target(directory, overwrite, flag)
    import onnx
    import torch
    from hwnas.supernet.onnx import onnx_bytes, set_metadata

    supernet = space.build_supernet().eval()
    example = torch.zeros(1, *space.input_shape)
    width = max(2, len(str(len(reference.archs))))
    tmp = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}"
    old: Path | None = None
    names = [f"ref_{i + 1:0{width}d}.onnx" for i in range(len(reference.archs))]
    try:
        tmp.mkdir()
        for i, (arch, name) in enumerate(zip(reference.archs, names)):
            proto = onnx.load_from_string(onnx_bytes(supernet.extract(space.from_string(arch)),
                                                     example))
            set_metadata(proto, {"arch": arch, "space": space.name,
                                 "space_config": space.config(), "reference_order": i + 1})
            write_atomic(tmp / name, proto.SerializeToString())
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["order", "arch", "file"])
        writer.writerows([i + 1, a, f] for i, (a, f) in enumerate(zip(reference.archs, names)))
        write_atomic(tmp / ARCHS_FILE, buffer.getvalue())
        if directory.exists():
            old = directory.parent / f".{directory.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(directory, old)
        os.rename(tmp, directory)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not directory.exists():
            os.rename(old, directory)  # the previous directory back
            old = None
        if isinstance(exc, OSError):
            raise UserError(f"{flag} {directory}: cannot write the models "
                            f"({exc.strerror or first_line(exc)}); nothing was written") from None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return [directory / name for name in names]
