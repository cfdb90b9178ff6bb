"""The models a new device should measure first, written as ONNX files for the on-device script.

``hwnas latency reference --space S --n 10 --export DIR`` starts the loop that makes a device
profile: the predictor's reference architectures (:func:`choose_reference`) become
``DIR/ref_NN.onnx`` files, each carrying its architecture in the ``arch`` metadata entry, plus
``DIR/archs.csv`` (``order,arch,file``; :func:`export_reference`). ``latency/ondevice.py DIR``
measures them on the device and ``hwnas latency adapt`` turns its CSV into a profile.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hwnas.core.errors import UserError
from hwnas.core import written
from hwnas.core.io import check_writable, write_atomic

__all__ = ["ARCHS_FILE", "ReferenceSet", "choose_reference", "export_reference"]

#: The architecture list written beside the models.
ARCHS_FILE = "archs.csv"


@dataclass(frozen=True)
class ReferenceSet:
    """The architectures to measure (canonical strings, in order) and how many of them are the
    predictor's reference architectures (the others are the range-spanning completion)."""

    archs: list[str]
    n_reference: int
    predictor: str


def choose_reference(space: Any, n: int, *, predictor: Any = None, seed: int = 0) -> ReferenceSet:
    """The first ``n`` reference architectures of ``predictor`` (default: the one ``hwnas
    latency adapt`` would adapt for ``space``): those whose latencies tell it most about a
    device (:attr:`~hwnas.latency.predictors.LatencyPredictor.reference_archs`). A predictor
    without reference architectures (a space without a shipped meta predictor), or more models
    than it has, is completed with the space's smallest and largest architectures and seeded
    random ones, so the measurements span the space's range."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UserError(f"the number of reference models must be an integer >= 1, got {n!r}")
    if n > MAX_REFERENCE:
        raise UserError(f"--n {n}: at most {MAX_REFERENCE} reference models (a device profile "
                        f"needs 10 to a few hundred measurements)")
    if predictor is None:
        from hwnas.latency.predictors import default_predictor

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


#: what writes a reference export, in its record of written files (:mod:`hwnas.core.written`)
WRITER = "latency reference"
#: more reference models than this is not a device profile's measurement (10 to a few hundred)
MAX_REFERENCE = 1000


def check_export_target(directory: Path, overwrite: bool, flag: str = "--export") -> None:
    """Refuse a directory (given as ``flag``) that could not take a reference export (a file,
    a folder holding anything but an earlier reference export's recorded files, a missing
    parent), before any work."""
    if not directory.parent.is_dir():
        raise UserError(f"{flag} {directory}: directory {directory.parent} does not exist")
    written.check_replaceable(directory, overwrite=overwrite, writers=[WRITER],
                              what="a reference export", flag=flag,
                              instead="choose a new directory")
    check_writable(directory, flag)


def export_reference(space: Any, reference: ReferenceSet, directory: str | Path, *,
                     overwrite: bool = False, flag: str = "--export") -> list[Path]:
    """Write ``ref_NN.onnx`` for each architecture of ``reference`` and ``archs.csv`` into
    ``directory`` (created; an existing non-empty one only with ``overwrite`` and only when it
    holds nothing but an earlier reference export, then replaced in one rename). The directory
    is written whole or not at all: everything goes into a temporary sibling that is renamed
    into place at the end. Latency does not depend on the weights, so the models are the
    subnets of a freshly initialised supernet (torch is imported only here, on use). Returns
    the model paths."""
    directory = Path(directory)
    check_export_target(directory, overwrite, flag)
    import onnx
    import torch
    from hwnas.supernet.onnx import onnx_bytes, set_metadata

    supernet = space.build_supernet().eval()
    example = torch.zeros(1, *space.input_shape)
    width = max(2, len(str(len(reference.archs))))
    names = [f"ref_{i + 1:0{width}d}.onnx" for i in range(len(reference.archs))]
    written.remove_stale(directory)
    with written.staged(directory, WRITER, flag=flag) as tmp:
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
    written.replace_dir(tmp, directory, writers=[WRITER], what="a reference export", flag=flag)
    return [directory / name for name in names]
