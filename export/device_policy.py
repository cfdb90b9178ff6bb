"""Per-device int8-vs-float choice per layer, measured with onnxruntime on this CPU.

onnxruntime's int8 is often slower than FP32 for MobileNetV3-style networks, and whether a layer
gains depends on its shape, its neighbours, the CPU, the batch and the threads, so it is
measured, not assumed (:func:`choose_float_layers`; why: ``benchmarks/export_ort_ops.md``).
Every choice keeps int8 layers unless float clearly pays (:func:`prefer_int8`), so timing noise
between two runs does not flip the choice between near-equal variants.

The chosen variant becomes the ``qdq-<device>`` file, one candidate among the others of
:mod:`hwnas.export.recommend`, whose one paired timing decides what is recommended. Its measured
per-layer ``int8_speedup`` table feeds
:meth:`hwnas.quant.device_rules.DeviceQuantRules.with_speedups` (via
:func:`hwnas.quant.device_rules.measure_int8_speedup`), so the next search prices int8 on this CPU
by measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from hwnas.core.progress import progress_bar
from hwnas.export.ort_profile import LayerIndex, profile_model
from hwnas.latency.devices.measured import MeasuredDevice
from hwnas.latency.onnx_measure import MIN_MARGIN, clearly_faster

__all__ = [
    "Candidate",
    "DevicePolicy",
    "LayerSpeed",
    "ProfiledLayerTimer",
    "choose_float_layers",
    "prefer_int8",
    "time_models",
    "time_rounds",
]


@dataclass
class LayerSpeed:
    """One quantized layer's cost in the all-int8 graph and in the FP32 graph (ms per run)."""

    layer: str
    kind: str
    float_ms: float
    int8_ms: float

    @property
    def speedup(self) -> float:
        """float time / int8 time (> 1: int8 is faster)."""
        return self.float_ms / self.int8_ms if self.int8_ms > 0 else float("inf")


@dataclass
class Candidate:
    """A set of layers kept float, and the measured latency of the model it gives."""

    label: str
    float_layers: list[str]
    median_ms: float = float("nan")
    p95_ms: float = float("nan")


@dataclass
class DevicePolicy:
    """The per-layer int8/float choice for one device (threads, batch) and its evidence."""

    device: str
    threads: int
    batch: int
    float_layers: list[str]
    fp32_ms: float
    fp32_p95_ms: float
    uniform_ms: float
    chosen_ms: float
    chosen_p95_ms: float
    chosen_label: str
    faster_twice: bool = True
    candidates: list[Candidate] = field(default_factory=list)
    layers: list[LayerSpeed] = field(default_factory=list)

    @property
    def quantized_faster(self) -> bool:
        """Whether the chosen quantized model measured faster than FP32: in the final
        interleaved timing (``chosen_ms < fp32_ms``) and in the candidates' timing before it
        (``faster_twice``), so one lucky measurement does not make hwnas recommend int8."""
        return bool(self.chosen_ms < self.fp32_ms and self.faster_twice)

    @property
    def speedup(self) -> float:
        """FP32 time / chosen quantized time."""
        return self.fp32_ms / self.chosen_ms if self.chosen_ms > 0 else float("nan")

    def speedup_table(self, layers: Iterable[Any] | None = None) -> dict[str, float]:
        """Measured int8 speed-up (float / int8 time) per layer name, for
        :meth:`hwnas.quant.device_rules.DeviceQuantRules.with_speedups`. With a layer list
        (:class:`hwnas.supernet.layers.Layer`), it goes through
        :func:`hwnas.quant.device_rules.measure_int8_speedup` (by name)."""
        speeds = {s.layer: s for s in self.layers if s.float_ms > 0 and s.int8_ms > 0}
        if layers is None:
            return {name: s.speedup for name, s in speeds.items()}
        from hwnas.quant.device_rules import measure_int8_speedup

        chosen = [layer for layer in layers if getattr(layer, "name", None) in speeds]
        return measure_int8_speedup(chosen, ProfiledLayerTimer(speeds), by="name")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(quantized_faster=self.quantized_faster, speedup=self.speedup)
        for row in d["layers"]:
            row["speedup"] = row["float_ms"] / row["int8_ms"] if row["int8_ms"] > 0 else None
        return d


class ProfiledLayerTimer:
    """A ``timer(layer, int8) -> ms`` for :func:`hwnas.quant.device_rules.measure_int8_speedup` that
    answers from in-context profiles (:class:`LayerSpeed`) instead of timing layers alone."""

    def __init__(self, speeds: Mapping[str, LayerSpeed]) -> None:
        self.speeds = dict(speeds)

    def __call__(self, layer: Any, int8: bool) -> float:
        s = self.speeds[layer.name]
        return s.int8_ms if int8 else s.float_ms


def time_rounds(models: Mapping[str, bytes], *, batch: int = 1, threads: int = 1,
                rounds: int = 5, runs: int = 5, warmup: int = 3, seed: int = 0,
                min_rounds: int | None = None, baseline: str = "fp32",
                runners: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """``{label: ms array (rounds, runs)}`` of each model on onnxruntime, timed round-robin
    (:func:`hwnas.latency.onnx_measure.time_interleaved`): ``rounds`` rounds in which every
    model runs ``runs`` timed calls (after ``warmup`` untimed calls each at the start), so
    background load drifts affect all models alike. ``min_rounds``: stop after that many
    rounds or more once the fastest model other than ``baseline`` is clearly the fastest and
    every model clearly faster or slower than the baseline
    (:func:`hwnas.latency.onnx_measure.order_settled`). ``runners``: onnxruntime runners (at
    ``threads``) by label, taken where a label has one and filled in for the labels that had
    none, so that the timings of one choice make one session per model (a label must name the
    same model in each): every timing starts with ``warmup`` untimed calls anyway, so a session
    that ran before times like a new one, and creating sessions - most of the seconds of a
    choice on a CIFAR-size QDQ graph - is not repeated while the machine is held."""
    from hwnas.latency.onnx_measure import make_runner, order_settled, time_interleaved

    made = runners if runners is not None else {}
    for label, blob in models.items():
        if label not in made:
            made[label] = make_runner(bytes(blob), threads=threads)

    def settled(t: dict) -> bool:
        return order_settled(t, baseline, faster_only=False)

    return time_interleaved({label: made[label] for label in models}, batch=batch, rounds=rounds,
                            runs=runs, warmup=warmup, seed=seed,
                            settled=settled if min_rounds is not None else None,
                            min_rounds=min_rounds or 1)


def time_models(models: Mapping[str, bytes], **kw: Any) -> dict[str, tuple[float, float]]:
    """``{label: (median ms, p95 ms)}`` of :func:`time_rounds` (same arguments)."""
    return {label: _summary(t) for label, t in time_rounds(models, **kw).items()}


def _summary(times: np.ndarray) -> tuple[float, float]:
    return float(np.median(times)), float(np.percentile(times, 95))


def prefer_int8(candidates: Iterable[Candidate], times: Mapping[str, np.ndarray]) -> Candidate:
    """Of ``candidates`` timed together (``times``: :func:`time_rounds`), the one to keep: among
    those the fastest does not clearly beat (by more than the pair's timing noise,
    :func:`hwnas.latency.onnx_measure.paired_margin`, 3-10 %, at least
    :data:`~hwnas.latency.onnx_measure.MIN_MARGIN`), the one with the fewest float layers
    (then the faster). Float layers are kept only where they clearly pay."""
    timed = [c for c in candidates if c.label in times]
    if not timed:
        raise ValueError("no candidate was timed")
    fastest = min(timed, key=lambda c: float(np.median(times[c.label])))
    ties = [c for c in timed if not clearly_faster(times[fastest.label], times[c.label])]
    return min(ties, key=lambda c: (len(c.float_layers), float(np.median(times[c.label]))))


def _per_layer(index: LayerIndex, model: bytes, *, batch: int, threads: int, runs: int
               ) -> dict[str, float]:
    prof = profile_model(model, batch=batch, threads=threads, runs=runs, warmup=2)
    return index.attribute(prof.optimized.graph, prof.node_ms)


def choose_float_layers(build_model: Callable[[Iterable[str]], bytes], fp32: bytes,
                        quantized: list[str], kinds: Mapping[str, str], *,
                        fp32_index: LayerIndex, qdq_index: LayerIndex,
                        device: MeasuredDevice | None = None, rounds: int = 5, runs: int = 5,
                        profile_runs: int = 10, refine: int = 0, progress: bool = False,
                        min_rounds: int | None = None,
                        runners: Mapping[str, Any] | None = None) -> DevicePolicy:
    """Choose which of the ``quantized`` layers (policy-quantized, integer-capable, in graph
    order) to keep in float on this CPU at ``device``'s threads and batch (default
    ``cpu-ort-1t``):

    1. the FP32 graph and the QDQ graph with every policy-quantized layer in int8 are profiled
       (:func:`hwnas.export.ort_profile.profile_model`) and each node's time charged to a layer
       (:class:`hwnas.export.ort_profile.LayerIndex`): per layer, its float cost and its int8
       cost in context (kernel + the Q/DQ/transposes it causes);
    2. candidates are built: all int8; float where the float cost is below the int8 cost by more
       than :data:`hwnas.latency.onnx_measure.MIN_MARGIN` (3 %); the same re-profiled in its own
       context (boundaries move; no third profile when no layer or every layer loses, which
       decides it); all depthwise layers float; every quantized layer float except
       pointwise/linear ones - and optionally refined greedily layer by layer (``refine``), each
       step a whole-model measurement;
    3. FP32 and all candidates are timed *interleaved* (round-robin, so drifting background load
       hits all alike) at the device's threads and batch; FP32, all-int8 and the two fastest
       candidates are timed together once more and chosen there
       (:attr:`DevicePolicy.quantized_faster` says whether it beat FP32 in both timings).

    ``build_model(float_layers)`` returns the QDQ model bytes with those layers in float;
    ``fp32`` is the float model. ``refine``: extra greedy steps (one whole-model timing each)
    that flip the layers closest to break-even. ``min_rounds``: let the two timings of all
    candidates stop early once their order is settled (:func:`time_models`). ``runners``:
    sessions made before, by label (``"fp32"``: the FP32 file's verification session at the
    device's threads); each model of the choice gets one session, which all its timings use
    (:func:`time_rounds`). Returns the choice with its evidence."""
    sessions = dict(runners or {})
    device = device if device is not None else MeasuredDevice("cpu-ort-1t", threads=1)
    timing = {"batch": device.batch, "threads": device.threads, "rounds": rounds, "runs": runs}
    bar = progress_bar(4 + refine, f"int8 vs float ({device.name})", disable=not progress)
    uniform = build_model(())
    speeds, losing, losing2 = _profiled_choices(build_model, fp32, uniform, quantized, kinds,
                                                fp32_index, qdq_index, device, profile_runs, bar)
    candidates = _candidates(quantized, kinds, losing, losing2)
    blobs = {"fp32": fp32, **{c.label: (uniform if not c.float_layers else build_model(c.float_layers))
                               for c in candidates}}
    timed = time_rounds(blobs, **timing, min_rounds=min_rounds, runners=sessions)
    bar.update()
    for c in candidates:
        c.median_ms, c.p95_ms = _summary(timed[c.label])
    best = _refine(build_model, quantized, speeds, prefer_int8(candidates, timed), candidates,
                   blobs, refine, timing, sessions, bar)
    # final: FP32, all-int8 and the two best candidates timed together again; chosen there
    # (prefer_int8), it counts as faster than FP32 only if it was faster in both timings
    finalists = {c.label: c for c in sorted(candidates, key=lambda c: c.median_ms)[:2]}
    finalists.setdefault(best.label, best)
    for c in candidates:
        if c.label == "all-int8":
            finalists.setdefault(c.label, c)
    final_rounds = time_rounds({"fp32": fp32, **{label: blobs[label] for label in finalists}},
                               **timing, min_rounds=min_rounds, runners=sessions)
    bar.close()
    final = {label: _summary(t) for label, t in final_rounds.items()}
    best = prefer_int8(finalists.values(), final_rounds)
    faster = (final[best.label][0] < final["fp32"][0]
              and best.median_ms < float(np.median(timed["fp32"])))
    return DevicePolicy(device=device.name, threads=device.threads, batch=device.batch,
                        float_layers=list(best.float_layers), fp32_ms=final["fp32"][0],
                        fp32_p95_ms=final["fp32"][1], uniform_ms=final["all-int8"][0],
                        chosen_ms=final[best.label][0], chosen_p95_ms=final[best.label][1],
                        chosen_label=best.label, faster_twice=faster, candidates=candidates,
                        layers=speeds)


def _refine(build_model: Callable[[Iterable[str]], bytes], quantized: list[str], speeds: list,
            best: Candidate, candidates: list[Candidate], blobs: dict[str, bytes], refine: int,
            timing: dict[str, Any], sessions: dict[str, Any], bar) -> Candidate:
    """Greedy refinement of :func:`choose_float_layers`: flip the ``refine`` layers whose two
    costs are closest, one at a time, each step timed against the best so far; every step's
    candidate joins ``candidates`` (and its bytes ``blobs``), the better of each pair is kept."""
    order = sorted(speeds, key=lambda s: abs(s.float_ms - s.int8_ms) / max(s.float_ms, 1e-9))
    for step, s in enumerate(order[:refine]):
        trial = [n for n in best.float_layers if n != s.layer] if s.layer in best.float_layers \
            else sorted(best.float_layers + [s.layer], key=quantized.index)
        if len(trial) >= len(quantized):
            continue
        label = f"refine-{step}"
        blob = build_model(trial)
        pair = time_rounds({best.label: blobs[best.label], label: blob}, **timing,
                           runners=sessions)
        bar.update()
        cand = Candidate(label, trial, *_summary(pair[label]))
        candidates.append(cand)
        blobs[label] = blob  # a rejected step can still be among the finalists
        best = prefer_int8([best, cand], pair)
    return best


def _profiled_choices(build_model: Callable[[Iterable[str]], bytes], fp32: bytes, uniform: bytes,
                      quantized: list[str], kinds: Mapping[str, str], fp32_index: LayerIndex,
                      qdq_index: LayerIndex, device: MeasuredDevice, runs: int, bar: Any
                      ) -> tuple[list[LayerSpeed], list[str], list[str]]:
    """Each layer's float and int8 cost from onnxruntime's profiler, and the layers where float
    pays: alone (``losing``) and in the context of that choice (``losing2``)."""
    at = {"batch": device.batch, "threads": device.threads, "runs": runs}
    f_costs = _per_layer(fp32_index, fp32, **at)
    bar.update()
    q_costs = _per_layer(qdq_index, uniform, **at)
    bar.update()
    speeds = [LayerSpeed(n, kinds.get(n, "conv"), f_costs.get(n, 0.0), q_costs.get(n, 0.0))
              for n in quantized]
    # a layer goes float only where float clearly pays (profiles are noisy too)
    losing = [s.layer for s in speeds if _float_pays(s.float_ms, s.int8_ms)]
    # the same rule in the context of that choice (boundaries between int8 and float move).
    # Already decided without a third profile when no layer loses (that graph is the all-int8
    # one just profiled) or every layer does (all float is FP32, never a candidate)
    if not losing:
        ctx = q_costs
    elif len(set(losing)) >= len(quantized):
        ctx = {}
    else:
        ctx = _per_layer(qdq_index, build_model(losing), **at)
    bar.update()
    losing2 = sorted(set(losing) | {s.layer for s in speeds if s.layer not in losing
                                    and _float_pays(s.float_ms, ctx.get(s.layer, 0.0))},
                     key=quantized.index)
    return speeds, losing, losing2


def _candidates(quantized: list[str], kinds: Mapping[str, str], losing: list[str],
                losing2: list[str]) -> list[Candidate]:
    """The float-layer sets worth timing, each once (all float is FP32, not a candidate)."""
    dense = {"pointwise", "linear"}
    candidates = [
        Candidate("all-int8", []),
        Candidate("profile", losing),
        Candidate("profile-in-context", losing2),
        Candidate("depthwise-float", [n for n in quantized if kinds.get(n) == "depthwise"]),
        Candidate("dense-only-int8", [n for n in quantized if kinds.get(n) not in dense]),
    ]
    unique: dict[tuple[str, ...], Candidate] = {}
    for c in candidates:
        if len(set(c.float_layers)) < len(quantized):
            unique.setdefault(tuple(c.float_layers), c)
    return list(unique.values())


def _float_pays(float_ms: float, int8_ms: float) -> bool:
    """A layer's float cost below its int8 cost by more than the minimum margin."""
    return float_ms < int8_ms * (1.0 - MIN_MARGIN)
