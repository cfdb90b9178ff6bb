"""Export one model: FP32 ONNX, QDQ ONNX of its policy, per-device QDQ; each verified, and the
fastest verified one recommended per measured device.

:func:`export_model` is the model-level API (:mod:`hwnas.export.run_export` calls it once per
Pareto-optimal model) and runs as named stages over one context (``_Export``): FP32
``<name>.onnx``, the exact QDQ of the searched policy ``qdq/<name>.onnx``, ``int4/<name>.onnx``
(``int4=True``), per onnxruntime device measurable here ``qdq-<device>/<name>.onnx`` (the layers
where int8 loses on it kept float, :mod:`hwnas.export.device_policy`), ``uint8[-...]/`` variants
(``uint8_input=True``), then the recommendation per device (:mod:`hwnas.export.recommend`) and
the verification sample. The layout is documented in ``docs/how-to/deploy.md``. Every file is
self-describing (:func:`hwnas.export.onnx_export.describe_model`) and verified before it is
written, atomically (:mod:`hwnas.export.verify`); a file that fails is recorded, not written.
The devices come in as :class:`hwnas.latency.devices.MeasuredDevice` objects
(:func:`measurable_devices`), each timed at its threads and batch.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from hwnas.export import verify
from hwnas.export.device_policy import DevicePolicy, choose_float_layers
from hwnas.export.onnx_export import InputSpec, describe_model, with_uint8_input
from hwnas.export.ort_profile import LayerIndex
from hwnas.export.parallel import checkpoint, timing_slot, worker_cores
from hwnas.export.passes import ImagePasses, StageClock
from hwnas.export.qdq.build import EXPORT_FORMAT, QdqBuild, build_qdq, float_proto
from hwnas.export.qdq.names import map_layer_nodes
from hwnas.export.recommend import CandidateFile, Recommendation, recommend_file
from hwnas.export.records import (
    DeviceEntry,
    ExportSettings,
    FileReport,
    ModelExport,
    manifest_rows,
    write_manifest,
)
from hwnas.export.verify import raw_images, verified_here
from hwnas.latency.devices import Device, MeasuredDevice, get_device
from hwnas.quant.policy import QuantPolicy
from hwnas.quant.ptq import PTQConfig
from torch import nn

from hwnas.core.errors import UserError, WriteError
from hwnas.core.io import first_line, write_atomic

__all__ = ["DeviceEntry", "ExportSettings", "FileReport", "ModelExport", "export_model",
           "manifest_rows", "measurable_devices", "write_manifest"]


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


def _write(out_dir: Path, rel: str, proto: onnx.ModelProto, report: FileReport) -> None:
    data = proto.SerializeToString()
    report.size_bytes = len(data)
    path = out_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    report.written = True


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


@dataclass
class _Export:
    """One model's export as it goes through the stages of :func:`export_model`: what it was
    asked (the model, its policy, the images, the devices) and what the stages made so far
    (the record, the image passes, the verified candidate files and the QDQ build)."""

    model: nn.Module
    name: str
    out_dir: Path
    example: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor | None
    policy: QuantPolicy | None
    calibration: Iterable | None
    ptq_config: PTQConfig | None
    quantized: nn.Module | None
    devices: dict[str, MeasuredDevice]
    s: ExportSettings
    progress: bool
    input_spec: InputSpec | None
    model_version: int
    shared: dict | None
    result: ModelExport
    passes: ImagePasses
    clock: StageClock
    base_meta: dict[str, Any]
    entries: dict[str, DeviceEntry] = field(default_factory=dict)
    #: verified files, FP32 first: what devices choose from
    candidates: list[CandidateFile] = field(default_factory=list)
    #: logits of the PyTorch models the files implement
    references: dict[str, np.ndarray] = field(default_factory=dict)
    fp32: onnx.ModelProto | None = None
    build: QdqBuild | None = None
    #: the quantized models by the layers they keep float (``()``: the searched one): devices
    #: that choose the same layers share one PTQ
    builds: dict[tuple[str, ...], QdqBuild] = field(default_factory=dict)
    #: ``{float layers: (path, graph bytes)}`` of the first device file of each quantized model
    device_graphs: dict[tuple[str, ...], tuple[str, bytes]] = field(default_factory=dict)

    def set_metadata(self, proto: onnx.ModelProto, meta: Mapping[str, Any]) -> None:
        policy_meta = "float" if self.policy is None else self.policy.to_dict()
        describe_model(proto, self.input_spec, {"policy": policy_meta, **meta},
                       model_version=self.model_version)

    def add_file(self, report: FileReport, stage: str, fn: Callable[[], None]) -> bool:
        """Record ``report`` and run ``fn`` (which verifies and writes its file) under
        ``stage``'s clock; False when the file failed (:func:`_attempt`)."""
        self.result.files.append(report)
        with self.clock(stage):
            return _attempt(self.result, report, fn)

    def uint8_variant(self, parent_rel: str, proto: onnx.ModelProto, parent: FileReport) -> None:
        """``uint8[-<dir>]/<name>.onnx``: ``proto`` with a uint8 NHWC input, checked against
        the parent file on the same images."""
        if not self.s.uint8_input:
            return
        folder = parent_rel.rpartition("/")[0]
        rel = f"uint8-{folder}/{self.name}.onnx" if folder else f"uint8/{self.name}.onnx"
        report = FileReport(rel, parent.precision, parent.target,
                            reference=f"{parent_rel} on normalised images")

        def do() -> None:
            u8 = with_uint8_input(proto, self.input_spec)
            describe_model(u8, self.input_spec, model_version=self.model_version)
            verify.verify_uint8(u8, self.passes.onnx(parent_rel, proto.SerializeToString()),
                                self.passes, self.input_spec, report, self.s,
                                exact=parent.precision == "fp32",
                                parent_float32_error=parent.float32_error)
            _write(self.out_dir, rel, u8, report)
        self.add_file(report, "uint8", do)


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

    ``devices``: the measured devices to tune for (:func:`measurable_devices`), each with its
    own int8-vs-float layer choice and file, timed at its threads and batch.
    ``predicted_latency``: ``{device: ms}`` for every device of the search (metadata and
    manifest). ``test_labels``: labels of ``test_images``, to report each file's top-1
    accuracy. ``ptq_config``: the QDQ files' PTQ (default: PTQ's defaults with
    ``settings.rounding``). ``input_spec``: mean, std and class names, written into every file
    (:func:`hwnas.export.onnx_export.describe_model`) and needed for ``settings.uint8_input``.
    ``quantized``: the model already quantized under ``policy`` (e.g. by QAT; ``model`` is then
    its float twin, :func:`hwnas.export.qdq.dequantized_twin`): its QDQ files take its learned
    scales instead of PTQ on ``calibration``, and are verified against it. ``shared``: a dict
    kept by the caller for the models of one float network (same architecture, same
    recalibrated weights): its FP32 graph and the one pass of it and of the float model over
    the test images are made once (every file still passes ``onnx.checker``). A file that fails
    verification is recorded (``status="failed"``) and not written; bad arguments raise
    UserError. The stages: FP32, the searched QDQ, INT4, one file per device, the
    recommendation per device, the verification sample."""
    s = settings or ExportSettings()
    s.validate()
    model = _checked_model(model, name=name, example=example, test_images=test_images,
                           test_labels=test_labels, policy=policy, calibration=calibration,
                           quantized=quantized, input_spec=input_spec, s=s)
    predicted = {k: verify.finite(v) for k, v in (predicted_latency or {}).items()}
    result = ModelExport(name=name, arch=arch, accuracy=accuracy,
                         policy=None if policy is None else policy.to_dict())
    x = _Export(model, name, Path(out_dir), example, test_images, test_labels, policy,
                calibration, ptq_config or PTQConfig(rounding=s.rounding), quantized,
                _at_policy_batch(devices or (), s), s,
                progress, input_spec, model_version, shared, result,
                ImagePasses(test_images, test_labels, device=s.device, cores=worker_cores()),
                StageClock(before=checkpoint),
                {"hwnas_format": EXPORT_FORMAT, "name": name, "arch": arch, "accuracy": accuracy,
                 "predicted_latency_ms": predicted, **dict(metadata or {})})
    result.info["stage_seconds"] = x.clock.seconds  # filled in as the stages run
    result.info["reference_notes"] = x.passes.notes
    _device_entries(x, predicted)
    fp32_ok = _stage_fp32(x)
    if policy is None:
        for entry in x.entries.values():
            entry.recommended, entry.note = fp32_ok, "float model (no quantization policy)"
        _recommend(x, searched=None)
        return result
    if not _stage_qdq(x):
        for entry in x.entries.values():
            entry.recommended = fp32_ok
            entry.note = "quantized export failed" + ("" if entry.measured else "; " + entry.note)
        _recommend(x, searched=None)
        return result
    result.info["integer_layers"] = x.build.integer_layers()
    x.builds[()] = x.build
    for entry in x.entries.values():
        if not entry.measured:
            entry.recommended = None  # cannot tell which is faster without measuring there
    _stage_int4(x)
    for device in x.devices.values():
        _stage_device_file(x, device)
    _recommend(x, searched=x.build.qmodel)
    _write_verify_sample(result, x.out_dir, test_images, test_labels, input_spec, s, x.passes)
    return result


def _checked_model(model: nn.Module, *, name: str, example: torch.Tensor,
                   test_images: torch.Tensor, test_labels: torch.Tensor | None,
                   policy: QuantPolicy | None, calibration: Iterable | None,
                   quantized: nn.Module | None, input_spec: InputSpec | None,
                   s: ExportSettings) -> nn.Module:
    """The arguments checked (one UserError line each); the model in eval mode on the CPU (a
    copy when it was not: the caller's model stays as it was)."""
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
        model = copy.deepcopy(model).cpu().eval()
    return model


def _device_entries(x: _Export, predicted: Mapping[str, float | None]) -> None:
    """One manifest entry per device: every device of the search, then those tuned for."""
    x.entries = {d: DeviceEntry(d, predicted.get(d), d in x.devices)
                 for d in list(predicted) + [d for d in x.devices if d not in predicted]}
    x.result.devices = list(x.entries.values())
    for entry in x.entries.values():
        if not entry.measured:
            entry.note = ("not measurable on this machine; time the exported files there with "
                          "python -m hwnas.latency.ondevice")


def _stage_fp32(x: _Export) -> str | None:
    """``<name>.onnx``: the FP32 file (from ``shared`` when made before), verified against
    PyTorch; returns its path when it is ok."""
    rel = f"{x.name}.onnx"
    report = FileReport(rel, "fp32", "", reference="PyTorch float model")

    def do() -> None:
        proto = onnx.ModelProto()
        if x.shared is not None and "fp32" in x.shared:  # the same float network, exported before
            proto.CopyFrom(x.shared["fp32"])
            x.passes.logits["float"], x.passes.files[rel] = x.shared["logits"]
        else:
            proto = float_proto(x.model, x.example[:1], opset=x.s.opset)
        plain = onnx.ModelProto()
        plain.CopyFrom(proto)
        x.set_metadata(proto, {**x.base_meta, "precision": "fp32", "policy": "float"})
        verify.verify_fp32(proto, x.model, x.passes, report, x.s)
        if x.shared is not None:
            x.shared["fp32"], x.shared["logits"] = plain, (x.passes.logits["float"],
                                                           x.passes.files[rel])
        _write(x.out_dir, rel, proto, report)
        x.fp32 = proto
        x.candidates.append(CandidateFile(rel, proto.SerializeToString(), "fp32", "float"))
    if x.add_file(report, "fp32", do):
        x.uint8_variant(rel, x.fp32, report)
    return rel if report.ok else None


def _stage_qdq(x: _Export) -> bool:
    """``qdq/<name>.onnx``: the searched policy, exact (Q/DQ where the fake-quant model has
    them; not every conv can be an integer kernel, so islands are reported, not fatal)."""
    rel = f"qdq/{x.name}.onnx"
    report = FileReport(rel, "qdq", "")

    def do() -> None:
        with x.clock("ptq"):
            x.build = build_qdq(x.model, x.policy, x.calibration, config=x.ptq_config,
                                example=x.example[:1], opset=x.s.opset, quantized=x.quantized,
                                device=x.s.device, portable=x.s.portable)
        proto = x.build.proto(requantize=False)
        x.set_metadata(proto, {**x.base_meta, "precision": "qdq", "target_device": ""})
        verify.verify_qdq(proto, x.build, x.passes, report, x.s, requantize=False,
                          require_integer=False)
        _write(x.out_dir, rel, proto, report)
        x.references[rel] = x.passes.logits[("deployed", rel)]  # the exact reference
        x.candidates.append(CandidateFile(rel, proto.SerializeToString(),
                                          _policy_kind(x.policy, ()), rel, baseline="searched"))
    return x.add_file(report, "qdq", do)


def _stage_int4(x: _Export) -> None:
    """``int4/<name>.onnx`` (``settings.int4``, some weights of <= 4 bits): the exact form with
    real ONNX INT4 weights, for size."""
    build = x.build
    if not (x.s.int4 and any(build.layers[n].w_bits <= 4 for n in build.integer_layers())):
        return
    rel = f"int4/{x.name}.onnx"
    report = FileReport(rel, "qdq-int4", "")

    def do() -> None:
        proto = build.proto(requantize=False, int4=True)
        x.set_metadata(proto, {**x.base_meta, "precision": "qdq-int4", "target_device": ""})
        verify.verify_qdq(proto, build, x.passes, report, x.s, requantize=False,
                          require_integer=False)
        _write(x.out_dir, rel, proto, report)
    x.add_file(report, "int4", do)


def _stage_device_file(x: _Export, device: MeasuredDevice) -> None:
    """``qdq-<device>/<name>.onnx`` for an onnxruntime device: the fastest int8/float mix
    there (:func:`_choose`), requantized for integer kernels. Devices that keep the same layers
    float share one PTQ (``x.builds``) and, their graphs being equal, one pass of the file and
    of its reference: only the file's metadata differs."""
    entry = x.entries[device.name]
    if device.runtime != "onnxruntime" or x.fp32 is None:
        return  # the per-layer choice reads onnxruntime's profiler
    try:
        with x.clock("choose"), timing_slot(_pin(x.s, [device.threads])):
            fp32_run = x.passes.sessions.get(("onnxruntime", f"{x.name}.onnx", 1, "f32"))
            choice = _choose(x.build, x.fp32, device, x.s, x.progress,
                             {"fp32": fp32_run} if fp32_run and device.threads == 1 else None)
    except UserError as exc:
        entry.note = f"int8-vs-float measurement failed: {first_line(exc)}"
        return
    evidence = choice.as_dict()
    for key in ("fp32_ms", "fp32_p95_ms", "uniform_ms", "chosen_ms", "chosen_p95_ms",
                "speedup", "quantized_faster", "faster_twice"):
        evidence.pop(key, None)  # the device's figures are those of its paired timing
    x.result.info.setdefault("device_choice", {})[device.name] = evidence
    entry.float_layers = list(choice.float_layers)
    rel = f"qdq-{device.name}/{x.name}.onnx"
    report = FileReport(rel, "qdq", device.name, float_layers_for_speed=list(choice.float_layers))
    made: dict[str, onnx.ModelProto] = {}

    def do() -> None:
        s = x.s
        key = tuple(choice.float_layers)
        if key not in x.builds:
            with x.clock("ptq"):
                x.builds[key] = build_qdq(
                    x.model, x.policy, x.calibration, config=x.ptq_config, example=x.example[:1],
                    float_layers=choice.float_layers, opset=s.opset, quantized=x.quantized,
                    device=s.device, portable=s.portable)
        build = x.builds[key]
        proto = build.proto(requantize=s.requantize)
        x.set_metadata(proto, {**x.base_meta, "precision": "qdq", "target_device": device.name,
                               "device_choice": {"threads": choice.threads, "batch": choice.batch,
                                                 "float_layers": len(choice.float_layers)}})
        graph = proto.graph.SerializeToString()
        first = x.device_graphs.setdefault(key, (rel, graph))
        if first[0] != rel and first[1] == graph:  # another device's file, but for its metadata
            x.passes.share(rel, first[0], ("deployed", rel), ("deployed", first[0]))
        verify.verify_qdq(proto, build, x.passes, report, s, requantize=s.requantize,
                          require_integer=s.require_integer, searched=x.build.qmodel)
        _write(x.out_dir, rel, proto, report)
        made["proto"] = proto
        x.references[rel] = x.passes.logits[("deployed", rel)]
        x.candidates.append(CandidateFile(rel, proto.SerializeToString(),
                                          _policy_kind(x.policy, choice.float_layers), rel,
                                          baseline="searched"))
    if not x.add_file(report, "device_files", do):
        entry.note = "the device's quantized model failed verification"
        return
    x.uint8_variant(rel, made["proto"], report)


def _write_verify_sample(result: ModelExport, out_dir: Path, images: torch.Tensor,
                         labels: torch.Tensor | None, spec: InputSpec | None,
                         s: ExportSettings, passes: ImagePasses | None = None) -> None:
    """``verify/<name>.npz``: ``verify_images`` labelled test images (uint8, stratified by
    class, seeded), the model's mean/std, its written float-input files and the top-1 each gave
    here with onnxruntime (``pred_<i>``), and the export's ``min_agreement``: what
    ``latency/ondevice.py --verify`` checks a device against.

    When the sample's inputs, as the device script rebuilds them from the uint8 pixels, are bit
    for bit the test images of ``passes`` (images that came from uint8, such as CIFAR-10's), a
    file's top-1 is read from the logits its verification pass already computed on them:
    onnxruntime computes each image of a batch alone, so the logits do not depend on the batch
    around them (bit-identical on every CIFAR-10 file checked, benchmarks/export_speed.md,
    Session 31). Otherwise each file runs on the sample."""
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
    same = passes is not None and np.array_equal(inputs, passes.np[idx])
    for i, rel in enumerate(files):
        if same and rel in passes.files:
            sample[f"pred_{i}"] = passes.files[rel][idx].argmax(axis=1).astype(np.int64)
            continue
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


def _recommend(x: _Export, *, searched: nn.Module | None) -> None:
    """For each measurable device: verify the candidates on its runtime, time them in one
    paired measurement and record the file to deploy (:func:`hwnas.export.recommend.recommend_file`).
    The references: logits of the models files implement, beside the float and ``searched``
    ones. On onnxruntime the verification reads the passes the export already made."""
    devices, candidates, passes, s = x.devices, x.candidates, x.passes, x.s
    if not devices or not candidates or candidates[0].kind != "fp32":
        return
    refs = {**x.references, "float": passes.torch("float", x.model)}
    if searched is not None:
        refs["searched"] = passes.torch("searched", searched)
    usable = [c for c in candidates if c.reference in refs and c.accuracy_baseline in refs]
    np_images, np_labels = passes.np, passes.labels
    cache: dict = passes.agreement_cache(refs, usable)
    reports = {f.path: f for f in x.result.files}
    with x.clock("recommend"), timing_slot(_pin(s, (d.threads for d in devices.values()))):
        _recommend_devices(x.result, x.entries, devices, usable, refs, np_images, np_labels, s,
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
            s: ExportSettings, progress: bool, runners: dict | None = None) -> DevicePolicy:
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
                               progress=progress, min_rounds=s.min_rounds, runners=runners)


