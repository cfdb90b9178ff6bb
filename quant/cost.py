"""Hardware cost models computed from the layer list (no torch): model size, BOPs, per-layer costs.

Both read the per-layer ``w_bits``/``a_bits`` of :class:`hwnas.supernet.layers.Layer` (32 = float), so
they price a quantized network as well as a float one. Biases are counted at 32 bits, as
integer runtimes keep them in int32.
"""

from __future__ import annotations

from hwnas.supernet.layers import Layer


def model_size_bytes(layers: list[Layer]) -> int:
    """Bytes needed to store the weights (at their bit-widths, packed) and the 32-bit biases.

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> int8 = apply_to_layers(uniform(layers, 8, 8), layers)
        >>> from hwnas.quant import model_size_bytes
        >>> model_size_bytes(layers), model_size_bytes(int8)      # float, then int8
        (47016, 13032)
    """
    bits = 0
    for layer in layers:
        bits += layer.weight_count * layer.w_bits
        bits += (layer.params - layer.weight_count) * 32
    return (bits + 7) // 8


def bops(layers: list[Layer]) -> int:
    """Bit operations: MACs × weight bits × activation bits, summed over layers (the usual
    hardware-agnostic cost of mixed-precision networks).

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> int8 = apply_to_layers(uniform(layers, 8, 8), layers)
        >>> from hwnas.quant import bops
        >>> bops(int8)         # MACs x 8 x 8
        11968512
    """
    return sum(layer.macs * layer.w_bits * layer.a_bits for layer in layers)


#: Names of the built-in per-layer costs (see :func:`layer_cost`).
COST_KINDS = ("size", "bops")


def layer_size_bits(layer: Layer) -> int:
    """Storage bits of one layer: weights at ``w_bits`` (packed) plus 32-bit biases."""
    return layer.weight_count * layer.w_bits + (layer.params - layer.weight_count) * 32


def layer_cost(layer: Layer, kind: str = "size") -> float:
    """The cost of one layer at its bit-widths: ``"size"`` in bytes (fractional, so that a sum
    over layers equals :func:`model_size_bytes` up to its final rounding) or ``"bops"``.

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> int8 = apply_to_layers(uniform(layers, 8, 8), layers)
        >>> from hwnas.quant import layer_cost
        >>> layer_cost(int8[0], "size")       # bytes of the first conv's int8 weights and biases
        208.0
    """
    if kind == "size":
        return layer_size_bits(layer) / 8.0
    if kind == "bops":
        return float(layer.macs * layer.w_bits * layer.a_bits)
    raise ValueError(f"unknown cost kind {kind!r}; expected one of {COST_KINDS}")


def weight_bits_budget_bytes(layers: list[Layer], avg_weight_bits: float) -> float:
    """The model size in bytes at which the conv/linear weights average ``avg_weight_bits``
    (biases at 32 bits): the size budget that "about N average weight bits" means.

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> int8 = apply_to_layers(uniform(layers, 8, 8), layers)
        >>> from hwnas.quant import weight_bits_budget_bytes
        >>> weight_bits_budget_bytes(layers, 6)   # the size at 6 weight bits on average
        10200.0
    """
    weights = sum(layer.weight_count for layer in layers if layer.op in ("conv", "linear"))
    biases = sum(layer.params - layer.weight_count for layer in layers)
    return (weights * avg_weight_bits + biases * 32) / 8.0
