"""Tests for the NAS-Bench-201 cell space (supernet.spaces.nb201): declaration, string form
against the real tables, encoding, layer list, smallest and largest."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hwnas.supernet.data import shared_data_dir
from hwnas.supernet.layers import Layer
from hwnas.supernet.spaces import NB201Arch, NB201Space, available_spaces, get_space
from hwnas.supernet.spaces.nb201 import NB201_EDGES, NB201_OPS

from hwnas.core.errors import UserError

EXAMPLE = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def space() -> NB201Space:
    return get_space("nb201")


@pytest.fixture(scope="module")
def samples(space) -> list[NB201Arch]:
    rng = np.random.default_rng(0)
    return [space.sample(rng) for _ in range(100)]


def _csv_column(relative: str, column: str) -> list[str]:
    root = shared_data_dir()
    path = None if root is None else root / relative
    if path is None or not path.is_file():
        pytest.skip(f"shared data file {relative} not found (set HWNAS_SHARED_DATA)")
    with open(path, newline="") as f:
        return [row[column] for row in csv.DictReader(f)]


# --------------------------------------------------------------------------------------------
# declaration
# --------------------------------------------------------------------------------------------


def test_registered_and_configurable():
    assert "nb201" in available_spaces()
    space = get_space("nb201")
    assert space.input_shape == (3, 32, 32) and space.num_classes == 100
    ten = get_space("nb201", num_classes=10)
    assert ten.num_classes == 10 and ten.layers(ten.largest())[-1].out_channels == 10
    rebuilt = get_space("nb201", config=ten.config())
    assert rebuilt.config() == ten.config() and rebuilt.num_classes == 10
    gray = get_space("nb201", in_channels=1, image_size=16)
    assert gray.input_shape == (1, 16, 16)
    assert gray.layers(gray.largest())[0].in_channels == 1
    with pytest.raises(UserError, match="image_size"):
        get_space("nb201", image_size=30)


# --------------------------------------------------------------------------------------------
# string form
# --------------------------------------------------------------------------------------------


def test_example_string(space):
    arch = space.from_string(EXAMPLE)
    assert arch.op(1, 0) == "nor_conv_3x3"
    assert arch.op(2, 1) == "avg_pool_3x3"
    assert arch.op(3, 2) == "skip_connect"
    assert arch.ops == ("nor_conv_3x3", "nor_conv_3x3", "avg_pool_3x3", "skip_connect",
                        "nor_conv_3x3", "skip_connect")
    assert space.to_string(arch) == EXAMPLE
    assert space.to_string(space.largest()) == (
        "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|nor_conv_3x3~0|nor_conv_3x3~1|nor_conv_3x3~2|"
    )


def test_all_members_have_distinct_strings(space):
    archs = list(space.all_architectures())
    assert len(archs) == 5 ** 6 == len(set(archs))
    assert len({space.to_string(a) for a in archs}) == len(archs)


@pytest.mark.parametrize(
    ("relative", "column"),
    [("latency/nb201_latency_ms.csv", "arch"), ("nb201/nb201_cifar100_accuracy.csv", "arch")],
)
def test_joins_every_string_of_the_shared_tables(space, relative, column):
    strings = _csv_column(relative, column)
    assert len(strings) == 15625
    archs = [space.from_string(s) for s in strings]
    assert [space.to_string(a) for a in archs] == strings
    assert len(set(archs)) == 15625
    assert set(archs) == set(space.all_architectures())


def test_unconnected_cells_have_chance_accuracy(space):
    """The real NAS-Bench-201 accuracies confirm is_connected(): an unconnected cell makes the
    output constant, i.e. chance accuracy (1% on CIFAR-100)."""
    root = shared_data_dir()
    path = None if root is None else root / "nb201/nb201_cifar100_accuracy.csv"
    if path is None or not path.is_file():
        pytest.skip("shared data file nb201/nb201_cifar100_accuracy.csv not found")
    with open(path, newline="") as f:
        rows = [(space.from_string(r["arch"]), float(r["cifar100_test_acc"])) for r in csv.DictReader(f)]
    unconnected = [acc for arch, acc in rows if not arch.is_connected()]
    connected = [acc for arch, acc in rows if arch.is_connected()]
    assert unconnected and max(unconnected) <= 1.5
    assert np.median(connected) > 50


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ["empty"]),
        ("|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|", ["2 node groups"]),
        (EXAMPLE.replace("avg_pool_3x3~1", "max_pool_3x3~1"),
         ["edge 2<-1", "max_pool_3x3", "avg_pool_3x3", "nor_conv_1x1", "none"]),
        (EXAMPLE.replace("skip_connect~2", "skip_connect~1"), ["edge 3<-2", "'<op>~2'", "none"]),
        (EXAMPLE.replace("|nor_conv_3x3~1|", "|"), ["node 3", "2 incoming edges", "expected 3"]),
        (EXAMPLE.replace("|+", "+", 1), ["node 1", "'|'"]),
        (EXAMPLE.replace("|skip_connect~0|", "|skipconnect~0|"), ["edge 3<-0", "skip_connect"]),
    ],
)
def test_bad_strings_name_the_field_and_the_choices(space, text, fragments):
    with pytest.raises(UserError) as info:
        space.from_string(text)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_validate_rejects_foreign_values(space):
    with pytest.raises(UserError, match="edge 3<-1"):
        space.to_string(NB201Arch(("none", "none", "none", "none", "conv", "none")))
    with pytest.raises(UserError, match="6 edge operations"):
        space.to_string(NB201Arch(("none",) * 5))
    with pytest.raises(UserError, match="NB201Arch"):
        space.to_string(("none",) * 6)


# --------------------------------------------------------------------------------------------
# encoding, Optuna
# --------------------------------------------------------------------------------------------


def test_encode_is_one_hot(space, samples):
    assert space.feature_dim == 30 == len(set(space.feature_names))
    for arch in samples:
        vec = space.encode(arch)
        assert vec.dtype == np.float32 and vec.shape == (30,)
        grid = vec.reshape(6, 5)
        assert np.array_equal(grid.sum(axis=1), np.ones(6))
        for e, op in enumerate(arch.ops):
            assert grid[e, NB201_OPS.index(op)] == 1
            assert space.feature_names[e * 5 + NB201_OPS.index(op)] == (
                f"edge{NB201_EDGES[e][0]}<-{NB201_EDGES[e][1]}={op}"
            )
    assert len({space.encode(a).tobytes() for a in samples}) == len(set(samples))


def test_suggest_and_to_params(space, samples):
    optuna = pytest.importorskip("optuna")
    for arch in [*samples[:20], space.smallest(), space.largest()]:
        params = space.to_params(arch)
        assert sorted(params) == [f"e{i}" for i in range(6)]
        assert space.suggest(optuna.trial.FixedTrial(params)) == arch


# --------------------------------------------------------------------------------------------
# layer list, FLOPs, smallest/largest
# --------------------------------------------------------------------------------------------


def test_layer_list_by_hand(space):
    layers = space.layers(space.largest())
    by_name = {layer.name: layer for layer in layers}
    assert by_name["stem.conv"] == Layer("stem.conv", "conv", 3, 16, 3, 1, 1, 32, 32, bias=True)
    assert by_name["cells.5.conv_a.conv"].stride == 2 and by_name["cells.5.conv_a.conv"].out_h == 16
    pool = by_name["cells.5.shortcut_pool"]
    assert (pool.op, pool.kernel, pool.stride, pool.out_h, pool.macs) == ("pool", 2, 2, 16, 0)
    assert by_name["cells.11.shortcut_conv"].in_channels == 32
    assert by_name["cells.16.edges.e3_2.conv"].in_h == 8
    assert by_name["classifier"] == Layer("classifier", "linear", 64, 100, bias=True)
    # 15 cells x 6 convs + 2 x 3 reduction convs + stem
    assert sum(layer.op == "conv" for layer in layers) == 15 * 6 + 6 + 1
    # nodes 2 and 3 sum 2 and 3 edges: 1 + 2 adds per cell, one per reduction block
    assert sum(layer.op == "add" for layer in layers) == 15 * 3 + 2
    # the NAS-Bench-201 largest network is ~220 M MACs on CIFAR
    assert 215e6 < space.macs(space.largest()) < 225e6


def test_example_layers(space):
    layers = [la for la in space.layers(space.from_string(EXAMPLE)) if la.name.startswith("cells.0.")]
    assert [(la.name, la.op, la.kernel) for la in layers] == [
        ("cells.0.edges.e1_0.conv", "conv", 3),
        ("cells.0.edges.e2_0.conv", "conv", 3),
        ("cells.0.edges.e2_1", "pool", 3),
        ("cells.0.node2.add0", "add", 1),
        ("cells.0.edges.e3_1.conv", "conv", 3),
        ("cells.0.node3.add0", "add", 1),
        ("cells.0.node3.add1", "add", 1),
    ]
    assert all(la.out_h == la.in_h == 32 for la in layers)


def test_largest_and_smallest(space):
    assert space.flops(space.largest()) > space.flops(space.smallest())
    assert space.params(space.largest()) > space.params(space.smallest())
    assert space.smallest().is_connected()
    assert not NB201Arch(("none",) * 6).is_connected()


def test_smallest_is_the_unique_cheapest_connected_cell(space):
    """Over all 15,625 cells: the largest has the most MACs, and the smallest is the unique
    minimum of (MACs, active edges, pooling edges) among connected cells."""
    archs = list(space.all_architectures())
    macs = {a: space.macs(a) for a in archs}
    assert max(macs.values()) == macs[space.largest()]
    assert [a for a in archs if macs[a] == macs[space.largest()]] == [space.largest()]

    def key(a):
        return (macs[a], sum(op != "none" for op in a.ops), sum(op == "avg_pool_3x3" for op in a.ops))

    connected = [a for a in archs if a.is_connected()]
    best = min(key(a) for a in connected)
    assert [a for a in connected if key(a) == best] == [space.smallest()]
    assert macs[space.smallest()] == min(macs[a] for a in connected)
