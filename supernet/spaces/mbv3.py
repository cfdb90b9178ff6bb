"""An elastic MobileNetV3-style space (Once-for-All): per-stage depth, per-block kernel and expand.

The network is a stem convolution, a sequence of stages of inverted-residual (MBConv) blocks and
a head (1×1 conv, global average pool, linear classifier). Each stage keeps its first ``depth``
blocks; each active block picks its depthwise kernel size and its expand ratio. The choices and
the macro-architecture (widths, strides, activations) are declared once, in :class:`MBV3Config`;
presets for particular datasets are instances of it.

Architecture string: stages separated by ``_``, the active blocks of a stage by ``-``, a block
written ``k{kernel}e{expand}``; e.g. ``k3e4-k5e6_k3e2_k7e6-k3e2-k5e4``. Only active blocks are
written, so every network has exactly one string.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from supernet.errors import UserError
from supernet.layers import Layer
from supernet.space import SearchSpace, check_choice

Block = tuple[int, int]  # (kernel, expand ratio)


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to the nearest multiple of ``divisor`` without dropping below 90% of it
    (the rule of MobileNet and Once-for-All, which keeps channel counts hardware-friendly)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if new < 0.9 * value:
        new += divisor
    return new


@dataclass(frozen=True)
class MBV3Config:
    """Macro-architecture and choices of an elastic MobileNetV3-style space."""

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

    def __post_init__(self) -> None:
        n = len(self.stage_channels)
        if not (len(self.stage_strides) == len(self.stage_activations) == n):
            raise ValueError("stage_channels, stage_strides and stage_activations differ in length")
        for name in ("depth_choices", "kernel_choices", "expand_choices"):
            values = getattr(self, name)
            if tuple(sorted(set(values))) != tuple(values):
                raise ValueError(f"{name} must be sorted and unique, got {values}")
        if any(k % 2 == 0 for k in self.kernel_choices):
            raise ValueError(f"kernel sizes must be odd, got {self.kernel_choices}")

    @property
    def num_stages(self) -> int:
        return len(self.stage_channels)

    @property
    def max_depth(self) -> int:
        return self.depth_choices[-1]

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MBV3Config:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


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
        self.cfg = config or MBV3Config()
        self.name = name
        self.input_shape = (self.cfg.in_channels, self.cfg.image_size, self.cfg.image_size)
        self.num_classes = self.cfg.num_classes

    def config(self) -> dict[str, Any]:
        return self.cfg.to_dict()

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

    def layers(self, arch: MBV3Arch) -> list[Layer]:
        self.validate(arch)
        c = self.cfg
        size = c.image_size
        layers = [
            Layer("stem_conv", "conv", c.in_channels, c.stem_channels, 3, c.stem_stride, 1,
                  size, size, bias=True, activation="hswish")
        ]
        size = layers[-1].out_h
        in_ch = c.stem_channels
        index = 0
        for s, stage in enumerate(arch.stages):
            out_ch, act = c.stage_channels[s], c.stage_activations[s]
            for b, (k, e) in enumerate(stage):
                stride = c.stage_strides[s] if b == 0 else 1
                mid = self.block_channels(in_ch, e)
                p = f"blocks.{index}"
                layers.append(Layer(f"{p}.expand_conv", "conv", in_ch, mid, 1, 1, 1, size, size,
                                    bias=True, activation=act))
                layers.append(Layer(f"{p}.dw_conv", "conv", mid, mid, k, stride, mid, size, size,
                                    bias=True, activation=act))
                out_size = layers[-1].out_h
                layers.append(Layer(f"{p}.project_conv", "conv", mid, out_ch, 1, 1, 1,
                                    out_size, out_size, bias=True))
                if stride == 1 and in_ch == out_ch:
                    layers.append(Layer(f"{p}.add", "add", out_ch, out_ch, in_h=out_size,
                                        in_w=out_size))
                in_ch, size, index = out_ch, out_size, index + 1
        layers.append(Layer("head_conv", "conv", in_ch, c.head_channels, 1, 1, 1, size, size,
                            bias=True, activation="hswish"))
        layers.append(Layer("pool", "avgpool", c.head_channels, c.head_channels, in_h=size,
                            in_w=size))
        layers.append(Layer("classifier", "linear", c.head_channels, c.num_classes, bias=True))
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
        from supernet.nn.mbv3 import MBV3Supernet

        return MBV3Supernet(self)
