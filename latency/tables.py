"""Latency tables (many devices × many architectures) and the few-shot protocol that uses them.

A latency table is a CSV (gzip-compressed when named ``*.gz``) with an ``arch`` column (the
space's canonical architecture string), an optional ``arch_idx`` column and one column per
device in milliseconds per forward pass (:func:`load_latency_table`, which validates it
completely before anything uses it). The few-shot protocol of HELP (Lee et al., NeurIPS 2021)
is kept here as data (:data:`HELP_PROTOCOLS`).

Importing this module needs numpy only (no torch, no pandas).
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from hwnas.core.errors import UserError
from hwnas.core.io import read_csv_rows
from hwnas.core.paths import shared_data_candidate

__all__ = [
    "LatencyTable",
    "FewShotProtocol",
    "HELP_PROTOCOLS",
    "help_protocol",
    "load_latency_table",
    "open_table_text",
    "shared_table_path",
    "latency_tables",
    "TABLE_FILES",
    "load_shared_table",
]

#: Columns of a latency table that are not devices.
KEY_COLUMNS = ("arch_idx", "arch")


@dataclass(frozen=True)
class LatencyTable:
    """A validated latency table.

    ``latency_ms[i, j]`` is the latency of ``archs[i]`` on ``devices[j]``; ``arch_idx`` holds
    the table's ``arch_idx`` column when it has one (else ``None``). Architecture strings are
    canonical when the table was loaded for a space.
    """

    archs: list[str]
    devices: list[str]
    latency_ms: np.ndarray
    arch_idx: np.ndarray | None = None
    path: Path | None = None
    space: str | None = None
    _row: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self._row:
            self._row.update({a: i for i, a in enumerate(self.archs)})

    def __len__(self) -> int:
        return len(self.archs)

    def __contains__(self, arch: object) -> bool:
        """Whether the table holds the architecture string ``arch``."""
        return arch in self._row

    def _where(self) -> str:
        return f"latency table {self.path}" if self.path else "latency table"

    def check_devices(self, devices: Sequence[str]) -> None:
        """Raise :class:`UserError` naming the first of ``devices`` the table lacks."""
        for d in devices:
            if d not in self.devices:
                raise UserError(
                    f"{self._where()} has no device column {d!r}; expected one of {self.devices}"
                )

    def column(self, device: str) -> np.ndarray:
        """The latencies (ms) of every architecture on ``device``."""
        self.check_devices([device])
        return self.latency_ms[:, self.devices.index(device)].copy()

    def columns(self, devices: Sequence[str]) -> dict[str, np.ndarray]:
        """``device -> latencies`` for several devices (the form predictors' ``meta_fit`` takes)."""
        self.check_devices(devices)
        return {d: self.column(d) for d in devices}

    def rows(self, archs: Sequence[str]) -> np.ndarray:
        """Row indices of ``archs`` (canonical strings); an unknown one is a :class:`UserError`."""
        out = np.empty(len(archs), dtype=np.int64)
        for i, a in enumerate(archs):
            j = self._row.get(a)
            if j is None:
                raise UserError(f"architecture {a!r} is not in the {self._where()} "
                                f"({len(self)} architectures)")
            out[i] = j
        return out

    def rows_of_idx(self, arch_idx: Sequence[int]) -> np.ndarray:
        """Row indices of the given ``arch_idx`` values (the table must have that column)."""
        if self.arch_idx is None:
            raise UserError(f"{self._where()} has no arch_idx column")
        where = {int(v): i for i, v in enumerate(self.arch_idx)}
        missing = [int(v) for v in arch_idx if int(v) not in where]
        if missing:
            raise UserError(f"{self._where()} has no arch_idx {missing[0]}")
        return np.array([where[int(v)] for v in arch_idx], dtype=np.int64)


def open_table_text(path: str | Path) -> IO[str]:
    """A table file opened as text for :mod:`csv` (gzip-decompressed when its name ends in
    ``.gz``; a byte-order mark skipped)."""
    path = Path(path)
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", newline="", encoding="utf-8-sig")
    return open(path, newline="", encoding="utf-8-sig")


_EXPECTED = "expected a CSV with an 'arch' column and one latency column (ms) per device"


def _read_rows(path: Path) -> list[tuple[int, list[str]]]:
    """The non-blank rows of a table file with their line numbers (header first)."""
    return read_csv_rows(path, "latency table", _EXPECTED, opener=open_table_text)


def _device_columns(path: Path, header: list[str], devices: Sequence[str] | None) -> list[str]:
    """The device columns to keep (``devices``, each checked, or every one of the header)."""
    if "arch" not in header:
        raise UserError(f"latency table {path} has no 'arch' column (header: {','.join(header)}); "
                        f"{_EXPECTED}")
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise UserError(f"latency table {path} repeats column {dupes[0]!r}; expected unique names")
    all_devices = [h for h in header if h not in KEY_COLUMNS]
    if not all_devices:
        raise UserError(f"latency table {path} has no device column; {_EXPECTED}")
    if devices is None:
        return all_devices
    for d in devices:
        if d not in all_devices:
            raise UserError(f"latency table {path} has no device column {d!r}; expected one of "
                            f"{all_devices}")
    return list(devices)


def _latency_cell(where: str, device: str, cell: str) -> float:
    """One latency cell: a finite number of ms > 0 (``where``: the file and line)."""
    cell = cell.strip()
    try:
        v = float(cell)
    except ValueError:
        what = "is empty" if not cell else f"{cell!r} is not a number"
        raise UserError(f"{where}: {device} {what}; expected a latency in ms > 0") from None
    if math.isnan(v) or math.isinf(v):
        raise UserError(f"{where}: {device} is {cell}; expected a finite latency in ms > 0")
    if v <= 0:
        raise UserError(f"{where}: {device} is {cell}; expected a latency in ms > 0")
    return v


def load_latency_table(
    path: str | Path,
    *,
    space: Any = None,
    devices: Sequence[str] | None = None,
) -> LatencyTable:
    """Read and validate a latency CSV, gzip-compressed when its name ends in ``.gz``.

    The layout: an ``arch`` column (the space's canonical architecture string), an optional
    ``arch_idx`` column (an integer index, e.g. the NAS-Bench-201 index) and one column per
    device holding milliseconds per forward pass - the layout of the shared
    ``nb201_latency_ms.csv`` / ``fbnet_latency_ms.csv`` (HW-NAS-Bench and HELP measurements), of
    the project's measured ``<space>_<machine>.csv.gz`` tables, and of any table a user brings
    to ``benchmarks/latency_fewshot.py --latency-csv``. The table is validated completely
    before anything uses it: a missing column, an empty or non-numeric cell, NaN/inf, a latency
    <= 0, a repeated architecture, an architecture outside the space or an unknown device each
    raise one :class:`UserError` line that names the file, the line and what was expected.

    ``space`` (a :class:`~supernet.space.SearchSpace`) parses every architecture string and
    stores its canonical form, so that tables join with a space by string. ``devices`` keeps
    only those device columns (each must exist). Every kept cell must be a finite number > 0.
    """
    path = Path(path)
    numbered = _read_rows(path)
    header = [h.strip() for h in numbered[0][1]]
    keep = _device_columns(path, header, devices)
    ia = header.index("arch")
    iidx = header.index("arch_idx") if "arch_idx" in header else None
    cols = [header.index(d) for d in keep]
    rows = numbered[1:]
    if not rows:
        raise UserError(f"latency table {path} has a header but no rows")
    archs: list[str] = []
    seen: dict[str, int] = {}
    idx_values: list[int] = []
    values = np.empty((len(rows), len(keep)), dtype=np.float64)
    for r, (line, row) in enumerate(rows):
        if len(row) != len(header):
            raise UserError(f"{path} line {line}: {len(row)} fields; the header has {len(header)}")
        text = row[ia].strip()
        if not text:
            raise UserError(f"{path} line {line}: empty arch; expected an architecture string")
        if space is not None:
            try:
                text = space.to_string(space.from_string(text))
            except UserError as exc:
                raise UserError(f"{path} line {line}: architecture is not in space "
                                f"{space.name}: {exc}") from None
        if text in seen:
            raise UserError(f"{path} line {line}: architecture {text!r} repeats line {seen[text]}; "
                            f"expected one row per architecture")
        seen[text] = line
        archs.append(text)
        if iidx is not None:
            try:
                idx_values.append(int(row[iidx]))
            except ValueError:
                raise UserError(f"{path} line {line}: arch_idx {row[iidx]!r} is not an "
                                f"integer") from None
        values[r] = [_latency_cell(f"{path} line {line}", keep[j], row[c])
                     for j, c in enumerate(cols)]
    arch_idx = None
    if iidx is not None:
        arch_idx = np.asarray(idx_values, dtype=np.int64)
        if len(np.unique(arch_idx)) != len(arch_idx):
            raise UserError(f"latency table {path} repeats an arch_idx; expected unique indices")
    return LatencyTable(archs, keep, values, arch_idx, path,
                        getattr(space, "name", None) if space is not None else None)


# --------------------------------------------------------------------------------------------
# the shared tables
# --------------------------------------------------------------------------------------------


#: Latency tables of the shared data: space name -> file name under ``<shared data>/latency``.
TABLE_FILES = {"nb201": "nb201_latency_ms.csv", "fbnet": "fbnet_latency_ms.csv"}


def _latency_data_dir() -> Path:
    """``<shared data>/latency``: ``$HWNAS_SHARED_DATA/latency`` when set, else the default
    beside the checkout (:mod:`hwnas.core.paths`, torch-free)."""
    return shared_data_candidate()[0] / "latency"


def latency_tables() -> dict[str, Path]:
    """The latency tables present: space name -> CSV path."""
    base = _latency_data_dir()
    return {space: base / f for space, f in TABLE_FILES.items() if (base / f).is_file()}



def shared_table_path(space_name: str) -> Path:
    """The shared latency table of ``space_name`` (``nb201`` or ``fbnet``).

    Found under ``$HWNAS_SHARED_DATA/latency`` or ``<checkout>/../shared/data/latency`` (the
    rule of :func:`latency_tables`); a :class:`UserError` when it is absent.
    """
    if space_name not in TABLE_FILES:
        raise UserError(f"no shared latency table for space {space_name!r}; tables exist for "
                        f"{sorted(TABLE_FILES)}")
    tables = latency_tables()
    if space_name not in tables:
        raise UserError(
            f"the shared latency table {TABLE_FILES[space_name]} was not found; set "
            f"$HWNAS_SHARED_DATA to the directory that holds latency/{TABLE_FILES[space_name]}"
        )
    return tables[space_name]


def load_shared_table(space_name: str, *, space: Any = None) -> LatencyTable:
    """Load (and validate) the shared latency table of ``space_name``.

    Examples:
        >>> from hwnas.latency import load_shared_table
        >>> table = load_shared_table("nb201")        # HW-NAS-Bench / HELP, from the shared data
        >>> len(table), "pixel3" in table.devices
        (15625, True)
    """
    return load_latency_table(shared_table_path(space_name), space=space)


# --------------------------------------------------------------------------------------------
# the HELP protocol, as data
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FewShotProtocol:
    """Device splits, reference architectures and query set of a few-shot latency benchmark.

    ``query_range`` is the half-open ``arch_idx`` range from which HELP draws its query set; the
    query set of a device is that range without the ``query_trim`` fraction of architectures
    with the lowest and the highest latency *on that device* (HELP's ``loader.py``: 1000
    architectures, the middle 80% kept = 800). Meta-training here uses the architectures
    outside ``query_range`` only (HELP's meta-training pool lies outside it too), so that the
    query architectures are never seen in meta-training.
    """

    space: str
    meta_train: tuple[str, ...]
    validation: tuple[str, ...]
    test: tuple[str, ...]
    reference_arch_idx: tuple[int, ...]
    query_range: tuple[int, int]
    query_trim: float = 0.1
    #: Spearman correlations published by HELP with 10 measured samples (plus its 10 reference
    #: architectures), per test device, and their mean.
    published: dict[str, float] = field(default_factory=dict)
    #: Where the protocol comes from.
    source: str = ""

    def meta_train_rows(self, table: LatencyTable) -> np.ndarray:
        """Rows of ``table`` usable for meta-training and as measured samples: outside the
        query range (every row when the table has no ``arch_idx``)."""
        if table.arch_idx is None:
            return np.arange(len(table))
        lo, hi = self.query_range
        return np.flatnonzero((table.arch_idx < lo) | (table.arch_idx >= hi))

    def query_rows(self, table: LatencyTable, device: str) -> np.ndarray:
        """HELP's query set for ``device``: rows with ``arch_idx`` in ``query_range``, sorted by
        the device's latency (stable), the lowest and highest ``query_trim`` fraction dropped."""
        if table.arch_idx is None:
            raise UserError(f"the help800 query set needs an arch_idx column; "
                            f"{table._where()} has none")
        lo, hi = self.query_range
        rows = np.flatnonzero((table.arch_idx >= lo) & (table.arch_idx < hi))
        rows = rows[np.argsort(table.arch_idx[rows], kind="stable")]
        if len(rows) != hi - lo:
            raise UserError(f"{table._where()} lacks part of the arch_idx range [{lo}, {hi}) of "
                            f"the help800 query set")
        order = np.argsort(table.column(device)[rows], kind="stable")
        cut = int(len(rows) * self.query_trim)
        return rows[order[cut:len(rows) - cut]]

    def reference_rows(self, table: LatencyTable) -> np.ndarray:
        """Rows of HELP's reference architectures."""
        return table.rows_of_idx(self.reference_arch_idx)


_HELP_SOURCE = ("Lee et al., HELP, NeurIPS 2021 (github.com/HayeonLee/HELP: loader.py, "
                "script/run_meta_test_*.sh; Table 2 and 3 of the paper)")

#: The HELP protocol for the two spaces with public latency tables: which devices meta-train,
#: which validate (hyper-parameters are chosen on these only) and which are the unseen test
#: devices; HELP's 10 reference architectures; its 800-architecture query set; and the Spearman
#: correlations HELP published.
HELP_PROTOCOLS: dict[str, FewShotProtocol] = {
    "nb201": FewShotProtocol(
        space="nb201",
        meta_train=("1080ti_1", "1080ti_32", "1080ti_256", "silver_4114", "silver_4210r",
                    "samsung_a50", "pixel3", "essential_ph_1", "samsung_s7"),
        validation=("titanx_1", "titanx_32", "titanx_256", "gold_6240"),
        test=("titan_rtx_256", "gold_6226", "fpga", "pixel2", "raspi4", "eyeriss"),
        reference_arch_idx=(11982, 431, 55, 9, 14451, 8636, 9881, 13479, 6196, 1462),
        query_range=(900, 1900),
        published={"titan_rtx_256": 0.987, "gold_6226": 0.989, "fpga": 0.985, "pixel2": 0.802,
                   "raspi4": 0.890, "eyeriss": 0.940, "mean": 0.932},
        source=_HELP_SOURCE,
    ),
    "fbnet": FewShotProtocol(
        space="fbnet",
        meta_train=("1080ti_1", "1080ti_32", "1080ti_64", "silver_4114", "silver_4210r",
                    "samsung_a50", "pixel3", "essential_ph_1", "samsung_s7"),
        validation=("titanx_1", "titanx_32", "titanx_64", "gold_6240"),
        test=("fpga", "raspi4", "eyeriss"),
        reference_arch_idx=(3328, 3790, 3313, 890, 3052, 2538, 1640, 2514, 457, 2100),
        query_range=(4000, 5000),
        published={"fpga": 0.892, "raspi4": 0.887, "eyeriss": 0.943, "mean": 0.910},
        source=_HELP_SOURCE,
    ),
}


def help_protocol(space_name: str) -> FewShotProtocol:
    """The HELP protocol of ``space_name``; :class:`UserError` for other spaces.

    Examples:
        >>> from hwnas.latency import help_protocol
        >>> protocol = help_protocol("nb201")         # HELP's device split, from the shared data
        >>> "pixel3" in protocol.meta_train, len(protocol.test) > 0
        (True, True)
    """
    if space_name not in HELP_PROTOCOLS:
        raise UserError(f"no few-shot protocol for space {space_name!r}; expected one of "
                        f"{sorted(HELP_PROTOCOLS)}")
    return HELP_PROTOCOLS[space_name]
