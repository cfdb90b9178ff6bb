"""An elastic MobileNetV3 space (Once-for-All): per-stage depth, per-block kernel and expand.

A stem, an optional fixed first block, stages of inverted-residual (MBConv) blocks and a head.
The choices and the macro-architecture (widths, strides, activations, SE) are declared once, in
:class:`MBV3Config`; the spaces registered by name are instances of it:

* ``mbv3-tiny`` -- :class:`MBV3Config`'s defaults: three small stages for the 8×8 digits.
* ``mbv3`` -- :func:`ofa_cifar_config`: Once-for-All's MobileNetV3 (widths 16 | 16 | 24, 40,
  80, 112, 160 | 960 → 1280, SE and ReLU/h-swish where OFA puts them, depth {2,3,4}, kernel
  {3,5,7}, expand {3,4,6}) with strides for 32×32 inputs; see that function.

Architecture string: stages separated by ``_``, the active blocks of a stage by ``-``, a block
written ``k{kernel}e{expand}``; e.g. ``k3e4-k5e6_k3e2_k7e6-k3e2-k5e4``. Only active blocks are
written, so every network has exactly one string. The fixed first block is not written (it has
no choices).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hwnas.supernet.layers import Layer
from hwnas.supernet.space import (
    SearchSpace,
    SpaceConfig,
    check_choice,
    restrict_choices,
)

from hwnas.core.errors import UserError

Block = tuple[int, int]  # (kernel, expand ratio)

#: Activation names the MobileNetV3 spaces use (see :func:`hwnas.supernet.nn.dynamic_ops.activation`).
ACTIVATIONS = ("relu", "hswish")

#: The elastic dimensions, in Once-for-All's progressive-shrinking order.
ELASTIC_DIMS = ("kernel", "depth", "expand")


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to the nearest multiple of ``divisor`` without dropping below 90% of it
    (the rule of MobileNet and Once-for-All, which keeps channel counts hardware-friendly)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if new < 0.9 * value:
        new += divisor
    return new


@dataclass(frozen=True)
class MBV3Config(SpaceConfig):
    """Macro-architecture and choices of an elastic MobileNetV3-style space.

    The network is a stem convolution, an optional fixed first block (Once-for-All's 3×3 MBConv
    with expand ratio 1), a sequence of stages of inverted-residual (MBConv) blocks, and a head
    (1×1 conv, global average pool, an optional 1×1 "feature mix" layer, linear classifier).
    Each stage keeps its first ``depth`` blocks; each active block picks its depthwise kernel
    size and its expand ratio; blocks of the stages listed in ``se_stages`` carry a
    squeeze-and-excitation module whose width follows the block's expanded channels.

    The defaults are the ``mbv3-tiny`` preset. Optional parts are off when 0 / empty:
    ``first_block_channels`` (a fixed 3×3 MBConv with expand ratio 1 after the stem),
    ``se_stages`` (indices of the stages whose blocks have squeeze-and-excitation, reduction
    ``se_reduction``) and ``feature_mix_channels`` (a bias-free linear layer with h-swish
    between the pooled head features and the classifier, OFA's ``feature_mix_layer``).
    """

    LABEL = "MBV3"

    in_channels: int = 1
    image_size: int = 8
    num_classes: int = 10
    stem_channels: int = 16
    stage_channels: tuple[int, ...] = (16, 24, 40)
    stage_strides: tuple[int, ...] = (1, 2, 2)
    stage_activations: tuple[str, ...] = ("relu", "hswish", "hswish")
    depth_choices: tuple[int, ...] = (1, 2, 3)
    kernel_choices: tuple[int, ...] = (3, 5, 7)
    expand_choices: tuple[int, ...] = (2, 4, 6)
    head_channels: int = 96
    stem_stride: int = 1
    stem_activation: str = "hswish"
    head_activation: str = "hswish"
    first_block_channels: int = 0
    first_block_activation: str = "relu"
    se_stages: tuple[int, ...] = ()
    se_reduction: int = 4
    feature_mix_channels: int = 0

    def __post_init__(self) -> None:
        n = len(self.stage_channels)
        if n == 0:
            raise ValueError("an MBV3 space needs at least one stage")
        if not (len(self.stage_strides) == len(self.stage_activations) == n):
            raise ValueError("stage_channels, stage_strides and stage_activations differ in length")
        for name in ("depth_choices", "kernel_choices", "expand_choices", "se_stages"):
            values = getattr(self, name)
            if tuple(sorted(set(values))) != tuple(values):
                raise ValueError(f"{name} must be sorted and unique, got {values}")
        for name in ("depth_choices", "kernel_choices", "expand_choices"):
            values = getattr(self, name)
            if not values or values[0] < 1:
                raise ValueError(f"{name} must be non-empty positive integers, got {values}")
        if any(k % 2 == 0 for k in self.kernel_choices):
            raise ValueError(f"kernel sizes must be odd, got {self.kernel_choices}")
        if any(not 0 <= s < n for s in self.se_stages):
            raise ValueError(f"se_stages {self.se_stages} must be stage indices in [0, {n})")
        acts = (*self.stage_activations, self.stem_activation, self.head_activation,
                self.first_block_activation)
        if any(a not in ACTIVATIONS for a in acts):
            raise ValueError(f"activations must be among {ACTIVATIONS}, got {acts}")
        if self.se_reduction < 1 or self.first_block_channels < 0 or self.feature_mix_channels < 0:
            raise ValueError("se_reduction must be >= 1; first_block_channels and "
                             "feature_mix_channels must be >= 0")

    @property
    def num_stages(self) -> int:
        return len(self.stage_channels)

    @property
    def max_depth(self) -> int:
        return self.depth_choices[-1]



def ofa_cifar_config(in_channels: int = 3, image_size: int = 32,
                     num_classes: int = 10) -> MBV3Config:
    """Once-for-All's elastic MobileNetV3 (``ofa_mbv3_d234_e346_k357_w1.0``) for 32×32 inputs.

    Widths, activations and SE placement are OFA's: stem 16 (h-swish, 3×3), a fixed first
    MBConv 16 → 16 (3×3, expand 1, ReLU), five elastic stages of 24, 40, 80, 112, 160 channels
    (ReLU, ReLU, h-swish, h-swish, h-swish; SE in the 40-, 112- and 160-channel stages), a
    960-channel 1×1 head conv, global pooling, a 1280-wide feature-mix layer and the classifier.

    Strides are what changes for 32×32 inputs: OFA's ImageNet network reduces 224 by 32 (stem 2,
    stages 2, 2, 2, 1, 2); here the stem has stride 1 and the stages (1, 2, 2, 1, 2), a total
    stride of 8, so the stages see 32, 16, 8, 8 and 4 pixels and the head a 4×4 map (the same
    per-stage layout as OFA's 56→7 pyramid shifted by the missing first reductions).
    """
    return MBV3Config(
        in_channels=in_channels,
        image_size=image_size,
        num_classes=num_classes,
        stem_channels=16,
        stem_stride=1,
        stem_activation="hswish",
        first_block_channels=16,
        first_block_activation="relu",
        stage_channels=(24, 40, 80, 112, 160),
        stage_strides=(1, 2, 2, 1, 2),
        stage_activations=("relu", "relu", "hswish", "hswish", "hswish"),
        se_stages=(1, 3, 4),
        se_reduction=4,
        depth_choices=(2, 3, 4),
        kernel_choices=(3, 5, 7),
        expand_choices=(3, 4, 6),
        head_channels=960,
        head_activation="hswish",
        feature_mix_channels=1280,
    )


@dataclass(frozen=True)
class MBV3Arch:
    """One member of the space: for each stage, the (kernel, expand) of each active block."""

    stages: tuple[tuple[Block, ...], ...]

    @property
    def depths(self) -> tuple[int, ...]:
        return tuple(len(s) for s in self.stages)


_BLOCK_RE = re.compile(r"^k(\d+)e(\d+)$")


class MBV3Space(SearchSpace[MBV3Arch]):
    """Elastic MobileNetV3-style space; see the module docstring."""

    def __init__(self, config: MBV3Config | None = None, name: str = "mbv3-tiny") -> None:
        self._set_config(config or MBV3Config(), name)

    def describe(self) -> str:
        c = self.cfg

        def values(v: tuple[int, ...]) -> str:
            return "{" + ",".join(map(str, v)) + "}"

        return (f"{self.name}: elastic MobileNetV3 ({c.num_stages} stages, depth "
                f"{values(c.depth_choices)}, kernel {values(c.kernel_choices)}, expand "
                f"{values(c.expand_choices)}{', SE' if c.se_stages else ''}), input "
                f"{self.input_shape}, {self.num_classes} classes")

    # -- elastic dimensions ----------------------------------------------------------------------
    def elastic_choices(self) -> dict[str, tuple[int, ...]]:
        """The values of each elastic dimension, in progressive-shrinking order."""
        c = self.cfg
        return {"kernel": c.kernel_choices, "depth": c.depth_choices, "expand": c.expand_choices}

    def restrict(self, choices: dict[str, Any] | None) -> MBV3Space:
        """The sub-space whose dimensions take only the given values (e.g. ``{"kernel": [7]}``).

        Used by training schedules (progressive shrinking) to sample under restrictions; every
        member of the result is a member of this space. Unnamed dimensions keep all values.
        """
        if not choices:
            return self
        changes = restrict_choices(self, choices)
        return MBV3Space(replace(self.cfg, **changes), name=self.name)

    # -- members ---------------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> MBV3Arch:
        c = self.cfg
        stages = []
        for _ in range(c.num_stages):
            depth = int(rng.choice(c.depth_choices))
            stages.append(
                tuple(
                    (int(rng.choice(c.kernel_choices)), int(rng.choice(c.expand_choices)))
                    for _ in range(depth)
                )
            )
        return MBV3Arch(tuple(stages))

    def _uniform(self, depth: int, kernel: int, expand: int) -> MBV3Arch:
        return MBV3Arch(tuple(((kernel, expand),) * depth for _ in range(self.cfg.num_stages)))

    def smallest(self) -> MBV3Arch:
        c = self.cfg
        return self._uniform(c.depth_choices[0], c.kernel_choices[0], c.expand_choices[0])

    def largest(self) -> MBV3Arch:
        c = self.cfg
        return self._uniform(c.depth_choices[-1], c.kernel_choices[-1], c.expand_choices[-1])

    def validate(self, arch: MBV3Arch) -> MBV3Arch:
        c = self.cfg
        if not isinstance(arch, MBV3Arch):
            raise UserError(f"expected an MBV3Arch for space {self.name}, got {type(arch).__name__}")
        if len(arch.stages) != c.num_stages:
            raise UserError(
                f"architecture has {len(arch.stages)} stages; space {self.name} has {c.num_stages}"
            )
        for s, stage in enumerate(arch.stages):
            check_choice(len(stage), c.depth_choices, f"depth of stage {s}")
            for b, (k, e) in enumerate(stage):
                check_choice(k, c.kernel_choices, f"kernel of stage {s} block {b}")
                check_choice(e, c.expand_choices, f"expand ratio of stage {s} block {b}")
        return arch

    # -- string form -----------------------------------------------------------------------------
    def to_string(self, arch: MBV3Arch) -> str:
        self.validate(arch)
        return "_".join("-".join(f"k{k}e{e}" for k, e in stage) for stage in arch.stages)

    def from_string(self, text: str) -> MBV3Arch:
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"empty architecture string for space {self.name}")
        stages = []
        for stage_text in text.strip().split("_"):
            blocks = []
            for block_text in stage_text.split("-"):
                m = _BLOCK_RE.match(block_text)
                if not m:
                    raise UserError(
                        f"malformed block {block_text!r} in architecture {text!r}; expected "
                        f"'k<kernel>e<expand>' blocks joined by '-', stages joined by '_' "
                        f"(e.g. {self.to_string(self.smallest())!r})"
                    )
                blocks.append((int(m.group(1)), int(m.group(2))))
            stages.append(tuple(blocks))
        return self.validate(MBV3Arch(tuple(stages)))

    # -- features --------------------------------------------------------------------------------
    @property
    def feature_names(self) -> list[str]:
        c = self.cfg
        names = []
        for s in range(c.num_stages):
            names += [f"s{s}_depth{d}" for d in c.depth_choices]
            for b in range(c.max_depth):
                names += [f"s{s}_b{b}_k{k}" for k in c.kernel_choices]
                names += [f"s{s}_b{b}_e{e}" for e in c.expand_choices]
        return names

    def encode(self, arch: MBV3Arch) -> np.ndarray:
        """One-hot depth per stage, then one-hot kernel and expand per block slot (all zero for
        the slots beyond the stage's depth)."""
        self.validate(arch)
        c = self.cfg
        out: list[float] = []
        for stage in arch.stages:
            out += [float(len(stage) == d) for d in c.depth_choices]
            for b in range(c.max_depth):
                k, e = stage[b] if b < len(stage) else (None, None)
                out += [float(k == kk) for kk in c.kernel_choices]
                out += [float(e == ee) for ee in c.expand_choices]
        return np.asarray(out, dtype=np.float32)

    # -- layers ----------------------------------------------------------------------------------
    def block_channels(self, in_channels: int, expand: int) -> int:
        """Hidden (expanded) channels of a block."""
        return make_divisible(in_channels * expand)

    def se_channels(self, channels: int) -> int:
        """Hidden channels of the squeeze-and-excitation module of a block with ``channels``
        expanded channels (OFA: ``make_divisible(channels // reduction, 8)``)."""
        return make_divisible(channels // self.cfg.se_reduction)

    def _block_layers(self, p: str, in_ch: int, out_ch: int, mid: int, kernel: int, stride: int,
                      act: str, se: bool, size: int, expand_conv: bool = True) -> list[Layer]:
        """Layers of one MBConv block (``expand_conv=False``: the fixed first block, which has
        expand ratio 1 and no expand convolution, as in OFA)."""
        layers = []
        if expand_conv:
            layers.append(Layer(f"{p}.expand_conv", "conv", in_ch, mid, 1, 1, 1, size, size,
                                bias=True, activation=act))
        layers.append(Layer(f"{p}.dw_conv", "conv", mid, mid, kernel, stride, mid, size, size,
                            bias=True, activation=act))
        out_size = layers[-1].out_h
        if se:
            hidden = self.se_channels(mid)
            layers += [
                Layer(f"{p}.se.pool", "avgpool", mid, mid, in_h=out_size, in_w=out_size),
                Layer(f"{p}.se.reduce", "conv", mid, hidden, 1, 1, 1, 1, 1, bias=True,
                      activation="relu"),
                Layer(f"{p}.se.expand", "conv", hidden, mid, 1, 1, 1, 1, 1, bias=True,
                      activation="hsigmoid"),
                Layer(f"{p}.se.mul", "mul", mid, mid, in_h=out_size, in_w=out_size),
            ]
        layers.append(Layer(f"{p}.project_conv", "conv", mid, out_ch, 1, 1, 1, out_size, out_size,
                            bias=True))
        if stride == 1 and in_ch == out_ch:
            layers.append(Layer(f"{p}.add", "add", out_ch, out_ch, in_h=out_size, in_w=out_size))
        return layers

    def layers(self, arch: MBV3Arch) -> list[Layer]:
        self.validate(arch)
        c = self.cfg
        size = c.image_size
        layers = [
            Layer("stem_conv", "conv", c.in_channels, c.stem_channels, 3, c.stem_stride, 1,
                  size, size, bias=True, activation=c.stem_activation)
        ]
        size = layers[-1].out_h
        in_ch = c.stem_channels
        if c.first_block_channels:
            layers += self._block_layers("first_block", in_ch, c.first_block_channels, in_ch, 3, 1,
                                         c.first_block_activation, False, size,
                                         expand_conv=False)
            in_ch = c.first_block_channels
        index = 0
        for s, stage in enumerate(arch.stages):
            out_ch, act = c.stage_channels[s], c.stage_activations[s]
            for b, (k, e) in enumerate(stage):
                stride = c.stage_strides[s] if b == 0 else 1
                mid = self.block_channels(in_ch, e)
                block = self._block_layers(f"blocks.{index}", in_ch, out_ch, mid, k, stride, act,
                                           s in c.se_stages, size)
                layers += block
                size = [layer for layer in block if layer.name.endswith(".dw_conv")][0].out_h
                in_ch, index = out_ch, index + 1
        layers.append(Layer("head_conv", "conv", in_ch, c.head_channels, 1, 1, 1, size, size,
                            bias=True, activation=c.head_activation))
        layers.append(Layer("pool", "avgpool", c.head_channels, c.head_channels, in_h=size,
                            in_w=size))
        features = c.head_channels
        if c.feature_mix_channels:
            layers.append(Layer("feature_mix", "linear", features, c.feature_mix_channels,
                                bias=False, activation="hswish"))
            features = c.feature_mix_channels
        layers.append(Layer("classifier", "linear", features, c.num_classes, bias=True))
        return layers

    # -- Optuna ----------------------------------------------------------------------------------
    def suggest(self, trial: Any) -> MBV3Arch:
        """Suggest every choice, inactive block slots included, so that the parameter set is the
        same in every trial (what multivariate TPE and NSGA-II need); slots beyond a stage's
        depth are ignored when the architecture is built."""
        c = self.cfg
        stages = []
        for s in range(c.num_stages):
            depth = trial.suggest_categorical(f"s{s}_depth", list(c.depth_choices))
            blocks = []
            for b in range(c.max_depth):
                k = trial.suggest_categorical(f"s{s}_b{b}_kernel", list(c.kernel_choices))
                e = trial.suggest_categorical(f"s{s}_b{b}_expand", list(c.expand_choices))
                blocks.append((int(k), int(e)))
            stages.append(tuple(blocks[: int(depth)]))
        return MBV3Arch(tuple(stages))

    def to_params(self, arch: MBV3Arch) -> dict[str, Any]:
        self.validate(arch)
        c = self.cfg
        params: dict[str, Any] = {}
        for s, stage in enumerate(arch.stages):
            params[f"s{s}_depth"] = len(stage)
            for b in range(c.max_depth):
                k, e = stage[b] if b < len(stage) else stage[-1]
                params[f"s{s}_b{b}_kernel"] = k
                params[f"s{s}_b{b}_expand"] = e
        return params

    # -- torch -----------------------------------------------------------------------------------
    def build_supernet(self):
        from hwnas.supernet.nn.mbv3 import MBV3Supernet

        return MBV3Supernet(self)
