"""Whether a QDQ file's integer layers can saturate on x86 CPUs without VNNI, read from the file.

onnxruntime's MLAS and OpenVINO's oneDNN run a uint8 x int8 layer on AVX2 or AVX-512BW without
VNNI with ``vpmaddubsw``: two neighbouring products along the reduction, added into a
*saturating* int16, then widened. A pair of weights of one sign at the ends of the int8 range
times uint8 activations near 255 overflows it (2 x 255 x 127 = 64770 > 32767) and the layer's
sum is silently clipped; VNNI (``vpdpbusd``) and AMX accumulate in int32 and never do. Which
neighbours form a pair depends on each kernel's packing, so the bound here takes, per output
channel, the two largest weights of one sign anywhere in the channel: ``max_uint8 x (|w1| +
|w2|)``. A file whose every integer layer stays within :data:`INT16_PAIR_LIMIT` gives the same
numbers on every x86 ISA (what :func:`hwnas.quant.ptq.int16_safe_layers` makes the export
write). Products of two activations (uint8 x uint8 attention MatMuls) are not bounded here:
both runtimes widen those to 16 bits before multiplying.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from hwnas.quant.fake_quant import INT16_PAIR_LIMIT
from onnx import TensorProto, numpy_helper

__all__ = ["INT16_PAIR_LIMIT", "PairBound", "int16_pair_bounds", "int16_report"]

_INT_WEIGHT_TYPES = (TensorProto.INT8, TensorProto.INT4)
_LAYER_OPS = ("Conv", "Gemm", "MatMul")


@dataclass
class PairBound:
    """The worst 16-bit pair sum of one integer layer: ``node``, its ``max_input`` (largest
    uint8 code its input can take: 255, or the integer Clip's top below 8 bits), the largest
    ``|w1| + |w2|`` of one sign in one output channel, and their product ``worst``."""

    node: str
    max_input: int
    weight_pair: int
    worst: int

    @property
    def safe(self) -> bool:
        return self.worst <= INT16_PAIR_LIMIT


def _max_uint8_code(tensor: str, producer: dict[str, onnx.NodeProto],
                    inits: dict[str, onnx.TensorProto]) -> int | None:
    """255 (or the integer Clip's upper bound) when ``tensor`` is a DequantizeLinear of uint8
    codes, else None (float or int8 input: not a U8S8 layer)."""
    dq = producer.get(tensor)
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    src = dq.input[0]
    clip = producer.get(src)
    top = 255
    if clip is not None and clip.op_type == "Clip" and len(clip.input) > 2 and clip.input[2] in inits:
        top = int(numpy_helper.to_array(inits[clip.input[2]]))
        src = clip.input[0]
    q = producer.get(src)
    if q is not None and q.op_type == "QuantizeLinear":
        zp = inits.get(q.input[2]) if len(q.input) > 2 else None
        if zp is not None and zp.data_type != TensorProto.UINT8:
            return None
        return top
    init = inits.get(src)
    if init is not None and init.data_type == TensorProto.UINT8:
        return int(numpy_helper.to_array(init).max(initial=0))
    return None


def _weight_codes(tensor: str, producer: dict[str, onnx.NodeProto],
                  inits: dict[str, onnx.TensorProto]) -> tuple[np.ndarray, int] | None:
    """``(integer weights, channel axis)`` when ``tensor`` is a DequantizeLinear of an int8/int4
    initializer, else None."""
    dq = producer.get(tensor)
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
        return None
    init = inits[dq.input[0]]
    if init.data_type not in _INT_WEIGHT_TYPES:
        return None
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    return numpy_helper.to_array(init).astype(np.int64), axis


def _worst_pair(w: np.ndarray, out_axis: int) -> int:
    """The largest sum of the two largest weights of one sign in one output channel."""
    per_channel = np.moveaxis(w, out_axis, 0).reshape(w.shape[out_axis], -1)
    worst = 0
    for side in (np.clip(per_channel, 0, None), np.clip(-per_channel, 0, None)):
        top2 = -np.sort(-side, axis=1)[:, :2]
        worst = max(worst, int(top2.sum(axis=1).max(initial=0)))
    return worst


def int16_pair_bounds(model: onnx.ModelProto) -> list[PairBound]:
    """:class:`PairBound` of every uint8 x int8 Conv/Gemm/MatMul of a QDQ ``model``."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    out = []
    for node in graph.node:
        if node.op_type not in _LAYER_OPS or len(node.input) < 2:
            continue
        max_input = _max_uint8_code(node.input[0], producer, inits)
        weights = _weight_codes(node.input[1], producer, inits)
        if max_input is None or weights is None:
            continue
        w, _ = weights
        if node.op_type == "Conv":
            out_axis = 0
        elif node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            out_axis = 0 if trans_b else 1
        else:
            out_axis = w.ndim - 1
        pair = _worst_pair(w, out_axis)
        out.append(PairBound(node.name, max_input, pair, max_input * pair))
    return out


def int16_report(model: onnx.ModelProto) -> dict:
    """What the manifest records of a file: ``int16_safe`` (every integer layer within
    :data:`INT16_PAIR_LIMIT`), the worst pair sum, and the layers over the limit."""
    bounds = int16_pair_bounds(model)
    over = [b.node for b in bounds if not b.safe]
    return {"int16_safe": not over, "integer_layers_bounded": len(bounds),
            "worst_pair_sum": max((b.worst for b in bounds), default=0),
            "int16_limit": INT16_PAIR_LIMIT, "layers_over": over}
