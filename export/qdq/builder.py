"""The QDQ graph builder: Q/DQ nodes, integer weights and int32 biases inserted into one
dequantized float graph from per-layer parameters (:class:`LayerQuant`), with output
requantizations where onnxruntime needs them for integer kernels, and the element-wise rewrite
of :mod:`hwnas.export.integer_ops` on top."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from hwnas.export.integer_ops import ElementwiseRewrite, integer_elementwise
from hwnas.quant.policy import FLOAT_BITS
from onnx import TensorProto, helper, numpy_helper

from hwnas.core.errors import UserError

__all__ = ["LayerQuant", "ProductQuant", "QdqGraphBuilder"]


# -- per-layer quantization parameters -------------------------------------------------------------

@dataclass
class LayerQuant:
    """What the exporter needs of one quantized layer, read from the fake-quant model.

    ``weight_int`` is in the ONNX weight layout (output channels along ``weight_axis``);
    ``requant`` the 8-bit (scale, zero point) of the conv output (or its ReLU) where the graph
    needs one; ``requant_after_relu`` says where it sits."""

    name: str
    kind: str
    w_bits: int
    a_bits: int
    weight_scale: np.ndarray | None = None
    weight_int: np.ndarray | None = None
    weight_axis: int = 0
    act_scale: float | None = None
    act_zero_point: int | None = None
    requant: tuple[float, int] | None = None
    requant_after_relu: bool = False

    @property
    def category(self) -> str:
        """``int`` (runs as an integer kernel), ``float``, or ``sim`` (one side quantized:
        simulated in float)."""
        w_float, a_float = self.w_bits >= FLOAT_BITS, self.a_bits >= FLOAT_BITS
        if w_float and a_float:
            return "float"
        return "sim" if (w_float or a_float) else "int"


@dataclass
class ProductQuant:
    """A quantized product of two activations (attention): the policy layer it ``follows``
    (whose activation bits it takes, and with which it is kept float) and the per-tensor uint8
    (scale, zero point) of each input, read from the fake-quant model."""

    name: str
    follows: str
    bits: int
    inputs: tuple[tuple[float, int], tuple[float, int]]


# -- assembling the QDQ graph ----------------------------------------------------------------------

#: ops onnxruntime's ``QDQPropagationTransformer`` moves a DequantizeLinear forward past (its
#: ``CanNodePropagate``): the data path is their first input, their values those of the input
DQ_PROPAGATES = frozenset({"MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice"})


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def _int4_tensor(name: str, values: np.ndarray) -> onnx.TensorProto:
    """An ONNX INT4 initializer: two values per byte, the first in the low nibble."""
    flat = values.astype(np.int64).reshape(-1)
    if flat.size % 2:
        flat = np.append(flat, 0)
    packed = ((flat[0::2] & 0xF) | ((flat[1::2] & 0xF) << 4)).astype(np.uint8).tobytes()
    return helper.make_tensor(name, TensorProto.INT4, list(values.shape), packed, raw=True)


class _Inits:
    """Initializers added while assembling a graph."""

    def __init__(self) -> None:
        self.items: list[onnx.TensorProto] = []

    def __call__(self, name: str, array: np.ndarray) -> str:
        self.items.append(numpy_helper.from_array(array, name))
        return name

    def tensor(self, tensor: onnx.TensorProto) -> str:
        self.items.append(tensor)
        return tensor.name


class QdqGraphBuilder:
    """Builds QDQ graphs from one dequantized float graph and per-layer parameters.

    Cheap to call repeatedly with different sets of layers kept in float (the per-device
    search times many variants; numerics do not matter for timing, the graph does)."""

    def __init__(self, twin: onnx.ModelProto, node_of: Mapping[str, str],
                 layers: Mapping[str, LayerQuant], modules: Mapping[str, str] | None = None,
                 products: Mapping[str, tuple[str, ProductQuant]] | None = None) -> None:
        self.twin, self.node_of, self.layers = twin, dict(node_of), dict(layers)
        #: product name -> (its MatMul node, its parameters)
        self.products = dict(products or {})
        #: module name -> "hswish" | "hsigmoid" | "" (for :func:`hwnas.export.integer_ops`)
        self.modules = dict(modules or {})
        self.layer_of = {v: k for k, v in self.node_of.items()}
        graph = twin.graph
        self.consumers = _consumers(graph)
        self.nodes = {n.name: n for n in graph.node}
        self.graph_outputs = {o.name for o in graph.output}
        # where each conv's requantization would sit: after its single ReLU consumer, if any
        self.requant_tensor: dict[str, str] = {}
        self.after_relu: dict[str, bool] = {}
        for layer, node_name in self.node_of.items():
            node = self.nodes[node_name]
            if node.op_type != "Conv":
                continue
            out = node.output[0]
            users = self.consumers.get(out, [])
            if len(users) == 1 and users[0].op_type == "Relu" and out not in self.graph_outputs:
                self.requant_tensor[layer], self.after_relu[layer] = users[0].output[0], True
            else:
                self.requant_tensor[layer], self.after_relu[layer] = out, False

    def needs_requant(self, layer: str, integer: set[str]) -> bool:
        """Whether ``layer`` (an integer conv) needs an output Q/DQ to run as an integer kernel
        when the layers in ``integer`` are integer: yes unless its output (after its ReLU) goes
        only into the input of one integer layer."""
        if layer not in self.requant_tensor:
            return False  # Gemm / MatMul: onnxruntime's integer kernels emit float
        tensor = self.requant_tensor[layer]
        if tensor in self.graph_outputs:
            return True
        users = self.consumers.get(tensor, [])
        if len(users) != 1:
            return True
        user_layer = self.layer_of.get(users[0].name)
        return not (user_layer in integer and users[0].input[0] == tensor)

    def integer_layers(self, float_layers: Iterable[str] = ()) -> set[str]:
        """Layers that run as integer kernels when ``float_layers`` are kept in float."""
        skip = set(float_layers)
        return {n for n, lq in self.layers.items() if lq.category == "int" and n not in skip}

    def int32_bias_layers(self, float_layers: Iterable[str] = ()) -> list[str]:
        """Integer layers whose bias the graph stores as int32 on ``input_scale *
        weight_scale`` (a Conv/Gemm bias input). A linear layer on a token sequence exports as
        MatMul + Add: onnxruntime adds that bias in float, after the integer product."""
        integer = self.integer_layers(float_layers)
        return [n for n, node in self.node_of.items() if n in integer
                and len(self.nodes[node].input) > 2 and self.nodes[node].input[2]]

    def integer_products(self, float_layers: Iterable[str] = ()) -> list[str]:
        """Products that run as integer kernels: those whose layer runs as one."""
        integer = self.integer_layers(float_layers)
        return [n for n, (_, pq) in self.products.items() if pq.follows in integer]

    def requant_layers(self, float_layers: Iterable[str] = ()) -> list[str]:
        """Integer convs that get an output requantization, in graph order."""
        integer = self.integer_layers(float_layers)
        return [n for n in self.node_of if n in integer and self.needs_requant(n, integer)]

    def build(self, *, float_layers: Iterable[str] = (), requantize: bool = True,
              int4: bool = False) -> onnx.ModelProto:
        """The QDQ graph with ``float_layers`` left in float (their weights as in the twin);
        with ``requantize``, its element-wise ops in int8 too (:meth:`rewrite`)."""
        if requantize:
            return self.rewrite(float_layers=float_layers, int4=int4).proto
        return self._build(float_layers=float_layers, requantize=False, int4=int4)

    def rewrite(self, *, float_layers: Iterable[str] = (), int4: bool = False
                ) -> ElementwiseRewrite:
        """The requantized QDQ graph with its element-wise ops rewritten to run as integer
        kernels (:func:`hwnas.export.integer_ops.integer_elementwise`), and what that changed."""
        proto = self._build(float_layers=float_layers, requantize=True, int4=int4)
        kinds = self.modules
        return integer_elementwise(
            proto, hswish_modules={m for m, k in kinds.items() if k == "hswish"},
            hsigmoid_modules={m for m, k in kinds.items() if k == "hsigmoid"},
            modules=set(kinds), requant_layer_of={f"/{n}/requant_q": n for n in self.layers})

    def _build(self, *, float_layers: Iterable[str], requantize: bool, int4: bool
               ) -> onnx.ModelProto:
        skip = set(float_layers)
        unknown = skip - set(self.layers)
        if unknown:
            raise UserError(f"cannot keep layer {sorted(unknown)[0]!r} in float: the model has no "
                            f"such quantizable layer")
        integer = self.integer_layers(skip)
        requant = set(self.requant_layers(skip)) if requantize else set()
        model = onnx.ModelProto()
        model.CopyFrom(self.twin)
        use_int4 = int4 and any(self.layers[n].w_bits <= 4 for n in integer)
        if use_int4:
            from onnx import version_converter

            model = version_converter.convert_version(model, 21)
        graph = model.graph
        inits = {i.name: i for i in graph.initializer}
        new_nodes: list[onnx.NodeProto] = []
        added = _Inits()
        after: dict[str, tuple[str, float, int]] = {}  # tensor -> (layer, scale, zp)
        for layer in requant:
            lq = self.layers[layer]
            if lq.requant is None:
                raise UserError(f"layer {layer!r} needs a requantization range that was not "
                                f"calibrated")
            after[self.requant_tensor[layer]] = (layer, *lq.requant)
        guards = self._float_guards(skip, integer, after)
        products = {self.products[n][0]: self.products[n][1]
                    for n in self.integer_products(skip)}
        for node in graph.node:
            if node.name in products:
                self._quantize_product(node, products[node.name], added, new_nodes)
            layer = self.layer_of.get(node.name)
            lq = self.layers.get(layer) if layer is not None else None
            if lq is not None and layer not in skip and lq.category != "float":
                self._quantize_node(node, lq, layer in integer, use_int4, inits, added, new_nodes)
            if layer in guards:
                scale, zp = guards[layer]
                lo = added(f"{layer}.float_guard_min", np.array((0 - zp) * np.float32(scale), np.float32))
                hi = added(f"{layer}.float_guard_max", np.array((255 - zp) * np.float32(scale), np.float32))
                new_nodes.append(helper.make_node("Clip", [node.input[0], lo, hi],
                                                  [f"{layer}.float_guard"], name=f"/{layer}/float_guard"))
                node.input[0] = f"{layer}.float_guard"
            new_nodes.append(node)
            for i, out in enumerate(node.output):
                if out not in after:
                    continue
                rl, scale, zp = after[out]
                pre = f"{out}/prequant"
                node.output[i] = pre
                s = added(f"{rl}.requant_scale", np.array(scale, np.float32))
                z = added(f"{rl}.requant_zero_point", np.array(zp, np.uint8))
                new_nodes.append(helper.make_node("QuantizeLinear", [pre, s, z], [f"{out}/q"],
                                                  name=f"/{rl}/requant_q"))
                new_nodes.append(helper.make_node("DequantizeLinear", [f"{out}/q", s, z], [out],
                                                  name=f"/{rl}/requant_dq"))
        del graph.node[:]
        graph.node.extend(new_nodes)
        graph.initializer.extend(added.items)
        used = {name for n in graph.node for name in n.input} | self.graph_outputs
        keep = [i for i in graph.initializer if i.name in used]
        del graph.initializer[:]
        graph.initializer.extend(keep)
        return model

    def _float_guards(self, skip: set[str], integer: set[str],
                      after: Mapping[str, tuple[str, float, int]]) -> dict[str, tuple[float, int]]:
        """Float conv layers that onnxruntime would quantize on its own, with the range of the
        DequantizeLinear that feeds them.

        onnxruntime's ``WeightBiasQuantization`` pass quantizes the float weights of a conv whose
        input comes from a DequantizeLinear and whose output (after a ReLU) goes into a
        QuantizeLinear, with its own scales - a layer kept float between two integer layers would
        silently run as int8 with other numbers. Its ``QDQPropagationTransformer`` first moves a
        DequantizeLinear forward past shape-only ops (:data:`DQ_PROPAGATES`: a channel shuffle's
        Reshape - Transpose - Reshape), so a requantized output reaches the conv through them too
        (fbnet's ``_g2`` blocks: ``benchmarks/qdq_divergence.md``, session 34). A ``Clip`` to the
        exact range the DequantizeLinear can produce (a no-op on its values) in front of the conv
        keeps it float."""
        quantized_inputs = {n for n, lq in self.layers.items()
                            if n not in skip and lq.category != "float" and lq.a_bits < FLOAT_BITS}
        producer = {out: n for n in self.twin.graph.node for out in n.output}
        guards: dict[str, tuple[float, int]] = {}
        for layer, node_name in self.node_of.items():
            lq = self.layers.get(layer)
            floaty = layer in skip or (lq is not None and lq.category == "float")
            node = self.nodes[node_name]
            if not floaty or node.op_type != "Conv":
                continue
            source = node.input[0]
            while source not in after and source in producer \
                    and producer[source].op_type in DQ_PROPAGATES:
                source = producer[source].input[0]
            if source not in after:
                continue
            out = node.output[0]
            users = self.consumers.get(out, [])
            if len(users) == 1 and users[0].op_type == "Relu":
                users = self.consumers.get(users[0].output[0], [])
            if any(self.layer_of.get(u.name) in quantized_inputs for u in users):
                _, scale, zp = after[source]
                guards[layer] = (scale, zp)
        return guards

    @staticmethod
    def _quantize_product(node: onnx.NodeProto, pq: ProductQuant, added: _Inits,
                          new_nodes: list[onnx.NodeProto]) -> None:
        """Q (uint8) [-> integer Clip to the low-bit grid] -> DQ on both inputs of a product."""
        for i, (scale, zp) in enumerate(pq.inputs):
            _qdq_input(node, i, f"{pq.name}.input{i}", f"/{pq.name}/input{i}", scale, zp,
                       pq.bits, added, new_nodes)

    @staticmethod
    def _quantize_node(node: onnx.NodeProto, lq: LayerQuant, integer: bool, use_int4: bool,
                       inits: dict[str, onnx.TensorProto], added: _Inits,
                       new_nodes: list[onnx.NodeProto]) -> None:
        name = lq.name
        # input activation: Q (uint8) [-> integer Clip to the low-bit grid] -> DQ
        if lq.a_bits < FLOAT_BITS:
            _qdq_input(node, 0, f"{name}.input", f"/{name}/input", lq.act_scale,
                       lq.act_zero_point, lq.a_bits, added, new_nodes)
        if lq.w_bits >= FLOAT_BITS:
            return
        w_scale = lq.weight_scale.astype(np.float32)
        w_int = lq.weight_int
        if not integer:  # simulated: the de-quantized weights, stored as float
            shape = [1] * w_int.ndim
            shape[lq.weight_axis] = -1
            node.input[1] = added(f"{name}.weight_fq",
                                  (w_int.astype(np.float32) * w_scale.reshape(shape)).astype(np.float32))
            return
        if use_int4 and lq.w_bits <= 4:
            w_name = added.tensor(_int4_tensor(f"{name}.weight_quantized", w_int))
            z_name = added.tensor(_int4_tensor(f"{name}.weight_zero_point",
                                               np.zeros(w_scale.size, np.int8)))
        else:
            w_name = added(f"{name}.weight_quantized", w_int.astype(np.int8))
            z_name = added(f"{name}.weight_zero_point", np.zeros(w_scale.size, np.int8))
        s_name = added(f"{name}.weight_scale", w_scale)
        new_nodes.append(helper.make_node("DequantizeLinear", [w_name, s_name, z_name],
                                          [f"{name}.weight_dq"], name=f"/{name}/weight_dq",
                                          axis=lq.weight_axis))
        node.input[1] = f"{name}.weight_dq"
        if len(node.input) > 2 and node.input[2]:
            bias = numpy_helper.to_array(inits[node.input[2]]).astype(np.float64)
            b_scale = (np.float32(lq.act_scale) * w_scale).astype(np.float32)
            b_int = np.clip(np.round(bias / b_scale.astype(np.float64)), -(2 ** 31) + 1, 2 ** 31 - 1)
            bq = added(f"{name}.bias_quantized", b_int.astype(np.int32))
            bs = added(f"{name}.bias_scale", b_scale)
            bz = added(f"{name}.bias_zero_point", np.zeros(b_scale.size, np.int32))
            new_nodes.append(helper.make_node("DequantizeLinear", [bq, bs, bz], [f"{name}.bias_dq"],
                                              name=f"/{name}/bias_dq", axis=0))
            node.input[2] = f"{name}.bias_dq"


def _qdq_input(node: onnx.NodeProto, index: int, tensor: str, node_name: str, scale: Any,
               zero_point: Any, bits: int, added: _Inits, new_nodes: list[onnx.NodeProto]) -> None:
    """Input ``index`` of ``node`` through Q (uint8) [-> integer Clip to the ``bits`` grid] -> DQ;
    initializers and outputs are named ``tensor + "_scale"`` ..., nodes ``node_name + "_q"`` ..."""
    s = added(f"{tensor}_scale", np.array(scale, np.float32))
    z = added(f"{tensor}_zero_point", np.array(zero_point, np.uint8))
    q_out = f"{tensor}_q"
    new_nodes.append(helper.make_node("QuantizeLinear", [node.input[index], s, z], [q_out],
                                      name=f"{node_name}_q"))
    if bits < 8:
        lo = added(f"{tensor}_qmin", np.array(0, np.uint8))
        hi = added(f"{tensor}_qmax", np.array(2 ** bits - 1, np.uint8))
        new_nodes.append(helper.make_node("Clip", [q_out, lo, hi], [f"{tensor}_qclip"],
                                          name=f"{node_name}_clip"))
        q_out = f"{tensor}_qclip"
    new_nodes.append(helper.make_node("DequantizeLinear", [q_out, s, z], [f"{tensor}_dq"],
                                      name=f"{node_name}_dq"))
    node.input[index] = f"{tensor}_dq"
