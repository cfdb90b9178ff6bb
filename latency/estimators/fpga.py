"""Latency of a dataflow (layer-pipelined) FPGA accelerator, in the spirit of FINN and hls4ml.

Every conv/linear layer (and attention product) gets its own compute engine, as in FINN's
matrix-vector-activation units and hls4ml's per-layer ``ReuseFactor`` (:class:`FPGAEstimator`):
``PE`` rows × ``SIMD`` columns of a layer's matrix per clock, so a layer takes
``MACs / (PE × SIMD)`` cycles per image. A MAC unit costs DSP slices or LUTs by bit-width
(:func:`mac_unit_cost`), which is how quantization buys speed here; the units are spread over
the layers for a balanced pipeline within the part's budget (:meth:`FPGAEstimator.fold`,
FINN's ``SetFolding``). Latency is batch-1 latency of the streaming pipeline, its steady-state
interval, or a sequential upper bound (``FPGAParams.mode``, :meth:`FPGAEstimator.breakdown`);
weights beyond on-chip BRAM are re-read from DDR every image.

Not modelled: BRAM port-width limits on parallelism, routing/timing closure (the clock is taken
as given), activation line-buffer size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from hwnas.latency.estimators.base import (
    ELEMENTWISE_OPS,
    Breakdown,
    Estimator,
    LayerCost,
    check_fraction,
    check_positive,
    in_elems,
    out_elems,
)
from hwnas.supernet.layers import Layer

from hwnas.core.errors import UserError

__all__ = ["FPGAParams", "FPGAEstimator", "PRESETS", "mac_unit_cost"]

MODES = ("latency", "throughput", "sequential")
#: Ops that get a MAC engine.
_MAC_OPS = ("conv", "linear", "matmul")


@dataclass(frozen=True)
class FPGAParams:
    """An FPGA device and the accelerator built on it (see :class:`FPGAEstimator`).

    Attributes:
        name: board and part.
        dsp: DSP slices of the part.
        lut: 6-input LUTs of the part.
        bram36: 36 Kb block RAMs of the part (URAM not counted).
        clock_mhz: accelerator clock.
        ddr_gbs: DDR bandwidth available to the accelerator, GB/s.
        int8_macs_per_dsp / int4_macs_per_dsp: MACs one DSP computes per clock at 8 / 4 bits.
        dsp_fraction / lut_fraction: fraction of DSPs / LUTs available to MAC units.
        bram_weight_fraction: fraction of BRAM available to weights.
        lut_mac_max_bits: weights of at most this many bits use LUT MACs.
        luts_per_bit_product / lut_mac_base: LUT cost of a LUT MAC, ``base + k × w × a``.
        float_bits: fixed-point width assumed for unquantized (32-bit) layers.
        special_lanes: elements per clock of the LayerNorm / softmax / GELU units.
        mode: ``"latency"``, ``"throughput"`` or ``"sequential"``
            (:meth:`FPGAEstimator.breakdown`).
        sources: where the numbers come from.
    """

    name: str
    dsp: int
    lut: int
    bram36: int
    clock_mhz: float
    ddr_gbs: float
    int8_macs_per_dsp: float = 2.0
    int4_macs_per_dsp: float = 4.0
    dsp_fraction: float = 0.9
    lut_fraction: float = 0.5
    bram_weight_fraction: float = 0.7
    lut_mac_max_bits: int = 3
    luts_per_bit_product: float = 1.0
    lut_mac_base: float = 8.0
    float_bits: int = 16
    special_lanes: int = 32
    mode: str = "latency"
    sources: str = ""

    def __post_init__(self) -> None:
        owner = f"FPGA {self.name!r}"
        check_positive(owner, dsp=self.dsp, lut=self.lut, bram36=self.bram36,
                       clock_mhz=self.clock_mhz, ddr_gbs=self.ddr_gbs,
                       int8_macs_per_dsp=self.int8_macs_per_dsp,
                       int4_macs_per_dsp=self.int4_macs_per_dsp, float_bits=self.float_bits,
                       special_lanes=self.special_lanes,
                       luts_per_bit_product=self.luts_per_bit_product)
        check_fraction(owner, dsp_fraction=self.dsp_fraction, lut_fraction=self.lut_fraction,
                       bram_weight_fraction=self.bram_weight_fraction)
        if self.lut_mac_base < 0 or self.lut_mac_max_bits < 0:
            raise UserError(f"{owner}: lut_mac_base and lut_mac_max_bits must be >= 0")
        if self.mode not in MODES:
            raise UserError(f"{owner}: mode {self.mode!r}; expected one of {list(MODES)}")

    @property
    def bram_bits(self) -> int:
        return self.bram36 * 36 * 1024


def _bits(value: int, float_bits: int) -> int:
    return float_bits if value >= 32 else value


def mac_unit_cost(layer: Layer, p: FPGAParams) -> tuple[str, float]:
    """``(resource, amount)`` one MAC unit of ``layer`` costs: ``("lut", LUTs)`` or
    ``("dsp", DSPs)`` (fractional: several narrow MACs share one DSP).

    A MAC unit is built from DSP slices or from LUTs, by bit-width ``b = max(w_bits, a_bits)``
    (unquantized 32-bit layers are taken as ``float_bits``-bit fixed point, hls4ml's default
    ``ap_fixed<16,6>``):

    * ``w_bits <= lut_mac_max_bits`` (binary to 3-bit weights): LUT MACs, FINN-style, costing
      ``lut_mac_base + luts_per_bit_product × w_bits × a_bits`` LUTs each;
    * ``b <= 4``: ``int4_macs_per_dsp`` MACs per DSP (4 on a DSP48E2: Xilinx WP521, "Convolutional
      Neural Network with INT4 Optimization on Xilinx Devices");
    * ``b <= 8``: ``int8_macs_per_dsp`` MACs per DSP (2 on a DSP48E2: Xilinx WP486, "Deep Learning
      with INT8 Optimization on Xilinx Devices");
    * ``b <= 18``: one MAC per DSP (the 27×18 / 25×18 multiplier); wider: 4 DSPs per MAC.
    """
    w = _bits(layer.w_bits, p.float_bits)
    a = _bits(layer.a_bits, p.float_bits)
    if w <= p.lut_mac_max_bits:
        return "lut", p.lut_mac_base + p.luts_per_bit_product * w * a
    b = max(w, a)
    if b <= 4:
        return "dsp", 1.0 / p.int4_macs_per_dsp
    if b <= 8:
        return "dsp", 1.0 / p.int8_macs_per_dsp
    if b <= 18:
        return "dsp", 1.0
    return "dsp", 4.0


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@functools.lru_cache(maxsize=4096)
def _unit_options(mh: int, mw: int) -> np.ndarray:
    """Sorted distinct PE × SIMD products with PE | MH and SIMD | MW."""
    return np.unique(np.outer(_divisors(mh), _divisors(mw)).ravel()).astype(np.float64)


def _fill_fraction(layer: Layer) -> float:
    """Fraction of its input a streaming layer consumes before its first output row."""
    if layer.op in ("avgpool", "matmul") or layer.in_h <= 1:
        return 1.0
    if layer.op == "linear":  # one token
        return 1.0 / layer.in_h
    rows = layer.kernel // 2 + 1 if layer.op in ("conv", "pool") else 1
    return min(1.0, rows / layer.in_h)


def _matrix_shape(layer: Layer) -> tuple[int, int, int]:
    """``(pixels, MH, MW)`` of a conv/linear/matmul layer (see :class:`FPGAEstimator`)."""
    if layer.op == "linear":
        return layer.in_h * layer.in_w, layer.out_channels, layer.in_channels
    if layer.op == "matmul":
        return (layer.in_h * layer.in_w * layer.groups, layer.out_channels // layer.groups,
                layer.in_channels // layer.groups)
    return (layer.out_h * layer.out_w, layer.out_channels,
            (layer.in_channels // layer.groups) * layer.kernel * layer.kernel)


def _padded(options: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The option lists as one matrix padded with +inf, and each row's length."""
    lengths = np.array([len(o) for o in options])
    matrix = np.full((len(options), int(lengths.max())), np.inf)
    for j, opts in enumerate(options):
        matrix[j, : len(opts)] = opts
    return matrix, lengths


def _snap_up(matrix: np.ndarray, lengths: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Per row, the smallest option >= ``need`` (the largest option if none is)."""
    idx = np.minimum((matrix < need[:, None] * (1 - 1e-12)).sum(axis=1), lengths - 1)
    return matrix[np.arange(len(matrix)), idx]


def _allocate_balanced(macs: np.ndarray, unit_cost: np.ndarray, count: np.ndarray,
                       options: list[np.ndarray], budget: float) -> np.ndarray | None:
    """FINN's folding for throughput: the smallest common initiation interval ``T`` such that
    each layer's cheapest unit count with ``macs / units <= T`` fits the budget together
    (``count`` identical layers per row). Returns the units per row, or ``None`` if one unit
    per layer already exceeds the budget."""
    cost = unit_cost * count
    if float(cost.sum()) > budget:
        return None
    matrix, lengths = _padded(options)
    floor = max(m / opts[-1] for m, opts in zip(macs, options))
    candidates = np.unique(np.concatenate([m / opts for m, opts in zip(macs, options)]))
    candidates = candidates[candidates >= floor * (1 - 1e-12)]
    lo, hi = 0, len(candidates) - 1
    best = _snap_up(matrix, lengths, macs / candidates[-1])
    while lo <= hi:  # resources fall as T grows: binary search the smallest feasible T
        mid = (lo + hi) // 2
        chosen = _snap_up(matrix, lengths, macs / candidates[mid])
        if float((chosen * cost).sum()) <= budget:
            best, hi = chosen, mid - 1
        else:
            lo = mid + 1
    return best


def _allocate_sequential(macs: np.ndarray, unit_cost: np.ndarray, count: np.ndarray,
                      options: list[np.ndarray], budget: float) -> np.ndarray | None:
    """Units per row minimising the pipeline latency ``Σ count × macs / units`` under the
    budget ``Σ count × unit_cost × units <= budget``: the Lagrangian optimum
    ``units = sqrt(macs / (λ × unit_cost))``, snapped to the better neighbouring allowed unit
    count, with the multiplier λ found by bisection. ``None`` if one unit per layer already
    exceeds the budget."""
    cost = unit_cost * count
    if float(cost.sum()) > budget:
        return None
    matrix, lengths = _padded(options)
    full = matrix[np.arange(len(matrix)), lengths - 1]
    if float((full * cost).sum()) <= budget:
        return full
    rows = np.arange(len(matrix))

    def pick(lam: float) -> np.ndarray:
        target = np.sqrt(macs / (lam * unit_cost))
        upper = np.minimum((matrix < target[:, None]).sum(axis=1), lengths - 1)
        lower = np.maximum(upper - 1, 0)
        a, b = matrix[rows, lower], matrix[rows, upper]
        score_a = macs / a + lam * unit_cost * a
        score_b = macs / b + lam * unit_cost * b
        return np.where(score_a <= score_b, a, b)

    lo, hi = -30.0, 30.0  # log10 of the multiplier: small -> many units, large -> few
    best = np.ones(len(macs))
    for _ in range(50):
        mid = (lo + hi) / 2
        chosen = pick(10.0**mid)
        if float((chosen * cost).sum()) <= budget:
            best, hi = chosen, mid
        else:
            lo = mid
    return best


class FPGAEstimator(Estimator):
    """Dataflow FPGA accelerator latency; see the module docstring.

    Every conv/linear layer gets its own compute engine, as in FINN's matrix-vector-activation units
    (Umuroglu et al., "FINN", FPGA 2017; Blott et al., "FINN-R", ACM TRETS 2018) and hls4ml's
    per-layer ``ReuseFactor`` (Duarte et al., JINST 2018). A layer is a matrix-vector product per
    output pixel: ``MH`` rows (output channels) by ``MW`` columns (input channels per group × k²; k²
    for a depthwise conv, whose channels are the rows). The engine computes ``PE`` rows × ``SIMD``
    columns per clock, ``PE`` dividing ``MH`` and ``SIMD`` dividing ``MW`` (FINN's folding
    constraints), so a layer takes::

        cycles = pixels × (MH / PE) × (MW / SIMD)  =  MACs / (PE × SIMD)

    cycles (its initiation interval per image), at least ``pixels`` (one output pixel per clock).

    Layers without MACs (add, pooling) stream one input pixel per clock with all channels in
    parallel (cheap LUT logic, not charged to the budget).

    Transformer ops: a token-wise ``linear`` layer is a matrix-vector product per token (``pixels``
    = tokens). Attention's ``matmul`` (Q·Kᵀ, attention × V) gets an engine like any MAC layer, per
    head a matrix-vector product per query row (``pixels`` = rows × heads, ``MH`` = columns of the
    second operand, ``MW`` = the reduction length), at its activations' width (unquantized: the
    fixed-point ``float_bits``); its second operand (K or V, ``Layer.second_operand`` elements) is
    an activation that must be held on chip whole before the first row can be computed, so it is
    charged to on-chip memory with the weights (a spill beyond BRAM goes over DDR like weights), and
    the engine's fill delay is its whole input. LayerNorm, softmax and GELU need exp / erf / rsqrt
    units: ``special_lanes`` elements per clock (our assumption; LUT/DSP logic not charged to the
    MAC budget), at least one token per clock.

    Memory: weights live in on-chip BRAM when they fit in ``bram_weight_fraction`` of it (the rest
    holds FIFOs and line buffers); weights beyond that are re-read from DDR every image at
    ``ddr_gbs`` (a spill term added to the latency: no overlap, conservative). The input image and
    the output are moved over DDR once per image. Not modelled: BRAM port-width limits on
    parallelism, routing/timing closure (the clock is taken as given), activation line-buffer size.
    """

    quant_rules = "fpga"

    def __init__(self, params: FPGAParams, name: str | None = None) -> None:
        self.params = params
        self.name = name or params.name
        self.description = f"dataflow FPGA accelerator on {params.name} ({params.mode})"

    def fold(self, layers: Sequence[Layer]) -> dict[str, object]:
        """Allocate MAC units to the conv/linear layers.

        Folding (FINN's ``SetFolding`` transform): DSP layers and LUT layers draw on
        ``dsp_fraction`` of the DSPs and ``lut_fraction`` of the LUTs (the rest is control, address
        generation, FIFOs). Units are spread to the smallest common initiation interval ``T`` for
        which every layer's cheapest (PE, SIMD) with ``cycles <= T`` fits the budget: a balanced
        pipeline, which is what FINN and hls4ml designs aim at. If even PE = SIMD = 1 everywhere
        does not fit (more layers than MAC units), engines are time-shared and every layer slows
        down by the over-commitment factor.

        Returns ``units`` and ``cycles`` per layer (units 0 for layers without MACs),
        ``overcommit`` (>= 1; > 1 when even one unit per layer does not fit) and the DSPs and
        LUTs used. DSP layers and LUT layers draw on separate budgets, so each is folded on
        its own."""
        p = self.params
        n = len(layers)
        cycles = np.zeros(n)
        units = np.zeros(n)
        # identical MAC layers are folded alike: search over distinct shapes only
        groups: dict[tuple, list[int]] = {}
        for i, layer in enumerate(layers):
            if layer.macs > 0 and layer.op in _MAC_OPS:
                _, mh, mw = _matrix_shape(layer)
                resource, cost = mac_unit_cost(layer, p)
                groups.setdefault((resource, layer.macs, mh, mw, cost), []).append(i)
            elif layer.op in ELEMENTWISE_OPS:
                cycles[i] = max(layer.in_h * layer.in_w, -(-out_elems(layer) // p.special_lanes))
            else:
                cycles[i] = layer.in_h * layer.in_w  # one input pixel per clock, all channels
        used = {"dsp": 0.0, "lut": 0.0}
        overcommit = 1.0
        budgets = {"dsp": p.dsp * p.dsp_fraction, "lut": p.lut * p.lut_fraction}
        for resource, budget in budgets.items():
            keys = [k for k in groups if k[0] == resource]
            if not keys:
                continue
            macs = np.array([k[1] for k in keys], dtype=np.float64)
            count = np.array([len(groups[k]) for k in keys], dtype=np.float64)
            unit_cost = np.array([k[4] for k in keys], dtype=np.float64)
            cost = unit_cost * count
            options = [_unit_options(k[2], k[3]) for k in keys]
            allocate = _allocate_sequential if p.mode == "sequential" else _allocate_balanced
            chosen = allocate(macs, unit_cost, count, options, budget)
            factor = 1.0
            if chosen is None:  # one MAC unit per layer does not fit: time-share the engines
                chosen = np.ones(len(keys))
                factor = float(cost.sum()) / budget
            used[resource] = float((chosen * cost).sum())
            overcommit = max(overcommit, factor)
            for j, key in enumerate(keys):
                for i in groups[key]:
                    units[i] = chosen[j]
                    cycles[i] = macs[j] / chosen[j] * factor
        return {"units": units, "cycles": cycles, "overcommit": overcommit,
                "dsp": used["dsp"], "lut": used["lut"]}

    def weight_bits(self, layers: Sequence[Layer]) -> int:
        """Bits held on chip: all weights (at their fixed-point width), 32-bit biases, and each
        ``matmul``'s second operand (at its activation width; see the class docstring)."""
        p = self.params
        return sum(layer.weight_count * _bits(layer.w_bits, p.float_bits)
                   + 32 * (layer.params - layer.weight_count)
                   + layer.second_operand * _bits(layer.a_bits, p.float_bits) for layer in layers)

    def breakdown(self, layers: Sequence[Layer]) -> Breakdown:
        """Latency of ``layers`` by ``params.mode``:

        * ``"latency"`` (default): batch-1 latency of the streaming pipeline. All engines run at
          once and pixels stream between them, so one image takes the bottleneck's interval plus
          each layer's fill delay, the time it needs before emitting its first output row::

              latency = max_l II_l + Σ_l fill_l × II_l,   fill_l = (k_l // 2 + 1) / H_l

          (``fill = 1`` for the global pool and the classifier, which need their whole input).
        * ``"throughput"``: the steady-state interval of a full pipeline, ``max_l II_l`` (FINN's
          ``max_cycles``); the memory terms (class docstring) overlap it (``max``) instead of
          adding.
        * ``"sequential"``: no overlap between layers, ``Σ_l II_l`` (FINN's
          ``critical_path_cycles``, an upper bound), with the units that minimise that sum instead
          (the Lagrangian optimum ``units ∝ sqrt(MACs / unit cost)`` snapped to allowed (PE, SIMD)
          products).
        """
        p = self.params
        if not layers:
            return Breakdown(0.0)
        fold = self.fold(layers)
        cycles = fold["cycles"]
        clock_hz = p.clock_mhz * 1e6
        costs = [LayerCost(layer.name, layer.op, float(c) / clock_hz * 1e3,
                           "compute" if layer.macs else "stream")
                 for layer, c in zip(layers, cycles)]
        ddr = p.ddr_gbs * 1e9
        spill_bytes = max(0.0, self.weight_bits(layers) - p.bram_bits * p.bram_weight_fraction) / 8
        spill_ms = spill_bytes / ddr * 1e3
        first, last = layers[0], layers[-1]
        io_bytes = (in_elems(first) * _bits(first.a_bits, p.float_bits)
                    + out_elems(last) * _bits(last.a_bits, p.float_bits)) / 8
        io_ms = io_bytes / ddr * 1e3
        if p.mode == "latency":
            fill = np.array([_fill_fraction(layer) for layer in layers])
            compute_ms = float(cycles.max() + (fill * cycles).sum()) / clock_hz * 1e3
            total = compute_ms + spill_ms + io_ms
        elif p.mode == "sequential":
            compute_ms = float(cycles.sum()) / clock_hz * 1e3
            total = compute_ms + spill_ms + io_ms
        else:
            compute_ms = float(cycles.max()) / clock_hz * 1e3
            total = max(compute_ms, spill_ms + io_ms)
        return Breakdown(total, costs, {"compute": compute_ms, "weight_spill": spill_ms,
                                        "io": io_ms, "overcommit": float(fold["overcommit"]),
                                        "dsp_used": float(fold["dsp"]),
                                        "lut_used": float(fold["lut"])})


# --------------------------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------------------------

ZCU102 = FPGAParams(
    name="Xilinx ZCU102 (Zynq UltraScale+ XCZU9EG)",
    dsp=2520, lut=274_080, bram36=912, clock_mhz=200.0, ddr_gbs=19.2,
    int8_macs_per_dsp=2.0, int4_macs_per_dsp=4.0,
    sources="Xilinx DS891 Zynq UltraScale+ MPSoC product selection guide (XCZU9EG: 2,520 DSP48E2, "
            "274,080 LUTs, 912 BRAM36 = 32.1 Mb, no URAM); UG1182 ZCU102 user guide (PS DDR4 "
            "64-bit, 2400 MT/s = 19.2 GB/s); WP486 (2 INT8 MACs per DSP48E2); WP521 (4 INT4 MACs "
            "per DSP48E2); 200 MHz is a typical FINN/hls4ml clock on this part",
)

ZC706 = FPGAParams(
    name="Xilinx ZC706 (Zynq-7000 XC7Z045)",
    dsp=900, lut=218_600, bram36=545, clock_mhz=150.0, ddr_gbs=4.2,
    # DSP48E1 (25x18): packing two int8 products needs the 27-bit pre-adder of the DSP48E2, so we
    # assume one int8 MAC per DSP and two int4 MACs (our assumption)
    int8_macs_per_dsp=1.0, int4_macs_per_dsp=2.0,
    sources="Xilinx DS190 Zynq-7000 product selection guide (XC7Z045: 900 DSP48E1, 218,600 LUTs, "
            "545 BRAM36 = 19.2 Mb); UG954 ZC706 user guide (PS DDR3 32-bit at 1066 MT/s = "
            "4.26 GB/s); a board of the class HW-NAS-Bench's FPGA numbers refer to (as we read "
            "its paper; not checked against its simulator)",
)

PYNQ_Z2 = FPGAParams(
    name="TUL PYNQ-Z2 (Zynq-7000 XC7Z020)",
    dsp=220, lut=53_200, bram36=140, clock_mhz=100.0, ddr_gbs=2.1,
    int8_macs_per_dsp=1.0, int4_macs_per_dsp=2.0,
    sources="Xilinx DS190 (XC7Z020: 220 DSP48E1, 53,200 LUTs, 140 BRAM36 = 4.9 Mb); TUL PYNQ-Z2 "
            "reference manual (512 MB DDR3 16-bit at 1050 MT/s = 2.1 GB/s); 100 MHz is the PYNQ "
            "default fabric clock",
)

PRESETS: dict[str, Callable[[], Estimator]] = {
    "fpga-zcu102-est": lambda: FPGAEstimator(ZCU102, "fpga-zcu102-est"),
    "fpga-zc706-est": lambda: FPGAEstimator(ZC706, "fpga-zc706-est"),
    "fpga-pynq-z2-est": lambda: FPGAEstimator(PYNQ_Z2, "fpga-pynq-z2-est"),
}
