"""FP32 and QDQ (QuantizeLinear/DequantizeLinear) ONNX graphs of a float model and its policy.

Why not let torch lower the fake-quant ops: it lowers ``fake_quantize_*`` to Q/DQ only for 8
bits and names nothing after the policy's layers. Here the *float* graph is exported (BatchNorm
folded, opset 17, dynamic batch) and the Q/DQ nodes are inserted from the policy and the
calibrated fake-quant model of :func:`hwnas.quant.ptq.ptq`: uint8 affine activations, int8
per-channel weights (bit-exact; W8A8 on a 7-bit grid by default, safe on x86 without VNNI),
int32 biases, 8-bit requantization where onnxruntime needs it for an integer kernel, integer
attention products and element-wise ops; :class:`DeployedReference` computes the same in
PyTorch. Each choice and its reason: ``benchmarks/export_ort_ops.md`` ("The QDQ graph").

The parts: :mod:`.names` (ONNX nodes to policy layers), :mod:`.builder` (the QDQ graph from a
dequantized float graph and per-layer parameters), :mod:`.requant` (the requantization points
and :class:`DeployedReference`) and :mod:`.build` (:func:`build_qdq`, the model-level entry
point). This package re-exports their public names.
"""

from hwnas.export.onnx_export import read_metadata, set_metadata
from hwnas.export.qdq.build import EXPORT_FORMAT, QdqBuild, build_qdq, dequantized_twin, float_proto
from hwnas.export.qdq.builder import LayerQuant, ProductQuant, QdqGraphBuilder
from hwnas.export.qdq.names import layer_kinds, map_layer_nodes, node_scope
from hwnas.export.qdq.requant import DeployedReference

__all__ = [
    "EXPORT_FORMAT",
    "LayerQuant",
    "ProductQuant",
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
