"""The single-path weight-sharing supernet of :class:`hwnas.supernet.spaces.nb201.NB201Space` and its
static subnets.

Every edge of every cell holds all candidate operations (its own ReLU-conv-BN for
``nor_conv_1x1`` and for ``nor_conv_3x3``; ``skip_connect`` and ``avg_pool_3x3`` have no weights);
the stem, the two ResNet reduction blocks and the classifier are shared by all subnets.
``NB201Supernet.set_active(arch)`` selects one operation per edge (stored on each cell);
``forward`` runs only those; ``extract(arch)`` returns a plain :class:`NB201Net` whose module
names are the layer names of :meth:`NB201Space.layers`.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch
from hwnas.supernet.nn.supernet import Supernet
from hwnas.supernet.spaces.nb201 import (
    CONV_KERNELS,
    NB201_EDGES,
    NUM_NODES,
    NB201Arch,
    NB201Space,
    edge_key,
)
from torch import nn


class ReLUConvBN(nn.Module):
    """NAS-Bench-201's ``nor_conv``: ReLU, k×k convolution (same padding, no bias), BatchNorm."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        self.relu = nn.ReLU(inplace=False)
        self.conv = nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(self.relu(x)))


class ResBlock(nn.Module):
    """NAS-Bench-201's reduction block: a stride-2 ResNet basic block whose shortcut is a 2×2
    average pool followed by a 1×1 convolution (no BN)."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.conv_a = ReLUConvBN(in_ch, out_ch, 3, 2)
        self.conv_b = ReLUConvBN(out_ch, out_ch, 3, 1)
        self.shortcut_pool = nn.AvgPool2d(kernel_size=2, stride=2, padding=0)
        self.shortcut_conv = nn.Conv2d(in_ch, out_ch, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_b(self.conv_a(x)) + self.shortcut_conv(self.shortcut_pool(x))


def make_op(op: str, channels: int) -> nn.Module:
    """A fresh module for a non-``none`` cell operation."""
    if op in CONV_KERNELS:
        return ReLUConvBN(channels, channels, CONV_KERNELS[op])
    if op == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
    if op == "skip_connect":
        return nn.Identity()
    raise ValueError(f"no module for cell operation {op!r}")


def _cell_forward(x: torch.Tensor, arch: NB201Arch, edge_module) -> torch.Tensor:
    """Run a cell: node j = sum of the active edges into it (zeros if none is active)."""
    nodes = [x]
    for node in range(1, NUM_NODES):
        terms = [edge_module(node, f, op)(nodes[f])
                 for f, op in arch.incoming(node) if op != "none"]
        if terms:
            total = terms[0]
            for t in terms[1:]:
                total = total + t
        else:
            total = torch.zeros_like(x)
        nodes.append(total)
    return nodes[-1]


class NB201Cell(nn.Module):
    """A static cell: one module per active edge, in ``edges[e{to}_{from}]``."""

    def __init__(self, arch: NB201Arch, edges: dict[str, nn.Module]) -> None:
        super().__init__()
        self.arch = arch
        self.edges = nn.ModuleDict(edges)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _cell_forward(x, self.arch, lambda t, f, op: self.edges[edge_key(t, f)])


class SuperCell(nn.Module):
    """A cell whose every edge holds all candidate operations; runs the active one per edge."""

    def __init__(self, channels: int, arch: NB201Arch) -> None:
        super().__init__()
        self.channels = channels
        self.edges = nn.ModuleDict(
            {
                edge_key(t, f): nn.ModuleDict(
                    {op: make_op(op, channels)
                     for op in ("skip_connect", *CONV_KERNELS, "avg_pool_3x3")}
                )
                for t, f in NB201_EDGES
            }
        )
        self.active = arch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _cell_forward(x, self.active, lambda t, f, op: self.edges[edge_key(t, f)][op])

    def static(self) -> NB201Cell:
        arch = self.active
        edges = {
            edge_key(t, f): copy.deepcopy(self.edges[edge_key(t, f)][op])
            for (t, f), op in zip(NB201_EDGES, arch.ops)
            if op != "none"
        }
        return NB201Cell(arch, edges)


class NB201Net(nn.Module):
    """A standalone NAS-Bench-201 network: stem, cells and reduction blocks, head."""

    def __init__(self, stem: nn.Module, cells: list[nn.Module], last_bn: nn.BatchNorm2d,
                 classifier: nn.Linear) -> None:
        super().__init__()
        self.stem = stem
        self.cells = nn.ModuleList(cells)
        self.last_bn = last_bn
        self.last_act = nn.ReLU(inplace=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for cell in self.cells:
            x = cell(x)
        x = self.last_act(self.last_bn(x))
        return self.classifier(torch.flatten(self.pool(x), 1))


class NB201Supernet(Supernet):
    """Weight-sharing supernet of an :class:`NB201Space`; starts with the largest cell active."""

    def __init__(self, space: NB201Space) -> None:
        super().__init__()
        cfg = space.cfg
        self.space = space
        largest = space.largest()
        ch = cfg.init_channels
        self.stem = nn.Sequential(
            OrderedDict(
                conv=nn.Conv2d(cfg.in_channels, ch, 3, 1, 1, bias=False),
                bn=nn.BatchNorm2d(ch),
            )
        )
        cells: list[nn.Module] = []
        for stage, stage_ch in enumerate(space.stage_channels()):
            if stage > 0:
                cells.append(ResBlock(ch, stage_ch))
                ch = stage_ch
            cells += [SuperCell(ch, largest) for _ in range(cfg.cells_per_stage)]
        self.cells = nn.ModuleList(cells)
        self.last_bn = nn.BatchNorm2d(ch)
        self.last_act = nn.ReLU(inplace=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(ch, cfg.num_classes)
        self._active = largest

    def _search_cells(self) -> list[SuperCell]:
        return [c for c in self.cells if isinstance(c, SuperCell)]

    def set_active(self, arch: NB201Arch | str) -> NB201Arch:
        """Select the cell ``arch`` (an architecture or its string) for later forward passes."""
        arch = self.space.parse(arch)
        for cell in self._search_cells():
            cell.active = arch
        self._active = arch
        return arch

    def active_arch(self) -> NB201Arch:
        return self._active

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for cell in self.cells:
            x = cell(x)
        x = self.last_act(self.last_bn(x))
        return self.classifier(torch.flatten(self.pool(x), 1))

    def static_net(self) -> NB201Net:
        cells = [c.static() if isinstance(c, SuperCell) else copy.deepcopy(c) for c in self.cells]
        return NB201Net(copy.deepcopy(self.stem), cells, copy.deepcopy(self.last_bn),
                        copy.deepcopy(self.classifier))
