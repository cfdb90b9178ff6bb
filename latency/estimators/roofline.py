"""Per-layer roofline estimates for GPU- and CPU-class devices (Jetson, phones, Raspberry Pi).

Each layer takes ``max(compute, memory) + overhead`` (batch 1, activations fused into the
preceding conv, BatchNorm folded), compute at the device's peak for the layer's precision times
an efficiency per op class (:meth:`RooflineEstimator.layer_cost`); the network adds a fixed cost
per inference. What it ignores: caches (every tensor is charged once from DRAM, the pessimistic
roofline for the small-batch case), operator fusion beyond conv+activation, kernel selection,
DVFS and thermal throttling. Peaks and bandwidths are vendor specifications (sources in each
preset); efficiencies, overheads and saturation sizes are our assumptions, typical of batch-1
inference with TensorRT / XNNPACK. These devices are kind ``"estimated"`` until adapted with
real measurements (``hwnas latency adapt``), which is the intended use: the estimate gives a
plausible ranking before any measurement exists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hwnas.latency.estimators.base import (
    Breakdown,
    Estimator,
    LayerCost,
    check_fraction,
    check_positive,
    in_elems,
    layer_kind,
    out_elems,
    vector_ops,
)
from hwnas.supernet.layers import Layer

from hwnas.core.errors import UserError

__all__ = ["RooflineParams", "RooflineEstimator", "PRESETS", "precision_bits"]


@dataclass(frozen=True)
class RooflineParams:
    """A device for the roofline model.

    Attributes:
        name: human-readable device name.
        peak_gops: peak arithmetic rate in G ops/s (1 MAC = 2 ops) per precision in bits,
            e.g. ``{32: 91.2, 8: 364.8}``.
        float_bits: precision at which unquantized (32-bit) layers run.
        mem_gbs: sustained DRAM bandwidth in GB/s (10^9 bytes/s).
        efficiency: fraction of peak reached per op class; must contain ``"default"``.
        layer_overhead_us: fixed time per layer (kernel launch / thread synchronisation), µs.
        invoke_overhead_ms: fixed time per inference (runtime entry, input/output copies), ms.
        saturation_outputs: output elements a layer needs to occupy every lane (GPU: thousands;
            a CPU core: tens); smaller layers reach proportionally less of the peak.
        sources: where the numbers come from.
    """

    name: str
    peak_gops: dict[int, float]
    float_bits: int
    mem_gbs: float
    efficiency: dict[str, float]
    layer_overhead_us: float
    invoke_overhead_ms: float
    saturation_outputs: int
    sources: str = ""

    def __post_init__(self) -> None:
        owner = f"roofline device {self.name!r}"
        if not self.peak_gops:
            raise UserError(f"{owner}: peak_gops is empty; expected {{bits: GOPS}}")
        for bits, gops in self.peak_gops.items():
            check_positive(owner, **{f"peak_gops[{bits}]": gops})
        if self.float_bits not in self.peak_gops:
            raise UserError(
                f"{owner}: float_bits={self.float_bits} has no entry in peak_gops "
                f"{sorted(self.peak_gops)}"
            )
        if "default" not in self.efficiency:
            raise UserError(f"{owner}: efficiency needs a 'default' entry")
        check_fraction(owner, **{f"efficiency[{k}]": v for k, v in self.efficiency.items()})
        check_positive(owner, mem_gbs=self.mem_gbs, saturation_outputs=self.saturation_outputs)
        if self.layer_overhead_us < 0 or self.invoke_overhead_ms < 0:
            raise UserError(f"{owner}: overheads must be >= 0")


def precision_bits(layer: Layer, available: Sequence[int], float_bits: int) -> int:
    """The precision a layer runs at: ``max(w_bits, a_bits)`` (``float_bits`` for 32-bit
    layers) rounded up to the nearest available precision (the largest one if none is wider)."""
    bits = max(layer.w_bits, layer.a_bits)
    if bits >= 32:
        bits = float_bits
    wider = sorted(b for b in available if b >= bits)
    return wider[0] if wider else max(available)


class RooflineEstimator(Estimator):
    """Per-layer roofline latency on a GPU/CPU-class device; see the module docstring."""

    def __init__(self, params: RooflineParams, name: str | None = None) -> None:
        self.params = params
        self.name = name or params.name
        self.description = f"roofline model of {params.name}"

    def layer_cost(self, layer: Layer) -> LayerCost:
        """The modelled time of one layer.

        For each layer (batch 1, activations fused into the preceding conv, BatchNorm folded)::

            ops      = 2 × MACs      (conv, linear)   or the element-wise/pool arithmetic
            util     = min(1, output elements / saturation_outputs)   (small layers: lanes idle)
            compute  = ops / (peak[precision] × efficiency[op class] × util)
            memory   = (input + output activations + weights) bytes / bandwidth
            time     = max(compute, memory) + layer_overhead

        and the network's latency is ``invoke_overhead + Σ time``. ``precision`` is the layer's
        ``max(w_bits, a_bits)`` rounded up to a precision the device has a peak for; unquantized
        (32-bit) layers run at ``float_bits`` (16 on the Jetsons: TensorRT FP16, the usual
        deployment; 32 on CPUs: XNNPACK/onnxruntime FP32). Op classes
        (:func:`hwnas.latency.estimators.layer_kind`): ``conv`` (dense k×k), ``pointwise`` (1×1),
        ``grouped``, ``depthwise``, ``linear``, ``add``, ``pool``, ``global_pool``, and the
        transformer ops ``matmul``, ``layernorm``, ``softmax``, ``gelu``; a class missing from
        ``efficiency`` uses ``efficiency["default"]``.

        Transformer ops: a ``matmul`` (Q·Kᵀ, attention × V) is priced like a layer with weights, by
        its MACs, but both of its operands are activations read from memory (:func:`in_elems`) and
        it has no weights; its efficiency ``"matmul"`` is below a linear layer's on a GPU (many
        small batched products per head, the shape attention kernels without fusion run at batch 1).
        LayerNorm, softmax and GELU have no MACs: their arithmetic is
        :data:`hwnas.latency.estimators.ELEMENTWISE_OPS` per element (exp and erf counted as 10
        operations), at the ``default`` efficiency, and they are usually memory-bound.
        """
        p = self.params
        bits = precision_bits(layer, list(p.peak_gops), p.float_bits)
        nbytes = bits / 8
        kind = layer_kind(layer)
        ops = 2 * layer.macs if layer.macs else vector_ops(layer)
        eff = p.efficiency.get(kind, p.efficiency["default"])
        util = min(1.0, out_elems(layer) / p.saturation_outputs)
        compute_s = ops / (p.peak_gops[bits] * 1e9 * eff * util) if ops else 0.0
        bias_bytes = 4 * (layer.params - layer.weight_count)
        moved = (in_elems(layer) + out_elems(layer)) * nbytes + layer.weight_count * nbytes + bias_bytes
        memory_s = moved / (p.mem_gbs * 1e9)
        bound = "compute" if compute_s >= memory_s else "memory"
        ms = max(compute_s, memory_s) * 1e3 + p.layer_overhead_us * 1e-3
        return LayerCost(layer.name, layer.op, ms, bound)

    def breakdown(self, layers: Sequence[Layer]) -> Breakdown:
        costs = [self.layer_cost(layer) for layer in layers]
        layer_ms = sum(c.ms for c in costs)
        overhead = self.params.invoke_overhead_ms
        return Breakdown(layer_ms + overhead, costs, {"layers": layer_ms, "invoke": overhead})


# --------------------------------------------------------------------------------------------
# presets (published specifications; efficiencies are our assumptions, see the module docstring)
# --------------------------------------------------------------------------------------------

#: Efficiencies for a GPU running TensorRT FP16 at batch 1: dense convs use the tensor cores at
#: a modest fraction of peak; depthwise convs have no tensor-core path (CUDA cores at 1/4 of the
#: tensor peak, poorly used); element-wise layers are memory-bound anyway.
#: Attention's batched matmuls (``matmul``) are small per head: a fifth of a dense conv's share.
_GPU_EFF = {"conv": 0.30, "pointwise": 0.25, "grouped": 0.10, "depthwise": 0.02,
            "linear": 0.05, "matmul": 0.06, "default": 0.05}
#: Efficiencies for one CPU core running XNNPACK/onnxruntime FP32 NEON kernels.
#: A ``matmul`` runs the same GEMM micro-kernels as a linear layer (per head).
_CPU_EFF = {"conv": 0.55, "pointwise": 0.65, "grouped": 0.40, "depthwise": 0.25,
            "linear": 0.30, "matmul": 0.30, "default": 0.20}

JETSON_ORIN_NANO = RooflineParams(
    name="NVIDIA Jetson Orin Nano 8GB (GPU, TensorRT FP16)",
    # 1024 CUDA cores + 32 tensor cores at 625 MHz: FP32 1024 × 2 × 0.625 = 1.28 TFLOPS;
    # 40 sparse INT8 TOPS = 20 dense INT8 TOPS, FP16 tensor (dense) half of that = 10 TFLOPS.
    peak_gops={32: 1_280.0, 16: 10_000.0, 8: 20_000.0},
    float_bits=16,
    mem_gbs=68.0,  # 128-bit LPDDR5, 68 GB/s
    efficiency=_GPU_EFF,
    layer_overhead_us=10.0,
    invoke_overhead_ms=0.15,
    saturation_outputs=16_384,
    sources="NVIDIA Jetson Orin Nano Series data sheet (DS-11105-001) and Jetson Orin "
            "technical brief: 1024-core Ampere GPU with 32 tensor cores at 625 MHz, 40 sparse "
            "INT8 TOPS, 8 GB 128-bit LPDDR5 at 68 GB/s",
)

JETSON_AGX_ORIN = RooflineParams(
    name="NVIDIA Jetson AGX Orin 64GB (GPU, TensorRT FP16)",
    # 2048 CUDA cores + 64 tensor cores at 1.3 GHz: FP32 5.3 TFLOPS; GPU 170 sparse INT8 TOPS =
    # 85 dense INT8 TOPS, FP16 tensor (dense) 42.5 TFLOPS.
    peak_gops={32: 5_300.0, 16: 42_500.0, 8: 85_000.0},
    float_bits=16,
    mem_gbs=204.8,  # 256-bit LPDDR5
    efficiency=_GPU_EFF,
    layer_overhead_us=6.0,
    invoke_overhead_ms=0.1,
    saturation_outputs=32_768,
    sources="NVIDIA Jetson AGX Orin Series data sheet (DS-10662-001) and Jetson Orin technical "
            "brief: 2048-core Ampere GPU with 64 tensor cores at 1.3 GHz (GPU 170 sparse INT8 "
            "TOPS, 5.3 FP32 TFLOPS), 64 GB 256-bit LPDDR5 at 204.8 GB/s",
)

PIXEL7_CPU = RooflineParams(
    name="Google Pixel 7 CPU (Tensor G2, one Cortex-X1 core, FP32)",
    # Cortex-X1: four 128-bit NEON pipes -> 4 × 4 FP32 FMA = 32 FLOP/cycle at 2.85 GHz = 91.2
    # GFLOPS; int8 dot products (SDOT) 4 × 16 MAC = 128 ops/cycle = 364.8 GOPS.
    peak_gops={32: 91.2, 16: 182.4, 8: 364.8},
    float_bits=32,
    mem_gbs=15.0,  # one core's sustained share of LPDDR5 (our assumption; the SoC peak is ~51 GB/s)
    efficiency=_CPU_EFF,
    layer_overhead_us=3.0,
    invoke_overhead_ms=0.05,
    saturation_outputs=64,
    sources="Google Tensor G2 (2× Cortex-X1 at 2.85 GHz, 2× A78, 4× A55, LPDDR5); Arm Cortex-X1 "
            "Software Optimization Guide (four 128-bit ASIMD/FP pipes); single-threaded TFLite/"
            "XNNPACK, as mobile latency tables are usually measured",
)

PIXEL3_CPU = RooflineParams(
    name="Google Pixel 3 CPU (Snapdragon 845, one Cortex-A75-based Kryo 385 Gold core, FP32)",
    # Cortex-A75: two 128-bit NEON pipes -> 2 × 4 FP32 FMA = 16 FLOP/cycle at 2.8 GHz = 44.8
    # GFLOPS; int8 SDOT 2 × 16 MAC = 64 ops/cycle = 179 GOPS.
    peak_gops={32: 44.8, 16: 89.6, 8: 179.2},
    float_bits=32,
    mem_gbs=10.0,  # one core's sustained share of LPDDR4X (our assumption; SoC peak 29.9 GB/s)
    efficiency=_CPU_EFF,
    layer_overhead_us=4.0,
    invoke_overhead_ms=0.05,
    saturation_outputs=32,
    sources="Qualcomm Snapdragon 845 (4× Kryo 385 Gold = Cortex-A75 at 2.8 GHz, LPDDR4X "
            "1866 MHz 4×16-bit); Arm Cortex-A75 Software Optimization Guide (two 128-bit "
            "ASIMD/FP pipes)",
)

RASPI4 = RooflineParams(
    name="Raspberry Pi 4 Model B (4× Cortex-A72 at 1.5 GHz, 4 threads, FP32)",
    # Cortex-A72: 8 FP32 FLOP/cycle/core sustained (one 128-bit FMA per cycle) -> 12 GFLOPS per
    # core, 48 GFLOPS on 4 cores; no int8 dot product (ARMv8.0): int8 via widening MLA ~2x FP32.
    peak_gops={32: 48.0, 16: 96.0, 8: 96.0},
    float_bits=32,
    mem_gbs=4.0,  # LPDDR4-3200 32-bit = 12.8 GB/s peak; ~4 GB/s sustained (our assumption, STREAM-like)
    efficiency=_CPU_EFF,
    layer_overhead_us=15.0,  # 4-thread fork/join per layer on a slow core
    invoke_overhead_ms=0.1,
    saturation_outputs=256,
    sources="Raspberry Pi 4 Model B product brief (BCM2711, quad Cortex-A72 at 1.5 GHz, "
            "LPDDR4-3200); Arm Cortex-A72 Software Optimization Guide (FP/ASIMD throughput)",
)

PRESETS: dict[str, Callable[[], Estimator]] = {
    "jetson-orin-nano-est": lambda: RooflineEstimator(JETSON_ORIN_NANO, "jetson-orin-nano-est"),
    "jetson-agx-orin-est": lambda: RooflineEstimator(JETSON_AGX_ORIN, "jetson-agx-orin-est"),
    "pixel7-cpu-est": lambda: RooflineEstimator(PIXEL7_CPU, "pixel7-cpu-est"),
    "pixel3-cpu-est": lambda: RooflineEstimator(PIXEL3_CPU, "pixel3-cpu-est"),
    "raspi4-est": lambda: RooflineEstimator(RASPI4, "raspi4-est"),
}
