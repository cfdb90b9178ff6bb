"""QuantPolicy: layer name -> (weight bits, activation bits), the unit the search optimises.

A policy names the quantizable layers of a network (every ``nn.Conv2d`` and ``nn.Linear``, by
qualified module name, which is also the :class:`hwnas.supernet.layers.Layer` name), so the same
object prices a network through the layer list (:func:`apply_to_layers` + :mod:`hwnas.quant.cost`)
and quantizes the torch model (:func:`hwnas.quant.ptq.quantize_model`). ``a_bits`` of layer L is the
bit-width of L's *input* activation; 32 means float.

This module does not import torch: search and the latency predictors use policies without it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwnas.core.errors import UserError

#: Bit-widths a layer may use; 32 = float (not quantized).
SUPPORTED_BITS: tuple[int, ...] = (2, 3, 4, 6, 8, 32)
FLOAT_BITS = 32
POLICY_FORMAT = "hwnas-quant-policy-1"
_QUANT_OPS = ("conv", "linear")
#: layer-list op of a product of two activations (attention): not a policy layer, its inputs
#: follow the activation bits of the layer before it (:func:`product_sources`)
PRODUCT_OP = "matmul"

__all__ = [
    "FLOAT_BITS",
    "SUPPORTED_BITS",
    "QuantPolicy",
    "apply_to_layers",
    "average_weight_bits",
    "check_bits",
    "first_last_8bit",
    "layer_names_of",
    "product_sources",
    "uniform",
]


def check_bits(value: Any, what: str, layer: str) -> int:
    """``value`` as an int if it is a supported bit-width, else a UserError naming the layer."""
    allowed = ", ".join(str(b) for b in SUPPORTED_BITS)
    if isinstance(value, bool) or not isinstance(value, int) or value not in SUPPORTED_BITS:
        raise UserError(
            f"quant policy: layer {layer!r} has {what} bits {value!r}; expected one of {allowed} "
            f"(32 = float)"
        )
    return int(value)


@dataclass
class QuantPolicy:
    """Per-layer bit-widths. ``bits`` keeps insertion order (the model's layer order when built
    by :func:`uniform`), which :func:`first_last_8bit` relies on.

    Examples:
        >>> from hwnas.quant import QuantPolicy
        >>> policy = QuantPolicy({"stem_conv": (8, 8), "classifier": (4, 8)})
        >>> policy.bits["classifier"]
        (4, 8)
    """

    bits: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.bits, Mapping):
            raise UserError(f"quant policy must map layer names to (w_bits, a_bits), got "
                            f"{type(self.bits).__name__}")
        clean: dict[str, tuple[int, int]] = {}
        for name, pair in self.bits.items():
            if not isinstance(name, str) or not name:
                raise UserError(f"quant policy: layer names must be non-empty strings, got {name!r}")
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise UserError(f"quant policy: layer {name!r} needs a (w_bits, a_bits) pair, "
                                f"got {pair!r}")
            clean[name] = (check_bits(pair[0], "weight", name), check_bits(pair[1], "activation", name))
        self.bits = clean

    # -- access ----------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> tuple[int, int]:
        return self.bits[name]

    def __contains__(self, name: object) -> bool:
        return name in self.bits

    def __len__(self) -> int:
        return len(self.bits)

    @property
    def layer_names(self) -> list[str]:
        return list(self.bits)

    def with_bits(self, changes: Mapping[str, tuple[int, int]]) -> QuantPolicy:
        """A copy with the layers in ``changes`` set to the given pairs."""
        return QuantPolicy({**self.bits, **dict(changes)})

    # -- validation ------------------------------------------------------------------------------
    def validate(self, model_or_names: Any) -> QuantPolicy:
        """Check that the policy covers exactly the quantizable layers of ``model_or_names`` (an
        ``nn.Module``, a layer list, or layer names) with supported bit-widths. Raises UserError
        naming the first unsupported width, unknown layer or missing layer; returns ``self``."""
        names = layer_names_of(model_or_names)
        known = set(names)
        for name, (w, a) in self.bits.items():  # again: ``bits`` may have been edited in place
            check_bits(w, "weight", name)
            check_bits(a, "activation", name)
        for name in self.bits:
            if name not in known:
                shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
                raise UserError(
                    f"quant policy names layer {name!r}, which the model does not have; its "
                    f"quantizable (Conv2d/Linear) layers are: {shown or 'none'}"
                )
        for name in names:
            if name not in self.bits:
                raise UserError(
                    f"quant policy has no bit-widths for layer {name!r} of the model; every "
                    f"Conv2d/Linear layer needs (w_bits, a_bits) (use 32 to keep it float)"
                )
        return self

    # -- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": POLICY_FORMAT,
            "layers": {n: {"w_bits": w, "a_bits": a} for n, (w, a) in self.bits.items()},
        }

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "quant policy") -> QuantPolicy:
        if not isinstance(d, Mapping) or d.get("format") != POLICY_FORMAT or not isinstance(
                d.get("layers"), Mapping):
            raise UserError(f"{source} is not an hwnas quant policy: expected a JSON object with "
                            f"\"format\": \"{POLICY_FORMAT}\" and a \"layers\" object")
        bits: dict[str, tuple[int, int]] = {}
        for name, entry in d["layers"].items():
            if not isinstance(entry, Mapping) or "w_bits" not in entry or "a_bits" not in entry:
                raise UserError(f"{source}: layer {name!r} needs \"w_bits\" and \"a_bits\", got "
                                f"{entry!r}")
            bits[name] = (entry["w_bits"], entry["a_bits"])
        return cls(bits)

    def to_json(self, path: str | Path) -> Path:
        """Write the policy as JSON to ``path`` (atomically: tmp file + rename)."""
        from hwnas.core.io import write_atomic

        return write_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> QuantPolicy:
        """Read a policy written by :meth:`to_json`; UserError for a missing or malformed file."""
        path = Path(path)
        if not path.is_file():
            raise UserError(f"quant policy file {path} does not exist")
        try:
            d = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"quant policy file {path} is not valid JSON: {exc}") from None
        return cls.from_dict(d, source=f"quant policy file {path}")


def quantizable_layer_names(model: Any) -> list[str]:
    """Qualified names of the layers a policy covers: every ``nn.Conv2d`` and ``nn.Linear`` of
    an ``nn.Module`` (quantized ones included), in module order. (Here, not in ``fake_quant``,
    which imports this module: torch is imported only when a model is given.)"""
    from torch import nn

    return [name for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


def layer_names_of(model_or_names: Any) -> list[str]:
    """Names of the quantizable layers of an ``nn.Module`` (Conv2d/Linear), of a layer list
    (``conv``/``linear`` layers), or a list of names, in order."""
    if hasattr(model_or_names, "named_modules"):
        return quantizable_layer_names(model_or_names)
    if isinstance(model_or_names, QuantPolicy):
        return model_or_names.layer_names
    items = list(model_or_names)
    names = []
    for item in items:
        if isinstance(item, str):
            names.append(item)
        elif hasattr(item, "op") and hasattr(item, "name"):
            if item.op in _QUANT_OPS:
                names.append(item.name)
        else:
            raise UserError(f"expected a model, a layer list or layer names, got an item of type "
                            f"{type(item).__name__}")
    return names


def uniform(model_or_layer_names: Any, w_bits: int, a_bits: int) -> QuantPolicy:
    """Every quantizable layer at ``(w_bits, a_bits)``.

    Examples:
        >>> from hwnas.quant import uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> policy = uniform([l.name for l in space.layers(space.smallest()) if l.op in ("conv", "linear")], 4, 8)
        >>> len(policy.bits), policy.bits["stem_conv"]
        (12, (4, 8))
    """
    names = layer_names_of(model_or_layer_names)
    if not names:
        raise UserError("cannot build a quant policy: the model has no Conv2d/Linear layers")
    return QuantPolicy({n: (w_bits, a_bits) for n in names})


def first_last_8bit(policy: QuantPolicy) -> QuantPolicy:
    """A copy with the first and the last layer (in the policy's order: the stem conv and the
    classifier for a policy built from a model) at 8/8 bits, the usual guard for the two most
    sensitive layers.

    Examples:
        >>> from hwnas.quant import first_last_8bit, uniform
        >>> policy = first_last_8bit(uniform(["stem", "block", "head"], 4, 8))
        >>> [policy.bits[n] for n in ("stem", "block", "head")]
        [(8, 8), (4, 8), (8, 8)]
    """
    names = policy.layer_names
    if not names:
        return QuantPolicy({})
    return policy.with_bits({names[0]: (8, 8), names[-1]: (8, 8)})


def product_sources(items: Any) -> dict[str, str]:
    """``{product: policy layer}``: the layer whose activation bits each product of two
    activations (attention's Q·Kᵀ and attention × V) takes for both of its inputs.

    A product has no weights, so it gets no bit-widths of its own in a policy (which would
    change the layer set of every stored policy and search); it follows the nearest
    quantizable layer before it, in a transformer block the Q/K/V projection that computed
    its operands. ``items``: ``(name, op)`` pairs in network order (``op`` conv | linear |
    matmul | anything else), a layer list, or :class:`Layer`-like records."""
    out: dict[str, str] = {}
    last: str | None = None
    for item in items:
        name, op = (item.name, item.op) if hasattr(item, "op") else item
        if op in _QUANT_OPS:
            last = name
        elif op == PRODUCT_OP and last is not None:
            out[name] = last
    return out


def apply_to_layers(policy: QuantPolicy, layers: list) -> list:
    """The layer list with each conv/linear layer's ``w_bits``/``a_bits`` set from ``policy``.

    Joins on ``Layer.name``; the policy must cover exactly the conv/linear layers (UserError
    otherwise). A product of two activations (``matmul``) takes the activation bits of the
    layer it follows (:func:`product_sources`) for both operands, as the fake-quant model and
    the QDQ export quantize it. Other layers (add, pool, LayerNorm) are returned unchanged. The
    result prices the policy with :mod:`hwnas.quant.cost`.

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> quantized = apply_to_layers(uniform(layers, 4, 8), layers)
        >>> quantized[0].w_bits, quantized[0].a_bits, layers[0].w_bits
        (4, 8, 32)
    """
    policy.validate(layers)
    follows = product_sources(layers)
    out = []
    for layer in layers:
        if layer.op in _QUANT_OPS:
            layer = layer.with_bits(*policy[layer.name])
        elif layer.name in follows:
            a_bits = policy[follows[layer.name]][1]
            layer = layer.with_bits(a_bits, a_bits)
        out.append(layer)
    return out


def average_weight_bits(policy: QuantPolicy, layers: list) -> float:
    """Mean weight bit-width over all weights of ``layers`` (weighted by each layer's weight
    count; float layers count 32).

    Examples:
        >>> from hwnas.quant import average_weight_bits, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> average_weight_bits(uniform(layers, 6, 8), layers)
        6.0
    """
    quantized = [layer for layer in apply_to_layers(policy, layers) if layer.op in _QUANT_OPS]
    total = sum(layer.weight_count for layer in quantized)
    if total == 0:
        raise UserError("average weight bits: the layer list has no conv/linear weights")
    return sum(layer.weight_count * layer.w_bits for layer in quantized) / total
