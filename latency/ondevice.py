#!/usr/bin/env python3
"""Measure the latency of exported ONNX models on the device you run this on.

A standalone script: it needs only Python 3.8+, numpy and onnxruntime (no hwnas, no torch), so
it can be copied to a Jetson, a Raspberry Pi or a phone (Termux) and run there::

    pip install numpy onnxruntime          # on the device
    python ondevice.py MODELS_DIR --out measurements.csv [--threads N] [--repeats 50]

On an Intel CPU, GPU or NPU time the models with OpenVINO instead (``--runtime openvino``);
``--verify`` checks an export's files on this device instead of timing them (:func:`main`).
Copy the CSV back and turn it into a device profile with::

    hwnas latency adapt --device MY_DEVICE --space SPACE --measurements measurements.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

#: Columns of the measurements CSV, in order.
CSV_COLUMNS = ("arch", "latency_ms", "p95_ms", "cv", "file")

#: Exit statuses.
EXIT_OK, EXIT_SOME_UNSTABLE, EXIT_ERROR = 0, 1, 2


#: CPU flags that decide how int8 layers run (x86: 16-bit pair sums without VNNI/AMX; Arm:
#: the dot-product extension).
ISA_FLAGS = ("sse4_1", "avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
             "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm", "sve")
#: x86 flags of integer dot products that accumulate in int32 (cannot saturate)
INT32_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_isa() -> dict:
    """This CPU's model name and its :data:`ISA_FLAGS` (from /proc/cpuinfo; the platform
    module's processor name elsewhere), and ``int8_without_saturation``: whether an x86 CPU
    has VNNI/AMX (True), or is an x86 CPU without them (False: uint8 x int8 kernels add
    product pairs into saturating int16), None off x86."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Hardware") and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    machine = platform.machine().lower()
    x86 = machine in ("x86_64", "amd64", "i386", "i686")
    return {"cpu": model or platform.processor() or machine,
            "isa": [f for f in ISA_FLAGS if f in flags],
            "int8_without_saturation": (any(f in flags for f in INT32_DOT_FLAGS) if x86 and flags
                                        else None)}


def isa_line(isa: dict) -> str:
    """``"AMD EPYC (avx2 avx512f ...; VNNI)"``: the CPU and what decides its int8 kernels."""
    kind = {True: "int8 dot products in int32 (VNNI/AMX)",
            False: "no VNNI/AMX: int8 pairs add in int16",
            None: "not x86"}[isa["int8_without_saturation"]]
    return f"{isa['cpu']} ({' '.join(isa['isa']) or 'no flags read'}; {kind})"


class MeasureError(Exception):
    """A bad argument or an unusable model: reported as one line, exit status 2."""


def session_for(path: Path, threads: int, provider: str = "CPUExecutionProvider",
                config: dict | None = None) -> ort.InferenceSession:
    """An onnxruntime session set up for reproducible timing: ``threads`` intra-op threads,
    sequential execution, all graph optimizations, no spinning between runs; ``config``: more
    session config entries (e.g. ``session.x64quantprecision``)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    # no residual spinning after a run: it would slow the next model timed in this process
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    for key, value in (config or {}).items():
        opts.add_session_config_entry(str(key), str(value))
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=[provider])
    except Exception as exc:
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise MeasureError(f"onnxruntime cannot load {path.name}: {first}") from exc


def model_arch(session: ort.InferenceSession, path: Path) -> str:
    """The ``arch`` metadata entry of the model, else the file name without ``.onnx``."""
    meta = session.get_modelmeta().custom_metadata_map or {}
    arch = str(meta.get("arch", "")).strip()
    return arch or path.stem


def random_feeds(session: ort.InferenceSession, batch: int = 1, seed: int = 0) -> dict:
    """Random float32 inputs; a symbolic first (batch) dimension is set to ``batch``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        if arg.type != "tensor(float)":
            raise MeasureError(f"input {arg.name!r} has type {arg.type}; expected float32 inputs")
        shape = []
        for axis, dim in enumerate(arg.shape):
            if isinstance(dim, int) and dim > 0:
                shape.append(dim)  # a fixed batch dimension is kept as exported
            elif axis == 0:
                shape.append(batch)
            else:
                raise MeasureError(f"input {arg.name!r} has a symbolic dimension {dim!r} at axis {axis}")
        feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def time_session(session: ort.InferenceSession, feeds: dict, warmup: int, repeats: int) -> dict:
    """Median, p95 and cv (std / mean) in ms of ``repeats`` timed runs after ``warmup`` runs."""
    for _ in range(warmup):
        session.run(None, feeds)
    times = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times[i] = (time.perf_counter() - start) * 1e3
    mean = float(times.mean())
    return {"latency_ms": float(np.median(times)), "p95_ms": float(np.percentile(times, 95)),
            "mean_ms": mean, "cv": float(times.std() / mean) if mean > 0 else 0.0}


class OpenVinoSession:
    """An OpenVINO compiled model behind the ``run(None, feeds)`` call of an onnxruntime
    session, so that :func:`time_session` times both runtimes the same way. A dynamic batch
    dimension is fixed at ``batch``, the batch measured: OpenVINO runs static shapes faster, as
    a deployment at a fixed batch would compile them. With ``streams`` S > 1 the model is
    compiled with ``NUM_STREAMS`` S for the sub-batch ``batch`` / S, and each call splits its
    batch into S sub-batches run on S infer requests at once, the outputs concatenated in
    order."""

    def __init__(self, path: Path, threads: int, device: str = "CPU", precision: str = "f32",
                 batch: int = 1, streams: int = 1):
        try:
            import openvino as ov
        except ImportError:
            raise MeasureError("--runtime openvino needs OpenVINO: pip install openvino") from None
        if batch % streams:
            raise MeasureError(f"--batch {batch} does not split into {streams} equal "
                               f"sub-batches; expected a batch divisible by --streams")
        config = {"INFERENCE_PRECISION_HINT": precision}
        if device == "CPU":
            config["INFERENCE_NUM_THREADS"] = threads
        if streams > 1:
            config["NUM_STREAMS"] = streams
        try:
            core = ov.Core()
            model = core.read_model(str(path))
            model.reshape({port.get_any_name(): [batch // streams, *port.get_partial_shape()[1:]]
                           for port in model.inputs if port.get_partial_shape().rank.is_static
                           and (port.get_partial_shape()[0].is_dynamic or streams > 1)})
            self.compiled = core.compile_model(model, device, config)
            got = int(self.compiled.get_property("NUM_STREAMS"))
        except Exception as exc:
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()),
                         type(exc).__name__)
            raise MeasureError(f"OpenVINO cannot load {path.name} on {device}: {first}") from exc
        if streams > 1 and got != streams:
            raise MeasureError(f"OpenVINO compiled {path.name} with {got} stream(s) on {device}, "
                               f"not the {streams} of --streams")
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self.streams = streams
        self.requests = [self.compiled.create_infer_request() for _ in range(streams)]

    def run(self, output_names, feeds: dict) -> list:
        if self.streams == 1:
            result = self.requests[0].infer(feeds)
            return [result[port] for port in self.compiled.outputs]
        split = {name: np.split(a, self.streams) for name, a in feeds.items()}
        for i, request in enumerate(self.requests):
            request.start_async({name: parts[i] for name, parts in split.items()})
        for request in self.requests:
            request.wait()
        return [np.concatenate([r.get_output_tensor(i).data for r in self.requests])
                for i in range(len(self.compiled.outputs))]


#: Where an export keeps the labelled sample of each model, relative to the export directory.
VERIFY_DIR = "verify"
#: Exit status of ``--verify`` when some file was refused.
EXIT_REFUSED = 1


def sample_inputs(sample) -> np.ndarray:
    """The float32 NCHW inputs of a verification sample (uint8 ``images`` normalised with its
    ``mean``/``std``): the export computes the same to record each file's top-1."""
    images = np.asarray(sample["images"], dtype=np.float32) / np.float32(255.0)
    mean = np.asarray(sample["mean"], dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(sample["std"], dtype=np.float32).reshape(1, -1, 1, 1)
    return ((images - mean) / std).astype(np.float32)


def predict(run, inputs: np.ndarray, chunk: int = 64) -> np.ndarray:
    """Top-1 classes of ``inputs`` by ``run(batch) -> logits``, ``chunk`` images at a time."""
    return np.concatenate([np.asarray(run(inputs[i:i + chunk])).argmax(axis=1)
                           for i in range(0, len(inputs), chunk)]).astype(np.int64)


def verify_runner(path: Path, runtime: str, threads: int, session_config: dict, batch: int):
    """``run(batch) -> logits`` of one file on this device's runtime (OpenVINO compiled for
    ``batch`` images per call)."""
    if runtime == "openvino":
        session = OpenVinoSession(path, threads, batch=batch)
        ov_name = session.compiled.inputs[0].get_any_name()
        return lambda x: session.run(None, {ov_name: x})[0]
    opts_session = session_for(path, threads, config=session_config)
    name = opts_session.get_inputs()[0].name
    return lambda x: opts_session.run(None, {name: x})[0]


def verify_export(export_dir: Path, runtime: str = "onnxruntime", threads: int = 1,
                  session_config: dict | None = None, out=None) -> tuple[list[dict], list[str]]:
    """Run every file of every ``verify/<model>.npz`` sample of ``export_dir`` on this device.

    ``export_dir`` is an export directory (``RUN_DIR/export``), whose ``verify/<model>.npz`` the
    export wrote beside the files - a few hundred labelled test images (uint8, with the
    mean/std the model takes), the files, and the top-1 each file gave on the machine that
    verified it. Each file is run here (``runtime``, ``session_config``: the onnxruntime
    settings a manifest asks for, ``--session-config KEY=VALUE``); one line per file gives its
    top-1 agreement with the FP32 file run here and its accuracy on the sample. A file whose
    top-1 agrees with what the export verified on fewer than the export's ``min_agreement``
    (99 %) of the images breaks the export's rule on this device - an int8 file whose 16-bit
    sums saturate on a CPU without VNNI, say - and is refused in one line naming the CPU's ISA
    and the runtime.

    Returns one record per file (top-1 agreement with the FP32 file here and with what the
    export verified, sample accuracy) and the one-line refusals of the files whose agreement
    with the export is below the sample's ``min_agreement``."""
    out = out or sys.stdout
    samples = sorted((export_dir / VERIFY_DIR).glob("*.npz"))
    if not samples:
        raise MeasureError(f"{export_dir} has no {VERIFY_DIR}/*.npz: expected an export directory "
                           f"written by hwnas export (it writes a labelled sample per model)")
    isa = cpu_isa()
    if runtime == "openvino":
        try:
            import openvino as ov
        except ImportError:
            raise MeasureError("--runtime openvino needs OpenVINO: pip install openvino") from None
        where = f"OpenVINO {ov.__version__}"
    else:
        where = f"onnxruntime {ort.__version__}" + "".join(
            f" {k}={v}" for k, v in sorted((session_config or {}).items()))
    print(f"# {isa_line(isa)}; {where}", file=out)
    records, refused = [], []
    for sample_path in samples:
        try:
            sample = np.load(sample_path, allow_pickle=False)
            inputs, labels = sample_inputs(sample), np.asarray(sample["labels"], dtype=np.int64)
            files = [str(f) for f in sample["files"]]
            fp32_rel, min_agreement = str(sample["fp32"]), float(sample["min_agreement"])
            exported = {f: np.asarray(sample[f"pred_{i}"]) for i, f in enumerate(files)}
        except (OSError, KeyError, ValueError) as exc:
            raise MeasureError(f"{sample_path} is not a verification sample: {exc}") from None
        batch = min(64, len(inputs))
        if runtime == "openvino" and len(inputs) % batch:
            batch = len(inputs)
        here: dict[str, np.ndarray] = {}
        for rel in [fp32_rel] + [f for f in files if f != fp32_rel]:
            path = export_dir / rel
            if not path.is_file():
                continue
            run = verify_runner(path, runtime, threads, session_config or {}, batch)
            here[rel] = predict(run, inputs, batch)
            pred = here[rel]
            rec = {"file": rel, "images": len(labels),
                   "accuracy": float((pred == labels).mean()),
                   "agreement_fp32": (float((pred == here[fp32_rel]).mean())
                                      if fp32_rel in here else None),
                   "agreement_export": float((pred == exported[rel]).mean()),
                   "min_agreement": min_agreement}
            rec["ok"] = rec["agreement_export"] >= min_agreement
            records.append(rec)
            fp = ("" if rec["agreement_fp32"] is None or rel == fp32_rel
                  else f"top-1 agreement with FP32 {100 * rec['agreement_fp32']:.1f}%, ")
            print(f"{rel}: {fp}with the export {100 * rec['agreement_export']:.1f}%, sample "
                  f"accuracy {100 * rec['accuracy']:.1f}% ({len(labels)} images): "
                  f"{'ok' if rec['ok'] else 'REFUSED'}", file=out)
            if not rec["ok"]:
                refused.append(
                    f"refused {rel}: top-1 agrees with what the export verified on "
                    f"{100 * rec['agreement_export']:.1f}% < {100 * min_agreement:.0f}% of "
                    f"{len(labels)} images on {isa_line(isa)} with {where}"
                    + ("; its int8 sums saturate without VNNI: deploy the portable export "
                       "(hwnas's default) or run it with session.x64quantprecision=1"
                       if isa["int8_without_saturation"] is False else ""))
    return records, refused


def list_models(models_dir: Path) -> list[Path]:
    """The ``*.onnx`` files of a directory, sorted by name."""
    if not models_dir.is_dir():
        raise MeasureError(f"{models_dir} is not a directory; expected a directory of .onnx files")
    files = sorted(p for p in models_dir.glob("*.onnx") if p.is_file())
    if not files:
        raise MeasureError(f"{models_dir} holds no .onnx files")
    return files


def write_csv_atomic(rows: list[dict], out: Path) -> None:
    """Write the rows (keys :data:`CSV_COLUMNS`) to ``out`` via a temporary file + rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=str(out.parent))
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS))
            writer.writeheader()
            for row in rows:
                writer.writerow({k: (f"{row[k]:.6g}" if isinstance(row[k], float) else row[k])
                                 for k in CSV_COLUMNS})
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _cv_limit(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


#: How far the 1-minute load average may exceed the machine's cores before a timing counts as
#: made on a busy machine: a timing that fills every core reads a little above the core count.
BUSY_SLACK = 0.5


def busy_load(load: float | None = None, cores: int | None = None) -> tuple[float, int] | None:
    """``(load, cores)`` when the 1-minute load average exceeds the cores by more than
    :data:`BUSY_SLACK` - more runnable threads than cores, so timed runs waited for a core, and
    not alike for every model - else None. ``load`` / ``cores`` default to this machine's;
    where there is no load average (Windows, some phones) None. The one rule for hwnas too
    (:func:`hwnas.latency.onnx_measure.busy_machine`): this script runs without hwnas."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
    cores = cores or os.cpu_count() or 1
    return (load, cores) if load > cores + BUSY_SLACK else None


def busy_note() -> str:
    """The warning this script prints after timing on a busy machine (:func:`busy_load`), or ""."""
    busy = busy_load()
    if busy is None:
        return ""
    return (f"the 1-minute load average is {busy[0]:.1f} on {busy[1]} cores: other programs "
            f"competed for them while timing, so these latencies may be slower than the device "
            f"alone; close them and measure again")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ondevice.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("models_dir", help="directory of .onnx models")
    parser.add_argument("--out", default="measurements.csv", help="CSV to write (default measurements.csv)")
    parser.add_argument("--threads", type=_positive, default=1,
                        help="onnxruntime intra-op threads, OpenVINO inference threads (default 1)")
    parser.add_argument("--batch", type=_positive, default=1,
                        help="images per timed call, for a dynamic batch dimension (default 1)")
    parser.add_argument("--repeats", type=_positive, default=50, help="timed runs per model (default 50)")
    parser.add_argument("--warmup", type=_non_negative, default=10, help="untimed runs first (default 10)")
    parser.add_argument("--max-cv", type=_cv_limit, default=0.1,
                        help="leave out models whose timing varies more than this (default 0.1)")
    parser.add_argument("--provider", default="CPUExecutionProvider",
                        help="onnxruntime execution provider (default CPUExecutionProvider)")
    parser.add_argument("--runtime", choices=("onnxruntime", "openvino"), default="onnxruntime",
                        help="runtime that runs the models (default onnxruntime; openvino needs "
                             "pip install openvino)")
    parser.add_argument("--ov-device", default="CPU",
                        help="OpenVINO device: CPU, GPU, NPU ... (default CPU)")
    parser.add_argument("--precision", choices=("f32", "bf16", "f16"), default="f32",
                        help="OpenVINO inference precision hint (default f32)")
    parser.add_argument("--streams", type=_positive, default=1,
                        help="OpenVINO streams: each call's batch split into this many "
                             "sub-batches run in parallel (default 1; needs --batch divisible "
                             "by it)")
    parser.add_argument("--quiet", action="store_true", help="no per-model lines")
    parser.add_argument("--verify", action="store_true",
                        help="check an export directory's files on this device against the "
                             "labelled sample the export wrote (verify/*.npz) instead of timing")
    parser.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE",
                        help="onnxruntime session config entry, e.g. "
                             "session.x64quantprecision=1 (repeatable)")
    return parser


def _session_config(args: argparse.Namespace) -> dict[str, str]:
    """The ``--session-config KEY=VALUE`` entries (onnxruntime only)."""
    session_config = {}
    for item in args.session_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MeasureError(f"--session-config {item!r}: expected KEY=VALUE")
        session_config[key] = value
    if session_config and args.runtime != "onnxruntime":
        raise MeasureError("--session-config is an onnxruntime setting")
    return session_config


def _check_timing_settings(args: argparse.Namespace) -> str:
    """:class:`MeasureError` for settings that do not go together; returns the runtime's label."""
    if args.runtime != "openvino" and (args.precision != "f32" or args.ov_device != "CPU"
                                       or args.streams != 1):
        raise MeasureError("--precision, --ov-device and --streams are OpenVINO settings; "
                           "add --runtime openvino")
    if args.batch % args.streams:
        raise MeasureError(f"--batch {args.batch} does not split into {args.streams} equal "
                           f"sub-batches; expected a batch divisible by --streams")
    if args.ov_device == "CPU" and args.streams > args.threads:
        raise MeasureError(f"--streams {args.streams} > --threads {args.threads}: every "
                           f"stream needs at least one thread")
    if args.provider not in ort.get_available_providers():
        raise MeasureError(f"provider {args.provider} is not available here; available: "
                           f"{', '.join(ort.get_available_providers())}")
    return f"onnxruntime {ort.__version__}"


def _openvino_label(args: argparse.Namespace) -> str:
    try:
        import openvino as ov
    except ImportError:
        raise MeasureError("--runtime openvino needs OpenVINO: pip install openvino") from None
    return (f"OpenVINO {ov.__version__} on {args.ov_device}, precision hint "
            f"{args.precision}, {args.streams} stream(s)")


def _time_models(files: list[Path], args: argparse.Namespace, session_config: dict[str, str],
                 prog: str) -> tuple[list[dict], list[dict]]:
    """Time every model (one retry when its cv exceeds ``--max-cv``): ``(rows, unstable)``."""
    rows, unstable = [], []
    for path in files:
        session = session_for(path, args.threads, args.provider, session_config)
        feeds = random_feeds(session, args.batch)
        arch = model_arch(session, path)
        used = ""
        if args.runtime == "openvino":
            batch = len(next(iter(feeds.values())))  # a fixed batch dimension as exported
            session = OpenVinoSession(path, args.threads, args.ov_device, args.precision,
                                      batch, args.streams)
            used = f", precision {session.precision}"
        stats = time_session(session, feeds, args.warmup, args.repeats)
        if stats["cv"] > args.max_cv:  # one retry: noise is often a passing background task
            stats = time_session(session, feeds, args.warmup, args.repeats)
        row = {"arch": arch, "file": path.name, **stats}
        if stats["cv"] > args.max_cv:
            unstable.append(row)
            print(f"{prog}: unstable: {path.name} cv {stats['cv']:.3f} > --max-cv "
                  f"{args.max_cv}; not written", file=sys.stderr)
            continue
        rows.append(row)
        if not args.quiet:
            print(f"{path.name}: {stats['latency_ms']:.4f} ms (p95 {stats['p95_ms']:.4f}, "
                  f"cv {stats['cv']:.3f}{used})", file=sys.stderr)
    return rows, unstable


def main(argv: list | None = None) -> int:
    """The command line (``python ondevice.py --help``).

    Every ``*.onnx`` file of MODELS_DIR (as ``hwnas latency reference --export DIR`` writes the
    models a new device should measure first, or as ``hwnas run`` exports them:
    ``trial_NNNN.onnx``; other files are ignored) is run with random input at batch ``--batch``
    (default 1): ``--warmup`` untimed runs, then ``--repeats`` timed ones (times are per call of
    the batch). The CSV has one row per model::

        arch,latency_ms,p95_ms,cv,file

    ``arch`` is the model's ``arch`` metadata entry (written by hwnas; the file name without
    ``.onnx`` when absent), ``latency_ms`` the median time per run, ``p95_ms`` the 95th
    percentile and ``cv`` the coefficient of variation (std / mean) of the timed runs. A model
    whose ``cv`` exceeds ``--max-cv`` is re-measured once (noise is often a passing background
    task); if it is still too noisy it is NOT written to the CSV - a noisy number would mislead
    the predictor - and the script says so. It warns (and still writes the CSV) when the load
    average says that other programs competed for the cores while it timed. The exit status is
    0 when every model was written, 1 when some were left out as unstable, 2 when none could be
    written (or on bad arguments; nothing is written then).

    ``--runtime openvino [--ov-device CPU] [--precision f32|bf16|f16] [--streams S]`` (``pip
    install openvino``; only then is it imported) times with OpenVINO: the model is read by
    onnxruntime for its inputs and metadata, then run by OpenVINO (:class:`OpenVinoSession`);
    the precision OpenVINO reports it used is printed, since a CPU without BF16/FP16 support
    falls back to f32. ``--streams S`` times a model as an export recommends it with
    ``NUM_STREAMS`` S: compiled with S streams sharing ``--threads`` for the sub-batch
    ``--batch`` / S, each call's batch split into S sub-batches run on S parallel infer requests
    (OpenVINO's way to keep many cores busy with a small network).

    ``--verify`` checks exported files on this device instead (:func:`verify_export`); exit
    status 0 when every file holds, 1 when some were refused.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    prog = parser.prog
    try:
        session_config = _session_config(args)
        if args.verify:
            export_dir = Path(args.models_dir)
            if not export_dir.is_dir():
                raise MeasureError(f"{export_dir} is not a directory; expected an export directory")
            _, refused = verify_export(export_dir, args.runtime, args.threads, session_config)
            for line in refused:
                print(f"{prog}: {line}", file=sys.stderr)
            return EXIT_REFUSED if refused else EXIT_OK
        runtime = _check_timing_settings(args)
        files = list_models(Path(args.models_dir))
        out = Path(args.out)
        if out.is_dir():
            raise MeasureError(f"--out {out} is a directory; expected a CSV file name")
        if args.runtime == "openvino":
            runtime = _openvino_label(args)
        if not args.quiet:
            print(f"# {platform.machine()} {platform.processor() or platform.platform()}, "
                  f"{runtime}, {args.threads} thread(s), batch {args.batch}, {len(files)} models",
                  file=sys.stderr)
        rows, unstable = _time_models(files, args, session_config, prog)
        if not rows:
            raise MeasureError(f"all {len(files)} models were unstable (cv > {args.max_cv}); "
                               f"nothing written - close other programs or raise --max-cv")
        busy = busy_note()
        if busy:
            print(f"{prog}: warning: {busy}", file=sys.stderr)
        write_csv_atomic(rows, out)
    except MeasureError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(f"wrote {len(rows)} measurements to {out}"
          + (f"; {len(unstable)} unstable models left out" if unstable else ""))
    return EXIT_SOME_UNSTABLE if unstable else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
