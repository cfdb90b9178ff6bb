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
  size; onnxruntime's CPU provider runs those layers in float (reported as float islands).
  By default (``portable``) the weights of W8A8 layers sit on a 7-bit grid ([-63, 63]): x86
  CPUs without VNNI (AVX2, AVX-512 without VNNI) run uint8 x int8 layers with ``vpmaddubsw``,
  which adds product pairs into a saturating int16, and full-range weights overflow it there;
  the bound is read back from the file (:mod:`.int16`) into the metadata;
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
* **attention products** (``QuantMatMul``: Q·Kᵀ and attention × V, two activations): a
  uint8 Q/DQ on each input with the fake-quant model's per-tensor parameters (the bits of the
  layer the product follows, an integer ``Clip`` below 8 bits), inserted right at the MatMul
  (after K's transpose: per-tensor quantization commutes with it), so onnxruntime runs the
  product as an integer kernel (QLinearMatMul, or MatMulIntegerToFloat where the output stays
  float for the scale and the softmax). LayerNorm, Softmax and GELU stay float: onnxruntime's
  CPU provider has no integer LayerNorm or GELU, and its QLinearSoftmax needs a quantized
  input the score scaling does not give;
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

The parts: :mod:`.names` (ONNX nodes to policy layers), :mod:`.builder` (the QDQ graph from a
dequantized float graph and per-layer parameters), :mod:`.requant` (the requantization points:
their calibration and the PyTorch model that computes what the rewritten graph computes) and
:mod:`.build` (:func:`build_qdq`, the model-level entry point). This package re-exports their
public names.
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
