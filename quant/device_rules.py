"""Per-device quantization rules: which bit-widths a device executes natively and what it gains.

A policy's bit-widths are what the network *asks* for; what a device *does* with them differs,
and this module declares that as data (:data:`DEVICE_RULES`, one :class:`DeviceQuantRules` per
family) so that search, cost models and export ask one place:

* ``edgetpu``: int8 only (lower widths run and are stored as int8); a float layer and every
  layer after it run on the host CPU (:func:`effective_layers`).
* ``cpu-ort``: int8 or float per layer; weights below 8 bits run as int8 and are stored in int8
  unless the export packs them (:class:`DeviceQuantRules`). Whether int8 is faster than float is
  measured per CPU and layer (:func:`measure_int8_speedup`; ``benchmarks/export_ort.md``); with no
  measurement no gain is assumed, so float stays a valid per-layer choice.
* ``fpga``: every width 2-8 native, compute cost ``w_bits * a_bits`` (BOPs), weights packed.

This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from hwnas.quant.policy import FLOAT_BITS, PRODUCT_OP
from hwnas.supernet.layers import Layer

from hwnas.core.errors import UserError

__all__ = [
    "DEVICE_RULES",
    "DeviceQuantRules",
    "available_device_rules",
    "device_size_bytes",
    "effective_layers",
    "execution_bits",
    "get_device_rules",
    "layer_latency_fn",
    "measure_int8_speedup",
    "speed_factor",
    "storage_w_bits",
]

_QUANT_OPS = ("conv", "linear")


@dataclass(frozen=True)
class DeviceQuantRules:
    """How one device family executes and stores quantized layers.

    ``compute_bits``: integer widths the compute units have (ascending); a lower requested
    width runs at the next one up, a width above the largest runs in float.
    ``storage_bits``: widths weights are stored in (a lower width is stored in the next one up).
    On ``cpu-ort`` weights below 8 bits are stored in int8 containers unless the export packs
    them (ONNX int4 for 4 bits and lower, opset 21): pass ``replace(rules, storage_bits=(4, 8))``
    for a packed export; size then counts the packed width, speed still counts 8 (the
    QLinearConv/MatMulInteger kernels a QDQ graph runs as are int8).
    ``float_placement``: where a float layer runs — ``"device"``, or ``"host_after"`` (it and
    every later layer run on the host CPU, the Edge TPU compiler's single partition).
    ``speed_model``: ``"measured"`` (an integer layer's speed factor vs float is
    ``1 / int8_speedup[layer]``) or ``"bitops"`` (factor ``w*a / 32^2``: the FPGA's bit-serial
    or LUT arithmetic, where every width 2-8 is native).
    ``int8_speedup``: measured float-time / int8-time per layer name (or per
    :func:`layer_key`); ``default_int8_speedup`` for layers not in it.
    """

    name: str
    description: str
    compute_bits: tuple[int, ...]
    storage_bits: tuple[int, ...]
    float_placement: str = "device"
    speed_model: str = "measured"
    int8_speedup: Mapping[str, float] = field(default_factory=dict)
    default_int8_speedup: float = 1.0

    def __post_init__(self) -> None:
        if self.float_placement not in ("device", "host_after"):
            raise ValueError(f"float_placement must be 'device' or 'host_after', got {self.float_placement!r}")
        if self.speed_model not in ("measured", "bitops"):
            raise ValueError(f"speed_model must be 'measured' or 'bitops', got {self.speed_model!r}")
        for attr in ("compute_bits", "storage_bits"):
            values = getattr(self, attr)
            if not values or tuple(sorted(values)) != tuple(values):
                raise ValueError(f"{attr} must be a non-empty ascending tuple, got {values}")

    @property
    def native(self) -> list[tuple[int, int]]:
        """The (w_bits, a_bits) pairs that run as requested (float included where it runs on
        the device)."""
        pairs = [(w, a) for w in self.compute_bits for a in self.compute_bits]
        if self.float_placement == "device":
            pairs.append((FLOAT_BITS, FLOAT_BITS))
        return pairs

    def with_speedups(self, table: Mapping[str, float]) -> DeviceQuantRules:
        """A copy using a measured int8 speed-up table (merged over the existing one)."""
        for key, value in table.items():
            if not value > 0:
                raise UserError(f"int8 speed-up for {key!r} must be positive, got {value!r}")
        return replace(self, int8_speedup={**self.int8_speedup, **dict(table)})


def _round_up(bits: int, widths: tuple[int, ...]) -> int:
    if bits >= FLOAT_BITS:
        return FLOAT_BITS
    for width in widths:
        if width >= bits:
            return width
    return FLOAT_BITS


def execution_bits(rules: DeviceQuantRules, w_bits: int, a_bits: int) -> tuple[int, int]:
    """The (w, a) widths the device computes with when ``(w_bits, a_bits)`` is requested.

    A float weight or activation makes the whole layer float on devices without mixed
    float/integer kernels (every rule set here except ``bitops`` devices).
    """
    w, a = _round_up(w_bits, rules.compute_bits), _round_up(a_bits, rules.compute_bits)
    if rules.speed_model != "bitops" and FLOAT_BITS in (w, a):
        return FLOAT_BITS, FLOAT_BITS
    return w, a


def storage_w_bits(rules: DeviceQuantRules, w_bits: int) -> int:
    """Bits per stored weight on the device for a requested ``w_bits``."""
    return _round_up(w_bits, rules.storage_bits)


def layer_key(layer: Layer) -> str:
    """A shape key for measured tables shared between layers of the same shape."""
    return (f"{layer.op}:{layer.in_channels}x{layer.out_channels}:k{layer.kernel}:s{layer.stride}"
            f":g{layer.groups}:{layer.in_h}x{layer.in_w}")


def effective_layers(layers: list[Layer], rules: DeviceQuantRules) -> list[Layer]:
    """The layer list as the device runs it: conv/linear ``w_bits``/``a_bits`` (and a quantized
    attention product's operand widths) replaced by the execution widths; ``extra`` gains ``placement`` ("device" or "host"), ``storage_w_bits``
    and ``requested_bits``. Latency estimators read this instead of the requested widths.

    ``"host_after"`` placement is the Edge TPU compiler's: it maps ops in order and, at the
    first op it cannot map (a float layer), hands that op *and every op after it* to the host
    CPU (one partition), so one float layer early in the network moves the rest of it to the host.

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> int8 = apply_to_layers(uniform(layers, 8, 8), layers)
        >>> from hwnas.quant import effective_layers, get_device_rules
        >>> four = apply_to_layers(uniform(layers, 4, 8), layers)
        >>> effective_layers(four, get_device_rules("edgetpu"))[1].w_bits   # runs as int8 there
        8
    """
    out: list[Layer] = []
    on_host = False
    for layer in layers:
        extra = dict(layer.extra)
        if layer.op in _QUANT_OPS:
            w, a = execution_bits(rules, layer.w_bits, layer.a_bits)
            if (w, a) == (FLOAT_BITS, FLOAT_BITS) and rules.float_placement == "host_after":
                on_host = True
            extra.update(requested_bits=[layer.w_bits, layer.a_bits],
                         storage_w_bits=storage_w_bits(rules, layer.w_bits))
            extra["placement"] = "host" if on_host else "device"
            out.append(replace(layer, w_bits=w, a_bits=a, extra=extra))
        elif layer.op == PRODUCT_OP and layer.a_bits < FLOAT_BITS:
            # a product of two activations quantized with the layer it follows: both operands
            # at the width the device executes that layer's activations
            _, a = execution_bits(rules, layer.a_bits, layer.a_bits)
            extra.update(requested_bits=[layer.w_bits, layer.a_bits])
            extra["placement"] = "host" if on_host else "device"
            out.append(replace(layer, w_bits=a, a_bits=a, extra=extra))
        else:
            extra["placement"] = "host" if on_host else "device"
            out.append(replace(layer, extra=extra))
    return out


def device_size_bytes(layers: list[Layer], rules: DeviceQuantRules) -> int:
    """Model size on the device: weights at their storage width, biases at 32 bits.

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> int8 = apply_to_layers(uniform(layers, 8, 8), layers)
        >>> from hwnas.quant import device_size_bytes, get_device_rules
        >>> four = apply_to_layers(uniform(layers, 4, 8), layers)
        >>> device_size_bytes(four, get_device_rules("edgetpu")) == device_size_bytes(int8, get_device_rules("edgetpu"))
        True
    """
    bits = 0
    for layer in layers:
        bits += layer.weight_count * storage_w_bits(rules, layer.w_bits)
        bits += (layer.params - layer.weight_count) * 32
    return (bits + 7) // 8


def speed_factor(layer: Layer, rules: DeviceQuantRules) -> float:
    """Latency of ``layer`` at its bit-widths relative to the same layer in float on the device
    (< 1 = faster). ``layer`` holds requested widths; they are mapped to execution widths.

    Under ``"measured"`` an int8 layer's factor comes from ``rules.int8_speedup`` (filled by
    :func:`measure_int8_speedup`, e.g. with :class:`hwnas.export.layer_timer.OrtLayerTimer`);
    without a measurement it is ``default_int8_speedup`` = 1.0: no gain assumed, because
    onnxruntime's int8 can be slower than float (``benchmarks/export_ort.md``)."""
    if layer.op not in _QUANT_OPS:
        return 1.0
    w, a = execution_bits(rules, layer.w_bits, layer.a_bits)
    if rules.speed_model == "bitops":
        return (w * a) / float(FLOAT_BITS * FLOAT_BITS)
    if (w, a) == (FLOAT_BITS, FLOAT_BITS):
        return 1.0
    speedup = rules.int8_speedup.get(layer.name, rules.int8_speedup.get(layer_key(layer),
                                                                          rules.default_int8_speedup))
    return 1.0 / float(speedup)


def layer_latency_fn(rules: DeviceQuantRules, float_latency: Callable[[Layer], float]
                     ) -> Callable[[Layer], float]:
    """A per-layer cost for :func:`hwnas.quant.allocate.allocate`: the layer's float latency on the
    device (from a measured table or an estimator) times its :func:`speed_factor`.

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> int8 = apply_to_layers(uniform(layers, 8, 8), layers)
        >>> from hwnas.quant import get_device_rules, layer_latency_fn
        >>> cost = layer_latency_fn(get_device_rules("cpu-ort"), lambda layer: 1e-6 * layer.macs)
        >>> cost(int8[1]) > 0
        True
    """
    def cost(layer: Layer) -> float:
        return float(float_latency(layer)) * speed_factor(layer, rules)
    return cost


def measure_int8_speedup(layers: Iterable[Layer], timer: Callable[[Layer, bool], float], *,
                         by: str = "name", progress: bool = False) -> dict[str, float]:
    """Measure float-time / int8-time for each conv/linear layer with ``timer(layer, int8)``
    (milliseconds). Returns a table for :meth:`DeviceQuantRules.with_speedups`, keyed by layer
    name (``by="name"``) or shape key (``by="shape"``, layers of one shape measured once).

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> int8 = apply_to_layers(uniform(layers, 8, 8), layers)
        >>> from hwnas.quant import measure_int8_speedup
        >>> def timer(layer, int8):            # ms; hwnas.export.OrtLayerTimer() times it for real
        ...     return 1.0 if int8 else 2.0
        >>> table = measure_int8_speedup(layers[:2], timer)
        >>> table[layers[1].name]
        2.0
    """
    if by not in ("name", "shape"):
        raise UserError(f"measure_int8_speedup: by must be 'name' or 'shape', got {by!r}")
    from tqdm.auto import tqdm

    todo = [layer for layer in layers if layer.op in _QUANT_OPS]
    table: dict[str, float] = {}
    by_shape: dict[str, float] = {}
    for layer in tqdm(todo, desc="int8 speed-up", disable=not progress, leave=False):
        key = layer_key(layer)
        if key not in by_shape:
            t_float, t_int8 = float(timer(layer, False)), float(timer(layer, True))
            if t_float <= 0 or t_int8 <= 0:
                raise UserError(f"timer returned a non-positive time for layer {layer.name!r}")
            by_shape[key] = t_float / t_int8
        table[layer.name if by == "name" else key] = by_shape[key]
    return table


DEVICE_RULES: dict[str, DeviceQuantRules] = {
    "edgetpu": DeviceQuantRules(
        "edgetpu", "Coral Edge TPU: int8 only; lower widths run and are stored as int8; a float "
        "layer and everything after it run on the host CPU",
        compute_bits=(8,), storage_bits=(8,), float_placement="host_after", speed_model="measured"),
    "cpu-ort": DeviceQuantRules(
        "cpu-ort", "onnxruntime on a CPU: int8 or float per layer; weights below 8 bits stored "
        "in int8 containers (size gain only if the export packs them); int8 speed-up measured",
        compute_bits=(8,), storage_bits=(8,), float_placement="device", speed_model="measured"),
    "fpga": DeviceQuantRules(
        "fpga", "FPGA accelerator: every width 2-8 native, compute cost proportional to "
        "w_bits * a_bits, weights packed at their true width",
        compute_bits=(2, 3, 4, 6, 8), storage_bits=(2, 3, 4, 6, 8), float_placement="device",
        speed_model="bitops"),
}


def available_device_rules() -> list[str]:
    return sorted(DEVICE_RULES)


def get_device_rules(name: str) -> DeviceQuantRules:
    """The rules of a device family by name (UserError for an unknown one).

    Examples:
        >>> from hwnas.quant import get_device_rules
        >>> rules = get_device_rules("edgetpu")
        >>> rules.name, 8 in rules.compute_bits
        ('edgetpu', True)
    """
    if name not in DEVICE_RULES:
        raise UserError(f"unknown device family {name!r} for quantization rules; expected one of "
                        f"{', '.join(available_device_rules())}")
    return DEVICE_RULES[name]
