"""FP32 and QDQ (QuantizeLinear/DequantizeLinear) ONNX graphs of a float model and its policy.

Why not let torch lower the fake-quant ops: torch's exporter lowers ``fake_quantize_*`` to
Q/DQ only for 8 bits (it refuses or silently widens lower widths) and names nothing after the
policy's layers. Here the *float* graph is exported (BatchNorm folded, the legacy exporter,
``dynamo=False``, opset 17, dynamic batch) and the Q/DQ nodes are inserted from the policy and
from the calibrated fake-quant model of :func:`hwnas.quant.ptq.ptq`:

* **activations** (the input of each quantized layer): uint8, affine per tensor, with the scale
  and zero point the fake-quant model calibrated. Below 8 bits the uint8 tensor passes an
  integer ``Clip`` to ``[0, 2^b - 1]`` between Q and DQ, so the values are exactly the low-bit
  grid (onnxruntime still fuses the layer into an integer kernel);
* **weights**: int8, symmetric per output channel (zero point 0), the integers of the
  fake-quant model (``round(fake_quant(w) / scale)``, bit-exact); weights below 8 bits stay in
  int8 containers restricted to ``[-(2^(b-1)-1), 2^(b-1)-1]``, their true width recorded in the
  metadata. ``int4=True`` stores weights of 4 bits or fewer as real ONNX INT4 (opset 21) for
  size; onnxruntime's CPU provider runs those layers in float (reported as float islands);
* **biases** of integer layers: int32 on the scale ``input_scale * weight_scale``, what the
  integer kernels add (onnxruntime rounds even a float bias so when it fuses a layer); the one
  difference from a fake-quant model that keeps float biases, which
  :class:`DeployedReference` reproduces;
* **requantization** (``proto(requantize=True)``): onnxruntime runs a conv as an integer
  kernel (QLinearConv) only when its output goes straight into a QuantizeLinear (a ReLU in
  between is folded away). Where the fake-quant model feeds a quantized conv's output into
  float ops (h-swish, a residual add, squeeze-excitation, a second consumer), an 8-bit Q/DQ is
  added on that output, calibrated on the fake-quant model (MSE observer by default; after the
  ReLU when one follows). That deviates from the fake-quant model on
  purpose - without it those convs stay float with weights de-quantized at run time, several
  times slower than FP32 - and :class:`DeployedReference` gives the PyTorch model that includes
  it. ``requantize=False`` is the exact form (Q/DQ only where the fake-quant model has them).
  Gemm/MatMul layers need none (onnxruntime's QGemm / MatMulIntegerToFloat emit float);
* **integer element-wise ops** (with ``requantize``): h-swish, squeeze-excitation and residual
  adds between integer layers are rewritten into patterns onnxruntime runs as QLinearAdd /
  QLinearMul / QLinearGlobalAveragePool (:mod:`hwnas.export.integer_ops`: on a VNNI/AMX Xeon the
  float islands cost more than the integer convs gained); :class:`DeployedReference` mirrors
  each extra rounding.

A layer at 32 bits stays float. A layer with only one side quantized (weights or activation at
32 bits) cannot run as an integer kernel anywhere; it is exported as simulated quantization
(input Q/DQ, de-quantized weights stored as float) so the numbers stay those of the fake-quant
model. Residual adds must be float (``PTQConfig.residual="float"``, the default).

ONNX nodes are mapped to policy layer names through their weight initializer
(``<layer>.weight``) or, failing that, their node-name scope (``/blocks/blocks.0/expand_conv/Conv``);
a layer that cannot be mapped raises :class:`UserError`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch
from hwnas.export.integer_ops import (
    HSIG_Q_SCALE,
    UNIT_SCALE,
    ElementwiseRewrite,
    integer_elementwise,
)
from hwnas.export.onnx_export import _metadata_value, onnx_bytes
from hwnas.quant.fake_quant import QUANT_LAYER_TYPES, SharedAddQuant, quant_layers
from hwnas.quant.fold import fold_bn
from hwnas.quant.policy import FLOAT_BITS, QuantPolicy
from hwnas.quant.ptq import PTQConfig, calibration_batches, policy_of, ptq
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from hwnas.core.errors import UserError

__all__ = [
    "EXPORT_FORMAT",
    "LayerQuant",
    "QdqBuild",
    "QdqGraphBuilder",
    "DeployedReference",
    "build_qdq",
    "dequantized_twin",
    "float_proto",
    "layer_kinds",
    "map_layer_nodes",
    "node_scope",
    "read_metadata",
    "set_metadata",
]

EXPORT_FORMAT = "hwnas-export-1"
_LAYER_OPS = ("Conv", "Gemm", "MatMul")
_TOKEN = re.compile(r"_token_\d+$")


# -- names -----------------------------------------------------------------------------------------

def node_scope(node_name: str) -> str:
    """The qualified module name encoded in a legacy-exporter node name:
    ``/blocks/blocks.0/expand_conv/Conv`` -> ``blocks.0.expand_conv`` (the last segment is the
    op; onnxruntime's ``_token_N`` suffixes are ignored)."""
    segments = [s for s in _TOKEN.sub("", node_name).strip("/").split("/") if s][:-1]
    scope = ""
    for seg in segments:
        if scope and seg.startswith(scope + "."):
            scope = seg
        elif scope:
            scope = f"{scope}.{seg}"
        else:
            scope = seg
    return scope


def _weight_axis(node: onnx.NodeProto) -> int:
    """Axis of the output channels in the weight initializer of a Conv/Gemm/MatMul node."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return 1  # MatMul: (K, N)


def map_layer_nodes(proto: onnx.ModelProto, layer_names: Iterable[str], *,
                    allow_missing: bool = False) -> dict[str, str]:
    """``{layer name: ONNX node name}`` for every layer of ``layer_names``.

    A Conv/Gemm/MatMul node whose weight is an initializer is matched by the initializer name
    (``<layer>.weight``) or, failing that, by its node-name scope. UserError when such a node
    matches no layer, or a layer matches no node (or several). ``allow_missing``: layers
    without a node are left out instead (dead code the ONNX exporter removed, e.g. a
    NAS-Bench-201 edge into a node that reaches no output)."""
    names = list(layer_names)
    known = set(names)
    inits = {i.name for i in proto.graph.initializer}
    out: dict[str, str] = {}
    for node in proto.graph.node:
        if node.op_type not in _LAYER_OPS or len(node.input) < 2 or node.input[1] not in inits:
            continue
        weight = node.input[1]
        layer = weight[: -len(".weight")] if weight.endswith(".weight") else ""
        if layer not in known:
            layer = node_scope(node.name)
        if layer not in known:
            raise UserError(f"cannot map ONNX node {node.name!r} ({node.op_type}, weight "
                            f"{weight!r}) to a layer of the policy; expected a weight named "
                            f"'<layer>.weight' or a node scope naming one of its "
                            f"{len(names)} layers")
        if layer in out:
            raise UserError(f"layer {layer!r} maps to two ONNX nodes ({out[layer]!r} and "
                            f"{node.name!r}); shared layers cannot be quantized per node")
        out[layer] = node.name
    missing = [n for n in names if n not in out]
    if missing and not allow_missing:
        raise UserError(f"layer {missing[0]!r} of the policy has no Conv/Gemm/MatMul node in "
                        f"the ONNX graph ({len(missing)} unmapped); the policy does not match "
                        f"this model")
    return out


def layer_kinds(model: nn.Module) -> dict[str, str]:
    """``{layer: kind}`` with kind depthwise | pointwise | conv | linear (for reports)."""
    kinds = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            if m.groups > 1 and m.groups == m.in_channels:
                kinds[name] = "depthwise"
            elif tuple(m.kernel_size) == (1, 1):
                kinds[name] = "pointwise"
            else:
                kinds[name] = "conv"
        elif isinstance(m, nn.Linear):
            kinds[name] = "linear"
    return kinds


# -- float graphs ----------------------------------------------------------------------------------

def float_proto(model: nn.Module, example: torch.Tensor, *, opset: int = 17,
                fold: bool = True) -> onnx.ModelProto:
    """The float ONNX graph of ``model`` (BatchNorm folded first when ``fold``, so weight
    initializers keep their module names): input ``input``, output ``logits``, dynamic batch."""
    if fold:
        model = fold_bn(model, example)
    return onnx.load_from_string(onnx_bytes(model, example, opset=opset))


def dequantized_twin(qmodel: nn.Module) -> nn.Module:
    """A plain float copy of a fake-quant model: each QuantConv2d/QuantLinear becomes an
    ``nn.Conv2d``/``nn.Linear`` with the same (folded, bias-corrected) float weights and bias."""
    twin = copy.deepcopy(qmodel).cpu().float().eval()
    for name, m in list(twin.named_modules()):
        if isinstance(m, SharedAddQuant):
            raise UserError("the QDQ exporter needs float residual adds "
                            "(PTQConfig.residual='float'); got a model with shared-scale adds")
        if not isinstance(m, QUANT_LAYER_TYPES):
            continue
        if isinstance(m, nn.Conv2d):
            plain: nn.Module = nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride,
                                         m.padding, m.dilation, m.groups, True, m.padding_mode)
        else:
            plain = nn.Linear(m.in_features, m.out_features, True)
        with torch.no_grad():
            plain.weight.copy_(m.weight)
            plain.bias.copy_(m.bias)
        parent_name, _, child = name.rpartition(".")
        parent = twin.get_submodule(parent_name) if parent_name else twin
        setattr(parent, child, plain.eval())
    return twin


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


def _fq_weight_ints(w: np.ndarray, scale: np.ndarray, axis: int, qmin: int, qmax: int) -> np.ndarray:
    """The integers of torch's per-channel fake quantization of ``w`` (bit-exact with the
    fake-quant model: the same kernel computes them)."""
    wt = torch.from_numpy(np.array(w, dtype=np.float32, copy=True))
    st = torch.from_numpy(scale.astype(np.float32))
    fq = torch.fake_quantize_per_channel_affine(wt, st, torch.zeros_like(st, dtype=torch.int32),
                                                axis, qmin, qmax)
    shape = [1] * wt.dim()
    shape[axis] = -1
    return torch.round(fq / st.view(shape)).clamp(qmin, qmax).to(torch.int8).numpy()


class DeployedReference:
    """Context manager that makes a fake-quant model compute what the QDQ graph computes: the
    biases of integer layers rounded to int32 on ``input_scale * weight_scale`` (as integer
    kernels add them) and the exporter's requantization points (forward hooks). The model is
    restored on exit. Used to show that an export is exact up to float rounding, beside its
    agreement with the plain fake-quant model. ``rewrite``: the integer element-wise ops of the
    graph (:mod:`hwnas.export.integer_ops`), mirrored by hooks on their modules."""

    def __init__(self, qmodel: nn.Module, layers: Mapping[str, LayerQuant],
                 integer: Iterable[str], requant: Iterable[str],
                 rewrite: ElementwiseRewrite | None = None) -> None:
        self.qmodel, self.layers = qmodel, layers
        self.integer, self.requant = set(integer), set(requant)
        self.rewrite = rewrite
        self.handles: list[Any] = []
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> nn.Module:
        modules = dict(self.qmodel.named_modules())
        for name in self.integer:
            lq, module = self.layers[name], modules[name]
            if module.bias is None:
                continue
            b_scale = torch.from_numpy((np.float32(lq.act_scale) * lq.weight_scale)
                                       .astype(np.float32)).to(module.bias.device)
            self.saved.append((module.bias, module.bias.detach().clone()))
            with torch.no_grad():
                module.bias.copy_((torch.round(module.bias.double() / b_scale.double())
                                   * b_scale.double()).to(module.bias.dtype))
        rw = self.rewrite or ElementwiseRewrite(onnx.ModelProto())
        for name in self.requant:
            lq = self.layers[name]
            scale, zp = rw.requant.get(name, lq.requant)

            def hook(_m, _inp, out, scale=scale, zp=zp, relu=lq.requant_after_relu):
                x = torch.relu(out) if relu else out
                return _fq8(x, scale, zp)
            self.handles.append(modules[name].register_forward_hook(hook))
        for name, qparams in rw.hswish.items():
            def hswish(_m, inp, out, qparams=qparams):
                x = inp[0].float()
                hsig = _fq8(x + 3.0, float(HSIG_Q_SCALE), 0) / 6.0  # relu6(x + 3) / 6, 1/255 grid
                y = x * hsig
                return (y if qparams is None else _fq8(y, *qparams)).to(out.dtype)
            self.handles.append(modules[name].register_forward_hook(hswish))
        for name in rw.gates:
            self.handles.append(modules[name].register_forward_hook(
                lambda _m, _inp, out: _fq8(out, float(UNIT_SCALE), 0)))
        for name, (scale, zp) in rw.residual.items():
            self.handles.append(modules[name].register_forward_hook(
                lambda _m, _inp, out, scale=scale, zp=zp: _fq8(out, scale, zp)))
        return self.qmodel

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        with torch.no_grad():
            for param, value in self.saved:
                param.copy_(value)
        self.saved.clear()


def _fq8(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """``x`` on the uint8 grid of (scale, zero point), as Q then DQ compute it."""
    return torch.fake_quantize_per_tensor_affine(x.float(), float(scale), int(zero_point), 0,
                                                 255).to(x.dtype)


# -- assembling the QDQ graph ----------------------------------------------------------------------

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
                 layers: Mapping[str, LayerQuant], modules: Mapping[str, str] | None = None
                 ) -> None:
        self.twin, self.node_of, self.layers = twin, dict(node_of), dict(layers)
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
        for node in graph.node:
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
        silently run as int8 with other numbers. A ``Clip`` to the exact range the
        DequantizeLinear can produce (a no-op on its values) in front of the conv keeps it
        float."""
        quantized_inputs = {n for n, lq in self.layers.items()
                            if n not in skip and lq.category != "float" and lq.a_bits < FLOAT_BITS}
        guards: dict[str, tuple[float, int]] = {}
        for layer, node_name in self.node_of.items():
            lq = self.layers.get(layer)
            floaty = layer in skip or (lq is not None and lq.category == "float")
            node = self.nodes[node_name]
            if not floaty or node.op_type != "Conv" or node.input[0] not in after:
                continue
            out = node.output[0]
            users = self.consumers.get(out, [])
            if len(users) == 1 and users[0].op_type == "Relu":
                users = self.consumers.get(users[0].output[0], [])
            if any(self.layer_of.get(u.name) in quantized_inputs for u in users):
                _, scale, zp = after[node.input[0]]
                guards[layer] = (scale, zp)
        return guards

    @staticmethod
    def _quantize_node(node: onnx.NodeProto, lq: LayerQuant, integer: bool, use_int4: bool,
                       inits: dict[str, onnx.TensorProto], added: _Inits,
                       new_nodes: list[onnx.NodeProto]) -> None:
        name = lq.name
        # input activation: Q (uint8) [-> integer Clip to the low-bit grid] -> DQ
        if lq.a_bits < FLOAT_BITS:
            s = added(f"{name}.input_scale", np.array(lq.act_scale, np.float32))
            z = added(f"{name}.input_zero_point", np.array(lq.act_zero_point, np.uint8))
            q_out = f"{name}.input_q"
            new_nodes.append(helper.make_node("QuantizeLinear", [node.input[0], s, z], [q_out],
                                              name=f"/{name}/input_q"))
            if lq.a_bits < 8:
                lo = added(f"{name}.input_qmin", np.array(0, np.uint8))
                hi = added(f"{name}.input_qmax", np.array(2 ** lq.a_bits - 1, np.uint8))
                new_nodes.append(helper.make_node("Clip", [q_out, lo, hi], [f"{name}.input_qclip"],
                                                  name=f"/{name}/input_clip"))
                q_out = f"{name}.input_qclip"
            new_nodes.append(helper.make_node("DequantizeLinear", [q_out, s, z],
                                              [f"{name}.input_dq"], name=f"/{name}/input_dq"))
            node.input[0] = f"{name}.input_dq"
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


# -- the model-level entry point -------------------------------------------------------------------

@dataclass
class QdqBuild:
    """A float model quantized by :func:`hwnas.quant.ptq.ptq` under a policy, ready to be written as
    QDQ ONNX (:meth:`proto`) and checked against its fake-quant model (``qmodel``).

    ``policy`` is the effective policy (the layers of ``float_layers`` at 32 bits);
    ``searched_policy`` the one asked for."""

    qmodel: nn.Module
    policy: QuantPolicy
    searched_policy: QuantPolicy
    builder: QdqGraphBuilder
    layers: dict[str, LayerQuant]
    float_layers: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    #: policy layers the ONNX graph does not contain (dead code: they never affect the output)
    dead_layers: list[str] = field(default_factory=list)

    def proto(self, *, requantize: bool = True, int4: bool = False,
              extra_float: Iterable[str] = ()) -> onnx.ModelProto:
        """The QDQ graph, its quantization facts in ``metadata_props`` (:meth:`metadata`).
        ``extra_float``: more layers kept float, for timing variants only (the weights of those
        layers are still the PTQ model's)."""
        rewrite = None
        if requantize:  # built once: the graph and what its rewrite changed (for the metadata)
            rewrite = self.builder.rewrite(float_layers=set(extra_float), int4=int4)
            proto = rewrite.proto
        else:
            proto = self.builder.build(float_layers=set(extra_float), requantize=False, int4=int4)
        if not extra_float:
            meta = self.metadata(requantized=requantize, rewrite=rewrite)
            if int4 and any(self.layers[n].w_bits <= 4 for n in self.integer_layers()):
                meta["weight_storage"] = ("ONNX INT4 (opset 21) for weights of <= 4 bits, int8 "
                                          "containers for the others")
            set_metadata(proto, meta)
        return proto

    def integer_layers(self, extra_float: Iterable[str] = ()) -> list[str]:
        chosen = self.builder.integer_layers(extra_float)
        return [n for n in self.builder.node_of if n in chosen]

    def requant_layers(self, *, requantize: bool = True) -> list[str]:
        return self.builder.requant_layers() if requantize else []

    def reference(self, *, requantize: bool = True) -> DeployedReference:
        """Context manager: the fake-quant model as the QDQ graph computes it (int32 biases,
        and the requantization points when ``requantize``)."""
        return DeployedReference(self.qmodel, self.layers, self.builder.integer_layers(),
                                 self.builder.requant_layers() if requantize else (),
                                 self.builder.rewrite() if requantize else None)

    def metadata(self, *, requantized: bool = True,
                 rewrite: ElementwiseRewrite | None = None) -> dict[str, Any]:
        """Quantization facts for ``metadata_props``: effective and searched policy, true weight
        widths, the layers kept float for speed and the requantized ones, and how many
        element-wise ops run as integer kernels (from ``rewrite``, the graph's
        :meth:`QdqGraphBuilder.rewrite`; built here when not given)."""
        if requantized and rewrite is None:
            rewrite = self.builder.rewrite()
        return {
            "policy": self.policy.to_dict(),
            "searched_policy": self.searched_policy.to_dict(),
            "weight_bits": {n: lq.w_bits for n, lq in self.layers.items()},
            "activation_bits": {n: lq.a_bits for n, lq in self.layers.items()},
            "float_for_speed": list(self.float_layers),
            "dead_layers": list(self.dead_layers),
            "requantized_layers": self.builder.requant_layers() if requantized else [],
            "integer_elementwise": ({"hswish": len(rewrite.hswish), "se_gates": len(rewrite.gates),
                                     "residual_adds": len(rewrite.residual)}
                                    if requantized else {}),
            "bias": "int32 on input_scale * weight_scale for integer layers",
            "weight_storage": "int8 containers (values on each layer's w_bits grid)",
        }


def _on_cpu(model: nn.Module) -> nn.Module:
    for p in model.parameters():
        if p.device.type != "cpu":
            return copy.deepcopy(model).cpu()
        break
    return model


@torch.no_grad()
def _calibrate_requant(build_layers: dict[str, LayerQuant], builder: QdqGraphBuilder,
                       qmodel: nn.Module, xs: list[torch.Tensor], config: PTQConfig,
                       observer: str | None = None) -> None:
    """8-bit (scale, zero point) of every integer conv's output (after its ReLU where one
    follows), observed on the fake-quant model with ``observer`` (default: the PTQ config's
    activation observer)."""
    from hwnas.quant.observers import ActivationObserver

    todo = [n for n in builder.requant_tensor if build_layers[n].category == "int"]
    if not todo:
        return
    modules = dict(qmodel.named_modules())
    per_update = max(1, config.max_samples // max(1, len(xs)))
    observers = {n: ActivationObserver(per_update, seed=config.seed + 7919 + i)
                 for i, n in enumerate(todo)}
    handles = []
    for name in todo:
        def hook(_m, _inp, out, name=name):
            observers[name].update(torch.relu(out) if builder.after_relu[name] else out)
        handles.append(modules[name].register_forward_hook(hook))
    try:
        qmodel.eval()
        for x in xs:
            qmodel(x)
    finally:
        for h in handles:
            h.remove()
    for name in todo:
        scale, zp = observers[name].qparams(8, observer or config.act_observer,
                                            percentile=config.percentile, grid=config.mse_grid)
        build_layers[name].requant = (max(float(scale.reshape(-1)[0]), 1e-8),
                                      int(round(float(zp.reshape(-1)[0]))))
        build_layers[name].requant_after_relu = builder.after_relu[name]


def _given_quantized(quantized: nn.Module, policy: QuantPolicy,
                     float_layers: Iterable[str]) -> nn.Module:
    """A CPU copy of an already quantized model, checked to be quantized under ``policy``,
    with the quantizers of ``float_layers`` made the identity."""
    if not quant_layers(quantized):
        raise UserError("the quantized model given to the QDQ exporter has no quantized layer")
    if policy_of(quantized).bits != policy.bits:
        raise UserError("the quantized model given to the QDQ exporter was quantized under "
                        "another policy than the one given")
    qmodel = copy.deepcopy(quantized).cpu().float().eval()
    for name in float_layers:
        layer = qmodel.get_submodule(name)
        layer.weight_quant.bits = layer.input_quant.bits = FLOAT_BITS
    return qmodel


def build_qdq(model: nn.Module, policy: QuantPolicy, calibration: Iterable, *,
              config: PTQConfig | None = None, example: torch.Tensor | None = None,
              float_layers: Iterable[str] = (), opset: int = 17,
              requant_observer: str = "mse", quantized: nn.Module | None = None) -> QdqBuild:
    """Quantize ``model`` (float, BatchNorm not yet folded) under ``policy`` with PTQ on
    ``calibration`` (``(x, y)`` batches or tensors) and prepare its QDQ graph.

    ``quantized``: a fake-quant model already quantized under ``policy`` (e.g. by QAT), taken
    as it is instead of running PTQ: its learned (LSQ) weight and activation scales go into the
    graph unchanged, and ``calibration`` only places the requantization points. ``model`` is
    then its float equivalent (:func:`dequantized_twin`); ``float_layers`` are made float in a
    copy of it (their quantizers become the identity; no bias correction re-runs).

    ``float_layers``: layers to keep in float although the policy quantizes them (the per-device
    choice); PTQ runs with them at 32 bits, so bias correction sees the model as exported.
    ``requant_observer``: how the requantization points' ranges are chosen (minmax | percentile
    | mse; MSE keeps the ONNX model's CIFAR-10 accuracy within ~0.5 points of the fake-quant
    model's where min-max loses 1.5). Raises UserError for a policy that does not match the
    model, a layer that cannot be mapped to an ONNX node, or unusable calibration data."""
    if not isinstance(policy, QuantPolicy):
        raise UserError(f"expected a QuantPolicy, got {type(policy).__name__}")
    config = config or PTQConfig()
    config.validate()
    model = _on_cpu(model).eval()
    policy.validate(model)
    float_layers = list(dict.fromkeys(float_layers))
    unknown = [n for n in float_layers if n not in policy]
    if unknown:
        raise UserError(f"cannot keep layer {unknown[0]!r} in float: the policy has no such layer")
    effective = policy.with_bits({n: (FLOAT_BITS, FLOAT_BITS) for n in float_layers})
    xs = calibration_batches(calibration, config.max_images, "cpu", config.batch_size)
    if example is None:
        example = xs[0][:1]
    if quantized is None:
        qmodel = ptq(model, effective, xs, config, example_input=example)
    else:
        qmodel = _given_quantized(quantized, policy, float_layers)
    twin = dequantized_twin(qmodel)
    proto = onnx.load_from_string(onnx_bytes(twin, example[:1], opset=opset))
    # the policy matches the model (validated above), so a layer without a node is dead code
    # the exporter removed - unless its weights are in the graph after all
    node_of = map_layer_nodes(proto, effective.layer_names, allow_missing=True)
    nodes = {n.name: n for n in proto.graph.node}
    inits = {i.name: i for i in proto.graph.initializer}
    dead = [n for n in effective.layer_names if n not in node_of]
    unmapped = [n for n in dead if f"{n}.weight" in inits]
    if unmapped:
        raise UserError(f"layer {unmapped[0]!r} has weights in the ONNX graph but no "
                        f"Conv/Gemm/MatMul node that maps to it; cannot quantize it")
    kinds = layer_kinds(model)
    layers: dict[str, LayerQuant] = {}
    for name, module in quant_layers(qmodel):
        if name not in node_of:
            continue  # dead: it does not run in the exported graph
        node = nodes[node_of[name]]
        lq = LayerQuant(name, kinds.get(name, "conv"), module.w_bits, module.a_bits)
        if lq.w_bits < FLOAT_BITS:
            axis = _weight_axis(node)
            w = numpy_helper.to_array(inits[node.input[1]])
            torch_w = module.weight.detach().cpu().float().numpy()
            as_torch = w.T if axis == 1 and w.ndim == 2 else w
            if as_torch.shape != torch_w.shape or not np.array_equal(as_torch, torch_w):
                raise UserError(f"ONNX node {node.name!r} does not hold the weights of layer "
                                f"{name!r}; cannot quantize it")
            scale, _, qmin, qmax = module.weight_quant.qparams()
            lq.weight_scale = scale.detach().cpu().float().numpy().reshape(-1)
            lq.weight_axis = axis
            lq.weight_int = _fq_weight_ints(w, lq.weight_scale, axis, qmin, qmax)
        if lq.a_bits < FLOAT_BITS:
            scale, zp, _, _ = module.input_quant.qparams()
            lq.act_scale = float(scale.reshape(-1)[0])
            lq.act_zero_point = int(zp.reshape(-1)[0])
        layers[name] = lq
    modules = {name: ("hswish" if isinstance(m, nn.Hardswish) else
                      "hsigmoid" if isinstance(m, nn.Hardsigmoid) else "")
               for name, m in qmodel.named_modules() if name}
    builder = QdqGraphBuilder(proto, node_of, layers, modules)
    from hwnas.quant.observers import ACT_OBSERVERS

    if requant_observer not in ACT_OBSERVERS:
        raise UserError(f"unknown requantization observer {requant_observer!r}; expected one of "
                        f"{', '.join(ACT_OBSERVERS)}")
    _calibrate_requant(layers, builder, qmodel, xs, config, requant_observer)
    return QdqBuild(qmodel, effective, policy, builder, layers, float_layers, kinds, dead)


def set_metadata(proto: onnx.ModelProto, metadata: Mapping[str, Any]) -> onnx.ModelProto:
    """Merge ``metadata`` into ``proto.metadata_props`` (values stringified, dicts/lists as
    JSON); returns ``proto``."""
    props = {p.key: p.value for p in proto.metadata_props}
    props.update({str(k): _metadata_value(v) for k, v in metadata.items() if v is not None})
    del proto.metadata_props[:]
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    return proto


def read_metadata(model: onnx.ModelProto) -> dict[str, Any]:
    """``metadata_props`` of a model, JSON values decoded."""
    out: dict[str, Any] = {}
    for p in model.metadata_props:
        try:
            out[p.key] = json.loads(p.value)
        except (json.JSONDecodeError, ValueError):
            out[p.key] = p.value
    return out
