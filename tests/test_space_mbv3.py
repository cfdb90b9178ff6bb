"""Tests for the SearchSpace interface as implemented by the elastic MobileNetV3 space."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hwnas.supernet.spaces import (
    MBV3Arch,
    MBV3Config,
    MBV3Space,
    available_spaces,
    get_space,
)

from hwnas import supernet
from hwnas.core.errors import UserError

N_SAMPLES = 200


@pytest.fixture(scope="module")
def space() -> MBV3Space:
    return get_space("mbv3-tiny")


@pytest.fixture(scope="module")
def samples(space) -> list[MBV3Arch]:
    rng = np.random.default_rng(0)
    return [space.sample(rng) for _ in range(N_SAMPLES)]


# --------------------------------------------------------------------------------------------
# string form
# --------------------------------------------------------------------------------------------


def test_string_format_example(space):
    arch = MBV3Arch((((3, 4), (5, 6)), ((3, 2),), ((7, 6), (3, 2), (5, 4))))
    assert space.to_string(arch) == "k3e4-k5e6_k3e2_k7e6-k3e2-k5e4"
    assert space.to_string(space.smallest()) == "k3e2_k3e2_k3e2"
    assert space.to_string(space.largest()) == "_".join(["-".join(["k7e6"] * 3)] * 3)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ["empty"]),
        ("   ", ["empty"]),
        ("hello", ["malformed", "'hello'"]),
        ("k3e2x_k3e2_k3e2", ["malformed", "'k3e2x'"]),
        ("k3-e2_k3e2_k3e2", ["malformed"]),
        ("k3e2__k3e2_k3e2", ["malformed"]),
        ("k3e2_k3e2_k3e2-", ["malformed"]),
        ("K3E2_k3e2_k3e2", ["malformed"]),
        ("k3e2_k3e2", ["2 stages", "has 3"]),
        ("k3e2_k3e2_k3e2_k3e2", ["4 stages"]),
        ("k3e2-k3e2-k3e2-k3e2_k3e2_k3e2", ["depth of stage 0", "= 4", "[1, 2, 3]"]),
        ("k4e2_k3e2_k3e2", ["kernel of stage 0 block 0", "= 4", "[3, 5, 7]"]),
        ("k3e2_k3e2-k9e2_k3e2", ["kernel of stage 1 block 1", "= 9"]),
        ("k3e2_k3e2_k3e3", ["expand ratio of stage 2 block 0", "= 3", "[2, 4, 6]"]),
        ("k3e2_k3e2_k3e2-k3e8", ["expand ratio of stage 2 block 1", "= 8"]),
    ],
)
def test_from_string_rejects(space, text, fragments):
    with pytest.raises(UserError) as info:
        space.from_string(text)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message


def test_from_string_rejects_non_string(space):
    with pytest.raises(UserError):
        space.from_string(None)  # type: ignore[arg-type]


def test_to_string_validates(space):
    with pytest.raises(UserError, match="stages"):
        space.to_string(MBV3Arch((((3, 2),),)))
    with pytest.raises(UserError, match="kernel"):
        space.to_string(MBV3Arch((((3, 2),), ((4, 2),), ((3, 2),))))
    with pytest.raises(UserError, match="MBV3Arch"):
        space.to_string("k3e2_k3e2_k3e2")


# --------------------------------------------------------------------------------------------
# encoding
# --------------------------------------------------------------------------------------------


def test_encode_shape_and_dtype(space, samples):
    c = space.cfg
    expected_dim = c.num_stages * (
        len(c.depth_choices) + c.max_depth * (len(c.kernel_choices) + len(c.expand_choices))
    )
    assert space.feature_dim == len(space.feature_names) == expected_dim
    assert len(set(space.feature_names)) == expected_dim
    for arch in [*samples[:20], space.smallest(), space.largest()]:
        vec = space.encode(arch)
        assert vec.shape == (expected_dim,)
        assert vec.dtype == np.float32
        assert set(np.unique(vec)) <= {0.0, 1.0}


def test_encode_one_hot_blocks(space, samples):
    c = space.cfg
    index = {name: i for i, name in enumerate(space.feature_names)}
    for arch in [*samples, space.smallest(), space.largest()]:
        vec = space.encode(arch)
        for s, stage in enumerate(arch.stages):
            depth_block = [vec[index[f"s{s}_depth{d}"]] for d in c.depth_choices]
            assert sum(depth_block) == 1
            assert vec[index[f"s{s}_depth{len(stage)}"]] == 1
            for b in range(c.max_depth):
                kernels = [vec[index[f"s{s}_b{b}_k{k}"]] for k in c.kernel_choices]
                expands = [vec[index[f"s{s}_b{b}_e{e}"]] for e in c.expand_choices]
                if b < len(stage):
                    k, e = stage[b]
                    assert sum(kernels) == 1 and vec[index[f"s{s}_b{b}_k{k}"]] == 1
                    assert sum(expands) == 1 and vec[index[f"s{s}_b{b}_e{e}"]] == 1
                else:  # inactive slot
                    assert sum(kernels) == 0 and sum(expands) == 0
        # nothing else is set: one depth per stage, two per active block
        assert vec.sum() == c.num_stages + 2 * sum(arch.depths)


# --------------------------------------------------------------------------------------------
# Optuna
# --------------------------------------------------------------------------------------------


def test_to_params_covers_inactive_slots(space):
    """Every trial has the same parameter set (needed by multivariate samplers)."""
    small, large = space.to_params(space.smallest()), space.to_params(space.largest())
    assert set(small) == set(large)
    assert small["s0_depth"] == 1 and large["s0_depth"] == space.cfg.max_depth


# --------------------------------------------------------------------------------------------
# registry and configuration
# --------------------------------------------------------------------------------------------


def test_unknown_space_lists_available():
    assert "mbv3-tiny" in available_spaces()
    assert supernet.available_spaces() == available_spaces()
    with pytest.raises(UserError) as info:
        get_space("nope")
    assert "'nope'" in str(info.value)
    assert "mbv3-tiny" in str(info.value)


def test_space_for_other_dataset_builds_matching_supernet():
    torch = pytest.importorskip("torch")
    space = get_space("mbv3-tiny", in_channels=3, image_size=32, num_classes=100)
    assert space.input_shape == (3, 32, 32)
    assert space.num_classes == 100
    layers = space.layers(space.largest())
    assert layers[0].in_channels == 3 and layers[0].in_h == 32
    assert layers[-1].out_channels == 100
    torch.manual_seed(0)
    net = space.build_supernet().eval()
    with torch.no_grad():
        for arch in (space.largest(), space.smallest()):
            net.set_active(arch)
            assert net(torch.randn(2, 3, 32, 32)).shape == (2, 100)


def test_config_round_trip_through_get_space():
    cfg = MBV3Config(
        in_channels=3,
        image_size=16,
        num_classes=5,
        stem_channels=8,
        stage_channels=(8, 16),
        stage_strides=(1, 2),
        stage_activations=("relu", "hswish"),
        depth_choices=(1, 2),
        kernel_choices=(3, 5),
        expand_choices=(3, 6),
        head_channels=32,
    )
    space = MBV3Space(cfg)
    config = json.loads(json.dumps(space.config()))  # as stored in a checkpoint
    rebuilt = get_space("mbv3-tiny", config=config)
    assert rebuilt.cfg == cfg
    assert rebuilt.config() == space.config()
    assert rebuilt.input_shape == (3, 16, 16) and rebuilt.num_classes == 5
    assert MBV3Config.from_dict(cfg.to_dict()) == cfg
    # the rebuilt space really uses the custom choices
    assert rebuilt.to_string(rebuilt.largest()) == "k5e6-k5e6_k5e6-k5e6"
    assert rebuilt.flops(rebuilt.largest()) == space.flops(space.largest())


def test_default_config_is_the_digits_preset(space):
    assert space.input_shape == (1, 8, 8)
    assert space.num_classes == 10
    assert get_space("mbv3-tiny", config=space.config()).cfg == MBV3Config()


# --------------------------------------------------------------------------------------------
# the "mbv3" space: Once-for-All's MobileNetV3 for 32x32 inputs
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ofa() -> MBV3Space:
    return get_space("mbv3")


def test_mbv3_is_ofa_mobilenetv3_for_32px(ofa):
    c = ofa.cfg
    assert ofa.name == "mbv3" and ofa.input_shape == (3, 32, 32) and ofa.num_classes == 10
    assert (c.depth_choices, c.kernel_choices, c.expand_choices) == ((2, 3, 4), (3, 5, 7), (3, 4, 6))
    assert c.stage_channels == (24, 40, 80, 112, 160) and c.num_stages == 5
    assert (c.stem_channels, c.first_block_channels, c.head_channels, c.feature_mix_channels) == (
        16, 16, 960, 1280)
    assert c.stage_activations == ("relu", "relu", "hswish", "hswish", "hswish")
    assert c.se_stages == (1, 3, 4)
    layers = {layer.name: layer for layer in ofa.layers(ofa.largest())}
    assert layers["stem_conv"].stride == 1 and layers["stem_conv"].out_h == 32
    assert layers["head_conv"].in_h == 4  # total stride 8: a 4x4 map before pooling
    assert "first_block.dw_conv" in layers and "first_block.expand_conv" not in layers
    assert layers["first_block.add"].in_channels == 16
    # SE width follows the block's expanded channels (OFA's DynamicSE)
    assert layers["blocks.4.se.reduce"].in_channels == layers["blocks.4.dw_conv"].out_channels == 144
    assert layers["blocks.4.se.reduce"].out_channels == 40 - 40 % 8  # make_divisible(144 // 4)
    assert "blocks.0.se.reduce" not in layers  # stage 0 has no SE
    assert layers["feature_mix"].op == "linear" and not layers["feature_mix"].bias
    assert layers["classifier"].in_channels == 1280
    assert ofa.to_string(ofa.largest()) == "_".join(["-".join(["k7e6"] * 4)] * 5)
    assert ofa.to_string(ofa.smallest()) == "_".join(["k3e3-k3e3"] * 5)
    small, large = ofa.smallest(), ofa.largest()
    assert 60e6 < ofa.flops(small) < ofa.flops(large) < 400e6
    assert 1.5e6 < ofa.params(small) < ofa.params(large) < 7e6


def test_mbv3_strings_round_trip_and_errors(ofa):
    rng = np.random.default_rng(0)
    for _ in range(100):
        arch = ofa.sample(rng)
        assert ofa.from_string(ofa.to_string(arch)) == arch
        assert ofa.encode(arch).shape == (ofa.feature_dim,)
    with pytest.raises(UserError, match=r"depth of stage 2 = 1.*\[2, 3, 4\]"):
        ofa.from_string("k3e3-k3e3_k3e3-k3e3_k3e3_k3e3-k3e3_k3e3-k3e3")
    with pytest.raises(UserError, match=r"expand ratio of stage 0 block 1 = 2.*\[3, 4, 6\]"):
        ofa.from_string("k3e3-k3e2_k3e3-k3e3_k3e3-k3e3_k3e3-k3e3_k3e3-k3e3")
    with pytest.raises(UserError, match="1 stages; space mbv3 has 5"):
        ofa.from_string("k3e3-k3e3")


def test_mbv3_suggest_round_trip(ofa):
    from optuna.trial import FixedTrial

    rng = np.random.default_rng(2)
    for arch in [ofa.smallest(), ofa.largest(), *(ofa.sample(rng) for _ in range(20))]:
        assert ofa.suggest(FixedTrial(ofa.to_params(arch))) == arch


def test_mbv3_config_round_trip(ofa):
    config = json.loads(json.dumps(ofa.config()))
    rebuilt = get_space("mbv3", config=config)
    assert rebuilt.cfg == ofa.cfg and rebuilt.name == "mbv3"
    assert get_space("mbv3", num_classes=100).layers(ofa.largest())[-1].out_channels == 100
    with pytest.raises(UserError, match="unknown MBV3 space setting"):
        get_space("mbv3", config={**config, "width": 2})
    with pytest.raises(UserError, match="invalid MBV3 space configuration"):
        get_space("mbv3", config={**config, "se_stages": [7]})


def test_restrict_samples_within_choices(ofa):
    sub = ofa.restrict({"kernel": [3, 7], "depth": [4], "expand": [6]})
    assert ofa.restrict(None) is ofa and ofa.restrict({}) is ofa
    rng = np.random.default_rng(3)
    for _ in range(50):
        arch = sub.sample(rng)
        assert arch.depths == (4,) * 5
        assert {k for stage in arch.stages for k, _ in stage} <= {3, 7}
        assert {e for stage in arch.stages for _, e in stage} == {6}
        assert ofa.parse(ofa.to_string(arch)) == arch  # members of the full space
    assert sub.largest() == ofa.largest()
    assert sub.smallest() == MBV3Arch(tuple(((3, 6),) * 4 for _ in range(5)))
    assert ofa.restrict({"depth": [3, 2]}).cfg.depth_choices == (2, 3)
    assert list(ofa.elastic_choices()) == ["kernel", "depth", "expand"]
    with pytest.raises(UserError, match="unknown dimension 'width'"):
        ofa.restrict({"width": [1]})
    with pytest.raises(UserError, match=r"not a non-empty subset of \[3, 5, 7\]"):
        ofa.restrict({"kernel": [9]})
    with pytest.raises(UserError, match="not a non-empty subset"):
        ofa.restrict({"expand": []})
    with pytest.raises(UserError, match=r"choices for 'kernel' must be a list of integers"):
        ofa.restrict({"kernel": ["seven"]})
