"""Where a QDQ file's integer codes leave its fake-quant reference, layer by layer.

Each activation quantizer's codes (the graph's ``/<layer>/input_q`` QuantizeLinear outputs in
onnxruntime) are compared with the codes the reference computes on the same images. A code
that differs only because float rounding put its value on the other side of a rounding
boundary (``x / s = k + 1/2`` within :data:`HALF_TOLERANCE` of a level) is a flip; one flip
then moves the layers after it in that image. A file whose every difference *starts* as such a
flip is correct, however far a deep or float-normalised network (a transformer's LayerNorm
and residual stream) carries the flips; a wrong scale, grid, bias or layer makes codes differ
in images nothing upstream touched, away from any boundary. The export's quantized check asks
this when its logit-level test (:func:`~hwnas.export.onnx_export.divergence_of`) cannot tell.
The reference's values and codes are taken as its quantizers compute them, ``x * (1/s)``
(:func:`~hwnas.quant.fake_quant.per_tensor_levels`); onnxruntime divides, so a value within an
ulp of a boundary may round to neighbouring codes in the two, a flip that must show where it
happens, not as a difference in the next layer (``benchmarks/qdq_divergence.md``, session 33).
For the same reason the reference's own rounding points (requantizations, residual adds made
integer adds, h-swish and squeeze-excitation gates on their grids:
:meth:`~hwnas.export.qdq.DeployedReference.rounding_points`) are traced before its hooks round
them: the next quantizer sees their values on its grid already, 0.5 level from any boundary
(session 37).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
import torch
from torch import nn

from hwnas.quant.fake_quant import per_tensor_levels

if TYPE_CHECKING:
    from hwnas.export.qdq.requant import RoundingPoint

#: a differing code counts as a rounding flip when its reference value lay this close to a
#: boundary (in quantization levels). Measured: vit's first flips on digits lay within 3e-5
#: of one (benchmarks/qdq_divergence.md); a real error moves values by whole levels.
HALF_TOLERANCE = 1e-2

__all__ = ["CodeTrace", "HALF_TOLERANCE", "trace_codes"]


@dataclass
class CodeTrace:
    """Per quantized input, in graph order: share of differing codes, largest difference,
    images touched; ``first_layer`` and how close its differing values lay to a boundary;
    ``unexplained``: the first layer with a difference that no upstream difference and no
    rounding boundary explains (None: every difference starts as a flip)."""

    layers: list[dict] = field(default_factory=list)
    first_layer: str | None = None
    first_distance_to_half: float | None = None
    unexplained: str | None = None
    unexplained_distance_to_half: float | None = None
    logits: np.ndarray | None = None
    reference: np.ndarray | None = None

    @property
    def differs(self) -> bool:
        return any(r["max_code_diff"] > 0 for r in self.layers)

    @property
    def starts_as_flips(self) -> bool:
        """Codes differ, and every difference begins as a rounding flip."""
        return self.differs and self.unexplained is None

    def describe(self) -> str:
        if not self.differs:
            return "no activation code differs, so the logits part after the last quantizer"
        moved = [r for r in self.layers if r["max_code_diff"] > 0]
        head = (f"codes first differ at {self.first_layer} "
                f"({self.first_distance_to_half:.1e} levels from a rounding boundary), then in "
                f"{len(moved)} of {len(self.layers)} quantizers, by at most "
                f"{max(r['max_code_diff'] for r in moved)} levels")
        if self.unexplained is None:
            return head + "; every difference starts as a rounding flip"
        return (head + f"; at {self.unexplained} codes differ in images nothing upstream "
                f"touched, {self.unexplained_distance_to_half:.2f} levels from a boundary")


#: the QuantizeLinear of a layer's input ``/<layer>/<suffix>_q`` -> the quantizer attribute
_SUFFIXES = {"input": "input_quant", "input0": "a_quant", "input1": "b_quant"}


def _quant_inputs(proto: onnx.ModelProto, points: Iterable[RoundingPoint] = ()
                  ) -> list[tuple[str, str]]:
    """``(quantizer module name, QuantizeLinear output)`` of every quantized layer input and
    product operand, graph order; before them, ``(point name, the same output)`` of each of
    the reference's rounding ``points`` at that QuantizeLinear (a residual add's output is
    quantized once with the next layer's input parameters: both read the same codes)."""
    at: dict[str, list[str]] = {}
    for p in points:
        at.setdefault(p.node, []).append(p.name)
    found = []
    for n in proto.graph.node:
        if n.op_type != "QuantizeLinear":
            continue
        found += [(name, n.output[0]) for name in at.get(n.name, [])]
        if not n.name.startswith("/") or not n.name.endswith("_q"):
            continue
        layer, _, suffix = n.name[1:-2].rpartition("/")
        if suffix in _SUFFIXES:
            found.append((f"{layer}.{_SUFFIXES[suffix]}", n.output[0]))
    return found


def _session(proto: onnx.ModelProto, quant: list[tuple[str, str]]):  # noqa: ANN202
    """An onnxruntime session (1 thread) whose outputs are the logits, then every code."""
    import onnxruntime as ort

    zero_types = {t.name: t.data_type for t in proto.graph.initializer}
    wanted = {o for _, o in quant}
    for node in proto.graph.node:
        if node.op_type == "QuantizeLinear" and node.output[0] in wanted:
            wanted.discard(node.output[0])  # a residual add's output is its consumer's code too
            elem = (zero_types.get(node.input[2], onnx.TensorProto.UINT8) if len(node.input) > 2
                    else onnx.TensorProto.UINT8)
            proto.graph.output.append(onnx.helper.make_tensor_value_info(node.output[0], elem, None))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _reference_pass(model: nn.Module, modules: dict[str, nn.Module], names: list[str],
                    points: dict[str, RoundingPoint], x: torch.Tensor
                    ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray],
                               dict[str, np.ndarray]]:
    """The reference's logits on ``x`` and, per traced quantizer (``modules``: the model's,
    by name) or rounding point (``points``, by name), its values in levels before rounding and
    its codes (forward hooks, removed again), and where a point's code matters (its ``live``
    mask, where it has one). Rounding points are traced before the reference's own hooks round
    them: the next quantizer sees their values on its grid."""
    values: dict[str, np.ndarray] = {}
    codes: dict[str, np.ndarray] = {}
    live: dict[str, np.ndarray] = {}

    def keep(name: str, v: torch.Tensor, zero_point, qmin: int, qmax: int) -> None:
        values[name] = v.numpy()
        # int32 holds every code exactly (at most 16 bits) at half the memory traffic of int64
        codes[name] = v.round().add(zero_point).clamp(qmin, qmax).numpy().astype(np.int32)

    def quantizer(name):
        def pre(q, inputs):
            v = per_tensor_levels(inputs[0].float(), q.scale.detach().clamp_min(1e-8))
            keep(name, v, q.zero_point.reshape(()), q.qmin, q.qmax)
        return pre

    def point(p: RoundingPoint):
        def post(_m, inputs, out):  # runs before the reference's own rounding hook
            keep(p.name, per_tensor_levels(p.value(inputs, out).float(),
                                           torch.tensor(float(p.scale))), p.zero_point, 0, 255)
            if p.live is not None:
                live[p.name] = p.live(inputs, out).numpy()
        return post

    handles = []
    for n in names:
        if n in points:
            handles.append(modules[points[n].module].register_forward_hook(point(points[n]),
                                                                           prepend=True))
        else:
            handles.append(modules[n].register_forward_pre_hook(quantizer(n)))
    try:
        with torch.no_grad():
            logits = model(x).numpy()
    finally:
        for h in handles:
            h.remove()
    return logits, values, codes, live


class _Tally:
    """Code differences summed over chunks of images, per traced quantizer."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.stats = {n: {"differ": 0, "count": 0, "max": 0, "touched": 0} for n in names}
        self.firsts: dict[str, float] = {}  # farthest distance to a boundary of any difference
        self.worst: dict[str, float] = {}   # ... of a difference nothing upstream explains
        self.images = 0

    def add(self, ort_codes: dict, codes: dict, values: dict, n_images: int,
            live: dict | None = None) -> None:
        """One chunk's codes. The code difference and the distance to a boundary are computed
        at the differing codes only (the same elements, so the same figures): a CIFAR-size
        chunk holds ~10^8 codes, of which few differ, and whole-tensor passes over them were
        half of a large model's trace (export_speed.md, Session 36). ``live``: per rounding
        point that has one, where its codes matter; differences elsewhere are not counted."""
        live = live or {}
        self.images += n_images
        upstream = np.zeros(n_images, bool)  # images some earlier quantizer's codes differ in
        for n in self.names:
            got, want, value = ort_codes[n], codes[n], values[n]
            if want.shape != got.shape and want.swapaxes(-1, -2).shape == got.shape:
                want, value = want.swapaxes(-1, -2), value.swapaxes(-1, -2)  # Kᵀ traced as such
            dif = got != want  # integer codes, compared exactly
            if n in live:
                dif &= live[n]
            per_image = dif.reshape(n_images, -1).any(1)
            s = self.stats[n]
            differ = int(np.count_nonzero(dif))
            s["differ"] += differ
            s["count"] += dif.size
            s["touched"] += int(per_image.sum())
            if differ:
                s["max"] = max(s["max"], int(np.abs(got[dif].astype(np.int64) - want[dif]).max()))
                v = value[dif]
                dist = np.abs(v - np.floor(v) - 0.5)
                self.firsts[n] = max(self.firsts.get(n, 0.0), float(dist.max()))
                fresh = ~np.broadcast_to(upstream.reshape((-1,) + (1,) * (dif.ndim - 1)),
                                         dif.shape)[dif]
                if fresh.any():
                    self.worst[n] = max(self.worst.get(n, 0.0), float(dist[fresh].max()))
            upstream |= per_image

    def result(self) -> CodeTrace:
        trace = CodeTrace()
        for n in self.names:
            s = self.stats[n]
            trace.layers.append({"layer": n,
                                 "codes_differ_pct": 100.0 * s["differ"] / max(1, s["count"]),
                                 "max_code_diff": s["max"],
                                 "images_touched_pct": 100.0 * s["touched"] / max(1, self.images)})
        trace.first_layer = next((n for n in self.names if n in self.firsts), None)
        trace.first_distance_to_half = self.firsts.get(trace.first_layer)
        trace.unexplained = next((n for n in self.names
                                  if self.worst.get(n, 0.0) > HALF_TOLERANCE), None)
        trace.unexplained_distance_to_half = self.worst.get(trace.unexplained)
        return trace


def trace_codes(data: bytes, reference: nn.Module, images: torch.Tensor, *,
                points: Iterable[RoundingPoint] = (), batch_size: int = 64) -> CodeTrace:
    """Compare the QDQ file ``data`` with ``reference`` (the fake-quant model it must match:
    ``QdqBuild.reference()`` entered) on ``images``, a chunk of images at a time (the codes of
    a CIFAR-size network on 1,000 images would not fit in memory at once). ``points``: the
    reference's own rounding points (``DeployedReference.rounding_points()``), traced too (as
    ``<module>.<kind>``, at their QuantizeLinear in the file). The reference runs on the CPU in
    float32, as onnxruntime does."""
    proto = onnx.load_from_string(data)
    points = {p.name: p for p in points}
    quant = _quant_inputs(proto, points.values())
    sess = _session(proto, quant)
    model = copy.deepcopy(reference).cpu().float().eval()
    modules = dict(model.named_modules())
    names = [n for n, _ in quant if n in points or hasattr(modules.get(n), "scale")]
    tally, logits, refs = _Tally(names), [], []
    out_names = [o.name for o in sess.get_outputs()]
    x_all = images.detach().to("cpu", torch.float32)
    for i in range(0, len(x_all), batch_size):
        x = x_all[i:i + batch_size]
        outs = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
        ref, values, codes, live = _reference_pass(model, modules, names, points, x)
        by_tensor = dict(zip(out_names, outs))
        tally.add({n: by_tensor[t] for n, t in quant}, codes, values, len(x), live)
        logits.append(outs[0])
        refs.append(ref)
    trace = tally.result()
    trace.logits, trace.reference = np.concatenate(logits), np.concatenate(refs)
    return trace
