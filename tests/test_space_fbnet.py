"""Tests for the FBNet space in HW-NAS-Bench's CIFAR-100 setting (supernet.spaces.fbnet):
declaration, string form against the real latency table, encoding, layer list."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hwnas.supernet.data import shared_data_dir
from hwnas.supernet.layers import Layer
from hwnas.supernet.spaces import FBNetArch, FBNetSpace, available_spaces, get_space
from hwnas.supernet.spaces.fbnet import FBNET_BLOCKS, block_spec

from hwnas.core.errors import UserError

N_LAYERS = 22


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def space() -> FBNetSpace:
    return get_space("fbnet")


@pytest.fixture(scope="module")
def samples(space) -> list[FBNetArch]:
    rng = np.random.default_rng(0)
    return [space.sample(rng) for _ in range(100)]


# --------------------------------------------------------------------------------------------
# declaration
# --------------------------------------------------------------------------------------------


def test_registered_and_configurable():
    assert "fbnet" in available_spaces()
    space = get_space("fbnet")
    assert space.input_shape == (3, 32, 32) and space.num_classes == 100
    ten = get_space("fbnet", num_classes=10)
    assert ten.layers(ten.largest())[-1].out_channels == 10
    rebuilt = get_space("fbnet", config=ten.config())
    assert rebuilt.config() == ten.config() and rebuilt.num_classes == 10
    small = get_space("fbnet", in_channels=1, image_size=16)
    assert small.input_shape == (1, 16, 16) and small.layers(small.smallest())[0].in_channels == 1


def test_block_specs():
    assert block_spec("skip") is None
    assert (block_spec("k5_e1_g2").kernel, block_spec("k5_e1_g2").expand,
            block_spec("k5_e1_g2").groups) == (5, 1, 2)
    assert (block_spec("k3_e6").kernel, block_spec("k3_e6").expand, block_spec("k3_e6").groups) == (3, 6, 1)
    assert len(FBNET_BLOCKS) == 9


# --------------------------------------------------------------------------------------------
# string form
# --------------------------------------------------------------------------------------------


def test_joins_every_string_of_the_latency_table(space):
    root = shared_data_dir()
    path = None if root is None else root / "latency/fbnet_latency_ms.csv"
    if path is None or not path.is_file():
        pytest.skip("shared data file latency/fbnet_latency_ms.csv not found (set HWNAS_SHARED_DATA)")
    with open(path, newline="") as f:
        strings = [row["arch"] for row in csv.DictReader(f)]
    assert len(strings) == 5000
    archs = [space.from_string(s) for s in strings]
    assert [space.to_string(a) for a in archs] == strings
    assert len(set(archs)) == 5000
    # every block occurs in every layer position somewhere in the table
    for i in range(N_LAYERS):
        assert {a.blocks[i] for a in archs} == set(FBNET_BLOCKS)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ["empty", "k3_e1_g2"]),
        ("-".join(["k3_e1"] * 21), ["21 layers", "22 block names"]),
        ("-".join(["k3_e1"] * 5 + ["k7_e6"] + ["k3_e1"] * 16), ["layer 5", "k7_e6", "k5_e6", "skip"]),
        ("-".join(["k3_e1"] * 21 + ["identity"]), ["layer 21", "identity", "skip"]),
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
    with pytest.raises(UserError, match="layer 3"):
        space.to_string(FBNetArch(("skip",) * 3 + ("k7_e1",) + ("skip",) * 18))
    with pytest.raises(UserError, match="22 layers"):
        space.to_string(FBNetArch(("skip",) * 21))


# --------------------------------------------------------------------------------------------
# encoding, Optuna
# --------------------------------------------------------------------------------------------


def test_encode_is_one_hot(space, samples):
    assert space.feature_dim == 22 * 9 == len(set(space.feature_names))
    for arch in samples:
        vec = space.encode(arch)
        assert vec.dtype == np.float32 and vec.shape == (198,)
        grid = vec.reshape(22, 9)
        assert np.array_equal(grid.sum(axis=1), np.ones(22))
        for i, block in enumerate(arch.blocks):
            assert grid[i, FBNET_BLOCKS.index(block)] == 1
            assert space.feature_names[i * 9 + FBNET_BLOCKS.index(block)] == f"l{i}={block}"


def test_suggest_and_to_params(space, samples):
    optuna = pytest.importorskip("optuna")
    for arch in [*samples[:20], space.smallest(), space.largest()]:
        params = space.to_params(arch)
        assert sorted(params, key=lambda k: int(k[1:])) == [f"l{i}" for i in range(22)]
        assert space.suggest(optuna.trial.FixedTrial(params)) == arch


# --------------------------------------------------------------------------------------------
# layer list, FLOPs
# --------------------------------------------------------------------------------------------


def test_macro_architecture(space):
    """HW-NAS-Bench's CIFAR FBNet: 32x32 stays 32x32 through stride-1 stem and first two
    stages, then 16, 8, 8, 4, 4."""
    layers = space.layers(space.largest())
    by_name = {layer.name: layer for layer in layers}
    assert by_name["stem.conv"] == Layer("stem.conv", "conv", 3, 16, 3, 1, 1, 32, 32, bias=True,
                                         activation="relu")
    outs = [(by_name[f"blocks.{i}.project_conv"].out_channels, by_name[f"blocks.{i}.dw_conv"].out_h)
            for i in range(22)]
    assert outs == (
        [(16, 32)] + [(24, 32)] * 4 + [(32, 16)] * 4 + [(64, 8)] * 4 + [(112, 8)] * 4
        + [(184, 4)] * 4 + [(352, 4)]
    )
    assert by_name["blocks.1.expand_conv"] == Layer("blocks.1.expand_conv", "conv", 16, 96, 1, 1, 1,
                                                    32, 32, bias=True, activation="relu")
    assert by_name["blocks.5.dw_conv"].stride == 2 and by_name["blocks.5.dw_conv"].kernel == 5
    assert by_name["head_conv"].out_channels == 1504
    assert by_name["classifier"] == Layer("classifier", "linear", 1504, 100, bias=True)
    # residual adds: every layer except the first of stages 2..7 (the first layer is 16 -> 16)
    assert sum(layer.op == "add" for layer in layers) == 22 - 6


def test_grouped_blocks_and_skip(space):
    arch = FBNetArch(("k3_e1_g2",) + ("skip",) * 21)
    layers = space.layers(arch)
    by_name = {layer.name: layer for layer in layers}
    assert by_name["blocks.0.expand_conv"].groups == 2
    assert by_name["blocks.0.expand_conv"].extra == {"channel_shuffle": 2}
    assert by_name["blocks.0.project_conv"].groups == 2
    # skip: identity where the shape allows (no layer), else a strided 1x1 projection
    skips = sorted(name for name in by_name if name.endswith(".conv") and name.startswith("blocks."))
    assert skips == sorted(f"blocks.{i}.conv" for i in (1, 5, 9, 13, 17, 21))
    assert by_name["blocks.5.conv"].stride == 2 and by_name["blocks.5.conv"].kernel == 1
    assert by_name["blocks.13.conv"].stride == 1  # 64 -> 112 keeps the size


def test_smallest_and_largest_are_extreme_per_layer(space):
    """With fixed channels each layer's MACs are independent, so checking every single-layer
    change from smallest/largest proves they minimise/maximise MACs over the whole space."""
    lo, hi = space.smallest(), space.largest()
    lo_macs, hi_macs = space.macs(lo), space.macs(hi)
    assert space.flops(hi) > space.flops(lo) and space.params(hi) > space.params(lo)
    # skip everywhere, except where a grouped block beats skip's 1x1 projection (64->112, 184->352)
    assert lo.blocks == ("skip",) * 13 + ("k3_e1_g2",) + ("skip",) * 7 + ("k3_e1_g2",)
    assert hi.blocks == ("k5_e6",) * N_LAYERS
    for i in range(N_LAYERS):
        for block in FBNET_BLOCKS:
            if block != lo.blocks[i]:
                assert space.macs(FBNetArch(lo.blocks[:i] + (block,) + lo.blocks[i + 1:])) > lo_macs
            if block != hi.blocks[i]:
                assert space.macs(FBNetArch(hi.blocks[:i] + (block,) + hi.blocks[i + 1:])) < hi_macs
