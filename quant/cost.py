"""Hardware cost models computed from the layer list (no torch): model size and BOPs.

Both read the per-layer ``w_bits``/``a_bits`` of :class:`supernet.layers.Layer` (32 = float), so
they price a quantized network as well as a float one. Biases are counted at 32 bits, as
integer runtimes keep them in int32.
"""

from __future__ import annotations

from supernet.layers import Layer


def model_size_bytes(layers: list[Layer]) -> int:
    """Bytes needed to store the weights (at their bit-widths, packed) and the 32-bit biases."""
    bits = 0
    for layer in layers:
        bits += layer.weight_count * layer.w_bits
        bits += (layer.params - layer.weight_count) * 32
    return (bits + 7) // 8


def bops(layers: list[Layer]) -> int:
    """Bit operations: MACs × weight bits × activation bits, summed over layers (the usual
    hardware-agnostic cost of mixed-precision networks)."""
    return sum(layer.macs * layer.w_bits * layer.a_bits for layer in layers)
