"""The elastic MobileNetV3 supernet of :class:`supernet.spaces.mbv3.MBV3Space` and its static
subnets.

``MBV3Supernet.set_active(arch)`` selects a subnet (each block stores its own active kernel and
expand ratio; no global flags); ``forward`` runs it; ``extract(arch)`` returns a plain
:class:`MBV3Net` built from ``nn.Conv2d``/``nn.BatchNorm2d`` with copies of the active weights,
which computes the same outputs and exports to ONNX as is.
"""

from __future__ import annotations

import torch
from torch import nn

from supernet.nn.dynamic_ops import (
    DynamicBatchNorm2d,
    DynamicConv2d,
    DynamicDepthwiseConv2d,
    activation,
)
from supernet.spaces.mbv3 import MBV3Arch, MBV3Space


class MBConv(nn.Module):
    """A static inverted-residual block: 1×1 expand, k×k depthwise, 1×1 project (+ residual).

    Attribute names match the layer names of :meth:`MBV3Space.layers`.
    """

    def __init__(self, expand_conv, expand_bn, dw_conv, dw_bn, project_conv, project_bn, act: str,
                 residual: bool) -> None:
        super().__init__()
        self.expand_conv, self.expand_bn = expand_conv, expand_bn
        self.dw_conv, self.dw_bn = dw_conv, dw_bn
        self.project_conv, self.project_bn = project_conv, project_bn
        self.act1, self.act2 = activation(act), activation(act)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act1(self.expand_bn(self.expand_conv(x)))
        y = self.act2(self.dw_bn(self.dw_conv(y)))
        y = self.project_bn(self.project_conv(y))
        return x + y if self.residual else y


class MBV3Net(nn.Module):
    """A standalone subnet: stem, a flat list of MBConv blocks, head."""

    def __init__(self, stem_conv, stem_bn, blocks: list[MBConv], head_conv, head_bn, classifier) -> None:
        super().__init__()
        self.stem_conv, self.stem_bn, self.stem_act = stem_conv, stem_bn, nn.Hardswish()
        self.blocks = nn.Sequential(*blocks)
        self.head_conv, self.head_bn, self.head_act = head_conv, head_bn, nn.Hardswish()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem_act(self.stem_bn(self.stem_conv(x)))
        x = self.blocks(x)
        x = self.head_act(self.head_bn(self.head_conv(x)))
        return self.classifier(torch.flatten(self.pool(x), 1))


class DynamicMBConv(nn.Module):
    """An MBConv block with elastic kernel and expand ratio (max-size weights shared)."""

    def __init__(self, space: MBV3Space, in_ch: int, out_ch: int, stride: int, act: str) -> None:
        super().__init__()
        cfg = space.cfg
        self.space, self.in_ch, self.out_ch, self.stride, self.act_name = space, in_ch, out_ch, stride, act
        max_mid = space.block_channels(in_ch, cfg.expand_choices[-1])
        self.expand_conv = DynamicConv2d(in_ch, max_mid, 1)
        self.expand_bn = DynamicBatchNorm2d(max_mid)
        self.dw_conv = DynamicDepthwiseConv2d(max_mid, cfg.kernel_choices, stride)
        self.dw_bn = DynamicBatchNorm2d(max_mid)
        self.project_conv = DynamicConv2d(max_mid, out_ch, 1)
        self.project_bn = DynamicBatchNorm2d(out_ch)
        self.act = activation(act)
        self.residual = stride == 1 and in_ch == out_ch
        self.active_kernel = cfg.kernel_choices[-1]
        self.active_expand = cfg.expand_choices[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mid = self.space.block_channels(x.size(1), self.active_expand)
        y = self.act(self.expand_bn(self.expand_conv(x, mid)))
        y = self.act(self.dw_bn(self.dw_conv(y, self.active_kernel)))
        y = self.project_bn(self.project_conv(y, self.out_ch))
        return x + y if self.residual else y

    def static(self) -> MBConv:
        mid = self.space.block_channels(self.in_ch, self.active_expand)
        return MBConv(
            self.expand_conv.static(self.in_ch, mid), self.expand_bn.static(mid),
            self.dw_conv.static(mid, self.active_kernel), self.dw_bn.static(mid),
            self.project_conv.static(mid, self.out_ch), self.project_bn.static(self.out_ch),
            self.act_name, self.residual,
        )


class MBV3Supernet(nn.Module):
    """Weight-sharing supernet of an :class:`MBV3Space`; starts with the largest subnet active."""

    def __init__(self, space: MBV3Space) -> None:
        super().__init__()
        cfg = space.cfg
        self.space = space
        self.stem_conv = nn.Conv2d(cfg.in_channels, cfg.stem_channels, 3, cfg.stem_stride, 1, bias=False)
        self.stem_bn = nn.BatchNorm2d(cfg.stem_channels)
        self.stem_act = nn.Hardswish()
        self.stages = nn.ModuleList()
        in_ch = cfg.stem_channels
        for s in range(cfg.num_stages):
            blocks = nn.ModuleList()
            for b in range(cfg.max_depth):
                stride = cfg.stage_strides[s] if b == 0 else 1
                blocks.append(DynamicMBConv(space, in_ch, cfg.stage_channels[s], stride,
                                            cfg.stage_activations[s]))
                in_ch = cfg.stage_channels[s]
            self.stages.append(blocks)
        self.head_conv = nn.Conv2d(in_ch, cfg.head_channels, 1, bias=False)
        self.head_bn = nn.BatchNorm2d(cfg.head_channels)
        self.head_act = nn.Hardswish()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(cfg.head_channels, cfg.num_classes)
        self.active_depths = [cfg.max_depth] * cfg.num_stages
        self.set_active(space.largest())

    def set_active(self, arch: MBV3Arch | str) -> MBV3Arch:
        """Select the subnet ``arch`` (an architecture or its string) for later forward passes."""
        arch = self.space.parse(arch)
        self.active_depths = list(arch.depths)
        for stage_blocks, stage in zip(self.stages, arch.stages):
            for block, (k, e) in zip(stage_blocks, stage):
                block.active_kernel, block.active_expand = k, e
        return arch

    def active_arch(self) -> MBV3Arch:
        return MBV3Arch(
            tuple(
                tuple((blk.active_kernel, blk.active_expand) for blk in stage_blocks[:d])
                for stage_blocks, d in zip(self.stages, self.active_depths)
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem_act(self.stem_bn(self.stem_conv(x)))
        for stage_blocks, depth in zip(self.stages, self.active_depths):
            for block in stage_blocks[:depth]:
                x = block(x)
        x = self.head_act(self.head_bn(self.head_conv(x)))
        return self.classifier(torch.flatten(self.pool(x), 1))

    @torch.no_grad()
    def extract(self, arch: MBV3Arch | str | None = None) -> MBV3Net:
        """A standalone copy of the subnet ``arch`` (default: the active one), in eval mode.

        The active subnet is left as it was."""
        previous = self.active_arch()
        if arch is not None:
            self.set_active(arch)
        try:
            blocks = [
                block.static()
                for stage_blocks, d in zip(self.stages, self.active_depths)
                for block in stage_blocks[:d]
            ]
            net = MBV3Net(
                _copy(self.stem_conv), _copy(self.stem_bn), blocks,
                _copy(self.head_conv), _copy(self.head_bn), _copy(self.classifier),
            )
        finally:
            self.set_active(previous)
        device = next(self.parameters()).device
        return net.to(device).eval()


def _copy(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module)
