"""A device from a user's measurements, and the latencies a device predicts: the library half of
``hwnas latency adapt`` and ``hwnas latency predict`` (:mod:`hwnas.latency.cli` only parses
and prints).

:func:`adapt_device` validates a measurements CSV, adapts a predictor and saves the device
profile (nothing written unless every step succeeds); :func:`pin_execution` fixes which
network the device runs where the measurements cannot tell; :func:`predict_csv` writes the
latency of a CSV's architectures on any device.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np
from hwnas.latency.predictors import default_predictor

from hwnas.core.errors import UserError
from hwnas.core.io import check_writable, read_csv_rows, write_atomic
from hwnas.core.maths import spearman

__all__ = ["adapt_device", "check_csv_out", "pin_execution", "predict_csv", "read_arch_csv"]


def check_csv_out(out: str | Path | None, overwrite: bool) -> Path | None:
    """The CSV file ``--out`` names, checked before any work (``None``: print instead)."""
    if out is None:
        return None
    path = Path(out)
    if path.is_dir():
        raise UserError(f"--out {path} is a directory; expected a CSV file name")
    if path.exists() and not overwrite:
        raise UserError(f"--out {path} already exists; pass --overwrite to replace it")
    if not path.parent.exists():
        raise UserError(f"--out {path}: directory {path.parent} does not exist")
    check_writable(path)
    return path


def adapt_device(
    name: str,
    space: Any,
    measurements_csv: str | Path,
    *,
    predictor: Any = None,
    seed: int = 0,
    overwrite: bool = False,
    base: str | Path | None = None,
) -> tuple[Any, Any, float]:
    """Validate a measurements CSV, adapt ``predictor`` (default:
    :func:`~hwnas.latency.predictors.default_predictor`) to it, and save the profile ``name``.
    Returns ``(profile, predictor, in-sample Spearman)``. Nothing is written unless every step
    succeeds."""
    from hwnas.latency.devices import resolve_space
    from hwnas.latency.profiles import (
        check_profile_name,
        check_profile_target,
        profiles_dir,
        read_measurements,
        save_profile,
    )

    check_profile_name(name)
    space = resolve_space(space)
    root = Path(base) if base is not None else profiles_dir()
    check_profile_target(root / name, name, overwrite)
    data = read_measurements(measurements_csv, space)  # bad rows fail before any loading
    if predictor is None:
        predictor = default_predictor(space)
    min_rows = int(getattr(predictor, "min_samples", 1))
    if len(data) < min_rows:
        raise UserError(
            f"measurements file {data.path} has {len(data)} measurement(s); predictor "
            f"{getattr(predictor, 'name', type(predictor).__name__)} needs at least {min_rows}"
        )
    archs = [space.from_string(a) for a in data.archs]
    predictor.adapt(archs, data.latency_ms, seed=seed)
    fitted = np.asarray(predictor.predict(archs), dtype=np.float64)
    rho = spearman(fitted, data.latency_ms) if len(fitted) >= 2 else float("nan")
    profile = save_profile(name, space, predictor, data, overwrite=overwrite, base=base)
    return profile, predictor, rho


def pin_execution(choice: str, predictor: Any, space: Any, data: Any) -> str | None:
    """Pin the execution variant ``--execution`` names (a variant, or a runtime of
    :data:`~hwnas.latency.predictors.features.RUNTIME_DROPS_DEAD_CODE`) on ``predictor``; with
    ``auto``, the variant of hwnas's ONNX exports when every measured model was an ONNX file
    (nothing otherwise: the measurements weigh the variants). Returns the line that says what
    was pinned and why, or ``None`` when nothing was."""
    from hwnas.latency.predictors.features import (
        RUNTIME_DROPS_DEAD_CODE,
        execution_variants,
        export_execution,
        runtime_execution,
    )

    variants = execution_variants(space)
    why = f"--execution {choice}"
    if choice in RUNTIME_DROPS_DEAD_CODE:
        choice = runtime_execution(space, choice)
        if len(variants) < 2:  # nothing to pin: the space has no dead code
            return None
    elif choice == "auto":
        onnx = bool(data.files) and all(f.lower().endswith(".onnx") for f in data.files)
        if len(variants) < 2 or not onnx or not hasattr(predictor, "pin_execution"):
            return None
        choice, why = export_execution(space), ("every measured model is an ONNX file, and "
                                                "hwnas exports hold no dead operations")
    elif choice not in variants:
        raise UserError(f"--execution {choice!r}: expected auto, a runtime "
                        f"({', '.join(RUNTIME_DROPS_DEAD_CODE)}) or an execution variant of "
                        f"space {space.name} ({', '.join(variants)})")
    if not hasattr(predictor, "pin_execution"):
        raise UserError(f"--execution {choice}: predictor "
                        f"{getattr(predictor, 'name', type(predictor).__name__)} does not weigh "
                        f"execution variants; use the meta predictor or --execution auto")
    predictor.pin_execution(choice)
    return f"execution: the device is taken to run the {choice} network ({why})"


def read_arch_csv(path: str | Path, space: Any) -> list[str]:
    """Canonical architecture strings of the ``arch`` column of a CSV (validated, every bad
    row named by its line)."""
    path = Path(path)
    numbered = read_csv_rows(path, "architectures file", "expected a CSV with an 'arch' column",
                             empty="expected a header with an 'arch' column")
    header = [h.strip() for h in numbered[0][1]]
    if "arch" not in header:
        raise UserError(f"architectures file {path} has no 'arch' column (header: {','.join(header)})")
    col = header.index("arch")
    out = []
    for line, row in numbered[1:]:
        text = row[col].strip() if col < len(row) else ""
        try:
            out.append(space.to_string(space.from_string(text)))
        except UserError as exc:
            raise UserError(f"{path} line {line}: architecture {text!r} is not in space {space.name}: {exc}") from None
    if not out:
        raise UserError(f"architectures file {path} has a header but no rows")
    return out


def predict_csv(device_name: str, space: Any, archs_csv: str | Path, out: str | Path,
                *, overwrite: bool = False) -> np.ndarray:
    """Latency of every architecture of ``archs_csv`` on a device, written to ``out``
    (``arch,latency_ms`` plus ``latency_std_ms`` when the device gives one). Returns the
    latencies."""
    from hwnas.latency.devices import get_device, resolve_space

    space = resolve_space(space)
    out_path = check_csv_out(out, overwrite)
    device = get_device(device_name, space)
    archs = read_arch_csv(archs_csv, space)
    mean, std = device.latency_with_std(space, archs)
    mean = np.asarray(mean, dtype=np.float64)
    columns = ["arch", "latency_ms"] + (["latency_std_ms"] if std is not None else [])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for i, arch in enumerate(archs):
        row = [arch, f"{mean[i]:.6g}"] + ([f"{float(std[i]):.6g}"] if std is not None else [])
        writer.writerow(row)
    write_atomic(out_path, buffer.getvalue())
    return mean
