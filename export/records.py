"""What an export is asked and what it records: :class:`ExportSettings`, the per-file
:class:`FileReport`, the per-device :class:`DeviceEntry`, the per-model :class:`ModelExport`,
and the manifest written from them (``manifest.json``, ``manifest.csv``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hwnas.search.rundir import RunDir

from hwnas.core.errors import UserError
from hwnas.core.io import write_atomic

__all__ = ["DeviceEntry", "ExportSettings", "FileReport", "ModelExport", "manifest_rows",
           "write_manifest"]


@dataclass
class ExportSettings:
    """How models are exported, verified and timed.

    ``requantize``: add the output requantizations onnxruntime needs for integer kernels
    (:mod:`hwnas.export.qdq`); ``require_integer``: a ``qdq-<device>`` file with float islands fails.
    ``min_agreement``: top-1 agreement a QDQ file needs with the fake-quant model it implements;
    ``max_accuracy_drop``: with labels, the most test accuracy (points) a QDQ file may lose
    against the searched fake-quant model (``None``: report only).
    ``max_candidate_drop``: the most test accuracy (points) a file may lose on a device's
    runtime against the searched model (float or fake-quant) and still be recommended there.
    ``policy_batch``: the batch every device is timed at unless the device fixes its own
    (``cpu-ov-8t-b32``: :meth:`hwnas.latency.devices.MeasuredDevice.at_batch`); ``warmup`` / ``rounds`` / ``runs``: the paired timing of a device's
    candidates (:mod:`hwnas.export.recommend`) and of the int8-vs-float search
    (:func:`hwnas.export.device_policy.choose_float_layers`), with ``profile_runs`` / ``refine``;
    ``min_rounds``: a paired timing may stop after that many rounds once its verdict is settled
    (every candidate clearly faster or slower than FP32 over its whole range; ``>= rounds``:
    never). ``workers``: models built and verified in that many processes at once by
    :func:`hwnas.export.run_export.export_run` (0: one per two cores, at most 8); timings never
    overlap other work. ``device``: torch device of BatchNorm recalibration, of PTQ's
    calibration passes and of the PyTorch reference outputs (onnxruntime always runs on the
    CPU).

    Examples:
        >>> from hwnas.export import ExportSettings, export_run
        >>> settings = ExportSettings(int4=True)    # add ONNX INT4 weights; export_run(run_dir, settings=settings)
        >>> settings.opset, settings.int4
        (17, True)
    """

    opset: int = 17
    requantize: bool = True
    int4: bool = False
    atol: float = 1e-4
    min_agreement: float = 0.99
    max_accuracy_drop: float | None = 2.0
    require_integer: bool = True
    max_candidate_drop: float = 0.3
    warmup: int = 3
    policy_batch: int = 1
    rounds: int = 5
    runs: int = 5
    profile_runs: int = 10
    refine: int = 0
    seed: int = 0
    min_rounds: int = 2
    workers: int = 1
    device: str = "cpu"
    #: also write ``uint8/<name>.onnx`` (and ``uint8-qdq-<device>/``): uint8 NHWC images in,
    #: normalised inside the graph (needs the model's :class:`InputSpec`)
    uint8_input: bool = False
    #: pin the threads of a timing to fixed cores (as many as the device's threads) while it
    #: runs, where the platform allows (:func:`hwnas.core.affinity.pinned`)
    pin_timings: bool = True
    #: int8 weights on a grid no x86 kernel can saturate (:func:`hwnas.export.qdq.build_qdq`'s
    #: ``portable``): the files compute the same with and without VNNI
    portable: bool = True
    #: labelled test images written to ``verify/<name>.npz`` with each file's top-1 here, for
    #: ``latency/ondevice.py --verify`` on the target (0: none)
    verify_images: int = 256
    #: how PTQ rounds the weights (:data:`hwnas.quant.ptq.ROUNDINGS`): "adaround" (default),
    #: learned rounding (:mod:`hwnas.quant.adaround`) of the files with weights below 6 bits,
    #: all their layers (what W4A8 files need to stay within a point of FP32, for 1-5 CPU s
    #: per layer, 3-10x PTQ's CPU time on CIFAR-10 models; benchmarks/quant_peers.md, Session
    #: 37, and benchmarks/adaround_steps.md, Session 38), W6/W8 files rounded to nearest
    #: (there learning moved -0.11 to +0.17 point); "nearest", every file as the search scored
    #: it; "adaround-all", all files learned. Each file's
    #: ``rounding`` and ``adaround_layers`` say what it got
    rounding: str = "adaround"

    def validate(self) -> None:
        for name in ("opset", "policy_batch",
                     "rounds", "runs", "profile_runs", "min_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"export setting {name} must be a positive integer, got {value!r}")
        if self.opset < 17:
            raise UserError(f"export opset must be >= 17, got {self.opset}")
        if self.max_accuracy_drop is not None and not self.max_accuracy_drop >= 0:
            raise UserError(f"max_accuracy_drop must be >= 0 points, got {self.max_accuracy_drop}")
        if not 0.0 <= self.min_agreement <= 1.0:
            raise UserError(f"min_agreement must be a fraction in [0, 1], got {self.min_agreement}")
        if not self.max_candidate_drop >= 0:
            raise UserError(f"max_candidate_drop must be >= 0 points, got {self.max_candidate_drop}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise UserError(f"export setting warmup must be an integer >= 0, got {self.warmup!r}")
        if not self.atol >= 0:
            raise UserError(f"atol must be >= 0, got {self.atol}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise UserError(f"export setting workers must be an integer >= 0 (0: automatic), "
                            f"got {self.workers!r}")
        for flag in ("pin_timings", "portable"):
            if not isinstance(getattr(self, flag), bool):
                raise UserError(f"export setting {flag} must be true or false, got "
                                f"{getattr(self, flag)!r}")
        if isinstance(self.verify_images, bool) or not isinstance(self.verify_images, int) \
                or self.verify_images < 0:
            raise UserError(f"export setting verify_images must be an integer >= 0 (0: none), "
                            f"got {self.verify_images!r}")
        from hwnas.quant.ptq import ROUNDINGS

        if self.rounding not in ROUNDINGS:
            raise UserError(f"export setting rounding {self.rounding!r}; expected one of "
                            f"{list(ROUNDINGS)}")
        from hwnas.supernet.train import check_torch_device

        check_torch_device(str(self.device))  # one line for a typo or a missing GPU


@dataclass
class FileReport:
    """Verification and timing of one ONNX file (``path`` relative to the export directory)."""

    path: str
    precision: str  # fp32 | qdq | qdq-int4
    target: str  # "" (as searched) or the device it was tuned for
    status: str = "failed"  # ok | failed
    error: str = ""
    written: bool = False
    checker: bool = False
    max_abs_diff: float | None = None
    top1_agreement: float | None = None
    reference: str = ""
    searched_agreement: float | None = None
    searched_max_abs_diff: float | None = None
    test_accuracy: float | None = None
    searched_test_accuracy: float | None = None
    n_images: int = 0
    quantized_layers: int = 0
    integer_layers: int = 0
    #: attention products of two activations checked to run as integer kernels
    integer_products: int = 0
    float_islands: list[str] = field(default_factory=list)
    float_layers_for_speed: list[str] = field(default_factory=list)
    #: why a QDQ file passed below ``min_agreement`` (near-tied logits; ``divergence_of``), or
    #: an FP32 file over ``atol`` (float32 rounding; ``verify.float32_rounding``)
    parity_note: str = ""
    #: an FP32 file over ``atol``: max |PyTorch float32 - float64| logits on the test images
    float32_error: float | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)  # device -> paired median
    size_bytes: int = 0
    #: where the checks above ran: CPU, its ISA flags, runtime and version
    verified_on: dict[str, Any] = field(default_factory=dict)
    #: QDQ files: the worst 16-bit pair sum of its integer layers (:mod:`hwnas.export.qdq.int16`)
    int16: dict[str, Any] = field(default_factory=dict)
    #: on which x86 CPUs the file computes what was verified: ``any`` or the ISA it needs
    isa_condition: str = ""
    #: QDQ files: how their weights were rounded, "adaround" (some layers learned) or
    #: "nearest" (``ExportSettings.rounding``; "" for an FP32 file)
    rounding: str = ""
    #: QDQ files: the layers whose weights' rounding was learned (AdaRound,
    #: ``ExportSettings.rounding``); the others are rounded to nearest
    adaround_layers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class DeviceEntry:
    """What the manifest says about one device: predicted latency, and - where it can be
    measured here - which file to deploy with which runtime settings.

    ``fp32_ms``, ``recommended_ms``, ``quantized_ms`` (the fastest verified quantized
    candidate), ``speedup`` and every entry of ``candidates`` come from one paired measurement
    (:mod:`hwnas.export.recommend`), so the figures beside a recommendation never contradict
    it. ``runtime``, ``threads`` and ``batch`` record the measured device it was timed as."""

    device: str
    predicted_latency_ms: float | None
    measured: bool
    runtime: str | None = None
    threads: int | None = None
    batch: int | None = None
    fp32_ms: float | None = None
    recommended_ms: float | None = None
    quantized_ms: float | None = None
    quantized_faster: bool | None = None
    speedup: float | None = None
    recommended: str | None = None
    precision: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    float_layers: list[str] = field(default_factory=list)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    rounds_timed: int | None = None
    busy: bool = False  # timed while other work competed for the cores: the note says so
    note: str = ""
    #: where the candidates were verified and timed: CPU, ISA flags, runtime and version
    verified_on: dict[str, Any] = field(default_factory=dict)
    #: the recommended file's ISA condition (``any``, or the CPUs on which it holds)
    isa_condition: str = ""


@dataclass
class ModelExport:
    """The outcome for one model: its files and per-device verdicts."""

    name: str
    arch: str | None
    status: str = "ok"  # ok | failed
    errors: list[str] = field(default_factory=list)
    files: list[FileReport] = field(default_factory=list)
    devices: list[DeviceEntry] = field(default_factory=list)
    accuracy: Any = None
    policy: dict | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def fail(self, message: str) -> None:
        self.status = "failed"
        self.errors.append(message)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def manifest_rows(models: Iterable[ModelExport]) -> list[dict[str, Any]]:
    """One flat row per file (the manifest CSV), devices as ``<field>:<device>`` columns."""
    rows = []
    for m in models:
        for f in m.files:
            row: dict[str, Any] = {"model": m.name, "arch": m.arch or "", "model_status": m.status,
                                   "accuracy": m.accuracy, **{k: v for k, v in asdict(f).items()}}
            row["float_islands"] = "; ".join(f.float_islands)
            row["float_layers_for_speed"] = " ".join(f.float_layers_for_speed)
            row["adaround_layers"] = " ".join(f.adaround_layers)
            del row["latency_ms"]
            for d in m.devices:
                row[f"predicted_ms:{d.device}"] = d.predicted_latency_ms
                row[f"latency_ms:{d.device}"] = f.latency_ms.get(d.device)
                row[f"quantized_faster:{d.device}"] = d.quantized_faster
                row[f"recommended:{d.device}"] = d.recommended
                row[f"settings:{d.device}"] = (" ".join(f"{k}={v}" for k, v in d.settings.items())
                                               if d.recommended == f.path else None)
            rows.append(row)
        if not m.files:
            rows.append({"model": m.name, "arch": m.arch or "", "model_status": m.status,
                         "error": "; ".join(m.errors)})
    return rows


def write_manifest(out_dir: str | Path, models: list[ModelExport], info: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` (everything) and ``manifest.csv`` (one row per file) atomically."""
    import csv
    import io

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"format": "hwnas-export-manifest-1", **dict(info),
           "models": [m.as_dict() for m in models],
           "failed": [m.name for m in models if m.status != "ok"]}
    write_atomic(out_dir / RunDir.MANIFEST, (json.dumps(doc, indent=1, default=str) + "\n").encode())
    rows = manifest_rows(models)
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    write_atomic(out_dir / RunDir.MANIFEST_CSV, buf.getvalue().encode())
    return out_dir / RunDir.MANIFEST
