"""Measure the inference latency of an ONNX model on the CPU, with onnxruntime or OpenVINO.

The search ranks architectures by latency, so the numbers must be comparable between runs:
one fixed execution provider (CPU), a fixed thread count, sequential execution, untimed warm-up
calls and robust statistics (median and p95, and the coefficient of variation ``cv`` that says
how noisy a measurement was, so a caller can re-measure or distrust it). Both runtimes
(:data:`RUNTIMES`; OpenVINO's precision hints and streams: :func:`make_runner`) are wrapped as a
:class:`Runner`, and every timing of hwnas - one model here, several interleaved in
:func:`time_interleaved` - goes through the same timed call (:func:`timed_runs`).

Only the standard library, numpy, onnxruntime, :mod:`hwnas.core.errors` and the stand-alone
:mod:`hwnas.latency.ondevice` are imported - never torch: this module is also the seed of the
measurement script that runs on target devices where only onnxruntime and numpy exist.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from hwnas.latency.ondevice import BUSY_SLACK, busy_load

from hwnas.core.errors import UserError
from hwnas.core.io import first_line

__all__ = ["BUSY_SLACK", "LatencyStats", "MAX_MARGIN", "MIN_MARGIN", "PRECISIONS", "RUNTIMES",
           "Runner", "busy_machine", "clearly_faster", "make_runner", "make_session", "measure_dir",
           "measure_onnx", "openvino_available", "order_settled", "paired_margin",
           "prime_openvino", "round_medians", "random_input", "session_options",
           "time_interleaved", "timed_runs"]

#: Runtimes that run an ONNX file here: onnxruntime (always), OpenVINO (the ``openvino`` extra,
#: imported only when asked for), which reads ONNX directly and takes an inference precision hint
#: and a number of streams (:func:`make_runner`).
RUNTIMES = ("onnxruntime", "openvino")
#: OpenVINO inference precision hints (its ``INFERENCE_PRECISION_HINT``).
PRECISIONS = ("f32", "bf16", "f16")


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
    runtime: str = "onnxruntime"
    precision: str = "f32"

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


def _source(model: str | Path | bytes) -> tuple[str | bytes, str]:
    """The model as a path string or bytes, and how to name it in an error."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model), "the ONNX model bytes"
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            kind = "is a directory" if path.is_dir() else "does not exist"
            raise UserError(f"ONNX model file {str(path)!r} {kind}; expected a path to an .onnx file")
        return str(path), f"ONNX model file {str(path)!r}"
    raise UserError(
        f"model must be a path to an .onnx file or ONNX model bytes, got {type(model).__name__}"
    )


def session_options(threads: int = 1) -> ort.SessionOptions:
    """The onnxruntime session settings of every measurement in hwnas: ``threads`` intra-op
    threads, one inter-op thread, sequential execution, all graph optimizations, errors-only
    logging, and no spinning between runs (``session.force_spinning_stop``): by default the
    intra-op workers keep spinning on their cores for up to about a second after a run, which
    slows whatever runs next in the process - another candidate of a paired timing, OpenVINO,
    PyTorch - while the run itself spins as usual."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only: warnings would clutter CLI output
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    return opts


def make_session(model: str | Path | bytes, *, threads: int = 1) -> ort.InferenceSession:
    """Create a CPU onnxruntime session configured for reproducible latency measurement.

    ``model`` is a path to an ``.onnx`` file or the serialized model bytes. The session
    uses only the CPUExecutionProvider and :func:`session_options` (what a deployment would
    use, without residual spinning between runs). Raises :class:`UserError` if the file is missing or onnxruntime cannot load it.
    """
    threads = _check_int("threads", threads, 1)
    source, what = _source(model)
    try:
        return ort.InferenceSession(source, sess_options=session_options(threads),
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises several unrelated exception types
        raise UserError(
            f"onnxruntime cannot load {what} (expected a valid ONNX model): {first_line(exc)}"
        ) from exc


def random_input(session: ort.InferenceSession | Runner, *, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for every input of ``session``: float32 standard normal, or uniform
    0..255 for a uint8 image input.

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
        if arg.type not in ("tensor(float)", "tensor(uint8)"):
            raise UserError(
                f"input {arg.name!r} has type {arg.type}; expected tensor(float) (float32) or "
                f"tensor(uint8) (image) inputs only"
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
        feeds[arg.name] = (rng.integers(0, 256, shape, dtype=np.uint8) if arg.type == "tensor(uint8)"
                           else rng.standard_normal(shape, dtype=np.float32))
    return feeds


@dataclass(frozen=True)
class InputArg:
    """An input as :func:`random_input` reads it (onnxruntime's ``NodeArg`` has the same fields)."""

    name: str
    type: str
    shape: list


class Runner:
    """One ONNX model compiled by one runtime: ``run(feeds)`` returns the outputs in order.

    ``runtime``, ``threads``, ``precision`` (what the runtime reports it computes in:
    ``f32`` for onnxruntime, the OpenVINO CPU plugin's ``INFERENCE_PRECISION_HINT`` after
    compilation) and ``streams`` (OpenVINO: parallel infer requests one call is split over; 1
    otherwise) travel with every timing, so a number is never separated from its settings.
    """

    runtime: str
    threads: int
    precision: str
    streams: int = 1

    def get_inputs(self) -> list:
        raise NotImplementedError

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def at_batch(self, batch: int) -> Runner:
        """This model as it runs at a fixed ``batch``: the runner itself, or (OpenVINO) the
        model recompiled for that static input shape, as a deployment at a fixed batch runs it."""
        return self


class _OrtRunner(Runner):
    runtime = "onnxruntime"

    def __init__(self, session: ort.InferenceSession, threads: int) -> None:
        self.session, self.threads, self.precision = session, threads, "f32"

    def get_inputs(self) -> list:
        return self.session.get_inputs()

    def run(self, feeds):
        return self.session.run(None, dict(feeds))


class _OvRunner(Runner):
    """An OpenVINO compiled model. With ``streams`` S > 1 it holds S infer requests of a model
    compiled with ``NUM_STREAMS`` S, and ``run`` splits the batch into S sub-batches along the
    first axis, starts them all asynchronously, waits for all and concatenates the outputs in
    order: one call's latency is what a user deploying that way waits for a batch."""

    runtime = "openvino"

    def __init__(self, compiled: Any, threads: int,
                 recompile: Callable[[int], Runner] | None = None, streams: int = 1) -> None:
        self.compiled, self.threads, self._recompile = compiled, threads, recompile
        self.streams = streams
        self.precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self.requests = [compiled.create_infer_request() for _ in range(streams)]
        self.request = self.requests[0]
        self.inputs = []
        for port in compiled.inputs:
            shape = [d.get_length() if d.is_static else "?" for d in port.get_partial_shape()]
            if shape and shape[0] != "?":
                shape[0] *= streams  # a call takes all the sub-batches at once
            kind = "tensor(float)" if port.get_element_type().get_type_name() == "f32" \
                else f"tensor({port.get_element_type().get_type_name()})"
            self.inputs.append(InputArg(port.get_any_name(), kind, shape))

    def get_inputs(self) -> list:
        return list(self.inputs)

    def run(self, feeds):
        if self.streams == 1:
            result = self.request.infer(dict(feeds))
            return [result[port] for port in self.compiled.outputs]
        n = min(len(a) for a in feeds.values())
        parts = max(1, min(self.streams, n))  # a dynamic batch smaller than S: fewer parts
        split = {name: np.array_split(a, parts) for name, a in feeds.items()}
        started, error = [], None
        for i, request in enumerate(self.requests[:parts]):
            try:
                request.start_async({name: chunks[i] for name, chunks in split.items()})
            except Exception as exc:  # noqa: BLE001 - raised below, once no request still runs
                error = exc
                break
            started.append(request)
        for request in started:
            try:
                request.wait()
            except Exception as exc:  # noqa: BLE001 - raised below, after every wait
                error = error or exc
        if error is not None:
            raise error
        return [np.concatenate([r.get_output_tensor(i).data for r in started])
                for i in range(len(self.compiled.outputs))]

    def at_batch(self, batch: int) -> Runner:
        if self._recompile is None or all(a.shape[:1] == [batch] for a in self.inputs):
            return self
        return self._recompile(batch)


def openvino_available() -> bool:
    """Whether OpenVINO imports here (the ``openvino`` extra is installed)."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


_OPENVINO_PRIMED = False


def prime_openvino() -> None:
    """Let OpenVINO's CPU plugin read this process's CPU affinity now, before a pinned timing.

    The plugin reads the affinity once, at its first use in the process, and keeps it: first
    used while a timing had pinned the process to one core (:func:`hwnas.core.affinity.pinned`),
    every model the process compiles later gets one thread and one stream, whatever it asks for
    (OpenVINO 2026.4). Call it before pinning; it does nothing once done or
    where OpenVINO is not installed."""
    global _OPENVINO_PRIMED
    if _OPENVINO_PRIMED:
        return
    try:
        import openvino as ov
    except ImportError:
        return
    try:
        ov.Core().get_property("CPU", "FULL_DEVICE_NAME")
    except Exception:  # no CPU plugin: nothing to prime, and make_runner will say so
        pass
    _OPENVINO_PRIMED = True


def make_runner(model: str | Path | bytes, *, runtime: str = "onnxruntime", threads: int = 1,
                precision: str | None = None, batch: int | None = None,
                streams: int = 1) -> Runner:
    """A :class:`Runner` of ``model`` (path or bytes) on this CPU with ``threads`` threads.

    onnxruntime: the session of :func:`make_session` (it has one precision, ``f32``; asking
    for another raises). OpenVINO: ``Core().compile_model`` on the CPU with
    ``INFERENCE_NUM_THREADS`` and ``INFERENCE_PRECISION_HINT`` (default ``f32``: the FP32 figure,
    not the plugin's own default, which is bf16 on AMX CPUs). ``batch``: OpenVINO compiles the
    model for that static batch (a dynamic batch dimension costs it speed; the runner then takes
    only that batch, and :meth:`Runner.at_batch` gives one for another); onnxruntime runs
    dynamic shapes at full speed and ignores it.

    ``streams`` S (OpenVINO only; default 1): the model is compiled with ``NUM_STREAMS`` S and
    ``INFERENCE_NUM_THREADS`` ``threads`` - S streams sharing the threads, so the total stays
    the device's; S must not exceed ``threads`` - for the static sub-batch ``batch`` / S
    (``batch`` divisible by S), and each call runs its batch as S sub-batches on S parallel
    infer requests (OpenVINO's throughput recipe for networks too small to keep all cores busy
    in one request). Errors are :class:`UserError`.
    """
    threads = _check_int("threads", threads, 1)
    streams = _check_int("streams", streams, 1)
    _check_runner_options(runtime, threads, precision, batch, streams)
    if runtime == "onnxruntime":
        return _OrtRunner(make_session(model, threads=threads), threads)
    return _openvino_compiler(model, threads, precision, streams)(batch)


def _check_runner_options(runtime: str, threads: int, precision: str | None, batch: int | None,
                          streams: int) -> None:
    """:class:`UserError` for :func:`make_runner` settings that the runtime cannot honour."""
    if runtime not in RUNTIMES:
        raise UserError(f"runtime {runtime!r}; expected one of {', '.join(RUNTIMES)}")
    if precision is not None and precision not in PRECISIONS:
        raise UserError(f"precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    if runtime == "onnxruntime":
        if precision not in (None, "f32"):
            raise UserError(f"onnxruntime's CPU provider runs ONNX files as written; precision "
                            f"{precision!r} needs runtime 'openvino'")
        if streams != 1:
            raise UserError(f"streams={streams} needs runtime 'openvino'; onnxruntime runs one "
                            f"call on one request (expected streams=1)")
        return
    if streams > threads:
        raise UserError(f"streams={streams} > threads={threads}: every OpenVINO stream needs at "
                        f"least one of the threads; expected streams <= threads")
    if batch is not None and _check_int("batch", batch, 1) % streams:
        raise UserError(f"batch {batch} does not split into {streams} equal sub-batches; "
                        f"expected a batch divisible by streams={streams}")


def _openvino_compiler(model: str | Path | bytes, threads: int, precision: str | None,
                       streams: int) -> Callable[[int | None], Runner]:
    """``compile_at(batch)``: an OpenVINO runner of ``model`` compiled for that static batch
    (``None``: as the file says); the runner recompiles itself through it for another batch."""
    try:
        import openvino as ov
    except ImportError:
        raise UserError("runtime 'openvino' needs OpenVINO: pip install 'hwnas[openvino]'") from None
    source, what = _source(model)
    config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": precision or "f32"}
    if streams > 1:
        config["NUM_STREAMS"] = streams

    def load_error(exc: Exception) -> UserError:  # OpenVINO raises RuntimeError and friends
        return UserError(f"OpenVINO cannot load {what} (expected a valid ONNX model): "
                         f"{first_line(exc)}")

    def compile_at(static_batch: int | None) -> Runner:
        try:
            core = ov.Core()
            graph = core.read_model(source)
        except Exception as exc:
            raise load_error(exc) from exc
        shapes = [port.get_partial_shape() for port in graph.inputs]
        fixed = [s[0].get_length() for s in shapes if s.rank.is_static and s[0].is_static]
        if streams > 1 and static_batch is None and fixed:
            static_batch = fixed[0]  # a file written for one batch: split that batch
        if static_batch is not None and static_batch % streams:
            raise UserError(f"batch {static_batch} does not split into {streams} equal "
                            f"sub-batches; expected a batch divisible by streams={streams}")
        try:
            if static_batch is not None:  # with streams every input takes the sub-batch
                graph.reshape({port.get_any_name(): [static_batch // streams, *shape[1:]]
                               for port, shape in zip(graph.inputs, shapes) if shape.rank.is_static
                               and (shape[0].is_dynamic or streams > 1)})
            compiled = core.compile_model(graph, "CPU", config)
            got = int(compiled.get_property("NUM_STREAMS"))
        except Exception as exc:
            raise load_error(exc) from exc
        if streams > 1 and got != streams:
            raise UserError(f"OpenVINO compiled {what} with {got} stream(s), not the "
                            f"{streams} asked for ({threads} threads)")
        return _OvRunner(compiled, threads, recompile=compile_at, streams=streams)

    return compile_at


def timed_runs(runner: Runner, feeds: Mapping[str, np.ndarray], runs: int) -> np.ndarray:
    """Milliseconds of ``runs`` calls of ``runner``, each timed on its own with
    ``time.perf_counter``: the one timed call of every measurement in hwnas."""
    times = np.empty(runs, dtype=np.float64)
    for i in range(runs):
        start = time.perf_counter()
        runner.run(feeds)
        times[i] = (time.perf_counter() - start) * 1e3
    return times


def _run_error(runner: Runner, feeds: Mapping[str, np.ndarray], exc: Exception) -> UserError:
    shapes = {name: list(a.shape) for name, a in feeds.items()}
    return UserError(f"{runner.runtime} failed to run the model on inputs {shapes}: "
                     f"{first_line(exc)}")


def time_interleaved(runners: Mapping[str, Runner], *, batch: int = 1, rounds: int = 5,
                     runs: int = 5, warmup: int = 3, seed: int = 0,
                     settled: Callable[[dict[str, np.ndarray]], bool] | None = None,
                     min_rounds: int = 2) -> dict[str, np.ndarray]:
    """Paired timing of several runners: ``{label: ms array of shape (rounds, runs)}``.

    Each runner first gets ``warmup`` untimed calls; then, ``rounds`` times, every runner in
    turn makes one untimed call (caches go cold while the others run) and ``runs`` timed calls
    (:func:`timed_runs`) on its own random input of batch ``batch``, so a drift of the
    machine's speed (background load, frequency) hits all of them alike and their ratios stay
    fair. The order is reversed every other round, so no runner always follows the same one.

    ``settled(times so far)``: asked after each round from ``min_rounds`` on; when it answers
    True the measurement stops there (the arrays then have fewer rows), so rounds are not
    spent on an ordering that is already clear."""
    batch = _check_int("batch", batch, 1)
    rounds, runs = _check_int("rounds", rounds, 1), _check_int("runs", runs, 1)
    warmup = _check_int("warmup", warmup, 0)
    min_rounds = _check_int("min_rounds", min_rounds, 1)
    runners = {label: r.at_batch(batch) for label, r in runners.items()}
    feeds = {label: random_input(r, batch=batch, seed=seed) for label, r in runners.items()}
    out = {label: np.empty((rounds, runs)) for label in runners}
    label = next(iter(runners), "")
    try:
        for label, r in runners.items():
            for _ in range(warmup):
                r.run(feeds[label])
        order = list(runners)
        for i in range(rounds):
            for label in (order if i % 2 == 0 else order[::-1]):
                runners[label].run(feeds[label])
                out[label][i] = timed_runs(runners[label], feeds[label], runs)
            if settled is not None and min_rounds <= i + 1 < rounds:
                sofar = {k: v[:i + 1] for k, v in out.items()}
                if settled(sofar):
                    return sofar
    except UserError:
        raise
    except Exception as exc:
        raise _run_error(runners[label], feeds[label], exc) from exc
    return out


def order_settled(times: Mapping[str, np.ndarray], baseline: str, *,
                  faster_only: bool = True) -> bool:
    """Whether a paired timing (:func:`time_interleaved`) already decides its verdict: every
    label's times lie all on one side of the ``baseline``'s, and the fastest of the labels
    that compete (those faster than the baseline, or with ``faster_only=False`` all of them)
    has every time below every time of the other competitors. Whole ranges, not medians, so
    more rounds could not reorder them unless the machine's speed itself changed."""
    lo = {k: float(np.min(v)) for k, v in times.items()}
    hi = {k: float(np.max(v)) for k, v in times.items()}
    med = {k: float(np.median(v)) for k, v in times.items()}
    others = [k for k in times if k != baseline]
    if baseline in times and any(not (hi[k] < lo[baseline] or lo[k] > hi[baseline])
                                 for k in others):
        return False
    competing = [k for k in others if not faster_only or baseline not in times
                 or med[k] < med[baseline]]
    if len(competing) < 2:
        return True
    best = min(competing, key=med.__getitem__)
    return all(hi[best] < lo[k] for k in competing if k != best)


#: The smallest relative difference between two models of one paired timing that counts as one
#: being faster (a choice between them does not follow a smaller, noise-sized difference).
MIN_MARGIN = 0.03
#: The most that timing noise may ask: a model estimated this much faster than another (median
#: per-round ratio) counts as faster however noisy the rounds, so one wild round on a shared
#: machine cannot tie a file 20 % slower with the fastest and hand the choice to a tie-break.
MAX_MARGIN = 0.10


def round_medians(times: np.ndarray) -> np.ndarray:
    """The median of each round of one model's paired timing (ms, shape (rounds, runs))."""
    return np.median(np.atleast_2d(np.asarray(times, dtype=np.float64)), axis=1)


def _round_ratios(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per round of a paired timing, ``a``'s median over ``b``'s."""
    ra, rb = round_medians(a), round_medians(b)
    n = min(len(ra), len(rb))
    return ra[:n] / rb[:n]


def paired_margin(a: np.ndarray, b: np.ndarray, floor: float = MIN_MARGIN) -> float:
    """The relative margin by which one of two models of a paired timing (:func:`time_interleaved`:
    ms arrays of shape (rounds, runs)) must beat the other to count as faster: the timing's own
    noise - half the range, over the rounds, of the ratio of their per-round medians, relative
    to its median (a drift of the machine's speed hits both alike and cancels in the ratio) -
    at least ``floor`` and at most :data:`MAX_MARGIN`."""
    ratio = _round_ratios(a, b)
    noise = 0.0
    if len(ratio) > 1:
        noise = float((ratio.max() - ratio.min()) / 2.0 / np.median(ratio))
    return max(float(floor), min(noise, MAX_MARGIN))


def clearly_faster(fast: np.ndarray, slow: np.ndarray, floor: float = MIN_MARGIN) -> bool:
    """Whether ``fast`` beats ``slow`` by more than :func:`paired_margin` of the two: the median,
    over the rounds, of their per-round ratio (drift cancels in it) below ``1 - margin``."""
    ratio = float(np.median(_round_ratios(fast, slow)))
    return ratio < 1.0 - paired_margin(fast, slow, floor)


def busy_machine(threads: int, *, load: float | None = None, cores: int | None = None) -> str:
    """A note when other work competed for this machine's cores while a timing ran, else "".

    The rule is :func:`hwnas.latency.ondevice.busy_load` (the load average above the cores by
    more than :data:`BUSY_SLACK`): the timing's own ``threads`` are among the runnable ones, and
    timed runs that waited for a core did so unequally for the models of a paired timing, so its
    verdict may not hold on a quiet machine. ``load`` / ``cores`` default to this machine's."""
    busy = busy_load(load, cores)
    if busy is None:
        return ""
    return (f"timed on a busy machine (1-minute load {busy[0]:.1f} on {busy[1]} cores, this "
            f"timing {threads} thread(s)): other work competed for the cores, so these timings "
            f"and a choice made from them may not hold on a quiet machine; time again there")


def _stats(times_ms: np.ndarray, *, warmup: int, threads: int, batch: int, runtime: str,
           precision: str) -> LatencyStats:
    times_ms = np.asarray(times_ms, dtype=np.float64).ravel()
    mean = float(times_ms.mean())
    return LatencyStats(
        median_ms=float(np.median(times_ms)),
        p95_ms=float(np.percentile(times_ms, 95)),
        mean_ms=mean,
        cv=float(times_ms.std() / mean) if mean > 0 else 0.0,
        repeats=int(times_ms.size),
        warmup=warmup,
        threads=threads,
        batch=batch,
        runtime=runtime,
        precision=precision,
    )


def measure_onnx(
    model: str | Path | bytes,
    *,
    batch: int = 1,
    warmup: int = 10,
    repeats: int = 50,
    threads: int = 1,
    seed: int = 0,
    runtime: str = "onnxruntime",
    precision: str | None = None,
) -> LatencyStats:
    """Measure the CPU latency of one ONNX model (a path or serialized bytes).

    Runs ``warmup`` untimed calls (to let allocators, caches and lazy initialisation
    settle), then ``repeats`` calls each timed on its own (:func:`timed_runs`), on the same
    random input of batch size ``batch``, with ``runtime`` (and OpenVINO's ``precision``
    hint, see :func:`make_runner`). Returns median, p95, mean (ms per call) and the
    coefficient of variation. Bad arguments and unloadable models raise :class:`UserError`.

    Examples:
        >>> import torch
        >>> from hwnas.export import onnx_bytes
        >>> from hwnas.latency import measure_onnx
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
        >>> stats = measure_onnx(onnx_bytes(model, torch.zeros(1, 3, 16, 16)), repeats=5, warmup=1)
        >>> stats.median_ms > 0, stats.repeats
        (True, 5)
    """
    batch = _check_int("batch", batch, 1)
    warmup = _check_int("warmup", warmup, 0)
    repeats = _check_int("repeats", repeats, 1)
    threads = _check_int("threads", threads, 1)

    runner = make_runner(model, runtime=runtime, threads=threads, precision=precision, batch=batch)
    times = time_interleaved({"model": runner}, batch=batch, rounds=1, runs=repeats,
                             warmup=warmup, seed=seed)["model"]
    return _stats(times, warmup=warmup, threads=threads, batch=batch, runtime=runtime,
                  precision=runner.precision)


def measure_dir(
    models_dir: str | Path,
    *,
    threads: int = 1,
    repeats: int = 50,
    warmup: int = 10,
    max_cv: float = 0.1,
    progress: Callable[[str], None] | None = None,
    runtime: str = "onnxruntime",
    precision: str | None = None,
) -> tuple[list[dict], list[dict]]:
    """Measure every ``*.onnx`` of ``models_dir`` with :func:`measure_onnx`
    on ``runtime`` (OpenVINO: with its ``precision`` hint, default f32).

    Returns ``(stable, unstable)`` rows (keys ``arch, latency_ms, p95_ms, cv, file``): a model
    whose cv exceeds ``max_cv`` is measured once more, and left in ``unstable`` if it still
    does. ``arch`` is the model's ``arch`` metadata (the file stem if absent).
    """
    from hwnas.latency.ondevice import model_arch

    if not (isinstance(max_cv, (int, float)) and max_cv > 0):
        raise UserError(f"max_cv must be a positive number, got {max_cv!r}")
    directory = Path(models_dir)
    if not directory.is_dir():
        raise UserError(f"{directory} is not a directory; expected a directory of .onnx models")
    files = sorted(p for p in directory.glob("*.onnx") if p.is_file())
    if not files:
        raise UserError(f"{directory} holds no .onnx files; expected exported models (*.onnx)")
    stable, unstable = [], []
    for path in files:
        arch = model_arch(make_session(path, threads=threads), path)
        stats = measure_onnx(path, threads=threads, repeats=repeats, warmup=warmup,
                             runtime=runtime, precision=precision)
        if stats.cv > max_cv:  # one retry: noise is often a passing background task
            stats = measure_onnx(path, threads=threads, repeats=repeats, warmup=warmup,
                                 runtime=runtime, precision=precision)
        row = {"arch": arch, "latency_ms": stats.median_ms, "p95_ms": stats.p95_ms,
               "cv": stats.cv, "file": path.name}
        (unstable if stats.cv > max_cv else stable).append(row)
        if progress is not None:
            verdict = "UNSTABLE, not reported" if stats.cv > max_cv else "ok"
            progress(f"{path.name}: {stats.median_ms:.4f} ms (p95 {stats.p95_ms:.4f}, "
                     f"cv {stats.cv:.3f}) {verdict}")
    return stable, unstable
