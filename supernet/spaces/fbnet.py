"""The FBNet space (Wu et al., CVPR 2019) in HW-NAS-Bench's CIFAR-100 setting (Li et al., 2021).

22 searchable layers, each one of 9 blocks: ``k{kernel}_e{expand}`` (an inverted-residual block)
with an optional ``_g2`` (grouped 1×1 convolutions), or ``skip``; 9**22 architectures. The
latency table ``fbnet_latency_ms.csv`` of HW-NAS-Bench/HELP measures 5,000 of them, so the
macro-architecture (:class:`FBNetConfig`) and the blocks (:class:`FBNetSpace`) follow
HW-NAS-Bench's ``hw_nas_bench_api/fbnet_models/model_infer.py`` (``FBNet_Infer``, ``cifar``).

Architecture string: the 22 block names joined by ``-`` (the ``arch`` column of the table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hwnas.supernet.layers import Layer
from hwnas.supernet.space import SearchSpace, SpaceConfig, check_choice

from hwnas.core.errors import UserError

#: The candidate blocks of a layer, in HW-NAS-Bench's order (also the one-hot order).
FBNET_BLOCKS: tuple[str, ...] = (
    "k3_e1", "k3_e1_g2", "k3_e3", "k3_e6", "k5_e1", "k5_e1_g2", "k5_e3", "k5_e6", "skip",
)


@dataclass(frozen=True)
class BlockSpec:
    """Kernel, expansion ratio and 1×1 groups of an inverted-residual block."""

    kernel: int
    expand: int
    groups: int


def block_spec(name: str) -> BlockSpec | None:
    """The spec of a block name (``None`` for ``skip``)."""
    if name == "skip":
        return None
    parts = name.split("_")
    groups = int(parts[2][1:]) if len(parts) > 2 else 1
    return BlockSpec(int(parts[0][1:]), int(parts[1][1:]), groups)


@dataclass(frozen=True)
class FBNetConfig(SpaceConfig):
    """Macro-architecture of the FBNet network (defaults: HW-NAS-Bench's CIFAR-100 setting).

    * stem: conv 3×3 ``in_channels -> 16``, stride 1, BN, ReLU;
    * 7 stages of (1, 4, 4, 4, 4, 4, 1) searchable layers with (16, 24, 32, 64, 112, 184, 352)
      output channels and strides (1, 1, 2, 2, 1, 2, 1) (FBNet's ImageNet strides with the stem
      and the first stride-2 stage at stride 1, so that 32×32 ends at 4×4); the stride and the
      channel change happen in a stage's first layer;
    * head: conv 1×1 ``352 -> 1504`` + BN + ReLU, global average pool, linear classifier.
    """

    LABEL = "FBNet"

    in_channels: int = 3
    image_size: int = 32
    num_classes: int = 100
    stem_channels: int = 16
    stem_stride: int = 1
    stage_channels: tuple[int, ...] = (16, 24, 32, 64, 112, 184, 352)
    stage_layers: tuple[int, ...] = (1, 4, 4, 4, 4, 4, 1)
    stage_strides: tuple[int, ...] = (1, 1, 2, 2, 1, 2, 1)
    head_channels: int = 1504

    def __post_init__(self) -> None:
        for name in ("in_channels", "image_size", "num_classes", "stem_channels", "head_channels"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"fbnet {name} = {value!r}; expected a positive integer")
        n = len(self.stage_channels)
        if not (len(self.stage_layers) == len(self.stage_strides) == n):
            raise UserError("fbnet stage_channels, stage_layers and stage_strides differ in length")
        if any(s not in (1, 2) for s in (*self.stage_strides, self.stem_stride)):
            raise UserError(f"fbnet strides must be 1 or 2, got {self.stage_strides}")
        if any(ch % 2 for ch in (self.stem_channels, *self.stage_channels)):
            raise UserError("fbnet channel counts must be even (the _g2 blocks use 2 groups)")

    @property
    def num_layers(self) -> int:
        return sum(self.stage_layers)

    def layer_plan(self) -> list[tuple[int, int, int]]:
        """``(in_channels, out_channels, stride)`` of each searchable layer."""
        plan = []
        in_ch = self.stem_channels
        for out_ch, n, stride in zip(self.stage_channels, self.stage_layers, self.stage_strides):
            for i in range(n):
                plan.append((in_ch, out_ch, stride if i == 0 else 1))
                in_ch = out_ch
        return plan



@dataclass(frozen=True)
class FBNetArch:
    """One member: the block name of each searchable layer."""

    blocks: tuple[str, ...]


class FBNetSpace(SearchSpace[FBNetArch]):
    """The FBNet space in HW-NAS-Bench's CIFAR setting; see the module docstring.

    Block ``k{k}_e{e}[_g2]`` (input ``C_in``, hidden ``C_in*e``): 1×1 expand conv (``groups``
    g) - BN - ReLU - channel shuffle (g > 1) - k×k depthwise conv with the layer's stride - BN -
    ReLU - 1×1 project conv (``groups`` g) - BN, plus the input when the stride is 1 and
    ``C_in == C_out``. ``skip`` is the identity when the stride is 1 and ``C_in == C_out``;
    otherwise it is a 1×1 conv with the layer's stride + BN + ReLU (HW-NAS-Bench's ``Skip``), so
    the shapes still match.
    """

    def __init__(self, config: FBNetConfig | None = None, name: str = "fbnet") -> None:
        self._set_config(config or FBNetConfig(), name)

    def describe(self) -> str:
        return (f"{self.name}: FBNet ({self.cfg.num_layers} layers x {len(FBNET_BLOCKS)} blocks), "
                f"input {self.input_shape}, {self.num_classes} classes")

    # -- members ---------------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> FBNetArch:
        idx = rng.integers(0, len(FBNET_BLOCKS), self.cfg.num_layers)
        return FBNetArch(tuple(FBNET_BLOCKS[int(i)] for i in idx))

    def smallest(self) -> FBNetArch:
        """The fewest MACs: the cheapest block of each layer (channels are fixed, so each
        layer's MACs do not depend on the other layers' blocks).

        That is ``skip`` (identity, or one 1×1 projection where the shape changes) except where
        the projection costs more than a grouped block: in the default space, the channel-changing
        stride-1 layers 13 (64 -> 112) and 21 (184 -> 352) take ``k3_e1_g2``.
        """
        return FBNetArch(tuple(
            min(FBNET_BLOCKS, key=lambda b, i=i: (self._block_macs(i, b), b != "skip"))
            for i in range(self.cfg.num_layers)
        ))

    def largest(self) -> FBNetArch:
        """The most MACs: the most expensive block of each layer (``k5_e6`` everywhere)."""
        return FBNetArch(tuple(max(FBNET_BLOCKS, key=lambda b, i=i: self._block_macs(i, b))
                               for i in range(self.cfg.num_layers)))

    def _block_macs(self, index: int, block: str) -> int:
        """MACs of ``block`` placed at searchable layer ``index``."""
        in_ch, out_ch, stride = self.cfg.layer_plan()[index]
        size = self.layer_input_sizes()[index]
        return sum(la.macs for la in self._block_layers(f"blocks.{index}", block, in_ch, out_ch,
                                                         stride, size))

    def layer_input_sizes(self) -> list[int]:
        """Spatial size of each searchable layer's input (the same for every block choice)."""
        c = self.cfg
        size = (c.image_size - 1) // c.stem_stride + 1
        sizes = []
        for _, _, stride in c.layer_plan():
            sizes.append(size)
            size = (size - 1) // stride + 1
        return sizes

    def validate(self, arch: FBNetArch) -> FBNetArch:
        n = self.cfg.num_layers
        if not isinstance(arch, FBNetArch):
            raise UserError(
                f"expected an FBNetArch for space {self.name}, got {type(arch).__name__}"
            )
        if not isinstance(arch.blocks, tuple) or len(arch.blocks) != n:
            raise UserError(f"an {self.name} architecture has {n} layers, got {arch.blocks!r}")
        for i, block in enumerate(arch.blocks):
            check_choice(block, FBNET_BLOCKS, f"block of layer {i}")
        return arch

    # -- string form -----------------------------------------------------------------------------
    def to_string(self, arch: FBNetArch) -> str:
        self.validate(arch)
        return "-".join(arch.blocks)

    def from_string(self, text: str) -> FBNetArch:
        n = self.cfg.num_layers
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"empty architecture string for space {self.name}; {self._expected()}")
        parts = text.strip().split("-")
        if len(parts) != n:
            raise UserError(f"architecture {text!r} has {len(parts)} layers; {self._expected()}")
        for i, block in enumerate(parts):
            check_choice(block, FBNET_BLOCKS, f"block of layer {i}")
        return self.validate(FBNetArch(tuple(parts)))

    def _expected(self) -> str:
        return (f"expected {self.cfg.num_layers} block names joined by '-', each one of "
                f"{list(FBNET_BLOCKS)} (e.g. {'-'.join(['k3_e3'] * self.cfg.num_layers)!r})")

    # -- features --------------------------------------------------------------------------------
    @property
    def feature_names(self) -> list[str]:
        return [f"l{i}={b}" for i in range(self.cfg.num_layers) for b in FBNET_BLOCKS]

    def encode(self, arch: FBNetArch) -> np.ndarray:
        """One-hot block per layer: 22 layers × 9 blocks = 198 features (HELP's encoding)."""
        self.validate(arch)
        out = np.zeros((self.cfg.num_layers, len(FBNET_BLOCKS)), dtype=np.float32)
        for i, block in enumerate(arch.blocks):
            out[i, FBNET_BLOCKS.index(block)] = 1.0
        return out.reshape(-1)

    # -- layers ----------------------------------------------------------------------------------
    def layers(self, arch: FBNetArch) -> list[Layer]:
        """The network as a layer list; names are the module names of the static model of
        :mod:`hwnas.supernet.nn.fbnet` (``blocks.{i}.expand_conv`` / ``dw_conv`` / ``project_conv``,
        ``blocks.{i}.conv`` for a projecting ``skip``). A channel shuffle after a grouped expand
        conv is recorded as ``extra["channel_shuffle"]`` (a permutation, no MACs)."""
        self.validate(arch)
        c = self.cfg
        size = c.image_size
        out = [Layer("stem.conv", "conv", c.in_channels, c.stem_channels, 3, c.stem_stride, 1,
                     size, size, bias=True, activation="relu")]
        size = out[-1].out_h
        for i, (block, (in_ch, out_ch, stride)) in enumerate(zip(arch.blocks, c.layer_plan())):
            out += self._block_layers(f"blocks.{i}", block, in_ch, out_ch, stride, size)
            size = (size - 1) // stride + 1
        last = c.stage_channels[-1]
        out.append(Layer("head_conv", "conv", last, c.head_channels, 1, 1, 1, size, size,
                         bias=True, activation="relu"))
        out.append(Layer("pool", "avgpool", c.head_channels, c.head_channels, in_h=size, in_w=size))
        out.append(Layer("classifier", "linear", c.head_channels, c.num_classes, bias=True))
        return out

    @staticmethod
    def _block_layers(p: str, block: str, in_ch: int, out_ch: int, stride: int,
                      size: int) -> list[Layer]:
        """The layers of one searchable layer (empty for an identity ``skip``)."""
        spec = block_spec(block)
        identity_shape = stride == 1 and in_ch == out_ch
        if spec is None:
            if identity_shape:
                return []
            return [Layer(f"{p}.conv", "conv", in_ch, out_ch, 1, stride, 1, size, size,
                          bias=True, activation="relu")]
        mid = in_ch * spec.expand
        g = spec.groups
        extra = {"channel_shuffle": g} if g > 1 else {}
        out = [
            Layer(f"{p}.expand_conv", "conv", in_ch, mid, 1, 1, g, size, size,
                  bias=True, activation="relu", extra=extra),
            Layer(f"{p}.dw_conv", "conv", mid, mid, spec.kernel, stride, mid, size, size,
                  bias=True, activation="relu"),
        ]
        new = out[-1].out_h
        out.append(Layer(f"{p}.project_conv", "conv", mid, out_ch, 1, 1, g, new, new, bias=True))
        if identity_shape:
            out.append(Layer(f"{p}.add", "add", out_ch, out_ch, in_h=new, in_w=new))
        return out

    # -- Optuna ----------------------------------------------------------------------------------
    def suggest(self, trial: Any) -> FBNetArch:
        """One categorical parameter per layer, ``l0``..``l21``."""
        return FBNetArch(
            tuple(str(trial.suggest_categorical(f"l{i}", list(FBNET_BLOCKS)))
                  for i in range(self.cfg.num_layers))
        )

    def to_params(self, arch: FBNetArch) -> dict[str, Any]:
        self.validate(arch)
        return {f"l{i}": block for i, block in enumerate(arch.blocks)}

    # -- torch -----------------------------------------------------------------------------------
    def build_supernet(self):
        from hwnas.supernet.nn.fbnet import FBNetSupernet

        return FBNetSupernet(self)
