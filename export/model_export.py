"""Export one model: FP32 ONNX, QDQ ONNX of its policy, per-device QDQ; each verified, and the
fastest verified one recommended per measured device.

:func:`export_model` is the model-level API (the run-directory glue, :mod:`hwnas.export.run_export`,
calls it once per Pareto-optimal model). For a float ``nn.Module`` (BatchNorm not folded), an
optional :class:`hwnas.quant.policy.QuantPolicy` and calibration batches it writes, under ``out_dir``:

``<name>.onnx``                FP32 (BatchNorm folded, opset 17, dynamic batch)
``qdq/<name>.onnx``            QDQ of the searched policy, *exact*: Q/DQ only where the
                               fake-quant model quantizes (layer inputs, weights). onnxruntime
                               runs a conv as an integer kernel only when its output is
                               requantized, so convs followed by h-swish, residual adds or SE stay
                               float islands here (reported by name; usually slower than FP32)
``qdq-<device>/<name>.onnx``   for each onnxruntime device measurable here (``cpu-ort-*``): the deployment
                               form - the layers where int8 loses on that device kept float
                               (:mod:`hwnas.export.device_policy`), 8-bit requantization after the other
                               integer convs where onnxruntime needs it, no float islands
``int4/<name>.onnx``           (``int4=True``, weights of <= 4 bits) the exact form with real ONNX
                               INT4 weights (opset 21), for size
``uint8[-qdq-<device>]/<name>.onnx``  (``uint8_input=True``) the FP32 and per-device files
                               taking uint8 NHWC images, normalised inside the graph

Every file is self-describing (:func:`hwnas.export.onnx_export.describe_model`): its metadata
holds the input's name, shape, layout and dtype, the mean/std and class names of
``input_spec``, the arch, policy, accuracy and the hwnas version.

FP32 files sit at the top so that the on-device script (``python -m hwnas.latency.ondevice
OUT_DIR``) and ``hwnas latency measure`` (which read the ``*.onnx`` of one directory and key rows
by the ``arch`` metadata) time the float architectures the latency predictors model;
``ondevice.py OUT_DIR/qdq-<device>`` times the quantized ones.

Every file is verified before it is written (atomically; a file that fails is not written):
``onnx.checker``; FP32: max |ONNX - PyTorch| <= ``atol`` (1e-4). QDQ: top-1 agreement >=
``min_agreement`` (99 %) with the PyTorch fake-quant model as the file computes it under
onnxruntime - the fake-quant model of the file's policy with its biases rounded to int32 on
``input_scale * weight_scale`` (onnxruntime's integer kernels do that even to a float bias) and,
for ``qdq-<device>`` files, the requantization points. This is exact up to float rounding
(max difference ~1e-7 on small nets), so any export error shows. The deviation from the
*searched* fake-quant model that integer execution brings (int32 biases, requantization, layers
kept float) is reported - top-1 agreement, max difference and, with labels, both test
accuracies - and a file losing more than ``max_accuracy_drop`` points of test accuracy fails.
After onnxruntime's optimizations every integer layer of a ``qdq-<device>`` file must run as an
integer kernel, and so must every quantized attention product of two activations (Q·Kᵀ,
attention × V: MatMulIntegerToFloat / QLinearMatMul; ``integer_products`` in the report);
float islands are reported by name for every file.

Per device measurable here (onnxruntime or OpenVINO, see :mod:`hwnas.export.recommend`) the
files are candidates - on OpenVINO also under its bf16/f16 precision hints - verified again on
that runtime and timed together in one paired measurement; the manifest recommends the fastest
verified one with the runtime settings it needs, and every time it shows for the device (and
for each file on it) comes from that measurement.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from hwnas.export.device_policy import DevicePolicy, choose_float_layers
from hwnas.export.onnx_export import (
    InputSpec,
    describe_model,
    divergence_of,
    parity_of,
    with_uint8_input,
)
from hwnas.export.parallel import checkpoint, timing_slot
from hwnas.export.passes import ImagePasses, StageClock
from hwnas.export.ort_profile import LayerIndex, integer_kernel_check
from hwnas.export.qdq.build import EXPORT_FORMAT, QdqBuild, build_qdq, float_proto
from hwnas.export.qdq.names import map_layer_nodes
from hwnas.export.recommend import CandidateFile, Recommendation, recommend_file
from hwnas.latency.devices import Device, MeasuredDevice, get_device
from hwnas.quant.policy import QuantPolicy
from hwnas.quant.ptq import PTQConfig
from hwnas.search.rundir import RunDir
from torch import nn

from hwnas.core.errors import UserError, WriteError
from hwnas.core.io import first_line, write_atomic

__all__ = ["DeviceEntry", "ExportSettings", "FileReport", "ModelExport", "export_model",
           "manifest_rows", "measurable_devices", "write_manifest"]


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
    #: why a QDQ file passed below ``min_agreement`` (near-tied logits; ``divergence_of``)
    parity_note: str = ""
    latency_ms: dict[str, float] = field(default_factory=dict)  # device -> paired median
    size_bytes: int = 0
    #: where the checks above ran: CPU, its ISA flags, runtime and version
    verified_on: dict[str, Any] = field(default_factory=dict)
    #: QDQ files: the worst 16-bit pair sum of its integer layers (:mod:`hwnas.export.qdq.int16`)
    int16: dict[str, Any] = field(default_factory=dict)
    #: on which x86 CPUs the file computes what was verified: ``any`` or the ISA it needs
    isa_condition: str = ""

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


def measurable_devices(devices: Iterable[str | Device]) -> dict[str, MeasuredDevice]:
    """``{name: device}`` of the devices that run on this CPU (``cpu-ort-*``, and
    ``cpu-ov-*`` with OpenVINO installed), which the export can time and tune for: where a
    device name becomes the Device the export carries (names it cannot build are left out)."""
    out = {}
    for device in devices:
        if not isinstance(device, Device):
            try:
                device = get_device(str(device))
            except (UserError, ImportError):
                continue
        if isinstance(device, MeasuredDevice) and device.provider == "cpu":
            out[device.name] = device
    return out


def _at_policy_batch(devices: Mapping[str, MeasuredDevice] | Iterable[MeasuredDevice],
                     s: ExportSettings) -> dict[str, MeasuredDevice]:
    """The devices by name, each timing at ``policy_batch`` unless its batch is fixed."""
    listed = devices.values() if isinstance(devices, Mapping) else devices
    out = {}
    for device in listed:
        if not isinstance(device, MeasuredDevice):
            raise UserError(f"export devices must be measured devices (see measurable_devices), "
                            f"got {device!r}")
        out[device.name] = device.at_batch(s.policy_batch)
    return out


def _finite(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def _write(out_dir: Path, rel: str, proto: onnx.ModelProto, report: FileReport) -> None:
    data = proto.SerializeToString()
    report.size_bytes = len(data)
    path = out_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    report.written = True


#: the ISA condition of a QDQ file some integer layer of which can saturate a 16-bit pair sum
NEEDS_VNNI = ("x86 with VNNI or AMX (avx512_vnni, avx_vnni or amx_int8), or onnxruntime with "
              "session.x64quantprecision=1; AVX2 and AVX-512 without VNNI saturate its sums")


def verified_here(runtime: str = "onnxruntime") -> dict[str, Any]:
    """Where a check runs: this CPU, its ISA flags (:func:`hwnas.latency.ondevice.cpu_isa`),
    the runtime and its version."""
    from hwnas.latency.ondevice import cpu_isa

    if runtime == "openvino":
        import openvino as ov

        version = ov.__version__
    else:
        import onnxruntime as ort

        version = ort.__version__
    return {**cpu_isa(), "runtime": runtime, "version": version}


def _isa_condition(proto: onnx.ModelProto, report: FileReport) -> None:
    """The file's 16-bit pair-sum bound and the CPUs on which it computes what was verified."""
    from hwnas.export.qdq.int16 import int16_report

    report.int16 = int16_report(proto)
    report.isa_condition = "any" if report.int16["int16_safe"] else NEEDS_VNNI


def _verify_fp32(proto: onnx.ModelProto, model: nn.Module, passes: ImagePasses,
                 report: FileReport, s: ExportSettings) -> None:
    """``onnx.checker`` and max |ONNX - PyTorch| <= ``atol`` on the test images (one pass of
    each, kept in ``passes``); with labels, the file's test accuracy."""
    onnx.checker.check_model(proto)
    report.checker = True
    report.verified_on, report.isa_condition = verified_here(), "any"
    got = passes.onnx(report.path, proto.SerializeToString())
    parity = parity_of(got, passes.torch("float", model), atol=s.atol)
    report.max_abs_diff, report.top1_agreement, report.n_images = (
        _finite(parity.max_abs_diff), parity.top1_agreement, parity.n)
    report.test_accuracy = passes.accuracy(got)
    if not parity.passed:
        raise UserError(f"FP32 parity failed: max |ONNX - PyTorch| = {parity.max_abs_diff:.3g} > "
                        f"{s.atol:g} on {parity.n} images")


def _verify_qdq(proto: onnx.ModelProto, build: QdqBuild, passes: ImagePasses, report: FileReport,
                s: ExportSettings, *, requantize: bool, require_integer: bool,
                searched: nn.Module | None = None) -> None:
    """Verify a QDQ file against what it implements and against what was searched.

    Pass/fail: ``onnx.checker``; top-1 agreement >= ``min_agreement`` with the fake-quant model
    as onnxruntime's integer kernels compute it (int32 biases, and the requantization points
    when ``requantize``) - any export error (a wrong scale, layer or grid) shows here; no float
    islands when ``require_integer``; with labels, test accuracy no more than
    ``max_accuracy_drop`` points below the searched fake-quant model's. Reported beside: the
    agreement and max difference with the searched fake-quant model (``searched``, default the
    build's own). One onnxruntime pass of the file and one PyTorch pass of each model
    (``passes``: the searched model's is shared by every file of the model)."""
    onnx.checker.check_model(proto)
    report.checker = True
    report.verified_on = verified_here()
    _isa_condition(proto, report)
    data = proto.SerializeToString()
    got = passes.onnx(report.path, data)
    with build.reference(requantize=requantize) as deployed:
        expected = passes.torch(("deployed", report.path), deployed)
    parity = parity_of(got, expected, atol=float("inf"))
    report.reference = ("fake-quant model with int32 biases"
                        + (" and 8-bit requantization points" if requantize and build.requant_layers()
                           else ""))
    report.max_abs_diff, report.top1_agreement, report.n_images = (
        _finite(parity.max_abs_diff), parity.top1_agreement, parity.n)
    searched = searched if searched is not None else build.qmodel
    searched_logits = passes.torch("searched", searched)
    plain = parity_of(got, searched_logits, atol=float("inf"))
    report.searched_agreement, report.searched_max_abs_diff = (plain.top1_agreement,
                                                               _finite(plain.max_abs_diff))
    labels = passes.labels
    if labels is not None:
        report.test_accuracy = passes.accuracy(got)
        report.searched_test_accuracy = passes.accuracy(searched_logits)
    index = LayerIndex.from_source(proto, build.kernel_nodes())
    quantized, products = build.integer_layers(), build.integer_products()
    integer, islands = integer_kernel_check(data, index, quantized + products)
    report.quantized_layers, report.integer_layers, report.float_islands = (
        len(quantized), sum(n in integer for n in quantized), islands)
    report.integer_products = sum(n in integer for n in products)
    if parity.max_abs_diff != parity.max_abs_diff:  # NaN
        raise UserError("quantized parity failed: onnxruntime produced NaN")
    if parity.top1_agreement < s.min_agreement:
        # rounding flips on near-tied logits (see divergence_of) pass, said so; anything else fails
        why = divergence_of(got, expected, labels, min_agreement=s.min_agreement,
                            max_accuracy_drop=s.max_accuracy_drop)
        shown = (f"top-1 agreement with the {report.reference} "
                 f"{100 * parity.top1_agreement:.2f}% < {100 * s.min_agreement:.0f}% on "
                 f"{parity.n} images (max diff {parity.max_abs_diff:.3g}; {why.describe()})")
        if not why.rounding:
            raise UserError(f"quantized parity failed: {shown}")
        report.parity_note = (f"{shown}: float-rounding flips on near-tied logits, not an export "
                              f"error")
    if require_integer and islands:
        raise UserError(f"{len(islands)} quantized layer(s) did not become integer kernels after "
                        f"onnxruntime's optimizations: {'; '.join(islands[:3])}"
                        + (" ..." if len(islands) > 3 else ""))
    if (labels is not None and s.max_accuracy_drop is not None
            and report.test_accuracy < report.searched_test_accuracy - s.max_accuracy_drop):
        raise UserError(f"the ONNX model's test accuracy {report.test_accuracy:.2f}% is more than "
                        f"{s.max_accuracy_drop:g} points below the searched fake-quant model's "
                        f"{report.searched_test_accuracy:.2f}% (top-1 agreement "
                        f"{100 * plain.top1_agreement:.1f}%)")


def raw_images(images: torch.Tensor, spec: InputSpec) -> np.ndarray:
    """The uint8 NHWC pixels that normalised NCHW ``images`` were made from (the inverse of
    ``(uint8 / 255 - mean) / std``, rounded: exact for images that came from uint8)."""
    mean = torch.tensor(spec.mean, dtype=torch.float64, device="cpu").view(1, -1, 1, 1)
    std = torch.tensor(spec.std, dtype=torch.float64, device="cpu").view(1, -1, 1, 1)
    pixels = ((images.detach().cpu().double() * std + mean) * 255.0).round().clamp(0, 255)
    return pixels.to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def _verify_uint8(proto: onnx.ModelProto, want: np.ndarray, passes: ImagePasses,
                  spec: InputSpec, report: FileReport, s: ExportSettings, *, exact: bool) -> None:
    """The uint8-input file on the raw pixels against its parent's logits ``want`` on the
    normalised images: max difference <= ``atol`` for a float parent, top-1 agreement >=
    ``min_agreement`` for a QDQ one (a pixel at a rounding boundary may land on the other side
    of an int8 step)."""
    from hwnas.latency.onnx_measure import make_session

    onnx.checker.check_model(proto)
    report.checker = True
    raw = raw_images(passes.x, spec)
    mine = make_session(proto.SerializeToString(), threads=1)
    got = np.concatenate([mine.run(None, {mine.get_inputs()[0].name: raw[i:i + 256]})[0]
                          for i in range(0, len(raw), 256)])
    report.max_abs_diff = _finite(float(np.max(np.abs(got.astype(np.float64) - want))))
    report.top1_agreement = float(np.mean(got.argmax(1) == want.argmax(1)))
    report.n_images = len(raw)
    report.test_accuracy = passes.accuracy(got)
    if exact and not (report.max_abs_diff is not None and report.max_abs_diff <= s.atol):
        raise UserError(f"uint8-input parity failed: max difference {report.max_abs_diff} > "
                        f"{s.atol:g} against the float-input file")
    if report.top1_agreement < s.min_agreement:
        raise UserError(f"uint8-input parity failed: top-1 agreement "
                        f"{100 * report.top1_agreement:.2f}% with the float-input file")


def _attempt(model_export: ModelExport, report: FileReport, fn) -> bool:  # noqa: ANN001
    """Run ``fn()``; a UserError (or an onnx/onnxruntime failure) fails this file, not the
    whole export. A file the system cannot write (a full disk) ends the export: every file
    after it would fail the same way."""
    try:
        fn()
    except WriteError:
        raise
    except (UserError, onnx.checker.ValidationError, RuntimeError) as exc:
        report.status, report.error = "failed", first_line(exc)
        model_export.fail(f"{report.path}: {report.error}")
        return False
    report.status = "ok"
    return True


def export_model(model: nn.Module, *, name: str, out_dir: str | Path, example: torch.Tensor,
                 test_images: torch.Tensor, test_labels: torch.Tensor | None = None,
                 policy: QuantPolicy | None = None, calibration: Iterable | None = None,
                 ptq_config: PTQConfig | None = None, arch: str | None = None,
                 accuracy: Any = None, predicted_latency: Mapping[str, float | None] | None = None,
                 devices: Mapping[str, MeasuredDevice] | Iterable[MeasuredDevice] | None = None,
                 metadata: Mapping[str, Any] | None = None,
                 settings: ExportSettings | None = None, progress: bool = False,
                 input_spec: InputSpec | None = None, model_version: int = 1,
                 quantized: nn.Module | None = None, shared: dict | None = None) -> ModelExport:
    """Export ``model`` (and its ``policy``) to ``out_dir`` (layout in the module docstring),
    verify and time every file; returns the record for the manifest.

    ``devices``: the measured devices to tune for (:func:`measurable_devices`) - each gets
    its own int8-vs-float layer choice and file, timed at its threads and batch. ``predicted_latency``: ``{device: ms}`` for
    every device of the search (metadata and manifest). ``test_labels``: labels of
    ``test_images``, to report each file's top-1 accuracy. ``input_spec``: mean, std and class
    names, written into every file (:func:`hwnas.export.onnx_export.describe_model`) and needed
    for ``settings.uint8_input``. ``quantized``: the model already quantized under ``policy``
    (e.g. by QAT; ``model`` is then its float twin, :func:`hwnas.export.qdq.dequantized_twin`):
    its QDQ files take its learned scales instead of PTQ on ``calibration``, and are verified
    against it. ``shared``: a dict kept by the caller for the models of one
    float network (same architecture, same recalibrated weights, e.g. several policies of one
    arch): its FP32 graph and the one pass of it and of the float model over the test images
    are made once (every file still passes ``onnx.checker``). A file that fails verification is
    recorded (``status="failed"``) and not written; bad arguments raise UserError."""
    s = settings or ExportSettings()
    s.validate()
    out_dir = Path(out_dir)
    if not isinstance(model, nn.Module):
        raise UserError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if quantized is not None and policy is None:
        raise UserError(f"model {name}: a quantized model needs the policy it was quantized under")
    if policy is not None and calibration is None:
        raise UserError(f"model {name}: a quantization policy needs calibration batches")
    if not isinstance(test_images, torch.Tensor) or test_images.dim() < 2 or len(test_images) == 0:
        raise UserError("test_images must be a non-empty tensor of input images")
    if s.uint8_input and input_spec is None:
        raise UserError(f"model {name}: a uint8-input variant needs the input's mean and std "
                        f"(input_spec)")
    if test_labels is not None and len(test_labels) != len(test_images):
        raise UserError(f"test_labels has {len(test_labels)} entries for {len(test_images)} images")
    if model.training or any(p.device.type != "cpu" for p in model.parameters()):
        model = copy.deepcopy(model).cpu().eval()  # the caller's model stays as it was
    predicted = {k: _finite(v) for k, v in (predicted_latency or {}).items()}
    result = ModelExport(name=name, arch=arch, accuracy=accuracy,
                         policy=None if policy is None else policy.to_dict())
    passes = ImagePasses(test_images, test_labels, device=s.device)
    clock = StageClock(before=checkpoint)
    result.info["stage_seconds"] = clock.seconds  # filled in as the stages run
    result.info["reference_notes"] = passes.notes
    base_meta = {"hwnas_format": EXPORT_FORMAT, "name": name, "arch": arch, "accuracy": accuracy,
                 "predicted_latency_ms": predicted, **dict(metadata or {})}
    policy_meta = "float" if policy is None else policy.to_dict()

    def set_metadata(proto: onnx.ModelProto, meta: Mapping[str, Any]) -> None:
        describe_model(proto, input_spec, {"policy": policy_meta, **meta},
                       model_version=model_version)

    def uint8_variant(parent_rel: str, proto: onnx.ModelProto, parent: FileReport) -> None:
        """``uint8[-<dir>]/<name>.onnx``: ``proto`` with a uint8 NHWC input, checked against
        the parent file on the same images."""
        if not s.uint8_input:
            return
        folder = parent_rel.rpartition("/")[0]
        rel = f"uint8-{folder}/{name}.onnx" if folder else f"uint8/{name}.onnx"
        report = FileReport(rel, parent.precision, parent.target,
                            reference=f"{parent_rel} on normalised images")
        result.files.append(report)

        def do() -> None:
            u8 = with_uint8_input(proto, input_spec)
            describe_model(u8, input_spec, model_version=model_version)
            _verify_uint8(u8, passes.onnx(parent_rel, proto.SerializeToString()), passes,
                          input_spec, report, s, exact=parent.precision == "fp32")
            _write(out_dir, rel, u8, report)
        with clock("uint8"):
            _attempt(result, report, do)
    devices = _at_policy_batch(devices or (), s)
    entries = {d: DeviceEntry(d, predicted.get(d), d in devices)
               for d in list(predicted) + [d for d in devices if d not in predicted]}
    result.devices = list(entries.values())
    for entry in entries.values():
        if not entry.measured:
            entry.note = ("not measurable on this machine; time the exported files there with "
                          "python -m hwnas.latency.ondevice")

    # -- FP32 -------------------------------------------------------------------------------
    fp32_rel = f"{name}.onnx"
    fp32_report = FileReport(fp32_rel, "fp32", "", reference="PyTorch float model")
    result.files.append(fp32_report)
    fp32: dict[str, onnx.ModelProto] = {}
    candidates: list[CandidateFile] = []  # verified files, FP32 first: what devices choose from
    references: dict[str, np.ndarray] = {}  # logits of the PyTorch models they implement

    def do_fp32() -> None:
        proto = onnx.ModelProto()
        if shared is not None and "fp32" in shared:  # the same float network, exported before
            proto.CopyFrom(shared["fp32"])
            passes.logits["float"], passes.files[fp32_rel] = shared["logits"]
        else:
            proto = float_proto(model, example[:1], opset=s.opset)
        plain = onnx.ModelProto()
        plain.CopyFrom(proto)
        set_metadata(proto, {**base_meta, "precision": "fp32", "policy": "float"})
        _verify_fp32(proto, model, passes, fp32_report, s)
        if shared is not None:
            shared["fp32"], shared["logits"] = plain, (passes.logits["float"],
                                                       passes.files[fp32_rel])
        _write(out_dir, fp32_rel, proto, fp32_report)
        fp32["proto"] = proto
        candidates.append(CandidateFile(fp32_rel, proto.SerializeToString(), "fp32", "float"))
    with clock("fp32"):
        fp32_done = _attempt(result, fp32_report, do_fp32)
    if fp32_done:
        uint8_variant(fp32_rel, fp32["proto"], fp32_report)
    fp32_ok = fp32_rel if fp32_report.ok else None
    if policy is None:
        for entry in entries.values():
            entry.recommended, entry.note = fp32_ok, "float model (no quantization policy)"
        _recommend(result, entries, devices, candidates, references, model, None, passes, s,
                   clock)
        return result

    # -- QDQ of the searched policy: exact (Q/DQ where the fake-quant model has them) ----------
    qdq_rel = f"qdq/{name}.onnx"
    qdq_report = FileReport(qdq_rel, "qdq", "")
    result.files.append(qdq_report)
    holder: dict[str, Any] = {}

    def do_qdq() -> None:
        with clock("ptq"):
            build = build_qdq(model, policy, calibration, config=ptq_config,
                              example=example[:1], opset=s.opset, quantized=quantized,
                              device=s.device, portable=s.portable)
        holder["build"] = build
        proto = build.proto(requantize=False)
        set_metadata(proto, {**base_meta, "precision": "qdq", "target_device": ""})
        # exact but not every conv can be an integer kernel: islands are reported, not fatal
        _verify_qdq(proto, build, passes, qdq_report, s, requantize=False,
                    require_integer=False)
        _write(out_dir, qdq_rel, proto, qdq_report)
        references[qdq_rel] = passes.logits[("deployed", qdq_rel)]  # the exact reference
        candidates.append(CandidateFile(qdq_rel, proto.SerializeToString(),
                                        _policy_kind(policy, ()), qdq_rel, baseline="searched"))
    with clock("qdq"):
        qdq_done = _attempt(result, qdq_report, do_qdq)
    if not qdq_done:
        for entry in entries.values():
            entry.recommended = fp32_ok
            entry.note = "quantized export failed" + ("" if entry.measured else "; " + entry.note)
        _recommend(result, entries, devices, candidates, references, model, None, passes, s,
                   clock)
        return result
    build: QdqBuild = holder["build"]
    result.info["integer_layers"] = build.integer_layers()
    for entry in entries.values():
        if not entry.measured:
            entry.recommended = None  # cannot tell which is faster without measuring there

    # -- INT4 weights (size) -------------------------------------------------------------------
    if s.int4 and any(build.layers[n].w_bits <= 4 for n in build.integer_layers()):
        int4_rel = f"int4/{name}.onnx"
        int4_report = FileReport(int4_rel, "qdq-int4", "")
        result.files.append(int4_report)

        def do_int4() -> None:
            proto = build.proto(requantize=False, int4=True)
            set_metadata(proto, {**base_meta, "precision": "qdq-int4", "target_device": ""})
            _verify_qdq(proto, build, passes, int4_report, s, requantize=False,
                        require_integer=False)
            _write(out_dir, int4_rel, proto, int4_report)
        with clock("int4"):
            _attempt(result, int4_report, do_int4)

    # -- per onnxruntime device: the fastest int8/float mix, requantized for integer kernels ----
    written: dict[str, onnx.ModelProto] = {}
    for device, dev in devices.items():
        entry = entries[device]
        if dev.runtime != "onnxruntime" or "proto" not in fp32:
            continue  # the per-layer choice reads onnxruntime's profiler
        try:
            with clock("choose"), timing_slot(_pin(s, [dev.threads])):
                choice = _choose(build, fp32["proto"], dev, s, progress)
        except UserError as exc:
            entry.note = f"int8-vs-float measurement failed: {first_line(exc)}"
            continue
        evidence = choice.as_dict()
        for key in ("fp32_ms", "fp32_p95_ms", "uniform_ms", "chosen_ms", "chosen_p95_ms",
                    "speedup", "quantized_faster", "faster_twice"):
            evidence.pop(key, None)  # the device's figures are those of its paired timing
        result.info.setdefault("device_choice", {})[device] = evidence
        entry.float_layers = list(choice.float_layers)
        dev_rel = f"qdq-{device}/{name}.onnx"
        dev_report = FileReport(dev_rel, "qdq", device,
                                float_layers_for_speed=list(choice.float_layers))
        result.files.append(dev_report)

        def do_device(choice=choice, dev_report=dev_report, device=device,
                      dev_rel=dev_rel) -> None:
            with clock("ptq"):
                dbuild = build if not choice.float_layers else build_qdq(
                    model, policy, calibration, config=ptq_config, example=example[:1],
                    float_layers=choice.float_layers, opset=s.opset, quantized=quantized,
                    device=s.device, portable=s.portable)
            proto = dbuild.proto(requantize=s.requantize)
            set_metadata(proto, {**base_meta, "precision": "qdq", "target_device": device,
                                 "device_choice": {"threads": choice.threads, "batch": choice.batch,
                                                   "float_layers": len(choice.float_layers)}})
            _verify_qdq(proto, dbuild, passes, dev_report, s, requantize=s.requantize,
                        require_integer=s.require_integer, searched=build.qmodel)
            _write(out_dir, dev_rel, proto, dev_report)
            written[dev_rel] = proto
            references[dev_rel] = passes.logits[("deployed", dev_rel)]
            candidates.append(CandidateFile(dev_rel, proto.SerializeToString(),
                                            _policy_kind(policy, choice.float_layers), dev_rel,
                                            baseline="searched"))
        with clock("device_files"):
            device_done = _attempt(result, dev_report, do_device)
        if not device_done:
            entry.note = "the device's quantized model failed verification"
            continue
        uint8_variant(dev_rel, written.pop(dev_rel), dev_report)
    _recommend(result, entries, devices, candidates, references, model, build.qmodel, passes, s,
               clock)
    _write_verify_sample(result, out_dir, test_images, test_labels, input_spec, s)
    return result


def _write_verify_sample(result: ModelExport, out_dir: Path, images: torch.Tensor,
                         labels: torch.Tensor | None, spec: InputSpec | None,
                         s: ExportSettings) -> None:
    """``verify/<name>.npz``: ``verify_images`` labelled test images (uint8, stratified by
    class, seeded), the model's mean/std, its written float-input files and the top-1 each gave
    here with onnxruntime (``pred_<i>``), and the export's ``min_agreement``: what
    ``latency/ondevice.py --verify`` checks a device against."""
    import io

    from hwnas.latency.ondevice import VERIFY_DIR, predict, sample_inputs, verify_runner
    from hwnas.supernet.data.splits import _rng, _stratified_take

    files = [f.path for f in result.files
             if f.written and f.precision in ("fp32", "qdq") and not f.path.startswith("uint8")]
    fp32 = f"{result.name}.onnx"
    if labels is None or spec is None or s.verify_images <= 0 or fp32 not in files:
        return
    y = labels.detach().cpu().numpy().astype(np.int64)
    n = min(s.verify_images, len(y))
    idx = np.arange(len(y)) if n == len(y) else _stratified_take(y, n, _rng(s.seed, 21))[1]
    pixels = raw_images(images[torch.from_numpy(idx)], spec).transpose(0, 3, 1, 2)
    sample = {"images": np.ascontiguousarray(pixels), "labels": y[idx],
              "mean": np.asarray(spec.mean, np.float32), "std": np.asarray(spec.std, np.float32),
              "files": np.asarray(files), "fp32": np.asarray(fp32),
              "min_agreement": np.asarray(s.min_agreement, np.float64),
              "verified_on": np.asarray(json.dumps(verified_here()))}
    inputs = sample_inputs(sample)
    for i, rel in enumerate(files):
        run = verify_runner(out_dir / rel, "onnxruntime", 1, {}, 64)
        sample[f"pred_{i}"] = predict(run, inputs, 64)
    buf = io.BytesIO()
    np.savez_compressed(buf, **sample)
    (out_dir / VERIFY_DIR).mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / VERIFY_DIR / f"{result.name}.npz", buf.getvalue())
    result.info["verify_sample"] = f"{VERIFY_DIR}/{result.name}.npz"


def _pin(s: ExportSettings, threads: Iterable[int]) -> int | None:
    """Cores to pin a timing to: the most threads it runs at (None: not pinned)."""
    most = max((int(t) for t in threads), default=0)
    return most if s.pin_timings and most >= 1 else None


def _policy_kind(policy: QuantPolicy, float_layers: Iterable[str]) -> str:
    """``int8`` when every quantized layer is 8-bit and none is kept float, else ``mixed``."""
    bits = {pair for pair in policy.bits.values() if pair != (32, 32)}
    return "int8" if bits <= {(8, 8)} and not list(float_layers) else "mixed"


def _recommend(result: ModelExport, entries: Mapping[str, DeviceEntry],
               devices: Mapping[str, MeasuredDevice],
               candidates: list[CandidateFile], references: dict[str, np.ndarray],
               model: nn.Module, searched: nn.Module | None, passes: ImagePasses,
               s: ExportSettings, clock: StageClock) -> None:
    """For each measurable device: verify the candidates on its runtime, time them in one
    paired measurement and record the file to deploy (:func:`hwnas.export.recommend.recommend_file`).
    ``references``: logits of the models files implement, beside the float and searched ones.
    On onnxruntime the verification reads the passes the export already made (``passes``)."""
    if not devices or not candidates or candidates[0].kind != "fp32":
        return
    refs = {**references, "float": passes.torch("float", model)}
    if searched is not None:
        refs["searched"] = passes.torch("searched", searched)
    usable = [c for c in candidates if c.reference in refs and c.accuracy_baseline in refs]
    np_images, np_labels = passes.np, passes.labels
    cache: dict = passes.agreement_cache(refs, usable)
    reports = {f.path: f for f in result.files}
    with clock("recommend"), timing_slot(_pin(s, (d.threads for d in devices.values()))):
        _recommend_devices(result, entries, devices, usable, refs, np_images, np_labels, s,
                           cache, passes.sessions, reports)


def _recommend_devices(result: ModelExport, entries: Mapping[str, DeviceEntry],
                       devices: Mapping[str, MeasuredDevice], usable: list[CandidateFile],
                       refs: dict[str, np.ndarray], np_images: np.ndarray,
                       np_labels: np.ndarray | None, s: ExportSettings, cache: dict,
                       sessions: dict, reports: dict[str, FileReport]) -> None:
    for device, dev in devices.items():
        entry = entries[device]
        entry.runtime, entry.threads, entry.batch = dev.runtime, dev.threads, dev.batch
        try:
            rec = recommend_file(dev, files=usable, references=refs, images=np_images,
                                 labels=np_labels, min_agreement=s.min_agreement,
                                 max_drop=s.max_candidate_drop, rounds=s.rounds, runs=s.runs,
                                 warmup=s.warmup, seed=s.seed, cache=cache,
                                 min_rounds=s.min_rounds, sessions=sessions)
        except UserError as exc:
            entry.recommended = None
            entry.note = f"no file could be verified and timed on {dev.runtime}: {first_line(exc)}"
            continue
        prior = entry.note  # e.g. why a quantized file is missing
        _fill_entry(entry, rec)
        chosen = reports.get(entry.recommended or "")
        entry.isa_condition = chosen.isa_condition if chosen is not None else ""
        if chosen is not None and chosen.isa_condition not in ("", "any"):
            entry.note += f"; holds only on {chosen.isa_condition}"
        if prior:
            entry.note = f"{prior}; {entry.note}"
        for c in rec.candidates:
            if c.median_ms is not None and c.label == c.path and c.path in reports:
                reports[c.path].latency_ms[device] = c.median_ms


def _fill_entry(entry: DeviceEntry, rec: Recommendation) -> None:
    """The device's verdict, every figure from the one paired measurement of ``rec``."""
    chosen, fp32 = rec.chosen, rec.fp32
    quantized = [c for c in rec.candidates if c.verified and c.median_ms is not None
                 and c.precision.startswith(("int8", "mixed"))]
    entry.candidates = [asdict(c) for c in rec.candidates]
    entry.rounds_timed, entry.busy = rec.rounds, rec.busy
    entry.fp32_ms, entry.recommended_ms, entry.speedup = fp32.median_ms, chosen.median_ms, rec.speedup
    entry.quantized_ms = min((c.median_ms for c in quantized), default=None)
    entry.recommended, entry.precision, entry.settings = chosen.path, chosen.precision, chosen.settings
    entry.quantized_faster = chosen.precision.startswith(("int8", "mixed"))
    entry.verified_on = verified_here(rec.runtime)
    if chosen is fp32:
        verified = sum(c.verified for c in rec.candidates)
        entry.note = (f"FP32 is the fastest of {verified} verified candidate(s) at batch "
                      f"{rec.batch}, {rec.threads} thread(s) on {rec.runtime}; deploy FP32")
    else:
        hint = "".join(f"; set {k}={v}" for k, v in chosen.settings.items() if v != "f32")
        entry.note = (f"{chosen.precision} {rec.speedup:.2f}x faster than FP32 at batch "
                      f"{rec.batch}, {rec.threads} thread(s) on {rec.runtime}{hint}")
    if rec.notes:
        entry.note += " (" + "; ".join(rec.notes) + ")"


def _choose(build: QdqBuild, fp32_proto: onnx.ModelProto, device: MeasuredDevice,
            s: ExportSettings, progress: bool) -> DevicePolicy:
    quantized = build.integer_layers()
    if not quantized:
        raise UserError("the policy quantizes no layer to integer widths")
    fp32_index = LayerIndex.from_source(fp32_proto,
                                        map_layer_nodes(fp32_proto, build.builder.node_of))
    qdq_index = LayerIndex.from_source(build.proto(requantize=s.requantize), build.builder.node_of)

    def variant(float_layers: Iterable[str]) -> bytes:
        return build.proto(requantize=s.requantize, extra_float=float_layers).SerializeToString()
    return choose_float_layers(variant, fp32_proto.SerializeToString(), quantized, build.kinds,
                               fp32_index=fp32_index, qdq_index=qdq_index, device=device,
                               rounds=s.rounds,
                               runs=s.runs, profile_runs=s.profile_runs, refine=s.refine,
                               progress=progress, min_rounds=s.min_rounds)


def manifest_rows(models: Iterable[ModelExport]) -> list[dict[str, Any]]:
    """One flat row per file (the manifest CSV), devices as ``<field>:<device>`` columns."""
    rows = []
    for m in models:
        for f in m.files:
            row: dict[str, Any] = {"model": m.name, "arch": m.arch or "", "model_status": m.status,
                                   "accuracy": m.accuracy, **{k: v for k, v in asdict(f).items()}}
            row["float_islands"] = "; ".join(f.float_islands)
            row["float_layers_for_speed"] = " ".join(f.float_layers_for_speed)
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
