"""The layer list: a plain, serializable description of a network, shared by every package.

A search space describes an architecture as a list of :class:`Layer` records. FLOPs, parameter
counts, model size, BOPs, lookup-table latency predictors and the analytical device estimators
all read this list, so none of them needs torch. Convolutions are described as deployed: a
BatchNorm that follows a convolution is folded into it, which gives the convolution a bias.

Transformers are described on token sequences: a layer that works per token has ``in_h`` = the
number of tokens and ``in_w`` = 1, and its channels are the features of one token. ``linear``
applies to each of its ``in_h × in_w`` positions (1 × 1 for a classifier on a pooled vector).
``matmul`` is a product of two activations (attention scores Q·Kᵀ, attention × V), ``layernorm``
a per-token LayerNorm, ``softmax`` a row softmax and ``gelu`` the GELU activation as its own op
(not a fused activation: integer runtimes and accelerators treat it apart).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

#: Operation types a layer may have. New ops are appended (never inserted): predictors that
#: store feature columns per op kind (:mod:`hwnas.latency.predictors.features`) rely on the order.
OPS = ("conv", "linear", "avgpool", "add", "pool", "mul", "matmul", "layernorm", "softmax", "gelu")


@dataclass(frozen=True)
class Layer:
    """One layer of a network.

    ``name`` is the qualified module name in the extracted static model (for ``conv`` and
    ``linear``), so that per-layer settings such as quantization bit-widths join with the model.
    ``in_h``/``in_w`` are the input's spatial size; ``avgpool`` is a global average pool,
    ``pool`` a local ``kernel``×``kernel`` pool with ``stride`` (average unless
    ``extra["mode"] == "max"``; zero MACs; 'same' output size ``ceil(in / stride)``) and
    ``add`` a residual addition of two tensors of ``in_channels`` channels and ``mul`` the
    product of an ``in_channels``×H×W tensor with a per-channel scale (squeeze-and-excitation).

    ``matmul``: ``groups`` independent products (attention heads) of an ``in_h × K`` by a
    ``K × N`` activation, ``K = in_channels / groups`` and ``N = out_channels / groups``; so the
    first operand and the output are ``in_h`` rows of ``in_channels`` and ``out_channels``
    features, like any token-wise layer, and the second operand has
    ``in_channels × out_channels / groups`` elements (:attr:`second_operand`). Q·Kᵀ of ``h``
    heads of width ``d`` over ``n`` tokens is ``matmul(h·d → h·n, groups=h, in_h=n)``,
    attention × V is ``matmul(h·n → h·d, groups=h, in_h=n)``. Both operands are activations:
    a matmul has no weights. ``layernorm`` has ``2 × in_channels`` parameters (scale, shift;
    ``bias=True``), ``softmax`` and ``gelu`` none; all three are element-wise work without MACs.

    Examples:
        >>> from hwnas.supernet import Layer
        >>> conv = Layer("conv1", "conv", in_channels=3, out_channels=16, kernel=3, in_h=32, in_w=32)
        >>> conv.macs, conv.params
        (442368, 432)
    """

    name: str
    op: str
    in_channels: int
    out_channels: int
    kernel: int = 1
    stride: int = 1
    groups: int = 1
    in_h: int = 1
    in_w: int = 1
    bias: bool = False
    activation: str | None = None
    w_bits: int = 32
    a_bits: int = 32
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"layer {self.name!r}: unknown op {self.op!r}; expected one of {OPS}")
        if self.op in ("conv", "matmul") and (self.in_channels % self.groups
                                               or self.out_channels % self.groups):
            raise ValueError(
                f"layer {self.name!r}: channels {self.in_channels}->{self.out_channels} "
                f"are not divisible by groups={self.groups}"
            )

    @property
    def out_h(self) -> int:
        """Output height, with 'same' padding (kernel // 2) as every space here uses."""
        if self.op == "conv":
            return (self.in_h + 2 * (self.kernel // 2) - self.kernel) // self.stride + 1
        if self.op == "pool":
            return (self.in_h - 1) // self.stride + 1
        if self.op == "avgpool":
            return 1
        return self.in_h

    @property
    def out_w(self) -> int:
        if self.op == "conv":
            return (self.in_w + 2 * (self.kernel // 2) - self.kernel) // self.stride + 1
        if self.op == "pool":
            return (self.in_w - 1) // self.stride + 1
        if self.op == "avgpool":
            return 1
        return self.in_w

    @property
    def macs(self) -> int:
        """Multiply-accumulates of one forward pass of one image."""
        if self.op == "conv":
            per_out = (self.in_channels // self.groups) * self.kernel * self.kernel
            return self.out_h * self.out_w * self.out_channels * per_out
        if self.op == "linear":
            return self.in_h * self.in_w * self.in_channels * self.out_channels
        if self.op == "matmul":
            return self.in_h * self.in_w * (self.in_channels // self.groups) * self.out_channels
        return 0

    @property
    def second_operand(self) -> int:
        """Elements of a ``matmul``'s second (activation) operand per image; 0 for other ops."""
        if self.op == "matmul":
            return self.in_channels * self.out_channels // self.groups
        return 0

    @property
    def params(self) -> int:
        """Number of weights and biases (BatchNorm folded into the preceding conv)."""
        if self.op == "conv":
            w = self.out_channels * (self.in_channels // self.groups) * self.kernel * self.kernel
            return w + (self.out_channels if self.bias else 0)
        if self.op == "linear":
            return self.in_channels * self.out_channels + (self.out_channels if self.bias else 0)
        if self.op == "layernorm":
            return 2 * self.in_channels if self.bias else self.in_channels
        return 0

    @property
    def weight_count(self) -> int:
        """Number of weights without biases (biases stay at 32 bits when quantized; a
        LayerNorm's shift counts as a bias)."""
        if self.bias and self.op in ("conv", "linear", "layernorm"):
            return self.params - self.out_channels
        return self.params

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Layer:
        return cls(**d)

    def with_bits(self, w_bits: int, a_bits: int) -> Layer:
        return replace(self, w_bits=w_bits, a_bits=a_bits)


def total_macs(layers: list[Layer]) -> int:
    """Multiply-accumulates of a layer list (convolutions, linear layers and attention products).

    Examples:
        >>> from hwnas.supernet import get_space, total_macs
        >>> space = get_space("mbv3-tiny")
        >>> total_macs(space.layers(space.smallest()))
        187008
    """
    return sum(layer.macs for layer in layers)


def total_flops(layers: list[Layer]) -> int:
    """FLOPs counted as 2 × MACs (one multiply and one add), the convention of most profilers:
    attention's ``matmul`` counts, the element-wise ops (add, pooling, LayerNorm, softmax, GELU)
    do not; the estimators price those by their element counts.

    Examples:
        >>> from hwnas.supernet import get_space, total_flops
        >>> space = get_space("mbv3-tiny")
        >>> total_flops(space.layers(space.smallest()))
        374016
    """
    return 2 * total_macs(layers)


def total_params(layers: list[Layer]) -> int:
    """Parameters (weights and biases) of a layer list.

    Examples:
        >>> from hwnas.supernet import get_space, total_params
        >>> space = get_space("mbv3-tiny")
        >>> total_params(space.layers(space.smallest()))
        11754
    """
    return sum(layer.params for layer in layers)


def save_layers(layers: list[Layer], path: str | Path) -> None:
    Path(path).write_text(json.dumps([layer.to_dict() for layer in layers], indent=1))


def load_layers(path: str | Path) -> list[Layer]:
    return [Layer.from_dict(d) for d in json.loads(Path(path).read_text())]
