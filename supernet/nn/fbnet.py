"""The single-path weight-sharing supernet of :class:`hwnas.supernet.spaces.fbnet.FBNetSpace` and its
static subnets.

Each searchable layer (:class:`SuperLayer`) holds the weights of all 9 blocks, shared the
Once-for-All way: the dense blocks share one max-size set, the grouped blocks their own, and
``skip`` needs one only where the shape changes.

``set_active(arch)`` stores each layer's block on the layer; ``forward`` runs only the active
blocks; ``extract(arch)`` returns a plain :class:`FBNetNet` whose module names are the layer
names of :meth:`FBNetSpace.layers`.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch
from hwnas.supernet.nn.dynamic_ops import (
    DynamicBatchNorm2d,
    DynamicConv2d,
    DynamicDepthwiseConv2d,
)
from hwnas.supernet.spaces.fbnet import FBNET_BLOCKS, FBNetArch, FBNetSpace, block_spec
from torch import nn


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """ShuffleNet's channel shuffle: (N, g·c, H, W) -> view (N, g, c) -> transpose -> flatten."""
    n, ch, h, w = x.shape
    return x.view(n, groups, ch // groups, h, w).transpose(1, 2).reshape(n, ch, h, w)


class FBNetBlock(nn.Module):
    """A static ``k{k}_e{e}[_g{g}]`` block: 1×1 expand (groups g) - BN - ReLU - shuffle (g > 1) -
    k×k depthwise - BN - ReLU - 1×1 project (groups g) - BN (+ input if ``residual``)."""

    def __init__(self, expand_conv: nn.Conv2d, expand_bn: nn.BatchNorm2d, dw_conv: nn.Conv2d,
                 dw_bn: nn.BatchNorm2d, project_conv: nn.Conv2d, project_bn: nn.BatchNorm2d,
                 groups: int, residual: bool) -> None:
        super().__init__()
        self.expand_conv, self.expand_bn = expand_conv, expand_bn
        self.dw_conv, self.dw_bn = dw_conv, dw_bn
        self.project_conv, self.project_bn = project_conv, project_bn
        self.act1, self.act2 = nn.ReLU(), nn.ReLU()
        self.groups, self.residual = groups, residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act1(self.expand_bn(self.expand_conv(x)))
        if self.groups > 1:
            y = channel_shuffle(y, self.groups)
        y = self.act2(self.dw_bn(self.dw_conv(y)))
        y = self.project_bn(self.project_conv(y))
        return x + y if self.residual else y


class FBNetSkip(nn.Module):
    """``skip`` where the shape changes: 1×1 conv (with the layer's stride) - BN - ReLU."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
        super().__init__()
        self.conv, self.bn, self.act = conv, bn, nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class FBNetNet(nn.Module):
    """A standalone FBNet network: stem, the 22 blocks (``nn.Identity`` for identity skips),
    head conv, pool, classifier."""

    def __init__(self, stem: nn.Module, blocks: list[nn.Module], head_conv: nn.Conv2d,
                 head_bn: nn.BatchNorm2d, classifier: nn.Linear) -> None:
        super().__init__()
        self.stem = stem
        self.blocks = nn.Sequential(*blocks)
        self.head_conv, self.head_bn, self.head_act = head_conv, head_bn, nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        x = self.head_act(self.head_bn(self.head_conv(x)))
        return self.classifier(torch.flatten(self.pool(x), 1))


class SuperLayer(nn.Module):
    """One searchable layer holding the weights of all 9 blocks, in three families:

    * the dense blocks ``k{3,5}_e{1,3,6}`` share one max-size (``e6``) expand conv, depthwise
      conv and project conv with their BatchNorms: expansion ``e`` uses the leading ``C_in*e``
      channels, and the 3×3 depthwise kernel is the transformed centre of the 5×5 one
      (:class:`~supernet.nn.dynamic_ops.DynamicDepthwiseConv2d`);
    * the grouped blocks ``k{3,5}_e1_g2`` share their own grouped 1×1 convs and a depthwise conv
      (3×3 again the transformed centre of 5×5): a grouped conv followed by a channel shuffle is
      a different function from a dense one, so it gets its own weights;
    * ``skip`` is the identity, or (stride 2 or a channel change) its own 1×1 conv + BN + ReLU.
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.in_ch, self.out_ch, self.stride = in_ch, out_ch, stride
        self.identity_shape = stride == 1 and in_ch == out_ch
        dense = [block_spec(b) for b in FBNET_BLOCKS if b != "skip" and block_spec(b).groups == 1]
        max_mid = in_ch * max(s.expand for s in dense)
        kernels = tuple(sorted({s.kernel for s in dense}))
        self.expand_conv = DynamicConv2d(in_ch, max_mid, 1)
        self.expand_bn = DynamicBatchNorm2d(max_mid)
        self.dw_conv = DynamicDepthwiseConv2d(max_mid, kernels, stride)
        self.dw_bn = DynamicBatchNorm2d(max_mid)
        self.project_conv = DynamicConv2d(max_mid, out_ch, 1)
        self.project_bn = DynamicBatchNorm2d(out_ch)
        # grouped family (e1, 2 groups)
        self.g_expand_conv = nn.Conv2d(in_ch, in_ch, 1, groups=2, bias=False)
        self.g_expand_bn = nn.BatchNorm2d(in_ch)
        self.g_dw_conv = DynamicDepthwiseConv2d(in_ch, kernels, stride)
        self.g_dw_bn = nn.BatchNorm2d(in_ch)
        self.g_project_conv = nn.Conv2d(in_ch, out_ch, 1, groups=2, bias=False)
        self.g_project_bn = nn.BatchNorm2d(out_ch)
        for conv in (self.g_expand_conv, self.g_project_conv):
            nn.init.kaiming_normal_(conv.weight, mode="fan_out")
        if not self.identity_shape:
            self.skip_conv = nn.Conv2d(in_ch, out_ch, 1, stride, 0, bias=False)
            nn.init.kaiming_normal_(self.skip_conv.weight, mode="fan_out")
            self.skip_bn = nn.BatchNorm2d(out_ch)
        self.act = nn.ReLU()
        self.active = "k5_e6"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = block_spec(self.active)
        if spec is None:
            if self.identity_shape:
                return x
            return self.act(self.skip_bn(self.skip_conv(x)))
        if spec.groups > 1:
            y = self.act(self.g_expand_bn(self.g_expand_conv(x)))
            y = channel_shuffle(y, spec.groups)
            y = self.act(self.g_dw_bn(self.g_dw_conv(y, spec.kernel)))
            y = self.g_project_bn(self.g_project_conv(y))
        else:
            mid = self.in_ch * spec.expand
            y = self.act(self.expand_bn(self.expand_conv(x, mid)))
            y = self.act(self.dw_bn(self.dw_conv(y, spec.kernel)))
            y = self.project_bn(self.project_conv(y, self.out_ch))
        return x + y if self.identity_shape else y

    def static(self) -> nn.Module:
        spec = block_spec(self.active)
        if spec is None:
            if self.identity_shape:
                return nn.Identity()
            return FBNetSkip(copy.deepcopy(self.skip_conv), copy.deepcopy(self.skip_bn))
        if spec.groups > 1:
            return FBNetBlock(
                copy.deepcopy(self.g_expand_conv), copy.deepcopy(self.g_expand_bn),
                self.g_dw_conv.static(self.in_ch, spec.kernel), copy.deepcopy(self.g_dw_bn),
                copy.deepcopy(self.g_project_conv), copy.deepcopy(self.g_project_bn),
                spec.groups, self.identity_shape,
            )
        mid = self.in_ch * spec.expand
        return FBNetBlock(
            self.expand_conv.static(self.in_ch, mid), self.expand_bn.static(mid),
            self.dw_conv.static(mid, spec.kernel), self.dw_bn.static(mid),
            self.project_conv.static(mid, self.out_ch), self.project_bn.static(self.out_ch),
            1, self.identity_shape,
        )


class FBNetSupernet(nn.Module):
    """Weight-sharing supernet of an :class:`FBNetSpace`; starts with the largest subnet active."""

    def __init__(self, space: FBNetSpace) -> None:
        super().__init__()
        cfg = space.cfg
        self.space = space
        self.stem = nn.Sequential(
            OrderedDict(
                conv=nn.Conv2d(cfg.in_channels, cfg.stem_channels, 3, cfg.stem_stride, 1,
                               bias=False),
                bn=nn.BatchNorm2d(cfg.stem_channels),
                act=nn.ReLU(),
            )
        )
        self.blocks = nn.ModuleList(SuperLayer(i, o, s) for i, o, s in cfg.layer_plan())
        last = cfg.stage_channels[-1]
        self.head_conv = nn.Conv2d(last, cfg.head_channels, 1, bias=False)
        self.head_bn = nn.BatchNorm2d(cfg.head_channels)
        self.head_act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(cfg.head_channels, cfg.num_classes)
        for conv in (self.stem.conv, self.head_conv):
            nn.init.kaiming_normal_(conv.weight, mode="fan_out")
        self.set_active(space.largest())

    def set_active(self, arch: FBNetArch | str) -> FBNetArch:
        """Select the subnet ``arch`` (an architecture or its string) for later forward passes."""
        arch = self.space.parse(arch)
        for layer, block in zip(self.blocks, arch.blocks):
            layer.active = block
        return arch

    def active_arch(self) -> FBNetArch:
        return FBNetArch(tuple(layer.active for layer in self.blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.blocks:
            x = layer(x)
        x = self.head_act(self.head_bn(self.head_conv(x)))
        return self.classifier(torch.flatten(self.pool(x), 1))

    @torch.no_grad()
    def extract(self, arch: FBNetArch | str | None = None) -> FBNetNet:
        """A standalone copy of the subnet ``arch`` (default: the active one), in eval mode.

        The active subnet is left as it was."""
        previous = self.active_arch()
        if arch is not None:
            self.set_active(arch)
        device = next(self.parameters()).device
        try:  # built on the supernet's device: no copy through the default device
            with torch.device(device):
                net = FBNetNet(
                    copy.deepcopy(self.stem), [layer.static() for layer in self.blocks],
                    copy.deepcopy(self.head_conv), copy.deepcopy(self.head_bn),
                    copy.deepcopy(self.classifier),
                )
        finally:
            self.set_active(previous)
        return net.to(device).eval()
