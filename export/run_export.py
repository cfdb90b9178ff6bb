"""Export the Pareto-optimal models of a run directory (``hwnas export RUN_DIR``).

Reads the run directory contract (``config.json``, ``supernet.pt``, ``pareto_<device>.csv``),
rebuilds each selected model (:func:`parse_select`) exactly as the search scored it and exports
it with :func:`hwnas.export.model_export.export_model` (:func:`export_run`). The run is prepared
once for all models (:func:`_prepare`); with ``settings.workers`` > 1 the models are built and
verified in spawned processes while every timing runs alone (:func:`_export_parallel`).
Everything goes to a staging directory moved into place at the end, so an interrupted export
leaves the previous one intact.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwnas.search.config import SearchConfig
from hwnas.search.replay import load_run_supernet, replay_splits
from hwnas.search.rundir import RunDir

from hwnas.core.errors import UserError, WriteError
from hwnas.core import written
from hwnas.core.heap import retain_freed_memory, retained_heap
from hwnas.core.io import check_writable

__all__ = ["ModelRow", "RunExport", "estimated_cost", "export_run", "parse_select", "read_front",
           "stage_summary", "submission_order"]


@dataclass
class ModelRow:
    """One selected row of a Pareto front (merged across fronts by arch + policy)."""

    trial: int
    arch: str
    policy: str
    accuracy: float | None
    predicted: dict[str, float | None]
    fronts: list[str] = field(default_factory=list)
    test_accuracy: float | None = None

    @property
    def name(self) -> str:
        return f"trial_{self.trial:04d}"


@dataclass
class RunExport:
    """The outcome of :func:`export_run`."""

    out_dir: Path
    models: list[Any]
    seconds: float
    #: wall seconds of the export's parts (:func:`stage_summary`): ``prepare`` (supernet, data,
    #: batches), ``workers_ready`` (parallel: spawn to the last worker ready), ``models``,
    #: ``timings_alone`` (within ``models``: the paired timings, during which nothing else ran),
    #: ``timings_waited`` (parallel: what the timings waited for the machine, in all),
    #: ``finish`` (speed-up tables, the directory moved into place)
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> list[Any]:
        return [m for m in self.models if m.status != "ok"]


#: stages of a model that time alone (the int8/float choice, the recommendation)
TIMING_STAGES = ("choose", "recommend")


def stage_summary(result: RunExport) -> str:
    """Where an export's wall seconds went, on one line, then the per-model stages summed over
    the models (``ptq`` is counted inside ``qdq`` and ``device_files``): what ``hwnas export``
    and ``hwnas run`` print, so that a run on another machine says where its time goes."""
    st = result.stages
    parts = [f"prepare {st.get('prepare', 0.0):.1f}"]
    if "workers_ready" in st:
        parts.append(f"workers ready after {st['workers_ready']:.1f}")
    waited = (f", waited for {st['timings_waited']:.1f}" if "timings_waited" in st else "")
    parts.append(f"models {st.get('models', 0.0):.1f} (timings alone "
                 f"{st.get('timings_alone', 0.0):.1f}{waited})")
    parts.append(f"finish {st.get('finish', 0.0):.1f}")
    sums: dict[str, float] = {}
    for m in result.models:
        for k, v in (m.info.get("stage_seconds") or {}).items():
            sums[k] = sums.get(k, 0.0) + v
    shown = ", ".join(f"{k} {v:.1f}" for k, v in sorted(sums.items(), key=lambda kv: -kv[1]))
    return (f"export stages (s): {', '.join(parts)}\n"
            f"model stages summed over {len(result.models)} model(s) (s): {shown or 'none'}")


def _float_or_none(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def read_front(path: Path, device: str) -> list[ModelRow]:
    """The rows of ``pareto_<device>.csv``; UserError for a file without the contract's
    columns."""
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if rows and not {"trial", "arch"} <= set(rows[0]):
        raise UserError(f"{path} is not a Pareto front of an hwnas run: expected columns trial, "
                        f"arch, policy, accuracy, latency_ms:DEVICE")
    out = []
    for i, row in enumerate(rows):
        try:
            trial = int(float(row["trial"]))
        except (TypeError, ValueError):
            raise UserError(f"{path}, row {i + 2}: trial {row.get('trial')!r} is not an "
                            f"integer") from None
        predicted = {k.split(":", 1)[1]: _float_or_none(v) for k, v in row.items()
                     if k and k.startswith("latency_ms:")}
        out.append(ModelRow(trial, (row.get("arch") or "").strip(), (row.get("policy") or "").strip(),
                            _float_or_none(row.get("accuracy")), predicted, [device],
                            _float_or_none(row.get("test_accuracy"))))
    return out


def parse_select(spec: str, rows: list[ModelRow], front: str | None) -> list[ModelRow]:
    """The rows chosen by ``spec`` (``--select``): ``all`` (default), trial numbers ``3,7,12``,
    ``top:K`` (the K most accurate) or ``fastest:K`` (the K fastest on the ``front`` device, by
    its ``latency_ms:DEVICE`` column)."""
    spec = (spec or "all").strip()
    if spec == "all":
        return rows
    kind, _, count = spec.partition(":")
    if kind in ("top", "fastest") and count:
        try:
            k = int(count)
        except ValueError:
            k = 0
        if k < 1:
            raise UserError(f"--select {spec}: expected a positive count, e.g. {kind}:3")
        if kind == "top":
            return sorted(rows, key=lambda r: -(r.accuracy if r.accuracy is not None else -1e9))[:k]
        if front is None:
            raise UserError(f"--select {spec} needs --front DEVICE (fastest on which device?)")
        return sorted(rows, key=lambda r: (r.predicted.get(front) is None,
                                           r.predicted.get(front) or 0.0))[:k]
    try:
        wanted = [int(t) for t in spec.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--select {spec!r}: expected 'all', trial numbers like 3,7,12, 'top:K' "
                        f"or 'fastest:K'") from None
    by_trial = {r.trial: r for r in rows}
    missing = [t for t in wanted if t not in by_trial]
    if missing:
        shown = ", ".join(str(t) for t in sorted(by_trial)[:12])
        raise UserError(f"--select: trial {missing[0]} is not on the selected front(s); its "
                        f"trials are: {shown or 'none'}")
    return [by_trial[t] for t in dict.fromkeys(wanted)]


def _load_run(run_dir: Path) -> SearchConfig:
    return RunDir(run_dir).read_search_config()


def _fronts(run_dir: Path, front: str | None) -> dict[str, Path]:
    rd = RunDir(run_dir)
    available = rd.fronts()
    if front is not None:
        if front not in available:
            raise UserError(f"{run_dir} has no Pareto front for device {front!r} "
                            f"({rd.pareto(front).name}); fronts: {', '.join(available) or 'none'}")
        return {front: available[front]}
    if not available:
        raise UserError(f"{run_dir} has no pareto_<device>.csv; has its search finished?")
    return available


def _say(progress: bool, text: str, *, err: bool = False) -> None:
    if progress or err:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)


def _print_line(line: str) -> None:
    """Default per-model report: stdout for a success, stderr for a failure."""
    failed = line.split(": ", 2)[1:2] == ["failed"]
    print(line, file=sys.stderr if failed else sys.stdout, flush=True)


def _machine() -> dict[str, Any]:
    import onnxruntime as ort

    from hwnas.latency.machine import cpu_model

    cpu = cpu_model()

    try:
        import openvino
        ov_version = openvino.__version__
    except ImportError:
        ov_version = None
    return {"cpu": cpu, "cores": os.cpu_count(), "onnxruntime": ort.__version__,
            "openvino": ov_version, "python": platform.python_version()}


def _selected_rows(run_dir: Path, front: str | None, select: str) -> list[ModelRow]:
    """The rows ``select`` picks from the fronts (a model on several fronts once, with every
    front's predictions); UserError when none is picked."""
    fronts = _fronts(run_dir, front)
    merged: dict[tuple[str, str], ModelRow] = {}
    for device, path in fronts.items():
        for row in read_front(path, device):
            key = (row.arch, row.policy)
            if key in merged:
                merged[key].fronts.append(device)
                merged[key].predicted.update({k: v for k, v in row.predicted.items()
                                              if merged[key].predicted.get(k) is None})
            else:
                merged[key] = row
    rows = parse_select(select, list(merged.values()), front)
    if not rows:
        raise UserError(f"no model selected from {', '.join(p.name for p in fronts.values())} "
                        f"(empty front?)")
    return rows


def _checked_arguments(devices: Sequence[str | Any], settings: Any,
                       max_test_images: Any) -> tuple[dict, Any]:
    """(the extra devices measurable here, the settings) of :func:`export_run`'s arguments;
    UserError for a device not measurable on this CPU or a bad ``max_test_images``."""
    from hwnas.export.model_export import ExportSettings, measurable_devices

    extra = measurable_devices(devices)
    wrong = [getattr(d, "name", d) for d in devices if getattr(d, "name", d) not in extra]
    if wrong:
        raise UserError(f"device {wrong[0]!r} cannot be measured on this CPU; expected "
                        f"cpu-ort-<N>t or cpu-ov-<N>t (OpenVINO installed), optionally with "
                        f"-b<batch>")
    settings = settings or ExportSettings()
    settings.validate()
    if isinstance(max_test_images, bool) or not isinstance(max_test_images, int) or max_test_images < 1:
        raise UserError(f"max_test_images must be a positive integer, got {max_test_images!r}")
    return extra, settings


def _export_models(run_dir: Path, context: Any, rows: list, staging: Path, progress: bool,
                   workers: int, done: Callable[[Any], None], results: list) -> dict[str, float]:
    """Every selected model exported (here, or by ``workers`` processes); returns the stage
    seconds the models' part adds (``timings_alone``, and the parallel ones)."""
    if workers == 1:
        for i, row in enumerate(rows):
            done(_export_row(context, row, staging, i, len(rows), progress))
        return {"timings_alone": sum(m.info.get("stage_seconds", {}).get(k, 0.0)
                                     for m in results for k in TIMING_STAGES)}
    return _export_parallel(run_dir, context, rows, staging, progress, workers, done)


def export_run(run_dir: str | Path, *, front: str | None = None, select: str = "all",
               out: str | Path | None = None, settings: Any = None, max_test_images: int = 1000,
               progress: bool = True, report: Callable[[str], None] | None = None,
               devices: Sequence[str | Any] = (), dataset: Any = None) -> RunExport:
    """Export the selected Pareto-optimal models of ``run_dir``: each rebuilt exactly as the
    search scored it - the subnet extracted from the supernet with its BatchNorm recalibrated on
    ``calib_batches`` augmented training batches (seed ``seed``), and, when the row has a
    policy, PTQ on ``ptq_images`` training images (128 per batch, shuffled with ``seed``).

    Everything is written to a staging directory beside ``out`` (default ``RUN_DIR/export``) and
    moved into place at the end, so an interrupted export leaves the previous one intact. Each
    model that fails (an architecture outside the space, a policy that does not match the model,
    a parity failure...) is reported on one line and recorded in the manifest; the others are
    still written. Whole-command errors (missing or foreign run directory, unknown front, bad
    ``select``) raise :class:`UserError` before anything is written.

    ``front``: one device's front (``pareto_<front>.csv``), default every front (models on
    several fronts are exported once). ``settings``: :class:`hwnas.export.model_export.ExportSettings`.
    ``devices``: devices measurable on this CPU to recommend a file for beside the run's own
    (names such as ``cpu-ov-2t``, ``cpu-ort-1t-b32``, or :class:`hwnas.latency.devices.MeasuredDevice`
    objects; a name becomes its Device here, once). ``report(line)``: called with one line per model
    (default: print). ``dataset``: the run's dataset already in memory, as
    :func:`hwnas.supernet.data.load_dataset` gives it for the run's ``dataset`` and ``data_seed``
    (``hwnas run`` passes the search's: :attr:`hwnas.search.runner.SearchResult.data`), so that it
    is not read and decoded again; default: loaded here. The calibration and test batches are
    drawn from it once, here, and handed to the worker processes.

    Examples:
        >>> from hwnas.export import export_run
        >>> result = export_run(run_dir, front="edgetpu-est", select="fastest:1", out="exported",
        ...                     progress=False, report=lambda line: None)   # run_dir: a finished search
        >>> len(result.models), sorted(p.name for p in result.out_dir.glob("*.json"))
        (1, ['.hwnas-written.json', 'manifest.json'])
    """
    from hwnas.export.model_export import write_manifest
    from hwnas.export.parallel import auto_workers

    start = time.perf_counter()
    run_dir = Path(run_dir)
    extra, settings = _checked_arguments(devices, settings, max_test_images)
    cfg = _load_run(run_dir)
    rows = _selected_rows(run_dir, front, select)
    out_dir = Path(out) if out is not None else RunDir(run_dir).export_dir
    check_replaceable(out_dir, run_dir)
    workers = auto_workers(len(rows), settings.workers)
    stages: dict[str, float] = {}
    with retained_heap():  # activations reuse freed memory, not fresh pages (hwnas.core.heap)
        # the data and batches once, here; with workers, the supernet stays on the CPU here
        # (its space and the devices are all the manifest needs) and each worker loads its own
        context = _prepare(run_dir, cfg, settings, rows, extra, max_test_images,
                           torch_device=settings.device if workers == 1 else "cpu",
                           batch_device=settings.device, dataset=dataset)
        stages["prepare"] = time.perf_counter() - start
        report = report or _print_line
        written.remove_stale(out_dir)
        results: list[Any] = []
        info = _info(run_dir, cfg, front, select, settings, context.tunable)
        info["workers"] = workers
        info["shared_seconds"] = context.seconds
        with written.staged(out_dir, WRITER) as staging:
            def done(result: Any) -> None:
                results.append(result)
                report(_summary_line(result))
                write_manifest(staging, results, info)
            t0 = time.perf_counter()
            stages.update(_export_models(run_dir, context, rows, staging, progress, workers,
                                         done, results))
            t1 = time.perf_counter()
            stages["models"] = t1 - t0
            _write_speedups(staging, results, context.space, context.tunable)
            info["export_stages_s"] = stages
            write_manifest(staging, results, info)
        written.replace_dir(staging, out_dir, writers=[WRITER], what="an hwnas export")
        stages["finish"] = time.perf_counter() - t1
        return RunExport(out_dir, results, time.perf_counter() - start, stages)


@dataclass
class _Context:
    """What every model of one export shares, prepared once: the run, its supernet and data,
    the BatchNorm recalibration and PTQ calibration batches, the test images, the devices."""

    cfg: SearchConfig
    space: Any
    supernet: Any
    data: Any
    settings: Any
    seed: int
    calib_batches: int
    bn_batches: list[Any]
    ptq_batches: list[Any]
    ptq_config: Any
    test_images: Any
    test_labels: Any
    devices: list[str]
    tunable: dict[str, Any]  # name -> the MeasuredDevice the export tunes for
    seconds: dict[str, float]
    input_spec: Any = None  # the images' mean, std and class names (InputSpec)
    #: arch string -> (its recalibrated float network, the work export_model shares for it)
    networks: dict[str, tuple[Any, dict]] = field(default_factory=dict)


def _prepare(run_dir: Path, cfg: SearchConfig, settings: Any, rows: list[ModelRow],
             extra: dict[str, Any], max_test_images: int, *, torch_device: str = "cpu",
             batch_device: str | None = None, dataset: Any = None) -> _Context:
    """Load the run's supernet (on ``torch_device``) and data (``dataset``: already loaded,
    :func:`export_run`), and draw the calibration and test batches once for all models: each
    model's BatchNorm recalibration and PTQ read the same seeded batches a per-model loader
    would give, so sharing them changes no number; the policies of one architecture share its
    recalibrated network and FP32 graph. ``batch_device``: where the BatchNorm batches are
    drawn (default ``torch_device``): the device the models recalibrate on, so that a worker
    process that receives them gets the numbers it would have drawn itself."""
    from hwnas.export.model_export import measurable_devices
    from hwnas.export.onnx_export import InputSpec
    from hwnas.quant.ptq import PTQConfig, calibration_batches
    from hwnas.supernet.data.loader import BatchLoader
    from hwnas.supernet.evaluate import bn_calibration_batches

    t0 = time.perf_counter()
    rd = RunDir(run_dir)
    space, supernet, payload = load_run_supernet(rd, cfg, device=torch_device)
    seed = cfg.seed
    devices = list(cfg.all_devices)
    for row in rows:
        for d in row.predicted:
            if d not in devices:
                devices.append(d)
    tunable = {**measurable_devices(devices), **extra}
    data = replay_splits(cfg, payload, str(rd.supernet), data=dataset)
    t1 = time.perf_counter()
    calib_batches = cfg.calib_batches
    ptq_config = PTQConfig(max_images=cfg.ptq_images, seed=seed, rounding=settings.rounding)
    bn_batches = bn_calibration_batches(data, calib_batches, seed=seed,
                                        device=batch_device or torch_device)
    ptq_batches = calibration_batches(
        BatchLoader(data.train, batch_size=128, mean=data.mean, std=data.std, shuffle=True,
                    seed=seed), ptq_config.max_images, "cpu")
    # a seeded random sample of the test split: CIFAR-10's test split is sorted by class, so
    # its first images are all one class
    test_loader = BatchLoader(data.test, batch_size=max_test_images, mean=data.mean, std=data.std,
                              shuffle=True, seed=seed)
    test_images, test_labels = next(iter(test_loader))
    seconds = {"load": t1 - t0, "batches": time.perf_counter() - t1}
    return _Context(cfg, space, supernet, data, settings, seed, calib_batches, bn_batches,
                    ptq_batches, ptq_config, test_images, test_labels, devices, tunable, seconds,
                    InputSpec(tuple(data.mean), tuple(data.std), tuple(data.classes)))


def _for_worker(ctx: _Context) -> _Context:
    """What a worker process receives: the batches (on the CPU, for pickling; bit for bit the
    same tensors), without the data set and the supernet (each worker loads the supernet)."""
    import dataclasses

    def cpu(batch: Any) -> Any:
        return tuple(t.cpu() for t in batch) if isinstance(batch, (tuple, list)) else batch.cpu()
    return dataclasses.replace(ctx, supernet=None, data=None, networks={},
                               bn_batches=[cpu(b) for b in ctx.bn_batches],
                               ptq_batches=[cpu(b) for b in ctx.ptq_batches])


def _export_row(ctx: _Context, row: ModelRow, staging: Path, index: int, total: int,
                progress: bool) -> Any:
    """Rebuild one selected model as the search scored it and export it into ``staging``;
    a UserError fails this model only (recorded in its result)."""
    import torch
    from hwnas.export.model_export import ModelExport, export_model
    from hwnas.quant.policy import QuantPolicy
    from hwnas.supernet.evaluate import recalibrated_subnet

    _say(progress, f"[{index + 1}/{total}] {row.name} {row.arch}"
                   + (" (quantized)" if row.policy else ""))
    result = ModelExport(name=row.name, arch=row.arch, accuracy=row.accuracy)
    data, space, seed = ctx.data, ctx.space, ctx.seed
    try:
        arch = space.from_string(row.arch)
        policy = None
        if row.policy:
            try:
                policy = QuantPolicy.from_dict(json.loads(row.policy),
                                               source=f"policy of trial {row.trial}")
            except json.JSONDecodeError as exc:
                raise UserError(f"policy of trial {row.trial} is not valid JSON: "
                                f"{exc}") from None
        t0 = time.perf_counter()
        key = space.to_string(arch)
        if key not in ctx.networks:  # several policies of one arch: one float network
            torch.manual_seed(seed)
            ctx.networks[key] = (recalibrated_subnet(
                ctx.supernet, arch, data, calib_batches=ctx.calib_batches, seed=seed,
                batches=ctx.bn_batches), {})
        network, shared = ctx.networks[key]
        model = copy.deepcopy(network)
        recalibrate_s = time.perf_counter() - t0
        if policy is not None:
            policy.validate(model)
        result = export_model(
            model, name=row.name, out_dir=staging, example=ctx.test_images[:1],
            test_images=ctx.test_images, test_labels=ctx.test_labels, policy=policy,
            calibration=ctx.ptq_batches, ptq_config=ctx.ptq_config,
            arch=space.to_string(arch), accuracy=row.accuracy,
            predicted_latency={d: row.predicted.get(d) for d in ctx.devices},
            devices=ctx.tunable, settings=ctx.settings, progress=progress,
            input_spec=ctx.input_spec,
            metadata={"trial": row.trial, "fronts": row.fronts, "space": space.name,
                      "dataset": ctx.cfg.dataset, "test_accuracy": row.test_accuracy},
            shared=shared)
        result.info.setdefault("stage_seconds", {})["recalibrate"] = recalibrate_s
    except WriteError:
        raise  # a full disk fails every model after it: the export ends, nothing is kept
    except UserError as exc:
        result.fail(str(exc))
    return result


# -- parallel export: workers build and verify side by side, timings run alone ---------------

#: how many times the export of a model whose PTQ learns its rounding (AdaRound: weights below
#: 6 bits, :func:`hwnas.quant.ptq.rounding_learned`) costs that of one of the same FLOPs that
#: does not: 3.6 per FLOP on one CPU thread (PTQ with AdaRound 81 % of the largest CIFAR-10
#: model's export), less where AdaRound runs on a GPU; only the order it gives matters
#: (benchmarks/export_speed.md, Session 39)
ADAROUND_COST = 4.0
#: a float model (no policy) against a quantized one of the same FLOPs: FP32 file and the
#: recommendation only, no PTQ, QDQ or per-device files
FLOAT_COST = 0.25


def estimated_cost(row: ModelRow, space: Any, rounding: str) -> float:
    """A model's export cost in arbitrary units, from what its row says: its FLOPs (the
    verification passes, calibration and timings scale with them), times :data:`ADAROUND_COST`
    when PTQ learns its rounding under ``rounding``, or :data:`FLOAT_COST` without a policy.
    Only its order matters (:func:`submission_order`); 0 for a row that cannot be read (it
    fails at once)."""
    from hwnas.quant.policy import QuantPolicy
    from hwnas.quant.ptq import rounding_learned

    try:
        flops = float(space.flops(space.from_string(row.arch)))
        if not row.policy:
            return flops * FLOAT_COST
        policy = QuantPolicy.from_dict(json.loads(row.policy))
    except (UserError, ValueError, KeyError, TypeError):
        return 0.0
    learned = rounding_learned((w for w, _ in policy.bits.values()), rounding)
    return flops * (ADAROUND_COST if learned else 1.0)


def submission_order(rows: Sequence[ModelRow], space: Any, rounding: str) -> list[int]:
    """The indices of ``rows`` costliest first (:func:`estimated_cost`; ties in the fronts'
    order): longest-processing-time-first list scheduling, so that no large model starts last.
    In the fronts' order (the smallest models often first), 9 models on 8 workers started one of
    the two largest only after a small one finished: the export took about a small model plus
    the largest instead of the largest alone (the GPU run of benchmarks/export_speed.md,
    Session 39)."""
    costs = [estimated_cost(row, space, rounding) for row in rows]
    return sorted(range(len(rows)), key=lambda i: -costs[i])


_WORKER: dict[str, Any] = {}


def _init_worker(gate: Any, run_dir: Path, shared: _Context, started: float,
                 cores: int) -> None:
    import dataclasses

    import torch

    from hwnas.export.parallel import install_gate

    torch.set_num_threads(1)
    retain_freed_memory()  # the worker only exports: freed activations stay for reuse
    install_gate(gate, cores)
    _WORKER["gate"] = gate
    device = shared.settings.device
    try:
        _, supernet, _ = load_run_supernet(RunDir(run_dir), shared.cfg, device=device)
    except UserError as exc:  # e.g. the checkpoint went away: the main process raises it
        _WORKER["error"] = exc
        return
    bn_batches = [tuple(t.to(device) for t in b) for b in shared.bn_batches]
    _WORKER["context"] = dataclasses.replace(shared, supernet=supernet, bn_batches=bn_batches)
    _WORKER["ready"] = time.time() - started  # spawn, imports, the supernet: seconds to ready


def _worker_row(row: ModelRow, staging: Path, index: int, total: int, progress: bool
                ) -> tuple[Any, float]:
    """One model in a worker, and how long after the pool started that worker was ready."""
    if "error" in _WORKER:
        raise _WORKER["error"]
    with _WORKER["gate"].computing():
        return (_export_row(_WORKER["context"], row, staging, index, total, progress),
                _WORKER["ready"])


def _export_parallel(run_dir: Path, context: _Context, rows: list[ModelRow], staging: Path,
                     progress: bool, workers: int, done: Callable[[Any], None]
                     ) -> dict[str, float]:
    """Export ``rows`` in ``workers`` spawned processes (CUDA and onnxruntime do not survive a
    fork), each given the batches ``context`` drew and loading the supernet once, while every
    timing runs alone (:mod:`hwnas.export.parallel`); the models are submitted costliest first
    (:func:`submission_order`) and their results reach ``done`` in the order of ``rows`` (the
    order of the fronts). Returns ``workers_ready`` (seconds from the pool's
    start to the last worker that reported ready), ``timings_alone`` (seconds the gate gave
    the machine to timings) and ``timings_waited`` (seconds timings waited for the other
    workers to reach a yield point, in all)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from hwnas.export.parallel import TimingGate

    ctx = multiprocessing.get_context("spawn")
    gate = TimingGate(ctx)
    ready = 0.0
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(gate, run_dir, _for_worker(context), time.time(),
                                       max(1, (os.cpu_count() or 1) // workers))) as pool:
        futures: list[Any] = [None] * len(rows)
        for i in submission_order(rows, context.space, context.settings.rounding):
            futures[i] = pool.submit(_worker_row, rows[i], staging, i, len(rows), progress)
        try:
            for future in futures:
                result, worker_ready = future.result()
                ready = max(ready, worker_ready)
                done(result)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return {"workers_ready": ready, "timings_alone": gate.held.value,
            "timings_waited": gate.waited.value}


#: what writes an export directory, in its record of written files (:mod:`hwnas.core.written`)
WRITER = "export"


def check_replaceable(out_dir: Path, run_dir: Path) -> None:
    """Raise unless ``out_dir`` is new, empty, or an earlier export whose record names
    everything in it (:mod:`hwnas.core.written`): a user's directory, the run directory or one
    holding it is never replaced."""
    if out_dir.exists() and not out_dir.is_symlink():
        target, run = out_dir.resolve(), run_dir.resolve()
        if target == run or target in run.parents:
            raise UserError(f"--out {out_dir} is the run directory or holds it; choose a new "
                            f"directory (default {RunDir(run_dir).export_dir})")
    written.check_replaceable(out_dir, overwrite=True, writers=[WRITER], what="an hwnas export",
                              instead="choose a new or empty directory")
    check_writable(out_dir)


def _info(run_dir: Path, cfg: SearchConfig, front: str | None, select: str, settings: Any,
          tunable: dict[str, Any]) -> dict[str, Any]:
    from dataclasses import asdict

    return {"run_dir": str(run_dir), "space": cfg.space, "dataset": cfg.dataset,
            "front": front, "select": select, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": _machine(), "settings": asdict(settings),
            "tuned_devices": {name: device.threads for name, device in tunable.items()},
            "layout": {"<name>.onnx": "FP32 (python -m hwnas.latency.ondevice DIR times these)",
                       "qdq/<name>.onnx": "QDQ of the searched policy",
                       "qdq-<device>/<name>.onnx": "QDQ with the layers that lose on <device> "
                                                   "kept float (onnxruntime devices)",
                       "recommended": "per device: the fastest file verified on its runtime, "
                                      "with the runtime settings it needs, from one paired "
                                      "timing of every candidate",
                       "int4/<name>.onnx": "QDQ with ONNX INT4 weights (size)",
                       "uint8[-qdq-<device>]/<name>.onnx": "the same with uint8 NHWC images in, "
                                                            "normalised inside the graph"}}


def _summary_line(result: Any) -> str:
    """One line per model: per measured device, the file to deploy and its time beside FP32's,
    both from that device's one paired measurement (so the two never contradict)."""
    if result.status != "ok":
        return f"{result.name}: failed: {result.errors[0] if result.errors else 'unknown error'}"
    parts = []
    for d in result.devices:
        if not d.measured:
            continue
        if d.recommended is None or d.fp32_ms is None:
            parts.append(f"{d.device}: no verified file")
        elif d.recommended_ms is None or d.recommended_ms >= d.fp32_ms or not d.speedup:
            parts.append(f"{d.device}: {d.recommended} fp32 {d.fp32_ms:.3f} ms")
        else:
            hint = "".join(f" {k}={v}" for k, v in d.settings.items())
            parts.append(f"{d.device}: {d.recommended} {d.precision}{hint} {d.recommended_ms:.3f} ms "
                         f"vs fp32 {d.fp32_ms:.3f} ms ({d.speedup:.2f}x)")
        if d.busy and d.recommended is not None and d.fp32_ms is not None:
            parts[-1] += " [timed on a busy machine: may not hold on a quiet one]"
    noted = [f for f in result.files if getattr(f, "parity_note", "")]
    rounded = [f for f in noted if f.precision == "fp32"]
    if rounded:  # passed over atol by the float64 check: say so (figures in the manifest)
        parts.append(", ".join(f.path for f in rounded) + ": over the FP32 parity bound by "
                     "float32 rounding, no farther from the float64 answer than PyTorch "
                     "(parity_note in the manifest)")
    tied = [f for f in noted if f.precision != "fp32"]
    if tied:  # passed below min_agreement: say why (the manifest's parity_note has the figures)
        parts.append(", ".join(f"{f.path} agrees {100 * f.top1_agreement:.1f}% with its "
                               f"fake-quant model" for f in tied)
                     + ": rounding flips on near-tied logits (parity_note in the manifest)")
    written = sum(1 for f in result.files if f.written)
    return f"{result.name}: ok: {written} file(s)" + "".join(f"; {p}" for p in parts)


def _write_speedups(out_dir: Path, results: list[Any], space: Any, tunable: dict[str, Any]) -> None:
    """``int8_speedup_<device>.json``: measured float/int8 time per layer shape
    (:func:`hwnas.quant.device_rules.layer_key`), median over the exported models, for
    :meth:`hwnas.quant.device_rules.DeviceQuantRules.with_speedups` in the next search."""
    import numpy as np
    from hwnas.export.device_policy import LayerSpeed, ProfiledLayerTimer
    from hwnas.quant.device_rules import measure_int8_speedup

    from hwnas.core.io import write_atomic

    for device in tunable:
        table: dict[str, list[float]] = {}
        for r in results:
            choice = r.info.get("device_choice", {}).get(device)
            if not choice or not r.arch:
                continue
            speeds = {row["layer"]: LayerSpeed(row["layer"], row["kind"], row["float_ms"],
                                               row["int8_ms"])
                      for row in choice["layers"] if row["float_ms"] > 0 and row["int8_ms"] > 0}
            layers = [layer for layer in space.layers(space.from_string(r.arch))
                      if layer.name in speeds]
            for key, value in measure_int8_speedup(layers, ProfiledLayerTimer(speeds),
                                                   by="shape").items():
                table.setdefault(key, []).append(value)
        if table:
            doc = {"device": device, "threads": tunable[device].threads,
                   "int8_speedup": {k: float(np.median(v)) for k, v in sorted(table.items())}}
            write_atomic(out_dir / f"int8_speedup_{device}.json",
                          (json.dumps(doc, indent=1) + "\n").encode())
