"""What onnxruntime makes of a graph, and where its time goes, per policy layer.

* :func:`optimized_model` - the graph after onnxruntime's optimizations (the fusions that turn
  ``DQ -> Conv -> Q`` into ``QLinearConv``, the NCHWc / NHWC layout changes), saved through
  ``SessionOptions.optimized_model_filepath``;
* :func:`profile_model` - per-node kernel times from onnxruntime's profiler on that graph;
* :class:`LayerIndex` - maps the nodes of an optimized graph back to the policy's layers (by
  weight initializer, by the source node their name derives from, or to the layer whose
  integer or float form caused them), so time is charged per layer.

Only onnxruntime, onnx and numpy are needed (no torch).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from hwnas.latency.onnx_measure import session_options as measurement_options

from hwnas.core.errors import UserError

__all__ = [
    "CONV_LIKE_OPS",
    "INTEGER_OPS",
    "LayerIndex",
    "NodeProfile",
    "optimized_model",
    "profile_model",
    "session_options",
]

#: onnxruntime op types that compute a conv/matmul on integers
INTEGER_OPS = frozenset({
    "QLinearConv", "ConvInteger", "MatMulInteger", "QGemm", "QLinearMatMul",
    "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "NhwcQLinearConv", "MatMulNBits",
})
#: op types that carry a layer's weights (float or integer)
CONV_LIKE_OPS = INTEGER_OPS | frozenset({
    "Conv", "FusedConv", "NhwcFusedConv", "NhwcConv", "Gemm", "FusedGemm", "MatMul",
    "FusedMatMul", "ConvTranspose",
})
_WEIGHT_SUFFIXES = ("weight", "weight_quantized", "weight_fq", "bias", "bias_quantized")
_PASS_THROUGH = frozenset({"Relu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "Add", "Mul",
                           "QuantizeLinear", "DequantizeLinear", "LeakyRelu"})
_SUFFIX = re.compile(r"(_token_\d+|_nchwc|_nhwc|/duplicated)+$")
#: nodes the exporter inserts for a layer: ``/<layer>/<role>`` (export.qdq)
_INSERTED = re.compile(r"^/(?P<layer>.+)/(input_q|input_clip|input_dq|weight_dq|bias_dq|requant_q|"
                       r"requant_dq|float_guard)$")


def session_options(threads: int = 1, *, optimized_path: str | None = None,
                    profile_prefix: str | None = None) -> ort.SessionOptions:
    """The session settings of every measurement in hwnas (see
    :func:`hwnas.latency.onnx_measure.make_session`), optionally saving the optimized graph and
    profiling."""
    opts = measurement_options(int(threads))
    if optimized_path is not None:
        opts.optimized_model_filepath = optimized_path
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return opts


def _session(model: bytes | str | Path, opts: ort.SessionOptions) -> ort.InferenceSession:
    source = str(model) if isinstance(model, (str, Path)) else bytes(model)
    try:
        return ort.InferenceSession(source, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises several unrelated types
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise UserError(f"onnxruntime cannot load the model: {first}") from exc


def optimized_model(model: bytes | str | Path, *, threads: int = 1) -> onnx.ModelProto:
    """The graph onnxruntime runs after ``ORT_ENABLE_ALL`` optimizations on this CPU."""
    with tempfile.TemporaryDirectory(prefix="hwnas-ort-") as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        _session(model, session_options(threads, optimized_path=path))
        return onnx.load(path)


@dataclass
class NodeProfile:
    """Median kernel time per node (ms, per run) of one profiled model, with its optimized
    graph; ``wall_ms`` is the median time of a whole run."""

    node_ms: dict[str, float]
    optimized: onnx.ModelProto
    wall_ms: float
    batch: int
    threads: int

    @property
    def total_ms(self) -> float:
        return float(sum(self.node_ms.values()))


def profile_model(model: bytes | str | Path, *, batch: int = 1, threads: int = 1, runs: int = 10,
                  warmup: int = 3, seed: int = 0) -> NodeProfile:
    """Profile ``model`` with onnxruntime: per-node kernel times (median over ``runs``).

    onnxruntime leaves the nodes it creates while optimizing (e.g. the HardSigmoid and Mul of a
    decomposed h-swish) unnamed, and the profiler cannot tell unnamed nodes apart. So the graph
    is optimized once, every node given a unique name, and that optimized graph is profiled with
    further optimization disabled (the same kernels run)."""
    import time

    from hwnas.latency.onnx_measure import random_input

    optimized = optimized_model(model, threads=threads)
    seen: set[str] = set()
    for i, node in enumerate(optimized.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.name or node.op_type}__{i}"
        seen.add(node.name)
    with tempfile.TemporaryDirectory(prefix="hwnas-prof-") as tmp:
        opts = session_options(threads, profile_prefix=os.path.join(tmp, "profile"))
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = _session(optimized.SerializeToString(), opts)
        feeds = random_input(sess, batch=batch, seed=seed)
        walls = []
        for i in range(warmup + runs):
            start = time.perf_counter()
            sess.run(None, feeds)
            if i >= warmup:
                walls.append((time.perf_counter() - start) * 1e3)
        trace = sess.end_profiling()
        with open(trace) as fh:
            events = json.load(fh)
    per: dict[str, list[float]] = {}
    for ev in events:
        if ev.get("cat") == "Node" and str(ev.get("name", "")).endswith("_kernel_time"):
            per.setdefault(ev["name"][: -len("_kernel_time")], []).append(float(ev["dur"]) / 1e3)
    node_ms = {name: float(np.median(v[-runs:])) for name, v in per.items()}
    return NodeProfile(node_ms, optimized, float(np.median(walls)), batch, threads)


@dataclass
class LayerIndex:
    """Maps nodes of (optimized) graphs derived from one source graph to policy layers.

    A conv-like node by its weight/bias initializer (``<layer>.weight_quantized``,
    ``<layer>.bias``) or by the source node / tensor its name derives from
    (``/blocks/blocks.0/dw_conv/Conv_token_41``, ``/blocks/blocks.1/act2/Relu_output_0_nchwc``);
    the Q/DQ/guard nodes the exporter inserted for a layer (``/<layer>/input_q``,
    ``/<layer>/requant_dq``...) to that layer; every other node (Transpose, Reorder,
    activations, adds, Q/DQ onnxruntime made) to the layer whose integer or float form caused
    it - a QuantizeLinear, a ReorderInput or an NCHW->NHWC Transpose to the layer it feeds,
    anything else to the layer that produced its input.
    """

    layers: set[str]
    layer_of_node: dict[str, str]
    owner_of_tensor: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_source(cls, source: onnx.ModelProto, node_of: Mapping[str, str]) -> LayerIndex:
        """``node_of``: ``{layer: source node name}`` (:func:`hwnas.export.qdq.map_layer_nodes`)."""
        layer_of_node = {v: k for k, v in node_of.items()}
        owner: dict[str, str] = {}
        produced_at: dict[str, int] = {}
        for i, node in enumerate(source.graph.node):
            layer = layer_of_node.get(node.name)
            if layer is None and node.op_type in _PASS_THROUGH:
                owned = [t for t in node.input if t in owner]
                if owned:  # the most recently produced owned input (the conv branch of an add)
                    layer = owner[max(owned, key=lambda t: produced_at.get(t, -1))]
            if layer is not None:
                for out in node.output:
                    owner[out] = layer
            for out in node.output:
                produced_at[out] = i
        return cls(set(node_of), layer_of_node, owner)

    def anchor(self, node: onnx.NodeProto, initializers: set[str]) -> str | None:
        """The layer whose weights a conv-like node carries, else None."""
        if node.op_type not in CONV_LIKE_OPS:
            return None
        for name in node.input:
            if name in initializers:
                base, _, suffix = name.rpartition(".")
                if suffix in _WEIGHT_SUFFIXES and base in self.layers:
                    return base
        stripped = _SUFFIX.sub("", node.name)
        if stripped in self.layer_of_node:
            return self.layer_of_node[stripped]
        if stripped in self.owner_of_tensor:
            return self.owner_of_tensor[stripped]
        for out in node.output:
            out = _SUFFIX.sub("", out)
            if out in self.layer_of_node:
                return self.layer_of_node[out]
        from hwnas.export.qdq.names import node_scope

        scope = node_scope(stripped)
        return scope if scope in self.layers else None

    def anchors(self, graph: onnx.GraphProto) -> dict[str, str]:
        """``{node name: layer}`` for the conv-like nodes of ``graph`` that carry a layer."""
        inits = {i.name for i in graph.initializer}
        out = {}
        for node in graph.node:
            layer = self.anchor(node, inits)
            if layer is not None:
                out[node.name] = layer
        return out

    def attribute(self, graph: onnx.GraphProto, node_ms: Mapping[str, float]) -> dict[str, float]:
        """Per-layer time: each node's time charged to a layer (see the class docstring);
        what reaches no layer is under ``""``."""
        anchors = self.anchors(graph)
        producer: dict[str, onnx.NodeProto] = {}
        consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for out in node.output:
                producer[out] = node
            for name in node.input:
                consumers.setdefault(name, []).append(node)

        def walk(node: onnx.NodeProto, down: bool) -> str | None:
            frontier, seen = [node], {node.name}
            for _ in range(12):
                nxt = []
                for n in frontier:
                    if n.name in anchors and n is not node:
                        return anchors[n.name]
                    tensors = n.output if down else n.input
                    for t in tensors:
                        for m in (consumers.get(t, []) if down else [producer.get(t)]):
                            if m is not None and m.name not in seen:
                                seen.add(m.name)
                                nxt.append(m)
                if not nxt:
                    return None
                frontier = nxt
            return None

        out: dict[str, float] = {}
        names = {n.name for n in graph.node}
        # onnxruntime duplicates a shared DequantizeLinear per consumer even when optimizations
        # are off ("<name>/duplicated"): charge the copies to the original
        ms_of: dict[str, float] = {}
        for key, value in node_ms.items():
            base = key if key in names else key.split("/duplicated")[0]
            base = base if base in names else ""
            ms_of[base] = ms_of.get(base, 0.0) + float(value)
        if ms_of.get(""):
            out[""] = ms_of[""]
        for node in graph.node:
            ms = ms_of.get(node.name, 0.0)
            inserted = _INSERTED.match(_SUFFIX.sub("", node.name))
            if node.name in anchors:
                layer: str | None = anchors[node.name]
            elif inserted and inserted.group("layer") in self.layers:
                layer = inserted.group("layer")  # a Q/DQ/guard the exporter added for it
            else:
                down_first = node.op_type in ("QuantizeLinear", "ReorderInput", "DynamicQuantizeLinear")
                if node.op_type == "Transpose":
                    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [])
                    down_first = perm == [0, 2, 3, 1]
                layer = walk(node, down_first) or walk(node, not down_first)
            out[layer or ""] = out.get(layer or "", 0.0) + ms
        return out

    def kernels(self, graph: onnx.GraphProto) -> dict[str, list[tuple[str, str]]]:
        """``{layer: [(node name, op type), ...]}`` of the conv-like nodes carrying each layer,
        plus any DequantizeLinear that still de-quantizes its weights at run time (recorded as
        ``("<node>", "DequantizeLinear")``)."""
        out: dict[str, list[tuple[str, str]]] = {}
        for name, layer in self.anchors(graph).items():
            node = next(n for n in graph.node if n.name == name)
            out.setdefault(layer, []).append((name, node.op_type))
        inits = {i.name for i in graph.initializer}
        for node in graph.node:
            if node.op_type == "DequantizeLinear" and node.input and node.input[0] in inits:
                base, _, suffix = node.input[0].rpartition(".")
                if suffix == "weight_quantized" and base in self.layers:
                    out.setdefault(base, []).append((node.name, "DequantizeLinear"))
        return out


def integer_kernel_check(model: bytes | str | Path, index: LayerIndex, quantized: Iterable[str], *,
                         kept_float: Iterable[str] = (), threads: int = 1
                         ) -> tuple[dict[str, str], list[str]]:
    """``({layer: integer op type}, [float island descriptions])`` for the ``quantized`` layers
    after onnxruntime's optimizations: a layer is an island when the node carrying it is a float
    op, when its weights are still de-quantized at run time, or when no node carries it. Layers of
    ``kept_float`` that onnxruntime made integer kernels anyway (with weight scales of its own)
    are in the dict too."""
    graph = optimized_model(model, threads=threads).graph
    kernels = index.kernels(graph)
    integer: dict[str, str] = {}
    islands: list[str] = []
    for layer in kept_float:
        int_ops = [op for _, op in kernels.get(layer, []) if op in INTEGER_OPS]
        if int_ops:
            integer[layer] = int_ops[0]
    for layer in quantized:
        found = kernels.get(layer, [])
        ops = [op for _, op in found]
        int_ops = [op for op in ops if op in INTEGER_OPS]
        float_ops = [f"{op} {name}" for name, op in found if op not in INTEGER_OPS]
        if int_ops and not float_ops:
            integer[layer] = int_ops[0]
        elif not found:
            islands.append(f"{layer} (no kernel found after optimization)")
        else:
            islands.append(f"{layer} ({', '.join(float_ops)})")
    return integer, islands
