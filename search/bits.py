"""The quantization-policy half of the joint search: per-group weight bit-widths.

Searching one bit-width per layer would give hundreds of dimensions (the nb201 space has 98
convolutions); layers are grouped instead by the block or cell they belong to
(:func:`layer_group`), and one weight width is searched per group, over
:data:`DEFAULT_BIT_CHOICES` (32 = float). Activations feeding a quantized layer run at 8 bits
(the integer runtimes' width); a float layer keeps float activations. The parameters cover every
group of the largest architecture, so the search space is static (:func:`suggest_group_bits`).

:class:`ArchBitsSpace` holds the joint candidates (architecture, group widths) for samplers that
reason about candidates (the screening sampler). :func:`sensitivity_seeds` seeds the search from
the largest subnet's Hessian sensitivity. This module imports torch only inside
:func:`sensitivity_seeds`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hwnas.quant.policy import FLOAT_BITS, SUPPORTED_BITS, QuantPolicy
from hwnas.supernet.space import SearchSpace

from hwnas.core.errors import UserError

#: weight widths searched by default (32 = the layer stays float)
DEFAULT_BIT_CHOICES: tuple[int, ...] = (4, 6, 8, 32)
#: activation width of every quantized layer
ACTIVATION_BITS = 8
PARAM_PREFIX = "bits:"
_QUANT_OPS = ("conv", "linear")


def layer_group(name: str) -> str:
    """The group of a layer: ``<container>.<index>`` for layers inside an indexed block or cell,
    else the first component of the name (``blocks.3.dw_conv`` -> ``blocks.3``, ``stem_conv`` ->
    ``stem_conv``)."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[1].isdigit():
        return ".".join(parts[:2])
    return parts[0]


def check_bit_choices(choices: Sequence[int]) -> tuple[int, ...]:
    out = tuple(sorted({int(b) for b in choices}))
    bad = [b for b in out if b not in SUPPORTED_BITS]
    if not out or bad:
        raise UserError(f"bit choices {list(choices)}: expected a non-empty subset of "
                        f"{list(SUPPORTED_BITS)} (32 = float)")
    return out


def bit_groups(space: SearchSpace) -> list[str]:
    """The groups of the space, in network order (from the largest architecture)."""
    groups: list[str] = []
    for layer in space.layers(space.largest()):
        if layer.op in _QUANT_OPS:
            g = layer_group(layer.name)
            if g not in groups:
                groups.append(g)
    return groups


def suggest_group_bits(trial: Any, groups: Sequence[str], choices: Sequence[int]) -> dict[str, int]:
    """One categorical parameter ``bits:<group>`` per group.

    ``groups`` is always *every* group of the space's largest architecture (:func:`bit_groups`),
    so the search space is static, which Optuna's multivariate TPE and NSGA-II need; groups that
    an architecture does not have are ignored for it."""
    return {g: int(trial.suggest_categorical(PARAM_PREFIX + g, list(choices))) for g in groups}


def group_params(group_bits: Mapping[str, int]) -> dict[str, int]:
    """Trial parameters that make :func:`suggest_group_bits` return ``group_bits`` (enqueue)."""
    return {PARAM_PREFIX + g: int(b) for g, b in group_bits.items()}


def policy_for(space: SearchSpace, arch: Any, group_bits: Mapping[str, int]) -> QuantPolicy | None:
    """The per-layer policy of ``arch`` under ``group_bits``; ``None`` when every layer is
    float (a float model, stored as an empty policy)."""
    bits: dict[str, tuple[int, int]] = {}
    for layer in space.layers(arch):
        if layer.op not in _QUANT_OPS:
            continue
        group = layer_group(layer.name)
        if group not in group_bits:
            raise UserError(f"no bit-width for layer group {group!r} of {space.name}; "
                            f"groups given: {sorted(group_bits)}")
        w = int(group_bits[group])
        bits[layer.name] = (w, ACTIVATION_BITS if w < FLOAT_BITS else FLOAT_BITS)
    if all(w == FLOAT_BITS for w, _ in bits.values()):
        return None
    return QuantPolicy(bits)


@dataclass(frozen=True)
class ArchBits:
    """A candidate of the joint search: an architecture and one weight width per layer group
    (``bits[i]`` for ``ArchBitsSpace.groups[i]``, every group of the space, used or not)."""

    arch: Any
    bits: tuple[int, ...]

    def group_bits(self, groups: Sequence[str]) -> dict[str, int]:
        return dict(zip(groups, self.bits))


class ArchBitsSpace:
    """The joint candidates (architecture x group bit-widths) of a search that searches bits,
    with the part of the :class:`~supernet.space.SearchSpace` interface that samplers reading
    candidates use (:class:`hwnas.search.screening.ScreeningSampler`): ``suggest`` (the very
    parameters the search's objective suggests: the space's, then ``bits:<group>``),
    ``to_params``, ``sample``, ``to_string`` / ``from_string`` and ``encode``.

    * ``to_string``: ``<arch string> @ <group>=<bits>,...`` over the groups the architecture
      has — candidates that differ only in the widths of absent groups are one model.
    * ``encode``: the space's encoding, then per group its quantization-noise scale
      ``2^-bits`` (float: 2^-32; a group the architecture lacks: 0, it adds no noise). PTQ error
      grows like 2^-bits, so 4 -> 6 bits is a larger step than 8 -> float, as in accuracy.
    * ``sample``: a random architecture; with probability ``uniform_fraction`` one width for
      every group (uniform policies, int8 above all, are the usual deployments and rare among
      independent draws: with 4 choices and 12 groups only 3 % of those avoid 4 bits), else
      an independent width per group.
    """

    SEPARATOR = " @ "

    def __init__(self, space: SearchSpace, choices: Sequence[int], *,
                 uniform_fraction: float = 0.25) -> None:
        self.space = space
        self.choices = check_bit_choices(choices)
        self.groups = bit_groups(space)
        if not 0.0 <= uniform_fraction <= 1.0:
            raise UserError(f"uniform_fraction = {uniform_fraction}; expected 0..1")
        self.uniform_fraction = float(uniform_fraction)
        self.name = f"{space.name}+bits"
        self._active: dict[str, tuple[bool, ...]] = {}

    # -- the objective's view ----------------------------------------------------------------
    def suggest(self, trial: Any) -> ArchBits:
        arch = self.space.suggest(trial)
        bits = suggest_group_bits(trial, self.groups, self.choices)
        return ArchBits(arch, tuple(bits[g] for g in self.groups))

    def to_params(self, cand: ArchBits) -> dict[str, Any]:
        return {**self.space.to_params(cand.arch), **group_params(cand.group_bits(self.groups))}

    def policy(self, cand: ArchBits) -> QuantPolicy | None:
        """The per-layer policy of the candidate (``None``: a float model)."""
        return policy_for(self.space, cand.arch, cand.group_bits(self.groups))

    # -- candidates ----------------------------------------------------------------------------
    def active(self, arch: Any) -> tuple[bool, ...]:
        """Per group: whether ``arch`` has layers in it (cached by architecture string)."""
        key = self.space.to_string(arch)
        got = self._active.get(key)
        if got is None:
            present = {layer_group(layer.name) for layer in self.space.layers(arch)
                       if layer.op in _QUANT_OPS}
            got = tuple(g in present for g in self.groups)
            if len(self._active) > 100_000:
                self._active.clear()
            self._active[key] = got
        return got

    def sample(self, rng: Any) -> ArchBits:
        arch = self.space.sample(rng)
        n = len(self.choices)
        if rng.random() < self.uniform_fraction:
            bits = (self.choices[int(rng.integers(n))],) * len(self.groups)
        else:
            bits = tuple(self.choices[int(i)] for i in rng.integers(0, n, len(self.groups)))
        return ArchBits(arch, bits)

    def to_string(self, cand: ArchBits) -> str:
        used = ",".join(f"{g}={b}" for g, b, on in zip(self.groups, cand.bits,
                                                        self.active(cand.arch)) if on)
        return f"{self.space.to_string(cand.arch)}{self.SEPARATOR}{used}"

    def from_string(self, text: str) -> ArchBits:
        """Inverse of :meth:`to_string`; groups the architecture lacks get the widest choice."""
        arch_text, sep, bits_text = str(text).rpartition(self.SEPARATOR)
        if not sep:
            raise UserError(f"candidate {text!r} is not '<architecture>{self.SEPARATOR}"
                            f"<group>=<bits>,...'")
        arch = self.space.from_string(arch_text)
        given: dict[str, int] = {}
        for item in filter(None, bits_text.split(",")):
            group, _, value = item.partition("=")
            if group not in self.groups or not value.strip().isdigit():
                raise UserError(f"candidate {text!r}: {item!r} is not <group>=<bits> for a "
                                f"group of {self.space.name}")
            given[group] = int(value)
        bad = [b for b in given.values() if b not in self.choices]
        if bad:
            raise UserError(f"candidate {text!r}: width {bad[0]} is not among the bit choices "
                            f"{list(self.choices)}")
        return ArchBits(arch, tuple(given.get(g, self.choices[-1]) for g in self.groups))

    def encode(self, cand: ArchBits) -> np.ndarray:
        noise = [2.0 ** -b if on else 0.0 for b, on in zip(cand.bits, self.active(cand.arch))]
        return np.concatenate([np.asarray(self.space.encode(cand.arch), dtype=np.float32),
                               np.asarray(noise, dtype=np.float32)])

    @property
    def feature_names(self) -> list[str]:
        return [*self.space.feature_names, *(f"noise:{g}" for g in self.groups)]


def uniform_groups(groups: Sequence[str], bits: int) -> dict[str, int]:
    return {g: int(bits) for g in groups}


def sensitivity_seeds(space: SearchSpace, supernet: Any, data: Any, choices: Sequence[int], *,
                      avg_bits: Sequence[float] = (6.0, 5.0), seed: int = 0,
                      max_images: int = 128) -> list[dict[str, int]]:
    """Group bit-widths from the Hessian sensitivity (HAWQ-V2) of the largest subnet,
    allocated by :func:`hwnas.quant.allocate.allocate` under a model-size budget at each average
    weight width of ``avg_bits``, then mapped to the groups.

    The allocation is per layer (integer program over the quantized choices of ``choices``);
    a group then takes the parameter-weighted mean width of its layers, rounded up to a
    choice. Budgets that no policy meets are skipped.
    """
    from hwnas.quant.allocate import allocate
    from hwnas.quant.cost import weight_bits_budget_bytes
    from hwnas.quant.policy import apply_to_layers
    from hwnas.quant.sensitivity import hessian_sensitivity
    from hwnas.supernet.evaluate import calibration_loader, recalibrated_subnet

    quantized = [b for b in check_bit_choices(choices) if b < FLOAT_BITS]
    if not quantized:
        return []
    arch = space.largest()
    # on the supernet's device: a GPU run computes the traces on the GPU
    model = recalibrated_subnet(supernet, arch, data, seed=seed)
    loader = calibration_loader(data, batch_size=128, seed=seed)
    candidates = [(b, ACTIVATION_BITS) for b in quantized]
    table = hessian_sensitivity(model, loader, candidates, max_images=max_images, n_samples=4, seed=seed)
    layers = [layer for layer in space.layers(arch) if layer.op in _QUANT_OPS]
    seeds: list[dict[str, int]] = []
    for avg in avg_bits:
        budget = weight_bits_budget_bytes(layers, avg)
        try:
            allocation = allocate(table, layers, budget, "size")
        except UserError:
            continue
        placed = apply_to_layers(allocation.policy, layers)
        weight: dict[str, float] = {}
        total: dict[str, float] = {}
        for layer in placed:
            g = layer_group(layer.name)
            weight[g] = weight.get(g, 0.0) + layer.weight_count * layer.w_bits
            total[g] = total.get(g, 0.0) + layer.weight_count
        group_bits = {}
        for g in bit_groups(space):
            mean = weight[g] / total[g] if total.get(g) else quantized[-1]
            group_bits[g] = next((b for b in quantized if b >= mean - 1e-9), quantized[-1])
        if group_bits not in seeds:
            seeds.append(group_bits)
    return seeds


def describe_bits(policy: QuantPolicy | None) -> str:
    """Short text: ``float`` or e.g. ``W4:3 W8:27`` (layers per weight width)."""
    if policy is None:
        return "float"
    counts: dict[int, int] = {}
    for w, _ in policy.bits.values():
        counts[w] = counts.get(w, 0) + 1
    return " ".join(f"{'F' if w == FLOAT_BITS else 'W' + str(w)}:{n}" for w, n in sorted(counts.items()))
