"""The NAS-Bench-201 cell space (Dong & Yang, ICLR 2020), as measured by HW-NAS-Bench and HELP.

A cell is a DAG of 4 nodes; node ``j`` is the sum of one operation applied to each earlier node
``i < j``, which gives 6 edges, each one of 5 operations (``none``, ``skip_connect``,
``nor_conv_1x1``, ``nor_conv_3x3``, ``avg_pool_3x3``): 5**6 = 15,625 architectures. Every cell of
the network uses the same cell. Macro-architecture: the standard NAS-Bench-201 network for
32×32 CIFAR images (:class:`NB201Config`); operations: NAS-Bench-201's (:class:`NB201Space`).

Architecture string: the NAS-Bench-201 format, the edges into node 1, 2 and 3 grouped by ``+``,
each edge written ``|op~source|``::

    |nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|

This is the ``arch`` column of the HW-NAS-Bench/HELP latency tables and of the NAS-Bench-201
accuracy table, so architectures join with them by string.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from hwnas.supernet.layers import Layer
from hwnas.supernet.space import SearchSpace, SpaceConfig, check_choice

from hwnas.core.errors import UserError

#: The candidate operations of an edge, in NAS-Bench-201's order (also the one-hot order).
NB201_OPS: tuple[str, ...] = (
    "none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3",
)

#: The cell's edges as (to_node, from_node), in the order of the string and of :class:`NB201Arch`.
NB201_EDGES: tuple[tuple[int, int], ...] = ((1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2))

#: Number of nodes of a cell (node 0 is the cell's input, the last node its output).
NUM_NODES = 4

#: Kernel size of each convolution operation.
CONV_KERNELS: dict[str, int] = {"nor_conv_1x1": 1, "nor_conv_3x3": 3}


def edge_key(to_node: int, from_node: int) -> str:
    """Module name of an edge inside a cell (``e{to}_{from}``), shared by the supernet, the
    static model and the layer list."""
    return f"e{to_node}_{from_node}"


@dataclass(frozen=True)
class NB201Config(SpaceConfig):
    """Macro-architecture of the NAS-Bench-201 network (defaults: HW-NAS-Bench's CIFAR-100 one).

    ``C`` is ``init_channels``, ``N`` is ``cells_per_stage``:

    * stem: conv 3×3 ``in_channels -> C`` + BN;
    * stage 1: ``N`` cells of ``C`` channels;
    * reduction: a ResNet basic block ``C -> 2C`` with stride 2 (ReLU-conv3×3/2-BN,
      ReLU-conv3×3-BN; shortcut 2×2 average pool/2 followed by a 1×1 conv without BN), then
      stage 2 of ``N`` cells;
    * another reduction ``2C -> 4C``, stage 3 of ``N`` cells;
    * BN + ReLU, global average pool, linear classifier.
    """

    LABEL = "NB201"

    in_channels: int = 3
    image_size: int = 32
    num_classes: int = 100
    init_channels: int = 16
    cells_per_stage: int = 5

    def __post_init__(self) -> None:
        names = ("in_channels", "image_size", "num_classes", "init_channels", "cells_per_stage")
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"nb201 {name} = {value!r}; expected a positive integer")
        if self.image_size % 4:
            # the two stride-2 reductions add a conv path and a 2x2-pool path, which only agree
            # in size when the input divides evenly
            raise UserError(
                f"nb201 image_size = {self.image_size}; expected a multiple of 4 (two stride-2 "
                f"reductions)"
            )



@dataclass(frozen=True)
class NB201Arch:
    """One cell: the operation of each edge, in :data:`NB201_EDGES` order."""

    ops: tuple[str, ...]

    def op(self, to_node: int, from_node: int) -> str:
        """The operation on the edge ``to_node <- from_node``."""
        return self.ops[NB201_EDGES.index((to_node, from_node))]

    def incoming(self, node: int) -> list[tuple[int, str]]:
        """``(from_node, op)`` for every edge into ``node``, ``none`` included."""
        return [(f, op) for (t, f), op in zip(NB201_EDGES, self.ops) if t == node]

    def is_connected(self) -> bool:
        """Whether the cell output depends on its input: a path of non-``none`` edges joins node
        0 to the last node. Unconnected cells make the whole network output a constant."""
        reached = {0}
        for node in range(1, NUM_NODES):
            if any(op != "none" and f in reached for f, op in self.incoming(node)):
                reached.add(node)
        return NUM_NODES - 1 in reached


class NB201Space(SearchSpace[NB201Arch]):
    """The NAS-Bench-201 cell space; see the module docstring.

    Cell operations: ``nor_conv_kxk`` = ReLU-conv(k×k, same padding, no bias)-BN;
    ``avg_pool_3x3`` = 3×3 average pool, stride 1, padding 1, ``count_include_pad=False``;
    ``skip_connect`` = identity; ``none`` = zeros (the edge contributes nothing). A node none of
    whose incoming edges is active is a zero tensor; the operations that read it still run (a
    ReLU-conv-BN of zeros is BN's constant shift), exactly as in NAS-Bench-201, so they stay in
    the layer list.
    """

    def __init__(self, config: NB201Config | None = None, name: str = "nb201") -> None:
        self._set_config(config or NB201Config(), name)

    def describe(self) -> str:
        return (f"{self.name}: NAS-Bench-201 cells (6 edges x {len(NB201_OPS)} ops), input "
                f"{self.input_shape}, {self.num_classes} classes")

    # -- what a device runs ---------------------------------------------------------------------
    def execution_variants(self) -> tuple[str, ...]:
        """``raw`` and ``pruned``: a ``none`` edge can leave a node whose value reaches the cell
        output by no path, and a runtime that eliminates dead code skips the operations
        computing it (HW-NAS-Bench's TFLite phone does; a cuDNN runtime does not)."""
        return ("raw", "pruned")

    def executed(self, arch: NB201Arch, variant: str) -> tuple[NB201Arch, bool]:
        """Under ``pruned``: the cell with its dead operations replaced by ``none``, and whether
        the cell output no longer depends on the cell input (a constant network)."""
        if variant == "raw":
            return arch, False
        if variant != "pruned":
            return super().executed(arch, variant)
        live = {NUM_NODES - 1}  # nodes whose value reaches the cell output
        for node in range(NUM_NODES - 2, -1, -1):
            if any(op != "none" and f == node and t in live
                   for (t, f), op in zip(NB201_EDGES, arch.ops)):
                live.add(node)
        ops = tuple(op if t in live else "none" for (t, _f), op in zip(NB201_EDGES, arch.ops))
        return NB201Arch(ops), not arch.is_connected()

    # -- members ---------------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> NB201Arch:
        """Uniform over all 15,625 cells (each edge drawn independently), unconnected ones
        included, as in NAS-Bench-201 itself."""
        idx = rng.integers(0, len(NB201_OPS), len(NB201_EDGES))
        return NB201Arch(tuple(NB201_OPS[int(i)] for i in idx))

    def smallest(self) -> NB201Arch:
        """``|none~0|+|none~0|none~1|+|skip_connect~0|none~1|none~2|``.

        Every edge at its first choice (all ``none``) would be a network whose output does not
        depend on its input, so the smallest member is defined among *connected* cells
        (:meth:`NB201Arch.is_connected`): minimal MACs (here: the macro network alone, the cell
        adds none), then fewest active edges, then fewest pooling edges. That minimum is unique:
        a single identity edge from the cell input to its output.
        """
        return NB201Arch(("none", "none", "none", "skip_connect", "none", "none"))

    def largest(self) -> NB201Arch:
        """Every edge ``nor_conv_3x3`` (the most MACs and parameters)."""
        return NB201Arch(("nor_conv_3x3",) * len(NB201_EDGES))

    def all_architectures(self) -> Iterator[NB201Arch]:
        """All 15,625 members, in NAS-Bench-201 op-index order (last edge fastest)."""
        for ops in itertools.product(NB201_OPS, repeat=len(NB201_EDGES)):
            yield NB201Arch(ops)

    def validate(self, arch: NB201Arch) -> NB201Arch:
        if not isinstance(arch, NB201Arch):
            raise UserError(
                f"expected an NB201Arch for space {self.name}, got {type(arch).__name__}"
            )
        if not isinstance(arch.ops, tuple) or len(arch.ops) != len(NB201_EDGES):
            raise UserError(
                f"an {self.name} architecture has {len(NB201_EDGES)} edge operations, got "
                f"{arch.ops!r}"
            )
        for (to_node, from_node), op in zip(NB201_EDGES, arch.ops):
            check_choice(op, NB201_OPS, f"op of edge {to_node}<-{from_node}")
        return arch

    # -- string form -----------------------------------------------------------------------------
    def to_string(self, arch: NB201Arch) -> str:
        self.validate(arch)
        groups = []
        for node in range(1, NUM_NODES):
            groups.append("|" + "|".join(f"{op}~{f}" for f, op in arch.incoming(node)) + "|")
        return "+".join(groups)

    def from_string(self, text: str) -> NB201Arch:
        example = ("|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|"
                   "+|skip_connect~0|none~1|nor_conv_1x1~2|")
        expected = (f"expected the NAS-Bench-201 form '|op~0|+|op~0|op~1|+|op~0|op~1|op~2|' "
                    f"(e.g. {example!r})")
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"empty architecture string for space {self.name}; {expected}")
        text = text.strip()
        groups = text.split("+")
        if len(groups) != NUM_NODES - 1:
            raise UserError(
                f"architecture {text!r} has {len(groups)} node groups separated by '+'; "
                f"{expected}"
            )
        ops: list[str] = []
        for node, group in enumerate(groups, start=1):
            if len(group) < 2 or not (group.startswith("|") and group.endswith("|")):
                raise UserError(
                    f"node {node} group {group!r} of {text!r} must start and end with '|'; "
                    f"{expected}"
                )
            items = group[1:-1].split("|")
            if len(items) != node:
                raise UserError(
                    f"node {node} of {text!r} has {len(items)} incoming edges; expected {node} "
                    f"(from nodes {list(range(node))}); {expected}"
                )
            for from_node, item in enumerate(items):
                op, sep, source = item.rpartition("~")
                if not sep or source != str(from_node):
                    raise UserError(
                        f"edge {node}<-{from_node} of {text!r} is written {item!r}; expected "
                        f"'<op>~{from_node}' with op one of {list(NB201_OPS)}"
                    )
                check_choice(op, NB201_OPS, f"op of edge {node}<-{from_node}")
                ops.append(op)
        return self.validate(NB201Arch(tuple(ops)))

    # -- features --------------------------------------------------------------------------------
    @property
    def feature_names(self) -> list[str]:
        return [f"edge{t}<-{f}={op}" for t, f in NB201_EDGES for op in NB201_OPS]

    def encode(self, arch: NB201Arch) -> np.ndarray:
        """One-hot operation per edge: 6 edges × 5 operations = 30 features (HELP's encoding)."""
        self.validate(arch)
        out = np.zeros((len(NB201_EDGES), len(NB201_OPS)), dtype=np.float32)
        for e, op in enumerate(arch.ops):
            out[e, NB201_OPS.index(op)] = 1.0
        return out.reshape(-1)

    # -- layers ----------------------------------------------------------------------------------
    def stage_channels(self) -> tuple[int, ...]:
        c = self.cfg.init_channels
        return (c, 2 * c, 4 * c)

    def layers(self, arch: NB201Arch) -> list[Layer]:
        """Stem conv, cells, reduction blocks, global pool and classifier as a layer list.

        Layer names are the module names of the static model of :mod:`hwnas.supernet.nn.nb201`
        (``cells.{i}`` counts cells and reduction blocks together, as NAS-Bench-201 does).
        The ReLU *before* each ReLU-conv-BN is recorded as ``extra["pre_activation"]``; a node
        that sums ``n`` active edges adds ``n - 1`` ``add`` layers; the final BN + ReLU is an
        element-wise affine map (no MACs) and is not a layer.
        """
        self.validate(arch)
        c = self.cfg
        pre = {"pre_activation": "relu"}
        size = c.image_size
        ch = c.init_channels
        out: list[Layer] = [
            Layer("stem.conv", "conv", c.in_channels, ch, 3, 1, 1, size, size, bias=True)
        ]
        index = 0
        for stage, stage_ch in enumerate(self.stage_channels()):
            if stage > 0:
                p = f"cells.{index}"
                conv_a = Layer(f"{p}.conv_a.conv", "conv", ch, stage_ch, 3, 2, 1, size, size,
                               bias=True, extra=dict(pre))
                new = conv_a.out_h
                out += [
                    conv_a,
                    Layer(f"{p}.conv_b.conv", "conv", stage_ch, stage_ch, 3, 1, 1, new, new,
                          bias=True, extra=dict(pre)),
                    Layer(f"{p}.shortcut_pool", "pool", ch, ch, 2, 2, 1, size, size,
                          extra={"mode": "avg"}),
                    Layer(f"{p}.shortcut_conv", "conv", ch, stage_ch, 1, 1, 1, new, new),
                    Layer(f"{p}.add", "add", stage_ch, stage_ch, in_h=new, in_w=new),
                ]
                ch, size, index = stage_ch, new, index + 1
            for _ in range(c.cells_per_stage):
                out += self._cell_layers(arch, f"cells.{index}", ch, size)
                index += 1
        out.append(Layer("pool", "avgpool", ch, ch, in_h=size, in_w=size))
        out.append(Layer("classifier", "linear", ch, c.num_classes, bias=True))
        return out

    @staticmethod
    def _cell_layers(arch: NB201Arch, prefix: str, ch: int, size: int) -> list[Layer]:
        out: list[Layer] = []
        for node in range(1, NUM_NODES):
            active = 0
            for from_node, op in arch.incoming(node):
                name = f"{prefix}.edges.{edge_key(node, from_node)}"
                if op in CONV_KERNELS:
                    out.append(Layer(f"{name}.conv", "conv", ch, ch, CONV_KERNELS[op], 1, 1,
                                     size, size, bias=True, extra={"pre_activation": "relu"}))
                elif op == "avg_pool_3x3":
                    out.append(Layer(name, "pool", ch, ch, 3, 1, 1, size, size,
                                     extra={"mode": "avg"}))
                active += op != "none"
            for a in range(active - 1):
                out.append(Layer(f"{prefix}.node{node}.add{a}", "add", ch, ch,
                                 in_h=size, in_w=size))
        return out

    # -- Optuna ----------------------------------------------------------------------------------
    def suggest(self, trial: Any) -> NB201Arch:
        """One categorical parameter per edge, ``e0``..``e5`` in :data:`NB201_EDGES` order."""
        return NB201Arch(
            tuple(str(trial.suggest_categorical(f"e{i}", list(NB201_OPS)))
                  for i in range(len(NB201_EDGES)))
        )

    def to_params(self, arch: NB201Arch) -> dict[str, Any]:
        self.validate(arch)
        return {f"e{i}": op for i, op in enumerate(arch.ops)}

    # -- torch -----------------------------------------------------------------------------------
    def build_supernet(self):
        from hwnas.supernet.nn.nb201 import NB201Supernet

        return NB201Supernet(self)
