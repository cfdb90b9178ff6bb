"""Integer element-wise ops in a QDQ graph: h-swish, squeeze-excitation and residual adds in int8.

Why: after :class:`hwnas.export.qdq.QdqGraphBuilder` every conv runs as an integer kernel, but the
element-wise ops between them stayed float, each behind a DequantizeLinear and before a
QuantizeLinear. Profiled on a Xeon with VNNI/AMX, those islands cost more than the integer convs
gain (single-threaded DequantizeLinear, h-swish on float tensors four times the size, NHWC<->NCHW
transposes around every island: ``benchmarks/export_ort_ops.md``). :func:`integer_elementwise`
rewrites them into patterns that onnxruntime fuses into its integer element-wise kernels
(QLinearAdd, QLinearMul, QLinearGlobalAveragePool), which stay in the NHWC layout of the
integer convs.

Each rewrite changes the numbers slightly (one more rounding to an 8-bit grid, or one fewer).
:class:`ElementwiseRewrite` records them per module so :class:`hwnas.export.qdq.DeployedReference`
computes the same in PyTorch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["ElementwiseRewrite", "integer_elementwise"]

_LAYER_OPS = ("Conv", "Gemm", "MatMul")
#: t = Q(x + 3) on this scale saturates at 0 and 6: relu6(x + 3)
HSIG_Q_SCALE = np.float32(6.0 / 255.0)
#: ... read back on this one, t is hsigmoid(x) = relu6(x + 3) / 6; also the SE gate's scale
UNIT_SCALE = np.float32(1.0 / 255.0)


@dataclass
class ElementwiseRewrite:
    """A rewritten graph and what a PyTorch model must do to compute the same.

    ``hswish``: h-swish module -> the (scale, zero point) its output is quantized with, or
    ``None`` where its consumers' input quantizer does it; ``gates``: h-sigmoid modules whose
    output is quantized on the 1/255 grid; ``residual``: module -> (scale, zero point) of its
    (add) output; ``requant``: layer -> the (scale, zero point) that replaced its own
    requantization parameters; ``nodes``: (module, kind) -> the QuantizeLinear node of each
    rounding above (kind ``hsigmoid``, ``hswish``, ``se_gate`` or ``residual``), where the code
    trace reads the file's codes (:meth:`hwnas.export.qdq.DeployedReference.rounding_points`)."""

    proto: onnx.ModelProto
    hswish: dict[str, tuple[float, int] | None] = field(default_factory=dict)
    gates: list[str] = field(default_factory=list)
    residual: dict[str, tuple[float, int]] = field(default_factory=dict)
    requant: dict[str, tuple[float, int]] = field(default_factory=dict)
    nodes: dict[tuple[str, str], str] = field(default_factory=dict)


class _Graph:
    """Producer/consumer look-ups and scalar quantization parameters of a graph."""

    def __init__(self, nodes: list[onnx.NodeProto], inits: Mapping[str, onnx.TensorProto],
                 outputs: set[str]) -> None:
        self.nodes, self.inits, self.outputs = nodes, inits, outputs
        self.producer = {o: n for n in nodes for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in nodes:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def qparams(self, node: onnx.NodeProto) -> tuple[float, int] | None:
        """(scale, zero point) of a per-tensor Q/DQ node with constant parameters, else None."""
        if len(node.input) < 3 or node.input[1] not in self.inits or node.input[2] not in self.inits:
            return None
        scale = numpy_helper.to_array(self.inits[node.input[1]])
        zp = numpy_helper.to_array(self.inits[node.input[2]])
        if scale.size != 1 or zp.size != 1 or zp.dtype != np.uint8:
            return None
        return float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0])

    def dequantized(self, tensor: str) -> onnx.NodeProto | None:
        """The per-tensor uint8 DequantizeLinear that produces ``tensor``, if one does."""
        node = self.producer.get(tensor)
        if node is None or node.op_type != "DequantizeLinear" or self.qparams(node) is None:
            return None
        return node

    def feeds_layer(self, tensor: str) -> bool:
        """Whether a conv/linear node reads ``tensor`` directly (a layer kept in float)."""
        return any(u.op_type in _LAYER_OPS for u in self.consumers.get(tensor, []))

    def common_quantizer(self, tensor: str) -> onnx.NodeProto | None:
        """A QuantizeLinear that every consumer of ``tensor`` is, all with equal parameters."""
        users = self.consumers.get(tensor, [])
        if not users or tensor in self.outputs or any(u.op_type != "QuantizeLinear" for u in users):
            return None
        params = {self.qparams(u) for u in users}
        return users[0] if len(params) == 1 and None not in params else None


def _scope_ends(nodes: list[onnx.NodeProto], scope_of) -> dict[str, str]:  # noqa: ANN001
    """``{scope: name of its last node}``, counting nodes of nested scopes as the scope's."""
    last: dict[str, str] = {}
    for n in nodes:
        scope = scope_of(n.name)
        while scope:
            last[scope] = n.name
            scope = scope.rpartition(".")[0]
    return last


def integer_elementwise(model: onnx.ModelProto, *, hswish_modules: set[str],
                        hsigmoid_modules: set[str], modules: set[str],
                        requant_layer_of: Mapping[str, str]) -> ElementwiseRewrite:
    """Rewrite ``model`` (a QDQ graph, modified in place) into onnxruntime's integer
    element-wise patterns:

    * **h-swish** ``x * relu6(x + 3) / 6`` of a de-quantized ``x``: ``t = Q(x + 3)`` on the
      scale 6/255 (the uint8 range clamps to [0, 6]: relu6 for free; a QLinearAdd), read back on
      the scale 1/255 (so ``t`` *is* ``hsigmoid(x)`` on a 1/255 grid), then ``x * t`` (a
      QLinearMul) quantized with the consumer's parameters, or with ``x``'s own where the
      consumers differ (h-swish shrinks magnitudes, so ``x``'s range holds it), or left float
      where a float layer reads it;
    * **squeeze-excitation**: the gate ``hsigmoid(...)`` (in [0, 1]) quantized on the scale
      1/255 so ``x * gate`` fuses into a QLinearMul; ``ReduceMean`` over H, W becomes
      ``GlobalAveragePool`` (a QLinearGlobalAveragePool between its DQ and Q);
    * **residual adds** whose output feeds an integer layer and other nodes (the next block's
      skip path) but no float layer: the output is quantized once with that layer's input
      parameters and every consumer reads it, so both adds fuse into QLinearAdd;
    * **requantization chains** ``Q(s1) -> DQ(s1) -> Q(s2)`` (a conv output requantized for a
      float op that no longer exists): the first Q takes ``s2`` directly;
    * nodes left without consumers are removed.

    No rewrite puts a DequantizeLinear directly in front of a layer kept in float: onnxruntime
    would quantize that conv with scales of its own (see ``QdqGraphBuilder._float_guards``).
    A rewrite is applied only where the op is a module of that kind
    (``nn.Hardswish``/``nn.Hardsigmoid``) or the add is the last op of its module (its output),
    so that a forward hook of :class:`hwnas.export.qdq.DeployedReference` can mirror it.

    ``hswish_modules`` / ``hsigmoid_modules``: the names of the ``nn.Hardswish`` /
    ``nn.Hardsigmoid`` modules (node names carry them, :func:`hwnas.export.qdq.node_scope`);
    ``modules``: every module name (residual adds are rewritten only where they are their
    module's output); ``requant_layer_of``: requantization QuantizeLinear node name -> layer."""
    from hwnas.export.qdq.names import node_scope

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    graph = _Graph(list(g.node), inits, {o.name for o in g.output})
    out = ElementwiseRewrite(model)
    added: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        if name not in inits:
            t = numpy_helper.from_array(value, name)
            inits[name] = t
            added.append(t)
        return name

    zero = const("int_ops.zero_point", np.array(0, np.uint8))
    three_q = const("int_ops.three_q", np.array(255, np.uint8))
    three_s = const("int_ops.three_scale", np.array(3.0 / 255.0, np.float32))
    hsig_qs = const("int_ops.hsig_q_scale", np.array(HSIG_Q_SCALE))
    unit = const("int_ops.unit_scale", np.array(UNIT_SCALE))
    ends = _scope_ends(graph.nodes, node_scope)

    replace: dict[str, list[onnx.NodeProto]] = {}
    after: dict[str, list[onnx.NodeProto]] = {}
    rewire: dict[tuple[str, int], str] = {}
    for n in graph.nodes:
        scope = node_scope(n.name)
        if n.op_type == "HardSwish" and scope in hswish_modules:
            dq = graph.dequantized(n.input[0])
            if dq is None:
                continue
            p, y = n.name, n.output[0]
            q_in, s_in, z_in = dq.input[0], dq.input[1], dq.input[2]
            nodes = [
                helper.make_node("DequantizeLinear", [three_q, three_s, zero], [f"{p}/three"],
                                 name=f"{p}/three_dq"),
                helper.make_node("DequantizeLinear", [q_in, s_in, z_in], [f"{p}/x_add"],
                                 name=f"{p}/x_add_dq"),
                helper.make_node("Add", [f"{p}/x_add", f"{p}/three"], [f"{p}/x_plus_3"],
                                 name=f"{p}/add3"),
                helper.make_node("QuantizeLinear", [f"{p}/x_plus_3", hsig_qs, zero],
                                 [f"{p}/hsig_q"], name=f"{p}/hsig_q"),
                helper.make_node("DequantizeLinear", [f"{p}/hsig_q", unit, zero], [f"{p}/hsig"],
                                 name=f"{p}/hsig_dq"),
                helper.make_node("DequantizeLinear", [q_in, s_in, z_in], [f"{p}/x_mul"],
                                 name=f"{p}/x_mul_dq"),
            ]
            if graph.common_quantizer(y) is not None or graph.feeds_layer(y):
                # consumers quantize it themselves, or a float layer reads it (a DQ in front of
                # a float conv would let onnxruntime quantize that conv with its own scales)
                nodes.append(helper.make_node("Mul", [f"{p}/x_mul", f"{p}/hsig"], [y],
                                              name=f"{p}/mul"))
                out.hswish[scope] = None
            else:
                nodes += [
                    helper.make_node("Mul", [f"{p}/x_mul", f"{p}/hsig"], [f"{p}/y"],
                                     name=f"{p}/mul"),
                    helper.make_node("QuantizeLinear", [f"{p}/y", s_in, z_in], [f"{p}/y_q"],
                                     name=f"{p}/y_q"),
                    helper.make_node("DequantizeLinear", [f"{p}/y_q", s_in, z_in], [y],
                                     name=f"{p}/y_dq"),
                ]
                out.hswish[scope] = graph.qparams(dq)
                out.nodes[(scope, "hswish")] = f"{p}/y_q"
            out.nodes[(scope, "hsigmoid")] = f"{p}/hsig_q"
            replace[n.name] = nodes
        elif (n.op_type == "HardSigmoid" and scope in hsigmoid_modules
              and graph.consumers.get(n.output[0])
              and all(u.op_type == "Mul" for u in graph.consumers[n.output[0]])):
            p, y = n.name, n.output[0]
            gate = onnx.NodeProto()
            gate.CopyFrom(n)
            gate.output[0] = f"{p}/gate"
            replace[n.name] = [
                gate,
                helper.make_node("QuantizeLinear", [f"{p}/gate", unit, zero], [f"{p}/gate_q"],
                                 name=f"{p}/gate_q"),
                helper.make_node("DequantizeLinear", [f"{p}/gate_q", unit, zero], [y],
                                 name=f"{p}/gate_dq"),
            ]
            out.gates.append(scope)
            out.nodes[(scope, "se_gate")] = f"{p}/gate_q"
        elif n.op_type == "ReduceMean":
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            if (len(n.input) == 1 and list(attrs.get("axes", [])) == [2, 3]
                    and attrs.get("keepdims", 1) == 1):
                replace[n.name] = [helper.make_node("GlobalAveragePool", [n.input[0]],
                                                    list(n.output), name=n.name)]
        elif n.op_type == "Add" and scope in modules and ends.get(scope) == n.name:
            y = n.output[0]
            users = graph.consumers.get(y, [])
            quantizers = [u for u in users if u.op_type == "QuantizeLinear" and graph.qparams(u)]
            if len(users) < 2 or not quantizers or y in graph.outputs or graph.feeds_layer(y):
                continue
            q = quantizers[0]
            after[q.name] = [helper.make_node("DequantizeLinear", list(q.output) + list(q.input[1:3]),
                                              [f"{y}/int"], name=f"{n.name}/out_dq")]
            for u in users:
                if u is not q:
                    for k, name in enumerate(u.input):
                        if name == y:
                            rewire[(u.name, k)] = f"{y}/int"
            out.residual[scope] = graph.qparams(q)
            out.nodes[(scope, "residual")] = q.name

    nodes: list[onnx.NodeProto] = []
    for n in graph.nodes:
        for k in range(len(n.input)):
            n.input[k] = rewire.get((n.name, k), n.input[k])
        nodes += replace.get(n.name, [n])
        nodes += after.get(n.name, [])
    g.initializer.extend(added)
    nodes = _fold_requant_chains(_Graph(_toposort(nodes, g), inits, graph.outputs),
                                 requant_layer_of, out.requant)
    nodes = _drop_dead(nodes, graph.outputs)
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in nodes for i in n.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return out


def _toposort(nodes: list[onnx.NodeProto], g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """``nodes`` in an order where every input is produced before it is read (stable)."""
    ready = {i.name for i in g.initializer} | {i.name for i in g.input} | {""}
    order: list[onnx.NodeProto] = []
    pending = list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(i in ready for i in n.input):
                order.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise ValueError(f"integer_elementwise: node {rest[0].name!r} reads a tensor that "
                             f"nothing produces")
        pending = rest
    return order


def _fold_requant_chains(graph: _Graph, requant_layer_of: Mapping[str, str],
                         record: dict[str, tuple[float, int]]) -> list[onnx.NodeProto]:
    """``Q(s1) -> DQ(s1) -> Q(s2)`` where the DQ feeds only equal Qs: the first Q takes s2.
    Returns the graph's nodes without the folded ones."""
    nodes = graph.nodes
    drop: set[str] = set()
    rename: dict[str, str] = {}
    for dq in nodes:
        if dq.op_type != "DequantizeLinear" or dq.name in drop:
            continue
        q0 = graph.producer.get(dq.input[0])
        if (q0 is None or q0.op_type != "QuantizeLinear" or q0.name not in requant_layer_of
                or len(graph.consumers.get(q0.output[0], [])) != 1):
            continue
        q1 = graph.common_quantizer(dq.output[0])
        if q1 is None:
            continue
        q0.input[1], q0.input[2] = q1.input[1], q1.input[2]
        record[requant_layer_of[q0.name]] = graph.qparams(q1)
        drop.add(dq.name)
        for u in graph.consumers[dq.output[0]]:
            drop.add(u.name)
            rename[u.output[0]] = q0.output[0]
    kept = [n for n in nodes if n.name not in drop]
    for n in kept:
        for k, name in enumerate(n.input):
            n.input[k] = rename.get(name, name)
    return kept


def _drop_dead(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` without those whose outputs nothing reads (repeatedly)."""
    while True:
        used = {i for n in nodes for i in n.input} | outputs
        kept = [n for n in nodes if any(o in used for o in n.output)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept
