"""Which ONNX node implements which layer of a policy: by its weight initializer's name
(``<layer>.weight``) or, failing that, by the module scope the legacy exporter writes into
node names. Also the layer kinds reports group by."""

from __future__ import annotations

import re
from collections.abc import Iterable

import onnx
from torch import nn

from hwnas.core.errors import UserError

__all__ = ["layer_kinds", "map_layer_nodes", "node_scope", "weight_axis"]

_LAYER_OPS = ("Conv", "Gemm", "MatMul")
_TOKEN = re.compile(r"_token_\d+$")


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


def weight_axis(node: onnx.NodeProto) -> int:
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
