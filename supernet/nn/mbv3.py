"""The elastic MobileNetV3 supernet of :class:`hwnas.supernet.spaces.mbv3.MBV3Space` and its static
subnets.

``MBV3Supernet.set_active(arch)`` selects a subnet (each block stores its own active kernel and
expand ratio; no global flags); ``forward`` runs it; ``extract(arch)`` returns a plain
:class:`MBV3Net` built from ``nn.Conv2d``/``nn.BatchNorm2d``/``nn.Linear`` with copies of the
active weights, which computes the same outputs and exports to ONNX as is; its module names are
the layer names of :meth:`MBV3Space.layers`. ``sort_channels()`` is Once-for-All's weight
re-organization: it permutes each block's expanded channels by importance so that the leading
slices, which the smaller expand ratios use, hold the most important channels.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from hwnas.supernet.nn.dynamic_ops import (
    DynamicBatchNorm2d,
    DynamicConv2d,
    DynamicDepthwiseConv2d,
    DynamicSE,
    SqueezeExcite,
    activation,
)
from hwnas.supernet.nn.supernet import Supernet
from hwnas.supernet.spaces.mbv3 import MBV3Arch, MBV3Space
from torch import nn


class MBConv(nn.Module):
    """A static inverted-residual block: 1×1 expand (absent for the expand-1 first block),
    k×k depthwise, optional squeeze-and-excitation, 1×1 project (+ residual).

    Attribute names match the layer names of :meth:`MBV3Space.layers`.
    """

    def __init__(self, expand_conv: nn.Module | None, expand_bn: nn.Module | None,
                 dw_conv: nn.Module, dw_bn: nn.Module, project_conv: nn.Module,
                 project_bn: nn.Module, act: str, residual: bool,
                 se: SqueezeExcite | None = None) -> None:
        super().__init__()
        self.expand_conv, self.expand_bn = expand_conv, expand_bn
        self.dw_conv, self.dw_bn = dw_conv, dw_bn
        self.se = se
        self.project_conv, self.project_bn = project_conv, project_bn
        self.act1, self.act2 = activation(act), activation(act)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x if self.expand_conv is None else self.act1(self.expand_bn(self.expand_conv(x)))
        y = self.act2(self.dw_bn(self.dw_conv(y)))
        if self.se is not None:
            y = self.se(y)
        y = self.project_bn(self.project_conv(y))
        return x + y if self.residual else y


class MBV3Net(nn.Module):
    """A standalone subnet: stem, optional fixed first block, a flat list of MBConv blocks,
    head (1×1 conv, pool, optional feature-mix layer, classifier)."""

    def __init__(self, *, stem_conv: nn.Module, stem_bn: nn.Module, stem_act: str,
                 first_block: MBConv | None, blocks: list[MBConv], head_conv: nn.Module,
                 head_bn: nn.Module, head_act: str, feature_mix: nn.Module | None,
                 classifier: nn.Module) -> None:
        super().__init__()
        self.stem_conv, self.stem_bn, self.stem_act = stem_conv, stem_bn, activation(stem_act)
        self.first_block = first_block
        self.blocks = nn.Sequential(*blocks)
        self.head_conv, self.head_bn, self.head_act = head_conv, head_bn, activation(head_act)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.feature_mix = feature_mix
        self.feature_mix_act = nn.Hardswish() if feature_mix is not None else None
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem_act(self.stem_bn(self.stem_conv(x)))
        if self.first_block is not None:
            x = self.first_block(x)
        x = self.blocks(x)
        x = self.head_act(self.head_bn(self.head_conv(x)))
        x = torch.flatten(self.pool(x), 1)
        if self.feature_mix is not None:
            x = self.feature_mix_act(self.feature_mix(x))
        return self.classifier(x)


def _banded_argsort(importance: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """Indices that sort ``importance`` in descending order within each band
    ``[0, b1), [b1, b2), ..., [bk, n)`` (channels never leave their band)."""
    n = importance.numel()
    edges = [0, *sorted({b for b in bounds if 0 < b < n}), n]
    parts = [lo + torch.argsort(importance[lo:hi], descending=True, stable=True)
             for lo, hi in zip(edges[:-1], edges[1:])]
    return torch.cat(parts)


@torch.no_grad()
def _permute_(tensor: torch.Tensor, perm: torch.Tensor, dim: int,
              optimizer: torch.optim.Optimizer | None = None) -> None:
    """Permute ``tensor`` along ``dim`` in place, and the optimizer's per-parameter state
    (e.g. SGD momentum) with it, so that training continues as if nothing had moved."""
    tensor.copy_(tensor.index_select(dim, perm))
    if optimizer is not None and isinstance(tensor, nn.Parameter):
        for value in optimizer.state.get(tensor, {}).values():
            if torch.is_tensor(value) and value.shape == tensor.shape:
                value.copy_(value.index_select(dim, perm))


def _permute_bn_(bn: nn.BatchNorm2d, perm: torch.Tensor, optimizer) -> None:
    for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
        _permute_(t, perm, 0, optimizer)


class DynamicMBConv(nn.Module):
    """An MBConv block with elastic kernel and expand ratio (max-size weights shared)."""

    def __init__(self, space: MBV3Space, in_ch: int, out_ch: int, stride: int, act: str,
                 se: bool = False) -> None:
        super().__init__()
        cfg = space.cfg
        self.space, self.in_ch, self.out_ch, self.stride, self.act_name = space, in_ch, out_ch, stride, act
        max_mid = space.block_channels(in_ch, cfg.expand_choices[-1])
        self.expand_conv = DynamicConv2d(in_ch, max_mid, 1)
        self.expand_bn = DynamicBatchNorm2d(max_mid)
        self.dw_conv = DynamicDepthwiseConv2d(max_mid, cfg.kernel_choices, stride)
        self.dw_bn = DynamicBatchNorm2d(max_mid)
        self.se = DynamicSE(max_mid, space.se_channels) if se else None
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
        if self.se is not None:
            y = self.se(y)
        y = self.project_bn(self.project_conv(y, self.out_ch))
        return x + y if self.residual else y

    def static(self) -> MBConv:
        mid = self.space.block_channels(self.in_ch, self.active_expand)
        return MBConv(
            self.expand_conv.static(self.in_ch, mid), self.expand_bn.static(mid),
            self.dw_conv.static(mid, self.active_kernel), self.dw_bn.static(mid),
            self.project_conv.static(mid, self.out_ch), self.project_bn.static(self.out_ch),
            self.act_name, self.residual,
            se=self.se.static(mid) if self.se is not None else None,
        )

    @torch.no_grad()
    def sort_channels(self, keep_expand: tuple[int, ...] = (),
                      optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """Reorder the expanded channels by importance (L1 norm of the project conv's weights
        over each input channel), most important first; likewise the SE's hidden channels (L1
        norm of its expand conv). Channels within the prefix of each expand ratio in
        ``keep_expand`` stay within it (those smaller widths were trained already). The block's
        function at every expand ratio in ``keep_expand`` and at the largest is unchanged.
        Returns the permutation of the expanded channels."""
        widths = [self.space.block_channels(self.in_ch, e) for e in keep_expand]
        perm = _banded_argsort(self.project_conv.weight.abs().sum(dim=(0, 2, 3)), widths)
        _permute_(self.project_conv.weight, perm, 1, optimizer)
        if self.se is not None:
            se = self.se
            _permute_(se.reduce.weight, perm, 1, optimizer)
            _permute_(se.expand.weight, perm, 0, optimizer)
            _permute_(se.expand.bias, perm, 0, optimizer)
            hidden = [self.space.se_channels(w) for w in widths]
            perm_se = _banded_argsort(se.expand.weight.abs().sum(dim=(0, 2, 3)), hidden)
            _permute_(se.expand.weight, perm_se, 1, optimizer)
            _permute_(se.reduce.weight, perm_se, 0, optimizer)
            _permute_(se.reduce.bias, perm_se, 0, optimizer)
        _permute_bn_(self.dw_bn, perm, optimizer)
        _permute_(self.dw_conv.weight, perm, 0, optimizer)
        _permute_bn_(self.expand_bn, perm, optimizer)
        _permute_(self.expand_conv.weight, perm, 0, optimizer)
        return perm


def _static_block(in_ch: int, out_ch: int, kernel: int, act: str) -> MBConv:
    """The fixed first block: 3×3 depthwise (expand 1, no expand conv), project, residual."""
    return MBConv(
        None, None,
        nn.Conv2d(in_ch, in_ch, kernel, 1, kernel // 2, groups=in_ch, bias=False), nn.BatchNorm2d(in_ch),
        nn.Conv2d(in_ch, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch),
        act, residual=in_ch == out_ch,
    )


class MBV3Supernet(Supernet):
    """Weight-sharing supernet of an :class:`MBV3Space`; starts with the largest subnet active."""

    def __init__(self, space: MBV3Space) -> None:
        super().__init__()
        cfg = space.cfg
        self.space = space
        self.stem_conv = nn.Conv2d(cfg.in_channels, cfg.stem_channels, 3, cfg.stem_stride, 1, bias=False)
        self.stem_bn = nn.BatchNorm2d(cfg.stem_channels)
        self.stem_act = activation(cfg.stem_activation)
        in_ch = cfg.stem_channels
        self.first_block = None
        if cfg.first_block_channels:
            self.first_block = _static_block(in_ch, cfg.first_block_channels, 3,
                                             cfg.first_block_activation)
            in_ch = cfg.first_block_channels
        self.stages = nn.ModuleList()
        for s in range(cfg.num_stages):
            blocks = nn.ModuleList()
            for b in range(cfg.max_depth):
                stride = cfg.stage_strides[s] if b == 0 else 1
                blocks.append(DynamicMBConv(space, in_ch, cfg.stage_channels[s], stride,
                                            cfg.stage_activations[s], se=s in cfg.se_stages))
                in_ch = cfg.stage_channels[s]
            self.stages.append(blocks)
        self.head_conv = nn.Conv2d(in_ch, cfg.head_channels, 1, bias=False)
        self.head_bn = nn.BatchNorm2d(cfg.head_channels)
        self.head_act = activation(cfg.head_activation)
        self.pool = nn.AdaptiveAvgPool2d(1)
        features = cfg.head_channels
        self.feature_mix = None
        if cfg.feature_mix_channels:
            self.feature_mix = nn.Linear(features, cfg.feature_mix_channels, bias=False)
            self.feature_mix_act = nn.Hardswish()
            features = cfg.feature_mix_channels
        self.classifier = nn.Linear(features, cfg.num_classes)
        for m in (self.stem_conv, self.head_conv, *(self.first_block.modules() if self.first_block else ())):
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
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
        if self.first_block is not None:
            x = self.first_block(x)
        for stage_blocks, depth in zip(self.stages, self.active_depths):
            for block in stage_blocks[:depth]:
                x = block(x)
        x = self.head_act(self.head_bn(self.head_conv(x)))
        x = torch.flatten(self.pool(x), 1)
        if self.feature_mix is not None:
            x = self.feature_mix_act(self.feature_mix(x))
        return self.classifier(x)

    @torch.no_grad()
    def sort_channels(self, trained: dict[str, Any] | None = None,
                      optimizer: torch.optim.Optimizer | None = None) -> None:
        """Once-for-All's re-organization before (further) shrinking the expand ratio: sort
        every block's expanded channels by importance (see :meth:`DynamicMBConv.sort_channels`).

        ``trained``: the choices trained so far (a schedule stage's ``choices``); the expand
        ratios in ``trained["expand"]`` below the largest keep their channel sets (sorted only
        within them), so the widths already trained are not scrambled. ``optimizer``: its
        per-parameter state (momentum) is permuted along, so training continues exactly as if
        the channels had always been in this order. Subnets with the largest expand ratio, and
        with the kept ones, compute the same function as before.
        """
        largest = self.space.cfg.expand_choices[-1]
        keep = tuple(sorted({int(e) for e in ((trained or {}).get("expand") or ())} - {largest}))
        for stage_blocks in self.stages:
            for block in stage_blocks:
                block.sort_channels(keep, optimizer)

    def static_net(self) -> MBV3Net:
        blocks = [
            block.static()
            for stage_blocks, d in zip(self.stages, self.active_depths)
            for block in stage_blocks[:d]
        ]
        cfg = self.space.cfg
        return MBV3Net(
            stem_conv=_copy(self.stem_conv), stem_bn=_copy(self.stem_bn),
            stem_act=cfg.stem_activation, first_block=_copy(self.first_block), blocks=blocks,
            head_conv=_copy(self.head_conv), head_bn=_copy(self.head_bn),
            head_act=cfg.head_activation, feature_mix=_copy(self.feature_mix),
            classifier=_copy(self.classifier),
        )


def _copy(module: nn.Module | None) -> nn.Module | None:
    return None if module is None else copy.deepcopy(module)
