"""Table devices: a column of a latency table, the measured latency of every architecture the
table holds, for the table's space (default configuration) only; an architecture the table
lacks is refused. Named by the column. Two sources: the shared HW-NAS-Bench/HELP tables
(:func:`hwnas.latency.tables.latency_tables`: ``pixel3``, ``fpga``, ``1080ti_32`` ...) and the
project's own measured tables (:func:`measured_tables_dir`, written by
``benchmarks/measure_latency_tables.py``, shipped as package data: ``<space>_<machine>.csv.gz``,
columns ``<machine>-<runtime>-<threads or batch>`` such as ``xeon-ort-1t``), where one device
column covers every space it was measured on. A table averaged over several sessions has a
``_sessions.json`` beside it; the description then says how alike the sessions ranked the
architectures (:func:`session_agreement`). Tables are read by
:func:`hwnas.latency.tables.load_latency_table`, the one table reader of the project.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import numpy as np
from hwnas.latency.devices.base import Device, parse_archs, resolve_space
from hwnas.latency.tables import KEY_COLUMNS, latency_tables, open_table_text

from hwnas.core.errors import UserError
from hwnas.core.resources import package_path

#: Environment variable naming the folder of the project's measured tables (see
#: :func:`measured_tables_dir`); set it empty to list none.
MEASURED_TABLES_ENV = "HWNAS_LATENCY_TABLES"
#: A measured table's file name: ``<space>_<machine>.csv.gz`` (``*_cv.csv.gz``, the variation of
#: each cell, does not match).
_MEASURED_FILE = re.compile(r"^(?P<space>[A-Za-z0-9-]+)_(?P<machine>[A-Za-z0-9]+)\.csv\.gz$")


def packaged_tables_dir() -> Path:
    """The measured tables shipped with hwnas: its package data ``hwnas/latency/data/tables``
    (``latency/data/tables/`` of the checkout), the same in a wheel and in a checkout."""
    return package_path("hwnas.latency", "data", "tables")


def measured_tables_dir() -> Path | None:
    """The folder of the project's measured latency tables: ``$HWNAS_LATENCY_TABLES`` when set
    (empty: none), else the shipped ones (:func:`packaged_tables_dir`); ``None`` when that
    folder does not exist."""
    env = os.environ.get(MEASURED_TABLES_ENV)
    if env is not None:
        path = Path(env).expanduser() if env.strip() else None
    else:
        path = packaged_tables_dir()
    return path if path is not None and path.is_dir() else None


def measured_tables() -> dict[str, list[Path]]:
    """The measured tables present: space name -> their ``<space>_<machine>.csv.gz`` files
    (sorted), for registered spaces only."""
    base = measured_tables_dir()
    if base is None:
        return {}
    from hwnas.supernet.spaces import available_spaces

    spaces = set(available_spaces())
    out: dict[str, list[Path]] = {}
    for path in sorted(base.glob("*.csv.gz")):
        m = _MEASURED_FILE.match(path.name)
        if m is not None and m["space"] in spaces and path.is_file():
            out.setdefault(m["space"], []).append(path)
    return out


@functools.lru_cache(maxsize=32)
def _table_columns(path: str, mtime: float) -> tuple[str, ...]:
    import csv

    with open_table_text(path) as fh:
        header = next(csv.reader(fh), [])
    return tuple(c.strip() for c in header if c.strip() not in KEY_COLUMNS)


@functools.lru_cache(maxsize=32)
def _table_rows(path: str, mtime: float) -> int:
    """Number of architectures (non-empty lines after the header) of a table file."""
    with open_table_text(path) as fh:
        return max(sum(1 for line in fh if line.strip()) - 1, 0)


@functools.lru_cache(maxsize=16)
def _load_table(path: str, mtime: float, space_name: str):
    """The validated table (:func:`hwnas.latency.tables.load_latency_table`, canonical strings of the
    default ``space_name`` space) and the set of its architectures; cached per file version."""
    from hwnas.latency.tables import load_latency_table
    from hwnas.supernet.spaces import get_space

    table = load_latency_table(path, space=get_space(space_name))
    return table, frozenset(table.archs)


class TableDevice(Device):
    """A device column of a latency table (see the module docstring).

    ``tables`` maps the spaces this column exists for to their CSV. Architectures are looked
    up by their canonical string; one the table does not hold is a :class:`UserError` (the
    FBNet table holds 5,000 of the 9**22 architectures). The tables measure the default
    configuration of their space, so a space with another configuration is refused.
    """

    kind = "table"

    def __init__(self, name: str, tables: dict[str, Path]) -> None:
        self.name = name
        self.tables = dict(tables)
        self.spaces = tuple(sorted(self.tables))
        self.description = table_description(name, self.tables)
        if name.startswith("fpga"):  # the tables' simulated FPGA accelerator
            self.quant_rules = "fpga"

    def latency(self, space, archs):
        space = resolve_space(space)
        self.check_space(space)
        from hwnas.supernet.spaces import get_space

        if space.config() != get_space(space.name).config():
            raise UserError(
                f"device {self.name!r} is a table of the default {space.name} network; this "
                f"space has another configuration ({space.config()})"
            )
        path = self.tables[space.name]
        table, known = _load_table(str(path), path.stat().st_mtime, space.name)
        keys = [space.to_string(a) for a in parse_archs(space, archs)]
        missing = [k for k in keys if k not in known]
        if missing:
            raise UserError(
                f"architecture {missing[0]!r} is not in the {space.name} latency table "
                f"{path.name} ({len(table)} measured architectures; {len(missing)} of the "
                f"{len(keys)} requested are missing); table device {self.name!r} only knows "
                f"measured architectures"
            )
        return table.column(self.name)[table.rows(keys)]


_TABLE_FAMILIES = (
    (("1080ti", "2080ti", "titan_rtx", "titanxp", "titanx"), "desktop NVIDIA GPU"),
    (("gold_", "silver_"), "Intel Xeon CPU"),
    (("pixel", "samsung", "essential"), "phone"),
    (("raspi4",), "Raspberry Pi 4"),
    (("eyeriss",), "Eyeriss ASIC (accelerator simulator)"),
    (("fpga",), "FPGA (accelerator simulator)"),
)


#: Runtime tags of measured table columns (``<machine>-<runtime>-<setting>``).
_TABLE_RUNTIMES = {"ort": "onnxruntime", "torch": "PyTorch eager", "ts": "TorchScript",
                   "ov": "OpenVINO", "cudagraph": "PyTorch CUDA graph replay"}


@functools.lru_cache(maxsize=16)
def _machine_text(path: str, mtime: float) -> str:
    """The measured machine in a few words, from a ``machine_<tag>.json`` of the tables."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(data, dict):
        return ""
    if data.get("gpu"):
        return str(data["gpu"])
    cpu = data.get("cpu") if isinstance(data.get("cpu"), dict) else {}
    model, cores = cpu.get("cpu_model"), cpu.get("usable_cpus") or cpu.get("logical_cpus")
    return f"{model}, {cores} cores" if model and cores else str(model or "")


def _measured_setting(column: str) -> str:
    """``onnxruntime, 1 thread`` from ``xeon-ort-1t``; ``PyTorch eager, batch 64`` from
    ``h200-torch-b64``; the column itself when it does not follow the naming."""
    parts = column.split("-")
    if len(parts) != 3 or parts[1] not in _TABLE_RUNTIMES:
        return column
    runtime, setting = _TABLE_RUNTIMES[parts[1]], parts[2]
    if re.fullmatch(r"[0-9]+t", setting):
        n = int(setting[:-1])
        return f"{runtime}, {n} thread{'s' if n != 1 else ''}"
    if re.fullmatch(r"b[0-9]+", setting):
        batch = int(setting[1:])
        return f"{runtime}, batch {batch}" + (" (ms per batch)" if batch > 1 else "")
    return f"{runtime}, {setting}"


def table_description(column: str, tables: dict[str, Path] | None = None) -> str:
    """What a table column measured (the shared tables: from the data's README, with its batch
    size if given; the measured tables: machine, runtime and setting) and, given its
    ``tables`` (space -> file), how many architectures each space's table holds."""
    measured = [p for p in (tables or {}).values() if p.name.endswith(".gz")]
    if measured:
        machine = _MEASURED_FILE.match(measured[0].name)["machine"]
        info = measured[0].parent / f"machine_{machine}.json"
        text = _machine_text(str(info), info.stat().st_mtime) if info.is_file() else ""
        head = f"{text or machine}: {_measured_setting(column)}: hwnas measured table"
    else:
        family = next((text for prefixes, text in _TABLE_FAMILIES if column.startswith(prefixes)),
                      "measured device")
        stem, _, batch = column.rpartition("_")
        if stem and batch.isdigit() and family == "desktop NVIDIA GPU":
            family += f", batch {batch}"
        head = f"{family}: HW-NAS-Bench/HELP latency table"
    if not tables:
        return head
    counts = ", ".join(f"{space} {_table_rows(str(p), p.stat().st_mtime)}"
                       for space, p in sorted(tables.items()))
    agree = []
    for space, path in sorted(tables.items()):
        found = session_agreement(path, column)
        if found is not None:
            k, rho = found
            low = ", noise-level" if reliability(k, rho) < MIN_RELIABILITY else ""
            agree.append(f"{space} {rho:.2f} ({k} sessions{low})")
    sessions = (f"; its averaged sessions rank alike at Spearman {', '.join(agree)}"
                if agree else "")
    return f"{head} ({counts} architectures{sessions})"


#: below this estimated reliability of a session-averaged column (:func:`reliability`), its
#: description calls it noise-level: it ranks architectures about as much by chance as by cost
MIN_RELIABILITY = 0.5


def reliability(sessions: int, rho: float) -> float:
    """Spearman-Brown estimate of how well the average of ``sessions`` measurement sessions
    whose pairs correlate at ``rho`` would correlate with a fresh average of as many: what the
    registered (averaged) column is worth as a ranking."""
    rho = max(float(rho), 0.0)
    return sessions * rho / (1.0 + (sessions - 1) * rho)


def session_agreement(table: Path, column: str) -> tuple[int, float] | None:
    """(sessions averaged, median Spearman between two of them) of ``column`` of a measured
    table, from the ``<space>_<machine>_sessions.json`` that ``merge_table_sessions.py`` writes
    beside it; ``None`` for a one-session table (no such file, or the column not in it)."""
    name = table.name.removesuffix(".csv.gz")
    info = table.with_name(f"{name}_sessions.json")
    if not info.is_file():
        return None
    return _session_agreements(str(info), info.stat().st_mtime).get(column)


@functools.lru_cache(maxsize=16)
def _session_agreements(path: str, mtime: float) -> dict[str, tuple[int, float]]:
    import json

    try:
        data = json.loads(Path(path).read_text())
        out = {}
        for column, entry in data["devices"].items():
            pairs = [float(v) for v in entry["spearman_between_sessions"].values()]
            if pairs:
                out[column] = (len(data["sessions"]), float(np.median(pairs)))
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _table_entries() -> dict[str, dict[str, Path]]:
    """Device column -> {space: table path}, over the tables present: the shared ones, then the
    measured ones (a column a space already has keeps its first table, with a warning)."""
    out: dict[str, dict[str, Path]] = {}
    sources = [(space, path) for space, path in latency_tables().items()]
    sources += [(space, path) for space, paths in measured_tables().items() for path in paths]
    for space, path in sources:
        for column in _table_columns(str(path), path.stat().st_mtime):
            entry = out.setdefault(column, {})
            if space in entry:
                import warnings

                warnings.warn(f"latency table {path} repeats device column {column!r} of "
                              f"{entry[space]} for space {space}; the first is used", stacklevel=2)
                continue
            entry[space] = path
    return out

