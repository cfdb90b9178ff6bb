"""What the analytical estimators share: the :class:`Estimator` interface, the per-layer
:class:`LayerCost` / :class:`Breakdown` records, layer-shape helpers and parameter checks.

Its own module so that :mod:`~hwnas.latency.estimators.fpga`, ``edgetpu`` and ``roofline``
import it without importing the package face, which registers them (no circle).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from hwnas.supernet.layers import Layer

from hwnas.core.errors import UserError

__all__ = [
    "Breakdown",
    "ELEMENTWISE_OPS",
    "Estimator",
    "LayerCost",
    "check_fraction",
    "check_positive",
    "in_elems",
    "layer_kind",
    "out_elems",
    "vector_ops",
]


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerCost:
    """The estimated time of one layer.

    ``bound`` says what limits it (``"compute"``, ``"memory"``, ``"overhead"``, ``"stream"``,
    ...), ``where`` the unit that runs it (``"accelerator"`` or ``"host"``).
    """

    name: str
    op: str
    ms: float
    bound: str
    where: str = "accelerator"


@dataclass(frozen=True)
class Breakdown:
    """An estimate with its parts: ``total_ms`` and the per-layer costs, plus whole-network
    ``terms`` in ms (e.g. ``{"compute": .., "param_stream": .., "io": ..}``) that sum (or, for
    throughput-style estimates, combine as documented by the estimator) to ``total_ms``."""

    total_ms: float
    layers: list[LayerCost] = field(default_factory=list)
    terms: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# layer helpers (shared by the estimators)
# --------------------------------------------------------------------------------------------


def layer_kind(layer: Layer) -> str:
    """A finer op class than ``layer.op``, for per-op efficiencies.

    ``conv`` splits into ``depthwise`` (groups == in == out channels), ``grouped`` (other
    groups > 1), ``pointwise`` (1×1) and ``conv`` (dense k×k); ``avgpool`` is ``global_pool``;
    the other ops (``linear``, ``add``, ``pool``, ``mul``, ``matmul``, ``layernorm``,
    ``softmax``, ``gelu``) keep their name, except a ``linear`` layer applied to several
    tokens, which is ``pointwise`` (the same matrix product as a 1×1 convolution).
    """
    if layer.op == "conv":
        if layer.groups > 1 and layer.groups == layer.in_channels == layer.out_channels:
            return "depthwise"
        if layer.groups > 1:
            return "grouped"
        return "pointwise" if layer.kernel == 1 else "conv"
    if layer.op == "avgpool":
        return "global_pool"
    if layer.op == "linear" and layer.in_h * layer.in_w > 1:
        return "pointwise"  # a linear layer applied to every token is a 1×1 convolution's GEMM
    return layer.op


def in_elems(layer: Layer) -> int:
    """Elements read from the layer's input tensor(s) per image (an ``add`` of two tensors
    reads two, a ``matmul`` reads both of its activation operands)."""
    n = layer.in_channels * layer.in_h * layer.in_w
    if layer.op == "add":
        return 2 * n
    return n + layer.second_operand


def out_elems(layer: Layer) -> int:
    """Elements of the layer's output tensor per image (a ``linear`` layer has one output
    vector per token, ``in_h × in_w`` of them; 1 for a classifier)."""
    return layer.out_channels * layer.out_h * layer.out_w


#: Arithmetic operations per element of the transformer's element-wise ops, counting one
#: transcendental function (exp, erf) as :data:`TRANSCENDENTAL_OPS` operations (our assumption:
#: roughly a range reduction plus a degree-5 polynomial, the usual vectorised evaluation).
#: ``layernorm``: mean (1), variance (3), normalise (2), scale and shift (2); ``softmax``: max,
#: subtract, exp, sum, scale by the reciprocal; ``gelu`` (``x/2 · (1 + erf(x/√2))``): 3
#: multiplies, 1 add and the erf. Our own counts.
TRANSCENDENTAL_OPS = 10
ELEMENTWISE_OPS = {"layernorm": 8, "softmax": 4 + TRANSCENDENTAL_OPS,
                   "gelu": 4 + TRANSCENDENTAL_OPS}


def vector_ops(layer: Layer) -> int:
    """Arithmetic of the layers without MACs: one add per output element for ``add``, k² per
    output element for a local ``pool``, one per input element for a global pool, and
    :data:`ELEMENTWISE_OPS` per element for ``layernorm``, ``softmax`` and ``gelu``; 0 otherwise
    (``mul``, and the layers with MACs, whose cost is 2 × MACs)."""
    if layer.op == "add":
        return out_elems(layer)
    if layer.op == "pool":
        return out_elems(layer) * layer.kernel * layer.kernel
    if layer.op == "avgpool":
        return layer.in_channels * layer.in_h * layer.in_w
    if layer.op in ELEMENTWISE_OPS:
        return ELEMENTWISE_OPS[layer.op] * out_elems(layer)
    return 0


def check_positive(owner: str, **values: float) -> None:
    """Raise :class:`UserError` naming the first value that is not a positive finite number."""
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise UserError(f"{owner}: {key} must be a positive number, got {value!r}")
        if not np.isfinite(value) or value <= 0:
            raise UserError(f"{owner}: {key} must be a positive number, got {value!r}")


def check_fraction(owner: str, **values: float) -> None:
    """Raise :class:`UserError` unless each value is in (0, 1]."""
    check_positive(owner, **values)
    for key, value in values.items():
        if value > 1:
            raise UserError(f"{owner}: {key} must be in (0, 1], got {value!r}")


# --------------------------------------------------------------------------------------------
# interface
# --------------------------------------------------------------------------------------------


class Estimator(ABC):
    """Latency (ms per image, batch 1) of a network on a modelled device, from its layer list.

    Subclasses hold their device description in a frozen dataclass ``params`` (so a variant is
    ``type(est)(dataclasses.replace(est.params, clock_mhz=300))``) and implement
    :meth:`breakdown`. Estimates are deterministic: the same layers give the same number.
    """

    #: Registry name of the estimator (the device name, e.g. ``"fpga-zcu102-est"``).
    name: str
    #: One line saying what is modelled.
    description: str
    #: Name of the device's quantization rules (:data:`hwnas.quant.device_rules.DEVICE_RULES`).
    quant_rules: str = "cpu-ort"

    @abstractmethod
    def breakdown(self, layers: Sequence[Layer]) -> Breakdown:
        """The estimate with its per-layer and whole-network parts."""

    def estimate(self, layers: Sequence[Layer]) -> float:
        """Estimated latency in ms of one forward pass of one image."""
        return float(self.breakdown(layers).total_ms)

    def estimate_many(self, networks: Sequence[Sequence[Layer]]) -> np.ndarray:
        """:meth:`estimate` for each layer list, as a float64 array."""
        return np.asarray([self.estimate(layers) for layers in networks], dtype=np.float64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
