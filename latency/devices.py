"""Devices: a name, a kind, and a way to give the latency of architectures of a search space.

Four kinds (:data:`KINDS`):

* ``measured`` - timed here on this CPU, the name saying runtime, threads and batch:
  ``cpu-ort-1t`` (onnxruntime, one thread), ``cpu-ort-all`` (every core), and with OpenVINO
  installed ``cpu-ov-1t`` and ``cpu-ov-<cores>t``; any ``cpu-ort-<N>t`` / ``cpu-ov-<N>t``, with
  ``-b<B>`` for batch B (``cpu-ov-8t-b32``), is built on request. ``cuda-ort`` / ``cuda-torch``
  / ``cuda-graph`` only when a GPU is present. The model of an architecture comes from ``model_fn(arch)`` (ONNX bytes or a torch
  module) or, by default, from a freshly built supernet of the space (latency does not depend
  on weights).
* ``table`` - a column of a latency table: the measured latency of every architecture the table
  holds, for the table's space (default configuration) only; an architecture the table lacks is
  refused. Named by the column. Two sources: the shared HW-NAS-Bench/HELP tables
  (``nb201_latency_ms.csv``, ``fbnet_latency_ms.csv``: ``pixel3``, ``fpga``, ``1080ti_32`` ...)
  and the project's own measured tables (:func:`measured_tables_dir`, written by
  ``benchmarks/measure_latency_tables.py``, shipped as package data: ``<space>_<machine>.csv.gz``, columns
  ``<machine>-<runtime>-<threads or batch>`` such as ``xeon-ort-1t`` or ``h200-cudagraph-b64``),
  where one device column covers every space it was measured on. A table averaged over several
  sessions (``merge_table_sessions.py``) has a ``_sessions.json`` beside it; the description
  then says how alike the sessions ranked the architectures (:func:`session_agreement`).
* ``estimated`` - an analytical estimator of :mod:`hwnas.latency.estimators` (``fpga-zcu102-est``,
  ``edgetpu-est``, ``jetson-orin-nano-est`` ...); any space, from its layer list.
* ``adapted`` - a device profile (:mod:`hwnas.latency.profiles`): a predictor adapted to a user's own
  measurements (``hwnas latency adapt``), for the space it was adapted on.

:func:`get_device` finds a device by name (optionally checking that it covers a space),
:func:`available_devices` lists them. Importing this module does not import torch (only
measuring with the default supernet does) nor pandas. Tables are read and validated by
:func:`hwnas.latency.tables.load_latency_table`, the one table reader of the project.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hwnas.latency.tables import KEY_COLUMNS, open_table_text
from hwnas.supernet.space import SearchSpace

from hwnas.core.errors import UserError
from hwnas.core.paths import shared_data_candidate
from hwnas.core.resources import package_path

__all__ = [
    "KINDS",
    "Device",
    "DeviceInfo",
    "MeasuredDevice",
    "TableDevice",
    "EstimatedDevice",
    "AdaptedDevice",
    "available_devices",
    "device_names",
    "get_device",
    "register_device",
    "builtin_device_names",
    "latency_tables",
    "measured_tables",
    "measured_tables_dir",
    "packaged_tables_dir",
    "parse_cpu_device",
    "reliability",
    "session_agreement",
    "resolve_space",
]

#: The kinds of device, in listing order.
KINDS = ("measured", "table", "estimated", "adapted")

#: Latency tables of the shared data: space name -> file name under ``<shared data>/latency``.
TABLE_FILES = {"nb201": "nb201_latency_ms.csv", "fbnet": "fbnet_latency_ms.csv"}

#: Environment variable naming the folder of the project's measured tables (see
#: :func:`measured_tables_dir`); set it empty to list none.
MEASURED_TABLES_ENV = "HWNAS_LATENCY_TABLES"
#: A measured table's file name: ``<space>_<machine>.csv.gz`` (``*_cv.csv.gz``, the variation of
#: each cell, does not match).
_MEASURED_FILE = re.compile(r"^(?P<space>[A-Za-z0-9-]+)_(?P<machine>[A-Za-z0-9]+)\.csv\.gz$")

ArchLike = Any  # an architecture of the space, or its canonical string


def resolve_space(space: SearchSpace | str) -> SearchSpace:
    """A space object from a space or a registered space name (default configuration)."""
    if isinstance(space, SearchSpace):
        return space
    if isinstance(space, str):
        from hwnas.supernet.spaces import get_space

        return get_space(space)
    raise UserError(f"expected a search space or a space name, got {type(space).__name__}")


def _space_name(space: SearchSpace | str | None) -> str | None:
    if space is None or isinstance(space, str):
        return space
    return space.name


# --------------------------------------------------------------------------------------------
# the interface
# --------------------------------------------------------------------------------------------


class Device(ABC):
    """A device: ``name``, ``kind`` (one of :data:`KINDS`), the spaces it covers (``None``:
    any space) and :meth:`latency`.

    Examples:
        >>> from hwnas.latency import get_device
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> device = get_device("edgetpu-est")          # a Device
        >>> device.kind, device.supports(space)
        ('estimated', True)
        >>> ms = device.latency(space, [space.smallest(), space.largest()])
        >>> bool(ms[0] < ms[1])
        True
    """

    name: str
    kind: str
    description: str = ""
    #: Names of the spaces this device has latencies for; ``None`` means every space.
    spaces: tuple[str, ...] | None = None
    #: Name of the device's quantization rules (:data:`hwnas.quant.device_rules.DEVICE_RULES`):
    #: which precisions run on it, what falls back, how int8 changes the speed. The rules are
    #: data of ``quant``; a device only names them, so latency and quant stay side by side.
    quant_rules: str = "cpu-ort"
    #: Measured float-time / int8-time per layer shape on this device
    #: (:func:`hwnas.quant.device_rules.layer_key`), e.g. from an export's
    #: ``int8_speedup_<device>.json``; ``None`` when nothing was measured.
    int8_speedup: dict[str, float] | None = None

    def supports(self, space: SearchSpace | str) -> bool:
        """Whether this device gives latencies for ``space`` (an object or a name)."""
        return self.spaces is None or _space_name(space) in self.spaces

    def check_space(self, space: SearchSpace | str) -> None:
        """Raise :class:`UserError` unless this device covers ``space``."""
        if not self.supports(space):
            raise UserError(
                f"device {self.name!r} ({self.kind}) has no latency for space "
                f"{_space_name(space)!r}; it covers {', '.join(self.spaces or ())}"
            )

    @abstractmethod
    def latency(self, space: SearchSpace | str, archs: Sequence[ArchLike]) -> np.ndarray:
        """Latency in ms (batch 1) of each architecture (object or canonical string)."""

    def latency_with_std(
        self, space: SearchSpace | str, archs: Sequence[ArchLike]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Latency and, where the device knows it, its standard deviation (else ``None``)."""
        return self.latency(space, archs), None

    def info(self) -> DeviceInfo:
        return DeviceInfo(self.name, self.kind, self.spaces, self.description)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, kind={self.kind!r})"


@dataclass(frozen=True)
class DeviceInfo:
    """What :func:`available_devices` lists: a device without building it."""

    name: str
    kind: str
    spaces: tuple[str, ...] | None
    description: str

    @property
    def spaces_text(self) -> str:
        return "any" if self.spaces is None else ",".join(self.spaces)


def _parse_all(space: SearchSpace, archs: Sequence[ArchLike]) -> list:
    """Every architecture validated in ``space`` (strings parsed); the error names the index."""
    if isinstance(archs, (str, bytes)):
        raise UserError("archs must be a list of architectures, got a single string")
    out = []
    for i, arch in enumerate(archs):
        try:
            out.append(space.parse(arch))
        except UserError as exc:
            raise UserError(f"architecture #{i}: {exc}") from None
    return out


# --------------------------------------------------------------------------------------------
# measured
# --------------------------------------------------------------------------------------------


class MeasuredDevice(Device):
    """Latency measured here: on the CPU (``provider="cpu"``) with ``runtime`` onnxruntime or
    openvino (FP32: OpenVINO's ``f32`` precision hint), onnxruntime CUDA (``"cuda-ort"``) or
    PyTorch CUDA (``"cuda-torch"``).

    ``model_fn(arch)`` returns the model of an architecture as ONNX bytes or a torch module;
    without it, the subnet is extracted from a fresh supernet of the space (built once per
    space; random weights time the same as trained ones). Each architecture is timed
    ``repeats`` times after ``warmup`` runs on a batch of ``batch`` inputs; the median is the
    latency, ``cv × mean`` its std. ``cuda_graph`` (PyTorch CUDA only): time replays of a
    captured CUDA graph of the forward pass, i.e. the GPU's own time without the Python/launch
    overhead of eager PyTorch (what a compiled deployment approaches).
    """

    kind = "measured"

    def __init__(self, name: str, *, threads: int, provider: str = "cpu",
                 model_fn: Callable[[Any], Any] | None = None, repeats: int = 30,
                 warmup: int = 5, batch: int = 1, cuda_graph: bool = False,
                 runtime: str = "onnxruntime", description: str = "") -> None:
        from hwnas.latency.onnx_measure import RUNTIMES

        if runtime not in RUNTIMES:
            raise UserError(f"device {name!r}: runtime {runtime!r}; expected one of "
                            f"{', '.join(RUNTIMES)}")
        if runtime != "onnxruntime" and provider != "cpu":
            raise UserError(f"device {name!r}: runtime {runtime!r} runs on provider 'cpu', got "
                            f"{provider!r}")
        self.runtime = runtime
        if int(batch) < 1:
            raise UserError(f"device {name!r}: batch must be >= 1, got {batch}")
        if cuda_graph and provider != "cuda-torch":
            raise UserError(f"device {name!r}: cuda_graph needs provider 'cuda-torch', got "
                            f"{provider!r}")
        self.cuda_graph = bool(cuda_graph)
        self.name = name
        self.threads = threads
        self.batch = int(batch)
        self.provider = provider
        self.model_fn = model_fn
        self.repeats = repeats
        self.warmup = warmup
        self.description = description
        self._supernets: dict[tuple, Any] = {}

    def _model(self, space: SearchSpace, arch: Any) -> Any:
        if self.model_fn is not None:
            return self.model_fn(arch)
        key = (space.name, repr(sorted(space.config().items())))
        if key not in self._supernets:
            self._supernets[key] = space.build_supernet().eval()
        return self._supernets[key].extract(arch)

    def _onnx(self, space: SearchSpace, model: Any) -> bytes:
        if isinstance(model, (bytes, bytearray, memoryview)):
            return bytes(model)
        import torch
        from hwnas.supernet.onnx import onnx_bytes

        if not isinstance(model, torch.nn.Module):
            raise UserError(
                f"model_fn must return ONNX bytes or a torch.nn.Module, got {type(model).__name__}"
            )
        return onnx_bytes(model, torch.zeros(1, *space.input_shape))

    def latency_with_std(self, space, archs):
        space = resolve_space(space)
        parsed = _parse_all(space, archs)
        med = np.empty(len(parsed))
        std = np.empty(len(parsed))
        for i, arch in enumerate(parsed):
            model = self._model(space, arch)
            if self.provider == "cuda-torch":
                med[i], std[i] = self._time_torch_cuda(space, model)
                continue
            stats = self._time_ort(self._onnx(space, model))
            med[i], std[i] = stats.median_ms, stats.cv * stats.mean_ms
        return med, std

    def latency(self, space, archs):
        return self.latency_with_std(space, archs)[0]

    def _time_ort(self, model: bytes):
        from hwnas.latency.onnx_measure import measure_onnx

        if self.provider == "cpu":
            return measure_onnx(model, threads=self.threads, repeats=self.repeats,
                                warmup=self.warmup, batch=self.batch, runtime=self.runtime)
        return _measure_ort_cuda(model, repeats=self.repeats, warmup=self.warmup,
                                 batch=self.batch)

    def _time_torch_cuda(self, space: SearchSpace, model: Any) -> tuple[float, float]:
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"device {self.name!r} needs a CUDA GPU, and torch sees none")
        if not isinstance(model, torch.nn.Module):
            raise UserError(f"device {self.name!r} times torch modules; model_fn returned bytes")
        model = model.cuda().eval()
        x = torch.zeros(self.batch, *space.input_shape, device="cuda")
        times = []
        with torch.no_grad():
            run = lambda: model(x)  # noqa: E731
            if self.cuda_graph:  # warm up on a side stream, then capture (PyTorch's recipe)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        model(x)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model(x)
                run = graph.replay
            for _ in range(self.warmup):
                run()
            torch.cuda.synchronize()
            for _ in range(self.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
        t = np.asarray(times)
        return float(np.median(t)), float(t.std())


def _measure_ort_cuda(model: bytes, *, repeats: int, warmup: int, batch: int = 1):
    """Median/cv timing of ONNX bytes on onnxruntime's CUDA provider (same statistics as
    :func:`hwnas.latency.onnx_measure.measure_onnx`)."""
    import time

    import onnxruntime as ort
    from hwnas.latency.onnx_measure import LatencyStats, random_input

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model, sess_options=opts, providers=["CUDAExecutionProvider"])
    feeds = random_input(session, batch=batch)
    for _ in range(warmup):
        session.run(None, feeds)
    times = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times[i] = (time.perf_counter() - start) * 1e3
    mean = float(times.mean())
    return LatencyStats(float(np.median(times)), float(np.percentile(times, 95)), mean,
                        float(times.std() / mean), repeats, warmup, 1, batch)


def _gpu_present() -> bool:
    """An NVIDIA driver is loaded (checked without importing torch)."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists()


def _ort_cuda_available() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


#: Short names of the CPU runtimes in device names.
RUNTIME_TAGS = {"ort": "onnxruntime", "ov": "openvino"}
_CPU_NAME = re.compile(r"^cpu-(?P<rt>ort|ov)-(?P<threads>[1-9][0-9]*)t(?:-b(?P<batch>[1-9][0-9]*))?$")


def _cpu_device(name: str, tag: str, threads: int, batch: int = 1
                ) -> tuple[Callable[..., Device], str]:
    runtime = RUNTIME_TAGS[tag]
    text = f"{runtime} on this CPU, {threads} thread{'s' if threads > 1 else ''}" + (
        f", batch {batch}" if batch > 1 else "")
    return (functools.partial(MeasuredDevice, name, threads=threads, batch=batch,
                              runtime=runtime, description=text), text)


def parse_cpu_device(name: str) -> tuple[str, int, int] | None:
    """``(runtime, threads, batch)`` of a CPU device name ``cpu-<ort|ov>-<N>t[-b<B>]``
    (``cpu-ort-all``: onnxruntime on every core), else ``None``."""
    if name == "cpu-ort-all":
        return "onnxruntime", os.cpu_count() or 1, 1
    m = _CPU_NAME.match(name)
    if m is None:
        return None
    return RUNTIME_TAGS[m["rt"]], int(m["threads"]), int(m["batch"] or 1)


def _measured_factories() -> dict[str, tuple[Callable[..., Device], str]]:
    from hwnas.latency.onnx_measure import openvino_available

    cores = os.cpu_count() or 1
    out: dict[str, tuple[Callable[..., Device], str]] = {
        "cpu-ort-1t": _cpu_device("cpu-ort-1t", "ort", 1),
        "cpu-ort-all": (functools.partial(MeasuredDevice, "cpu-ort-all", threads=cores,
                                          description=f"onnxruntime on this CPU, {cores} threads"),
                        f"onnxruntime on this CPU, all {cores} threads"),
    }
    if openvino_available():
        for threads in dict.fromkeys((1, cores)):
            out[f"cpu-ov-{threads}t"] = _cpu_device(f"cpu-ov-{threads}t", "ov", threads)
    if _gpu_present():
        out["cuda-torch"] = (functools.partial(MeasuredDevice, "cuda-torch", threads=1,
                                               provider="cuda-torch",
                                               description="PyTorch on the CUDA GPU, batch 1"),
                             "PyTorch on the CUDA GPU, batch 1")
        out["cuda-graph"] = (functools.partial(MeasuredDevice, "cuda-graph", threads=1,
                                               provider="cuda-torch", cuda_graph=True,
                                               description="PyTorch CUDA graph replay, batch 1"),
                             "PyTorch on the CUDA GPU as a replayed CUDA graph (the GPU's own "
                             "time, no launch overhead), batch 1")
    if _ort_cuda_available():
        out["cuda-ort"] = (functools.partial(MeasuredDevice, "cuda-ort", threads=1,
                                             provider="cuda-ort",
                                             description="onnxruntime CUDA provider, batch 1"),
                           "onnxruntime CUDA provider, batch 1")
    return out


# --------------------------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------------------------


def _latency_data_dir() -> Path:
    """``<shared data>/latency``: ``$HWNAS_SHARED_DATA/latency`` when set, else the default
    beside the checkout (:mod:`hwnas.core.paths`, torch-free)."""
    return shared_data_candidate()[0] / "latency"


def latency_tables() -> dict[str, Path]:
    """The latency tables present: space name -> CSV path."""
    base = _latency_data_dir()
    return {space: base / f for space, f in TABLE_FILES.items() if (base / f).is_file()}


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
        keys = [space.to_string(a) for a in _parse_all(space, archs)]
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


# --------------------------------------------------------------------------------------------
# estimated
# --------------------------------------------------------------------------------------------


class EstimatedDevice(Device):
    """An analytical estimator (:mod:`hwnas.latency.estimators`) applied to the space's layer list."""

    kind = "estimated"

    def __init__(self, estimator: Any, name: str | None = None) -> None:
        self.estimator = estimator
        self.name = name or estimator.name
        self.description = estimator.description
        self.quant_rules = getattr(estimator, "quant_rules", Device.quant_rules)

    def latency(self, space, archs):
        space = resolve_space(space)
        return self.estimator.estimate_many([space.layers(a) for a in _parse_all(space, archs)])


# --------------------------------------------------------------------------------------------
# adapted
# --------------------------------------------------------------------------------------------


class AdaptedDevice(Device):
    """A device profile (:mod:`hwnas.latency.profiles`): a predictor adapted to the user's
    measurements, for the space it was adapted on (its configuration included)."""

    kind = "adapted"

    def __init__(self, profile: Any) -> None:
        self.profile = profile
        self.name = profile.name
        self.spaces = (profile.space,)
        self.description = (f"{profile.predictor} predictor adapted to {profile.n_measurements} "
                            f"measurements ({profile.created[:10]})")
        self._predictor = None

    @property
    def predictor(self):
        if self._predictor is None:
            from hwnas.latency.profiles import load_profile_predictor

            self._predictor = load_profile_predictor(self.profile)
        return self._predictor

    def _space_and_archs(self, space, archs):
        space = resolve_space(space)
        self.check_space(space)
        if space.config() != self.profile.space_config:
            raise UserError(
                f"device {self.name!r} was adapted on {self.profile.space} with configuration "
                f"{self.profile.space_config}; this space has {space.config()}"
            )
        return space, _parse_all(space, archs)

    def latency(self, space, archs):
        _, parsed = self._space_and_archs(space, archs)
        return np.asarray(self.predictor.predict(parsed), dtype=np.float64)

    def latency_with_std(self, space, archs):
        _, parsed = self._space_and_archs(space, archs)
        mean, std = self.predictor.predict_with_std(parsed)
        return (np.asarray(mean, dtype=np.float64),
                None if std is None else np.asarray(std, dtype=np.float64))


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

#: Devices registered by users: name -> (factory(**options), kind, spaces, description).
_USER: dict[str, tuple[Callable[..., Device], str, tuple[str, ...] | None, str]] = {}


def register_device(name: str, factory: Callable[..., Device], *, kind: str,
                    spaces: tuple[str, ...] | None = None, description: str = "") -> None:
    """Make a device available by name. Built-in names (and profiles) cannot be shadowed."""
    if kind not in KINDS:
        raise UserError(f"device kind {kind!r}; expected one of {list(KINDS)}")
    if name in builtin_device_names():
        raise UserError(f"device name {name!r} is taken by a built-in device")
    _USER[name] = (factory, kind, spaces, description)


def builtin_device_names() -> set[str]:
    """Names of the measured, table and estimated devices (profiles may not take them)."""
    from hwnas.latency.estimators import available_estimators

    return set(_measured_factories()) | set(_table_entries()) | set(available_estimators())


def _all_infos() -> list[DeviceInfo]:
    from hwnas.latency.estimators import available_estimators, get_estimator

    infos: list[DeviceInfo] = []
    for name, (_, description) in _measured_factories().items():
        infos.append(DeviceInfo(name, "measured", None, description))
    for name, tables in sorted(_table_entries().items()):
        infos.append(DeviceInfo(name, "table", tuple(sorted(tables)),
                                table_description(name, tables)))
    for name in available_estimators():
        infos.append(DeviceInfo(name, "estimated", None, get_estimator(name).description))
    taken = {i.name for i in infos}
    for name, (_, kind, spaces, description) in sorted(_USER.items()):
        if name not in taken:
            infos.append(DeviceInfo(name, kind, spaces, description))
            taken.add(name)
    from hwnas.latency.profiles import list_profiles

    for profile in list_profiles():
        if profile.name not in taken:
            infos.append(AdaptedDevice(profile).info())
    return infos


def available_devices(space: SearchSpace | str | None = None) -> list[DeviceInfo]:
    """Every device (optionally: those covering ``space``), in :data:`KINDS` order then name.

    Examples:
        >>> from hwnas.latency import available_devices
        >>> infos = available_devices("nb201")
        >>> sorted({i.kind for i in infos}) >= ['estimated', 'measured', 'table']
        True
        >>> next(i for i in infos if i.name == "xeon-ort-1t").kind   # a measured table, shipped
        'table'
    """
    name = _space_name(space)
    infos = [i for i in _all_infos() if name is None or i.spaces is None or name in i.spaces]
    return sorted(infos, key=lambda i: (KINDS.index(i.kind), i.name))


def device_names(space: SearchSpace | str | None = None) -> list[str]:
    return [i.name for i in available_devices(space)]


def get_device(name: str, space: SearchSpace | str | None = None, **options: Any) -> Device:
    """The device ``name``; with ``space``, also check that it covers that space.

    ``options`` go to the device's constructor (e.g. ``model_fn``, ``repeats`` and ``warmup``
    for measured devices). Unknown names raise :class:`UserError` listing close names.

    Examples:
        >>> from hwnas.latency import get_device
        >>> get_device("cpu-ort-1t").kind, get_device("xeon-ort-1t", "nb201").kind
        ('measured', 'table')
    """
    if not isinstance(name, str) or not name:
        raise UserError(f"device name must be a non-empty string, got {name!r}")
    device = _build(name, options)
    if device is None:
        known = device_names()
        close = difflib.get_close_matches(name, known, n=4, cutoff=0.5)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        raise UserError(
            f"unknown device {name!r}; {hint}see 'hwnas latency devices' for the "
            f"{len(known)} available devices"
        )
    if space is not None:
        device.check_space(space)
    return device


def _build(name: str, options: dict[str, Any]) -> Device | None:
    measured = _measured_factories()
    factory = measured[name][0] if name in measured else _USER[name][0] if name in _USER else None
    cpu = parse_cpu_device(name) if factory is None else None
    if cpu is not None:  # any thread count and batch, on request
        if cpu[0] == "openvino":
            from hwnas.latency.onnx_measure import openvino_available

            if not openvino_available():
                raise UserError(f"device {name!r} needs OpenVINO: pip install 'hwnas[openvino]'")
        factory = _cpu_device(name, name.split("-")[1], cpu[1], cpu[2])[0]
    if factory is not None:
        try:
            return factory(**options)
        except TypeError as exc:  # an option the device does not take
            raise UserError(f"device {name!r}: bad option(s) {sorted(options)}: {exc}") from None
    tables = _table_entries()
    from hwnas.latency.estimators import available_estimators, get_estimator
    from hwnas.latency.profiles import find_profile

    device: Device | None = None
    if name in tables:
        device = TableDevice(name, tables[name])
    elif name in available_estimators():
        device = EstimatedDevice(get_estimator(name))
    else:
        profile = find_profile(name)
        device = AdaptedDevice(profile) if profile is not None else None
    if device is not None and options:
        raise UserError(f"device {name!r} ({device.kind}) takes no options, got {sorted(options)}")
    return device

