"""Which exported file to deploy on each measured device, with the runtime settings it needs.

For a device measurable here (runtime, threads, batch: ``cpu-ort-1t``, ``cpu-ov-8t`` ...) the
candidates are every exported file the device's runtime can run - FP32, the searched QDQ
policy, the per-device int8/float variants - and, on OpenVINO, the same files under reduced
precision hints and with several streams (:func:`verify_candidates`). Each is verified on the
test images with the device's runtime, then all are timed together in one paired, interleaved
measurement (:func:`time_candidates`), from which the recommendation, the speed-up printed and
the timings written all come (:func:`choose_fastest`): a file is recommended only if it beat
FP32 overall and in both halves of that measurement, and noise never flips the choice between
near-equal files. :func:`recommend_file` does all of it for one device.

Torch-free: reference logits come in as arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from hwnas.latency.devices.measured import (
    STREAM_COUNTS,
    MeasuredDevice,
    reduced_precisions,
    stream_counts,
)
from hwnas.latency.onnx_measure import (
    Runner,
    busy_machine,
    clearly_faster,
    make_runner,
    order_settled,
    time_interleaved,
)

from hwnas.core.errors import UserError
from hwnas.core.io import first_line

__all__ = ["NOT_FASTER_NOTE", "STREAM_COUNTS", "TIE_PHRASE", "CandidateFile", "DeviceCandidate",
           "Recommendation", "choose_fastest", "recommend_file", "reduced_precisions",
           "stream_counts", "tie_note", "tie_order", "time_candidates", "verify_candidates"]

#: The precision hints stream counts are tried under (f16 runs slower than f32 on CPUs and
#: breaks int8 files: not worth the timing).
_STREAM_HINTS = ("f32", "bf16")


@dataclass
class CandidateFile:
    """An exported, verified file: its path in the export, bytes, what it computes in
    (``fp32``, ``int8``, ``mixed``), the key of the PyTorch model it implements exactly
    (``reference``: top-1 agreement) and of the one it must not lose accuracy against
    (``baseline``, default the reference: the searched fake-quant model for a quantized file
    that adds requantization points)."""

    path: str
    data: bytes
    kind: str
    reference: str
    baseline: str = ""

    @property
    def accuracy_baseline(self) -> str:
        return self.baseline or self.reference


@dataclass
class DeviceCandidate:
    """One file under one runtime setting, its verification and its paired timing."""

    label: str
    path: str
    precision: str  # fp32 | bf16 | f16 | int8 | mixed: what runs
    settings: dict[str, Any] = field(default_factory=dict)  # runtime settings it needs
    runtime_precision: str = "f32"  # the inference precision the runtime reports it used
    verified: bool = False
    top1_agreement: float | None = None
    test_accuracy: float | None = None
    reference_accuracy: float | None = None
    note: str = ""
    median_ms: float | None = None
    p95_ms: float | None = None
    halves_ms: list[float] = field(default_factory=list)
    size_bytes: int = 0  # the file's size (0: unknown); the smaller wins a tie within noise
    streams: int = 1  # OpenVINO streams: the batch runs as this many parallel sub-batches


@dataclass
class Recommendation:
    """The verdict for one device: every candidate with its figures, the FP32 baseline and the
    chosen candidate, all from one paired measurement."""

    device: str
    runtime: str
    threads: int
    batch: int
    fp32: DeviceCandidate
    chosen: DeviceCandidate
    candidates: list[DeviceCandidate]
    notes: list[str] = field(default_factory=list)
    rounds: int = 0  # rounds of the paired timing that ran (fewer than asked: settled early)
    busy: bool = False  # other work competed for the cores while it was timed (a note says so)

    @property
    def speedup(self) -> float:
        """FP32 time / chosen time, in the same measurement."""
        return self.fp32.median_ms / self.chosen.median_ms

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "runtime": self.runtime, "threads": self.threads,
                "batch": self.batch, "fp32": self.fp32.label, "chosen": self.chosen.label,
                "speedup": self.speedup, "notes": list(self.notes), "rounds": self.rounds,
                "busy": self.busy,
                "candidates": [asdict(c) for c in self.candidates]}


def time_candidates(runners: Mapping[str, Runner], *, batch: int, rounds: int, runs: int,
                    warmup: int, seed: int = 0, fp32_label: str | None = None,
                    min_rounds: int | None = None) -> dict[str, np.ndarray]:
    """``{label: ms array (rounds, runs)}``: the candidates timed together, interleaved
    (:func:`hwnas.latency.onnx_measure.time_interleaved`). With ``fp32_label`` and
    ``min_rounds``, the timing stops after ``min_rounds`` or more rounds once every candidate
    is clearly faster or slower than FP32 and the fastest of those faster is clearly the
    fastest (:func:`hwnas.latency.onnx_measure.order_settled`): :func:`choose_fastest` reads
    the same, shorter, measurement."""
    early = fp32_label is not None and min_rounds is not None and fp32_label in runners
    return time_interleaved(runners, batch=batch, rounds=rounds, runs=runs, warmup=warmup,
                            seed=seed, min_rounds=min_rounds or 1,
                            settled=(lambda t: order_settled(t, fp32_label)) if early else None)


def _halves(times: np.ndarray) -> list[float]:
    flat = np.asarray(times, dtype=np.float64).ravel()  # in time order: round by round
    if flat.size < 2:
        return [float(np.median(flat))] * 2
    mid = flat.size // 2
    return [float(np.median(flat[:mid])), float(np.median(flat[mid:]))]


#: The note of a verified candidate that did not beat FP32 (so it is never recommended).
NOT_FASTER_NOTE = "not faster than FP32 overall and in both halves of the paired timing"


#: What the note of a candidate that tied with the fastest says (:func:`tie_note`).
TIE_PHRASE = "within the paired timing's noise"


def tie_note(best_label: str) -> str:
    """The note of a candidate that tied with the fastest and lost the tie to ``best_label``."""
    return f"as fast as {best_label} {TIE_PHRASE}; {best_label} is the smaller or simpler file"


def tie_order(size_bytes: int, runtime_precision: str, streams: int, median_ms: float) -> tuple:
    """How a tie within noise is broken: the smaller file (0: unknown, last), then the runtime's
    own f32 precision, then fewer streams, then the faster."""
    return (size_bytes or float("inf"), runtime_precision != "f32", streams, median_ms)


def choose_fastest(candidates: Sequence[DeviceCandidate], times: Mapping[str, np.ndarray],
                   fp32_label: str) -> DeviceCandidate:
    """Fill each timed candidate's figures from ``times`` (one paired measurement) and return
    the one to deploy among the verified candidates that beat FP32 in the whole measurement
    and in each of its halves (so a lucky stretch of timing never recommends a file that is
    slower than FP32): of those the fastest does not clearly beat (within the pair's timing
    noise, :func:`hwnas.latency.onnx_measure.paired_margin`, 3-10 %), the smallest file, then
    one at the runtime's f32 precision, then the one with fewer streams, then the fastest; FP32
    when none beat it. So noise does not flip the recommendation between near-equal files."""
    by_label = {c.label: c for c in candidates}
    for label, t in times.items():
        c = by_label[label]
        flat = np.asarray(t, dtype=np.float64).ravel()
        c.median_ms, c.p95_ms = float(np.median(flat)), float(np.percentile(flat, 95))
        c.halves_ms = _halves(flat)
    fp32 = by_label[fp32_label]
    beating = []
    for c in candidates:
        if c.label == fp32_label or not c.verified or c.median_ms is None:
            continue
        beats = c.median_ms < fp32.median_ms and all(
            a < b for a, b in zip(c.halves_ms, fp32.halves_ms))
        if not beats:
            c.note = c.note or NOT_FASTER_NOTE
        else:
            beating.append(c)
    if not beating:
        return fp32
    fastest = min(beating, key=lambda c: c.median_ms)
    ties = [c for c in beating if not clearly_faster(times[fastest.label], times[c.label])]
    best = min(ties, key=lambda c: tie_order(c.size_bytes, c.runtime_precision, c.streams,
                                             c.median_ms))
    for c in ties:
        if c is not best:
            c.note = c.note or tie_note(best.label)
    return best


def _model_text(key: str) -> str:
    return {"float": "the float PyTorch model",
            "searched": "the searched fake-quant model"}.get(key, "the fake-quant model it implements")


def _agreement(runner: Runner, data: np.ndarray, reference: np.ndarray,
               labels: np.ndarray | None) -> tuple[float, float | None]:
    name = runner.get_inputs()[0].name
    chunks = []
    for i in range(0, len(data), 256):
        out = np.asarray(runner.run({name: data[i:i + 256]})[0])
        if out.ndim != 2 or out.shape[0] != len(data[i:i + 256]):
            # e.g. OpenVINO 2026.4 under the f16 hint returns (0, classes) for some QDQ files
            raise ValueError(f"{runner.runtime} returned logits of shape {list(out.shape)} for "
                             f"{len(data[i:i + 256])} images")
        chunks.append(out.argmax(1))
    preds = np.concatenate(chunks)
    agreement = float((preds == reference.argmax(1)).mean())
    accuracy = None if labels is None else float(100.0 * (preds == labels).mean())
    return agreement, accuracy


def _judge(c: DeviceCandidate, result: tuple | str, f: CandidateFile,
           reference_accuracy: float | None, min_agreement: float, max_drop: float) -> None:
    """Set ``c``'s verdict from its run (``(agreement, accuracy)``, or the error text): verified
    when its top-1 agreement reaches ``min_agreement`` and its accuracy is at most ``max_drop``
    points below the reference's; the note says why not."""
    if isinstance(result, str):
        c.note = f"failed to run: {result}"
        return
    c.top1_agreement, c.test_accuracy = result
    c.reference_accuracy = reference_accuracy
    c.verified = c.top1_agreement >= min_agreement
    if not c.verified:
        c.note = (f"top-1 agreement {100 * c.top1_agreement:.2f}% with "
                  f"{_model_text(f.reference)} < {100 * min_agreement:.0f}%")
    elif c.test_accuracy is not None and c.test_accuracy < c.reference_accuracy - max_drop:
        c.verified = False
        c.note = (f"test accuracy {c.test_accuracy:.2f}% is more than {max_drop:g} "
                  f"point(s) below {_model_text(f.accuracy_baseline)}'s "
                  f"{c.reference_accuracy:.2f}%")


def verify_candidates(*, runtime: str, threads: int, files: Sequence[CandidateFile],
                      references: Mapping[str, np.ndarray], images: np.ndarray,
                      labels: np.ndarray | None, min_agreement: float = 0.99,
                      max_drop: float = 0.3, cache: dict | None = None, batch: int | None = None,
                      sessions: dict | None = None, streams: Sequence[int] | None = None,
                      ) -> tuple[list[DeviceCandidate], dict[str, Runner], list[str]]:
    """Every candidate of ``files`` on ``runtime`` (each file as written and, on OpenVINO,
    under each reduced precision hint the CPU runs), verified on ``images``: ``(candidates,
    runners of the verified ones and of the FP32 file, notes)``.

    The reduced hints are ``bf16`` and ``f16``, kept where the CPU plugin reports that it uses
    them (on a CPU without BF16 it falls back to f32; the candidate is then dropped and the
    fall-back noted). On OpenVINO with two threads or more timed at a batch of two or more, each
    verified candidate under the f32 or bf16 hint also runs with 2 and 4 streams
    (:func:`stream_counts`): the batch split into that many sub-batches on parallel infer
    requests, the threads shared between them - OpenVINO's way to keep many cores busy with a
    network too small for one request. Such a candidate computes exactly what its one-stream
    twin does, so it takes that verification (no second pass over the test images) and is only
    timed. A candidate is verified by its top-1 agreement with the PyTorch model the file
    implements (the float model for FP32 and reduced precision, the fake-quant model - with its
    requantization points, if any - for quantized files) of at least ``min_agreement`` and,
    with labels, test accuracy no more than ``max_drop`` points below the model that was
    searched (the float one, or the searched fake-quant one). Split from
    :func:`recommend_file` so that candidates of several runtimes can be timed together.
    ``cache``: ``{(runtime, path, precision): (agreement, accuracy) or error}`` already
    known; ``sessions``: ``{(runtime, path, threads, hint[, streams]): runner}`` to reuse.
    ``batch``: the batch the candidates will be timed at; OpenVINO times them compiled for that
    static batch, so their settings name it (``static_batch``). ``streams``: the stream counts
    beyond one tried under the f32 and bf16 hints (default :func:`stream_counts`); such a
    candidate's settings add ``NUM_STREAMS`` and its ``static_batch`` is the sub-batch."""
    cache = {} if cache is None else cache
    sessions = {} if sessions is None else sessions
    notes: list[str] = []
    ref_acc = {k: (None if labels is None else float(100.0 * (v.argmax(1) == labels).mean()))
               for k, v in references.items()}
    candidates: list[DeviceCandidate] = []
    runners: dict[str, Runner] = {}
    counts = stream_counts(runtime, threads, batch) if streams is None else tuple(streams)
    for f in files:
        seen: set[str] = set()
        for hint in ("f32", *reduced_precisions(runtime)):  # a device's precision_hints
            label = f.path if hint == "f32" else f"{f.path}@{hint}"
            made = (runtime, f.path, threads, hint)
            try:
                runner = sessions.get(made) or make_runner(
                    f.data, runtime=runtime, threads=threads,
                    precision=None if runtime == "onnxruntime" else hint)
            except UserError as exc:
                notes.append(f"{label}: {first_line(exc)}")
                continue
            sessions[made] = runner
            if runner.precision in seen:  # the runtime fell back to a precision already tried
                notes.append(f"{label}: the {hint} hint ran in {runner.precision} on this CPU; "
                             f"not a separate candidate")
                continue
            seen.add(runner.precision)
            precision = f.kind if hint == "f32" else (hint if f.kind == "fp32"
                                                       else f"{f.kind}+{hint}")
            settings = {} if runtime == "onnxruntime" else {
                "INFERENCE_PRECISION_HINT": hint, **({"static_batch": batch} if batch else {})}
            c = DeviceCandidate(label, f.path, precision, settings, runner.precision,
                                size_bytes=len(f.data))
            key = (runtime, f.path, runner.precision)
            if key not in cache:
                try:
                    cache[key] = _agreement(runner, images, references[f.reference], labels)
                except Exception as exc:  # a runtime that cannot run the file
                    cache[key] = first_line(exc)
            _judge(c, cache[key], f, ref_acc[f.accuracy_baseline], min_agreement, max_drop)
            candidates.append(c)
            if c.verified or c.label == files[0].path:
                runners[c.label] = runner
            if c.verified and hint in _STREAM_HINTS:
                for extra in _with_streams(c, f, runner, hint, counts, runtime=runtime,
                                           threads=threads, batch=batch, sessions=sessions,
                                           notes=notes):
                    candidates.append(extra)
                    runners[extra.label] = sessions[(runtime, f.path, threads, hint,
                                                     extra.streams)]
    return candidates, runners, notes


def _with_streams(c: DeviceCandidate, f: CandidateFile, runner: Runner, hint: str,
                  counts: Sequence[int], *, runtime: str, threads: int, batch: int | None,
                  sessions: dict, notes: list[str]) -> list[DeviceCandidate]:
    """The verified candidate ``c`` with each stream count of ``counts``: its runner (kept in
    ``sessions``), compiled for the sub-batch, and ``c``'s verification - the same file and
    precision compute the same logits however the batch is split. A count the runtime cannot
    run, or that makes the plugin report another precision, is noted and left out."""
    out = []
    for streams in counts:
        label = f"{f.path}@{hint}x{streams}"
        made = (runtime, f.path, threads, hint, streams)
        try:
            if batch is None:
                raise UserError("streams need the batch the candidates are timed at")
            split = sessions.get(made) or make_runner(f.data, runtime=runtime, threads=threads,
                                                      precision=hint, batch=batch,
                                                      streams=streams)
        except UserError as exc:
            notes.append(f"{label}: {first_line(exc)}")
            continue
        sessions[made] = split
        if split.precision != runner.precision:
            notes.append(f"{label}: ran in {split.precision}, not {runner.precision} as with one "
                         f"stream; not a separate candidate")
            continue
        settings = {**c.settings, "NUM_STREAMS": streams, "static_batch": batch // streams}
        out.append(replace(c, label=label, settings=settings, streams=streams, note=""))
    return out


def recommend_file(device: MeasuredDevice, *, files: Sequence[CandidateFile], references: Mapping[str, np.ndarray],
                   images: np.ndarray, labels: np.ndarray | None, min_agreement: float = 0.99,
                   max_drop: float = 0.3, rounds: int = 5, runs: int = 5, warmup: int = 3,
                   seed: int = 0, cache: dict | None = None, min_rounds: int | None = None,
                   sessions: dict | None = None) -> Recommendation:
    """Verify (:func:`verify_candidates`) and time (:func:`time_candidates`,
    :func:`choose_fastest`) every candidate of ``files`` on ``device``:
    its runtime and precision hints, at its threads and batch, with its stream counts.

    ``files[0]`` is the FP32 file, the baseline. ``references``: logits of the PyTorch models
    on ``images`` (``"float"``, ``"searched"``). ``cache``: verification results shared between
    devices of the same runtime (they do not depend on threads or batch); ``sessions``: the
    sessions made, shared between devices of the same runtime and threads. ``min_rounds``:
    stop timing early once the verdict is settled (:func:`time_candidates`). Raises
    :class:`UserError` when the FP32 file does not verify on this runtime."""
    if not files or files[0].kind != "fp32":
        raise UserError("the candidates must start with the FP32 file")
    runtime, threads, batch = device.runtime, device.threads, device.batch
    candidates, runners, notes = verify_candidates(
        runtime=runtime, threads=threads, files=files, references=references, images=images,
        labels=labels, min_agreement=min_agreement, max_drop=max_drop, cache=cache, batch=batch,
        sessions=sessions, streams=device.stream_counts)
    fp32 = next((c for c in candidates if c.label == files[0].path), None)
    if fp32 is None or not fp32.verified:
        raise UserError(f"the FP32 file does not verify on {runtime}: "
                        f"{fp32.note if fp32 else '; '.join(notes)}")
    times = time_candidates(runners, batch=batch, rounds=rounds, runs=runs, warmup=warmup,
                            seed=seed, fp32_label=fp32.label, min_rounds=min_rounds)
    chosen = choose_fastest(candidates, times, fp32.label)
    rounds_run = max((np.asarray(t).shape[0] for t in times.values()), default=0)
    busy = busy_machine(threads)  # the load average just after the timing, which it spans
    if busy:
        notes.append(busy)
    return Recommendation(device.name, runtime, threads, batch, fp32, chosen, candidates, notes,
                          rounds_run, bool(busy))
