#!/usr/bin/env python3
"""Measure the latency of exported ONNX models on the device you run this on.

A standalone script: it needs only Python 3.8+, numpy and onnxruntime (no hwnas, no torch), so
it can be copied to a Jetson, a Raspberry Pi or a phone (Termux) and run there::

    pip install numpy onnxruntime          # on the device
    python ondevice.py MODELS_DIR --out measurements.csv [--threads N] [--repeats 50]

On an Intel CPU, GPU or NPU time the models with OpenVINO instead (``pip install openvino``;
only then is it imported): ``--runtime openvino [--ov-device CPU] [--precision f32|bf16|f16]
[--streams S]``. The timing is the same (the model is read by onnxruntime for its inputs and
metadata, then run by OpenVINO); the precision OpenVINO reports it used is printed, since a CPU
without BF16/FP16 support falls back to f32. ``--streams S`` times a model as an export
recommends it with ``NUM_STREAMS`` S: compiled with S streams sharing ``--threads`` for the
sub-batch ``--batch`` / S, each call's batch split into S sub-batches run on S parallel infer
requests (OpenVINO's way to keep many cores busy with a small network).

Every ``*.onnx`` file of MODELS_DIR (as ``hwnas latency reference --export DIR`` writes the
models a new device should measure first, or as ``hwnas run`` exports them: ``trial_NNNN.onnx``;
other files are ignored) is run with random input at batch ``--batch`` (default 1):
``--warmup`` untimed runs, then ``--repeats`` timed ones (times are per call of the batch).
The CSV has one row per model::

    arch,latency_ms,p95_ms,cv,file

``arch`` is the model's ``arch`` metadata entry (written by hwnas; the file name without
``.onnx`` when absent), ``latency_ms`` the median time per run, ``p95_ms`` the 95th percentile
and ``cv`` the coefficient of variation (std / mean) of the timed runs. A model whose ``cv``
exceeds ``--max-cv`` is re-measured once (noise is often a passing background task); if it is
still too noisy it is NOT written to the CSV - a noisy number would mislead the predictor - and
the script says so. It warns (and still writes the CSV) when the load average says that other
programs competed for the cores while it timed. The exit status is 0 when every model was written, 1 when some were left out
as unstable, 2 when none could be written (or on bad arguments; nothing is written then).

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


class MeasureError(Exception):
    """A bad argument or an unusable model: reported as one line, exit status 2."""


def session_for(path: Path, threads: int, provider: str = "CPUExecutionProvider") -> ort.InferenceSession:
    """An onnxruntime session set up for reproducible timing: ``threads`` intra-op threads,
    sequential execution, all graph optimizations, no spinning between runs."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    # no residual spinning after a run: it would slow the next model timed in this process
    opts.add_session_config_entry("session.force_spinning_stop", "1")
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
            "cv": float(times.std() / mean) if mean > 0 else 0.0}


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


def main(argv: list | None = None) -> int:
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
    args = parser.parse_args(argv)

    prog = parser.prog
    try:
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
        files = list_models(Path(args.models_dir))
        out = Path(args.out)
        if out.is_dir():
            raise MeasureError(f"--out {out} is a directory; expected a CSV file name")
        runtime = f"onnxruntime {ort.__version__}"
        if args.runtime == "openvino":
            try:
                import openvino as ov
            except ImportError:
                raise MeasureError("--runtime openvino needs OpenVINO: pip install openvino") from None
            runtime = (f"OpenVINO {ov.__version__} on {args.ov_device}, precision hint "
                       f"{args.precision}, {args.streams} stream(s)")
        if not args.quiet:
            print(f"# {platform.machine()} {platform.processor() or platform.platform()}, "
                  f"{runtime}, {args.threads} thread(s), batch {args.batch}, {len(files)} models",
                  file=sys.stderr)
        rows, unstable = [], []
        for path in files:
            session = session_for(path, args.threads, args.provider)
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
