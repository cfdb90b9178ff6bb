"""Measure the inference latency of an ONNX model with onnxruntime on the CPU.

The search ranks architectures by latency, so the numbers must be comparable between
runs: one fixed execution provider (CPU), a fixed thread count, sequential execution,
warm-up calls that are not timed, and robust statistics (median and p95 rather than a
single timing). The coefficient of variation (``cv``) says how noisy a measurement was,
so a caller can re-measure or distrust a noisy one.

This module deliberately imports only the standard library, numpy and onnxruntime
(and :mod:`hwnas.core.errors`, which is dependency-free) - never torch - because it is
also the seed of a stand-alone measurement script that runs on target devices where
only onnxruntime and numpy are installed.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from hwnas.core.errors import UserError
from hwnas.core.io import first_line

__all__ = ["LatencyStats", "make_session", "random_input", "measure_onnx"]


@dataclass(frozen=True)
class LatencyStats:
    """Summary of the timed runs of one latency measurement.

    Times are wall-clock milliseconds per ``session.run`` call (one batch of ``batch``
    samples). ``cv`` is the coefficient of variation (population std / mean) of the
    timed runs: a noise indicator, not a latency. ``repeats``, ``warmup``, ``threads``
    and ``batch`` record the settings, so a number is never separated from how it was
    obtained.
    """

    median_ms: float
    p95_ms: float
    mean_ms: float
    cv: float
    repeats: int
    warmup: int
    threads: int
    batch: int

    def as_dict(self) -> dict:
        """Plain ``dict`` of all fields, ready for JSON/CSV output."""
        return asdict(self)


#: the largest input a measurement feeds (values per input: 1 GiB of float32); a larger one is
#: a mistake, not a vision model, and would exhaust memory before onnxruntime runs
MAX_INPUT_ELEMENTS = 2 ** 28


def _check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an int >= ``minimum``; otherwise raise :class:`UserError`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise UserError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise UserError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def make_session(model: str | Path | bytes, *, threads: int = 1) -> ort.InferenceSession:
    """Create a CPU onnxruntime session configured for reproducible latency measurement.

    ``model`` is a path to an ``.onnx`` file or the serialized model bytes. The session
    uses only the CPUExecutionProvider, ``threads`` intra-op threads, one inter-op
    thread, sequential execution and all graph optimizations (what a deployment would
    use). Raises :class:`UserError` if the file is missing or onnxruntime cannot load it.
    """
    threads = _check_int("threads", threads, 1)
    if isinstance(model, (bytes, bytearray, memoryview)):
        source: str | bytes = bytes(model)
        what = "the ONNX model bytes"
    elif isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            kind = "is a directory" if path.is_dir() else "does not exist"
            raise UserError(f"ONNX model file {str(path)!r} {kind}; expected a path to an .onnx file")
        source = str(path)
        what = f"ONNX model file {str(path)!r}"
    else:
        raise UserError(
            f"model must be a path to an .onnx file or ONNX model bytes, got {type(model).__name__}"
        )

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only: warnings would clutter CLI output
    try:
        return ort.InferenceSession(source, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises several unrelated exception types
        raise UserError(
            f"onnxruntime cannot load {what} (expected a valid ONNX model): {first_line(exc)}"
        ) from exc


def random_input(session: ort.InferenceSession, *, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 feeds (standard normal) for every input of ``session``.

    Latency does not depend on the values, only on the shapes, so random data is enough.
    A symbolic (or unknown) first dimension is taken as the batch dimension and set to
    ``batch``; any other symbolic dimension cannot be guessed and raises
    :class:`UserError` naming the input. A fixed first dimension that differs from
    ``batch`` also raises, rather than silently measuring another batch size. Values come
    from ``np.random.default_rng(seed)``, drawn in input order, so feeds are reproducible.
    """
    batch = _check_int("batch", batch, 1)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        if arg.type != "tensor(float)":
            raise UserError(
                f"input {arg.name!r} has type {arg.type}; expected tensor(float) (float32) inputs only"
            )
        shape: list[int] = []
        for axis, dim in enumerate(arg.shape):
            fixed = isinstance(dim, (int, np.integer)) and dim > 0
            if axis == 0:
                if fixed and dim != batch:
                    raise UserError(
                        f"input {arg.name!r} has a fixed batch dimension {dim}, but batch={batch} "
                        f"was requested; expected a dynamic batch dimension or batch={dim}"
                    )
                shape.append(batch)
            elif fixed:
                shape.append(int(dim))
            else:
                raise UserError(
                    f"input {arg.name!r} has a symbolic dimension {dim!r} at axis {axis} "
                    f"(shape {list(arg.shape)}); expected fixed sizes for every axis but the first (batch)"
                )
        if math.prod(shape) > MAX_INPUT_ELEMENTS:
            raise UserError(
                f"input {arg.name!r} has shape {shape} ({math.prod(shape):,} values); expected at "
                f"most {MAX_INPUT_ELEMENTS:,} values per input (a vision model's input)"
            )
        feeds[arg.name] = rng.standard_normal(shape, dtype=np.float32)
    return feeds


def measure_onnx(
    model: str | Path | bytes,
    *,
    batch: int = 1,
    warmup: int = 10,
    repeats: int = 50,
    threads: int = 1,
    seed: int = 0,
) -> LatencyStats:
    """Measure the CPU latency of one ONNX model (a path or serialized bytes).

    Runs ``warmup`` untimed calls (to let allocators, caches and lazy initialisation
    settle), then ``repeats`` calls each timed on its own with ``time.perf_counter``, on
    the same random input of batch size ``batch``. Returns median, p95, mean (ms per
    call) and the coefficient of variation. Bad arguments and unloadable models raise
    :class:`UserError`.
    """
    batch = _check_int("batch", batch, 1)
    warmup = _check_int("warmup", warmup, 0)
    repeats = _check_int("repeats", repeats, 1)
    threads = _check_int("threads", threads, 1)

    session = make_session(model, threads=threads)
    feeds = random_input(session, batch=batch, seed=seed)
    try:
        for _ in range(warmup):
            session.run(None, feeds)
        times = np.empty(repeats, dtype=np.float64)
        for i in range(repeats):
            start = time.perf_counter()
            session.run(None, feeds)
            times[i] = time.perf_counter() - start
    except Exception as exc:
        shapes = {name: list(a.shape) for name, a in feeds.items()}
        raise UserError(f"onnxruntime failed to run the model on inputs {shapes}: {first_line(exc)}") from exc

    times_ms = times * 1e3
    mean = float(times_ms.mean())
    return LatencyStats(
        median_ms=float(np.median(times_ms)),
        p95_ms=float(np.percentile(times_ms, 95)),
        mean_ms=mean,
        cv=float(times_ms.std() / mean) if mean > 0 else 0.0,
        repeats=repeats,
        warmup=warmup,
        threads=threads,
        batch=batch,
    )
