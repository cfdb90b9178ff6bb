"""Latency of the Google Coral Edge TPU: an int8 systolic array with an on-chip parameter cache.

The model (:class:`EdgeTPUEstimator`): a ``rows × cols`` weight-stationary int8 MAC array
(:class:`EdgeTPUParams`, from the Coral documentation and Yazdanbakhsh et al., 2021) with about
8 MB of on-chip SRAM for parameters; parameters that do not fit stream over the host link on
every inference. Layers are cut into array tiles (:meth:`EdgeTPUEstimator.tpu_cycles`), so
narrow and depthwise layers leave most of the array idle, as on the real device.

The compiler partitions the graph only once: from the first operation the Edge TPU does not
support (:func:`tpu_supported`: the Coral op table, including its limits on transformer ops),
everything runs on the host CPU, a roofline device (:mod:`hwnas.latency.estimators.roofline`).
So a vision transformer leaves the TPU at its first attention product unless
``batch_matmul_on_tpu`` is set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hwnas.latency.estimators.base import (
    Breakdown,
    Estimator,
    LayerCost,
    check_positive,
    in_elems,
    layer_kind,
    out_elems,
    vector_ops,
)
from hwnas.latency.estimators.roofline import RASPI4, RooflineEstimator, RooflineParams
from hwnas.supernet.layers import Layer

from hwnas.core.errors import UserError

__all__ = ["EdgeTPUParams", "EdgeTPUEstimator", "PRESETS", "TPU_ACTIVATIONS", "tpu_supported"]

#: Activations the Edge TPU runs fused with (or right after) a supported layer.
TPU_ACTIVATIONS = frozenset({None, "relu", "relu6", "sigmoid", "logistic", "tanh", "hswish",
                             "hardswish", "hsigmoid", "hardsigmoid", "swish", "silu", "identity"})

_TPU_OPS = frozenset({"conv", "linear", "add", "pool", "avgpool", "layernorm", "matmul",
                      "softmax"})
#: Most elements of a Softmax input the Edge TPU maps (Coral op table: 1-D input, <= 16,000).
SOFTMAX_MAX_ELEMENTS = 16_000

MIB = 1024 * 1024


@dataclass(frozen=True)
class EdgeTPUParams:
    """An Edge TPU and its host.

    The device (Coral documentation, coral.ai/docs/edgetpu: "TensorFlow models on the Edge TPU",
    "Edge TPU Compiler"; and Yazdanbakhsh et al., "An Evaluation of Edge TPU Accelerators for
    Convolutional Neural Networks", 2021):

    * 4 TOPS int8 peak: modelled as a ``rows × cols`` = 64 × 64 weight-stationary MAC array at 480
      MHz (2 × 4096 × 480e6 ≈ 3.9 TOPS). Models must be fully int8-quantized; layers are taken at 8
      bits whatever their ``w_bits``/``a_bits`` (narrower weights are stored as int8 too).
    * About 8 MB of on-chip SRAM caches the parameters; a small part is reserved for the compiled
      executable. Parameters that do not fit are fetched from host memory on every inference, over
      the host link (USB 3 for the USB Accelerator, PCIe Gen2 ×1 for the M.2/mini-PCIe cards).
    * Operations the Edge TPU does not support run on the host CPU, and the compiler partitions the
      graph only once: from the first unsupported operation on, everything runs on the CPU.

    Attributes:
        name: product name.
        rows / cols: MAC array size.
        clock_mhz: array clock.
        param_cache_mib: on-chip SRAM for parameters, MiB.
        reserved_mib: part of it taken by the compiled executable (our assumption).
        link_gbs: host link bandwidth for streamed parameters and tensors, GB/s.
        invoke_overhead_ms: fixed cost of one inference call (driver, link round trip).
        layer_overhead_us: fixed cost per layer on the TPU.
        channel_shuffle_on_tpu: whether a channel shuffle (Transpose) maps to the TPU.
        batch_matmul_on_tpu: whether a product of two activations (attention's BatchMatMul)
            maps to the TPU (not in the Coral op table: False).
        host: the host CPU, for layers that fall back to it.
        sources: where the numbers come from.
    """

    name: str
    rows: int = 64
    cols: int = 64
    clock_mhz: float = 480.0
    param_cache_mib: float = 8.0
    reserved_mib: float = 0.5
    link_gbs: float = 0.32
    invoke_overhead_ms: float = 0.3
    layer_overhead_us: float = 2.0
    channel_shuffle_on_tpu: bool = True
    batch_matmul_on_tpu: bool = False
    host: RooflineParams = field(default=RASPI4)
    sources: str = ""

    def __post_init__(self) -> None:
        owner = f"Edge TPU {self.name!r}"
        check_positive(owner, rows=self.rows, cols=self.cols, clock_mhz=self.clock_mhz,
                       param_cache_mib=self.param_cache_mib, link_gbs=self.link_gbs)
        if not 0 <= self.reserved_mib < self.param_cache_mib:
            raise UserError(f"{owner}: reserved_mib must be in [0, param_cache_mib)")
        if self.invoke_overhead_ms < 0 or self.layer_overhead_us < 0:
            raise UserError(f"{owner}: overheads must be >= 0")


def tpu_supported(layer: Layer, params: EdgeTPUParams) -> tuple[bool, str]:
    """Whether ``layer`` runs on the Edge TPU, and if not, why.

    Support rule (ours, from the op table of the Coral documentation): conv (dense, grouped,
    depthwise), fully connected, add, average/max pooling and global mean are supported, fused with
    the activations in :data:`TPU_ACTIVATIONS` (ReLU, ReLU6, logistic, tanh, and the hard-swish /
    swish family, which maps to supported HardSwish or Logistic+Mul ops). Any other activation
    (GELU, ELU, ...) or op makes that layer and every later one run on the host. A grouped conv
    followed by a channel shuffle needs a Transpose, which the 2019 op table did not list; newer
    compilers map it, which is our default (``channel_shuffle_on_tpu``). A layer that
    :func:`hwnas.quant.device_rules.effective_layers` placed on the host (``extra["placement"]``: a
    float layer of a quantized policy) counts as unsupported too.

    Transformer ops (ours, from the same op table and TFLite's lowering of them):

    * ``layernorm`` runs on the TPU: TFLite has no LayerNorm kernel, the converter writes it as
      Mean, SquaredDifference, Rsqrt, Mul, Sub and Add, all in the op table; the vector unit does
      :data:`hwnas.latency.estimators.ELEMENTWISE_OPS` work per element. The table allows a Mean
      over the channel (z) axis only when the channels are a multiple of 4; otherwise it is not
      mapped.
    * a token-wise ``linear`` runs on the TPU (FullyConnected, or a 1×1 Conv2d over the tokens:
      ``tokens`` pixels streamed through the array).
    * ``matmul`` (attention's product of two activations, TFLite BatchMatMul) is not in the op
      table: attention starts the host part, unless ``batch_matmul_on_tpu`` is set (to model a
      compiler that maps it; it then runs as a weight-less matrix product on the array).
    * ``softmax``: the table limits Softmax to a 1-D input (the classifier's output); a row softmax
      over attention scores (``in_h`` > 1 rows) is not mapped.
    * ``gelu``: not in the op table (neither GELU nor Erf), so it runs on the host.
    """
    if layer.op not in _TPU_OPS:
        return False, f"op {layer.op!r} is not in the Edge TPU op table"
    if layer.op == "matmul" and not params.batch_matmul_on_tpu:
        return False, "a product of two activations (BatchMatMul) is not in the Edge TPU op table"
    if layer.op == "layernorm" and layer.in_channels % 4:
        return False, "the Edge TPU maps a Mean over channels only for a multiple of 4 channels"
    if layer.op == "softmax" and (layer.in_h * layer.in_w > 1
                                  or layer.in_channels > SOFTMAX_MAX_ELEMENTS):
        return False, ("the Edge TPU maps Softmax only on a 1-D input of at most "
                       f"{SOFTMAX_MAX_ELEMENTS} elements")
    if layer.extra.get("placement") == "host":
        return False, "placed on the host by quant.device_rules.effective_layers (a float layer)"
    for act in (layer.activation, layer.extra.get("pre_activation")):
        if act not in TPU_ACTIVATIONS:
            return False, f"activation {act!r} is not supported by the Edge TPU"
    if layer.extra.get("channel_shuffle") and not params.channel_shuffle_on_tpu:
        return False, "channel shuffle (Transpose) is not mapped by this compiler"
    return True, ""


def param_bytes(layers: Sequence[Layer]) -> int:
    """Parameter bytes as compiled: int8 weights and int32 biases."""
    return sum(layer.weight_count + 4 * (layer.params - layer.weight_count) for layer in layers)


class EdgeTPUEstimator(Estimator):
    """Coral Edge TPU latency; see the module docstring.

    Host part: the host CPU is a roofline device (:mod:`hwnas.latency.estimators.roofline`, default
    a Raspberry Pi 4, a common Coral host); the activation tensor at the cut crosses the link once.

    Not modelled: activation memory limits (large feature maps also spill), the compiler's
    segmenting/pipelining over several TPUs, the first-inference cache fill.

    So under these rules a vision transformer leaves the TPU at its first attention product: the
    tokenizer convolutions, the first LayerNorm and the first QKV projection run on the TPU, the
    rest on the host (a model whose attention is rewritten without BatchMatMul, or a compiler that
    maps it, keeps more on the TPU: ``batch_matmul_on_tpu``).
    """

    quant_rules = "edgetpu"

    def __init__(self, params: EdgeTPUParams, name: str | None = None) -> None:
        self.params = params
        self.name = name or params.name
        self.description = f"systolic-array model of the {params.name}"
        self._host = RooflineEstimator(params.host)

    def tpu_cycles(self, layer: Layer) -> int:
        """Array cycles of one layer (our mapping onto the array):

        * dense / grouped conv and linear: per group, a ``K × N`` weight matrix (``K`` = input
          channels per group × k², ``N`` = output channels per group) is cut into
          ``⌈K/rows⌉ × ⌈N/cols⌉`` array tiles; each tile loads its weights (``rows`` cycles) and
          streams every output pixel through the array:
          ``cycles = groups × tiles × (pixels + rows + cols)`` (fill and drain included). Narrow
          layers leave most of the array idle, as on the real device.
        * depthwise conv: channels across the columns, kernel taps down the rows:
          ``⌈C/cols⌉ × ⌈k²/rows⌉`` tiles, i.e. at most ``k²/rows`` of the array is busy (14% for
          3×3): the known poor utilisation of depthwise convolutions on systolic arrays.
        * add / pooling: the vector unit, ``cols`` elements per cycle.
        * plus ``layer_overhead_us`` per layer (instruction issue, tile switching).
        """
        p = self.params
        fill = p.rows + p.cols
        kind = layer_kind(layer)
        if layer.op == "matmul":  # per head: (in_h × K) by (K × N), K and N tiled on the array
            k, n = layer.in_channels // layer.groups, layer.out_channels // layer.groups
            tiles = layer.groups * math.ceil(k / p.rows) * math.ceil(n / p.cols)
            return tiles * (layer.in_h * layer.in_w + fill)
        if layer.op in ("conv", "linear"):
            pixels = layer.in_h * layer.in_w if layer.op == "linear" else layer.out_h * layer.out_w
            if kind == "depthwise":
                tiles = math.ceil(layer.out_channels / p.cols) * math.ceil(layer.kernel**2 / p.rows)
            else:
                g = layer.groups if layer.op == "conv" else 1
                k = (layer.in_channels // g) * (layer.kernel**2 if layer.op == "conv" else 1)
                n = layer.out_channels // g
                tiles = g * math.ceil(k / p.rows) * math.ceil(n / p.cols)
            return tiles * (pixels + fill)
        return math.ceil(vector_ops(layer) / p.cols)

    def breakdown(self, layers: Sequence[Layer]) -> Breakdown:
        p = self.params
        if not layers:
            return Breakdown(0.0)
        cut = len(layers)
        for i, layer in enumerate(layers):
            if not tpu_supported(layer, p)[0]:
                cut = i
                break
        tpu_layers, host_layers = layers[:cut], layers[cut:]
        clock_hz = p.clock_mhz * 1e6
        link = p.link_gbs * 1e9
        costs = [LayerCost(layer.name, layer.op,
                           self.tpu_cycles(layer) / clock_hz * 1e3 + p.layer_overhead_us * 1e-3,
                           "compute") for layer in tpu_layers]
        tpu_ms = sum(c.ms for c in costs)
        cache = (p.param_cache_mib - p.reserved_mib) * MIB
        streamed = max(0.0, param_bytes(tpu_layers) - cache)
        stream_ms = streamed / link * 1e3
        host_costs = [self._host.layer_cost(layer) for layer in host_layers]
        costs += [LayerCost(c.name, c.op, c.ms, c.bound, "host") for c in host_costs]
        host_ms = sum(c.ms for c in host_costs)
        # int8 tensors over the link: the input, and the TPU part's output (the cut tensor, or
        # the network output when everything ran on the TPU)
        moved = in_elems(layers[0]) if tpu_layers else 0
        if tpu_layers:
            moved += out_elems(tpu_layers[-1])
        io_ms = moved / link * 1e3
        total = p.invoke_overhead_ms + tpu_ms + stream_ms + io_ms + host_ms
        return Breakdown(total, costs, {"invoke": p.invoke_overhead_ms, "tpu": tpu_ms,
                                        "param_stream": stream_ms, "io": io_ms, "host": host_ms,
                                        "tpu_layers": float(len(tpu_layers))})


# --------------------------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------------------------

_CORAL_SOURCES = ("Coral Edge TPU documentation (coral.ai/docs): 4 TOPS int8, ~8 MB on-chip "
                  "parameter cache, parameters beyond it fetched from host memory, single "
                  "partition at the first unsupported op; Coral USB Accelerator datasheet "
                  "(USB 3.0 Type-C); Coral M.2 Accelerator datasheet (PCIe Gen2 ×1)")

USB_ACCELERATOR = EdgeTPUParams(
    name="Coral USB Accelerator (Edge TPU) on a Raspberry Pi 4",
    link_gbs=0.32,  # USB 3.0 5 Gb/s, about 320 MB/s in practice (our assumption)
    invoke_overhead_ms=0.3,
    sources=_CORAL_SOURCES,
)

PCIE_ACCELERATOR = EdgeTPUParams(
    name="Coral M.2 / mini-PCIe Accelerator (Edge TPU)",
    link_gbs=0.4,  # PCIe Gen2 x1: 500 MB/s raw, ~400 MB/s payload (our assumption)
    invoke_overhead_ms=0.1,
    sources=_CORAL_SOURCES,
)

PRESETS: dict[str, Callable[[], Estimator]] = {
    "edgetpu-est": lambda: EdgeTPUEstimator(USB_ACCELERATOR, "edgetpu-est"),
    "edgetpu-pcie-est": lambda: EdgeTPUEstimator(PCIE_ACCELERATOR, "edgetpu-pcie-est"),
}
