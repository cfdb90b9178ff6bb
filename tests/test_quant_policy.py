"""QuantPolicy: JSON round trip, validation errors, helpers, pricing through the layer list, and
applying a policy to a model without touching the model."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hwnas.quant.cost import (
    bops,
    layer_cost,
    model_size_bytes,
    weight_bits_budget_bytes,
)
from hwnas.quant.policy import (
    SUPPORTED_BITS,
    QuantPolicy,
    apply_to_layers,
    average_weight_bits,
    first_last_8bit,
    uniform,
)
from hwnas.quant.ptq import quantize_model
from hwnas.supernet.layers import Layer
from hwnas.supernet.spaces import get_space
from torch import nn

from hwnas.core.errors import UserError


@pytest.fixture(scope="module")
def space():
    return get_space("mbv3-tiny")


@pytest.fixture(scope="module")
def subnet(space):
    torch.manual_seed(0)
    return space.build_supernet().extract(space.smallest())


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_uniform_covers_every_conv_and_linear_in_order(subnet, space):
    policy = uniform(subnet, 4, 8)
    names = [n for n, m in subnet.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert policy.layer_names == names
    assert set(policy.bits.values()) == {(4, 8)}
    # the model's names are the layer list's names: the same policy prices the layer list
    assert uniform(space.layers(space.smallest()), 4, 8).bits == policy.bits


def test_json_round_trip(tmp_path, subnet):
    policy = first_last_8bit(uniform(subnet, 3, 6)).with_bits({"blocks.0.dw_conv": (32, 32)})
    path = policy.to_json(tmp_path / "sub" / "policy.json")
    loaded = QuantPolicy.from_json(path)
    assert loaded == policy
    assert loaded.layer_names == policy.layer_names  # order kept
    assert json.loads(path.read_text())["format"] == "hwnas-quant-policy-1"
    assert not list(path.parent.glob(".*.tmp"))


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "not valid JSON"),
    ('{"layers": {}}', "not an hwnas quant policy"),
    ('{"format": "hwnas-quant-policy-1", "layers": {"a": {"w_bits": 8}}}', "needs \"w_bits\" and \"a_bits\""),
    ('{"format": "hwnas-quant-policy-1", "layers": {"a": {"w_bits": 5, "a_bits": 8}}}',
     "layer 'a' has weight bits 5; expected one of 2, 3, 4, 6, 8, 32"),
])
def test_from_json_rejects_malformed_files(tmp_path, content, fragment):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(UserError, match=None) as info:
        QuantPolicy.from_json(path)
    assert fragment in str(info.value)
    with pytest.raises(UserError, match="does not exist"):
        QuantPolicy.from_json(tmp_path / "missing.json")


@pytest.mark.parametrize("bits, what", [((5, 8), "weight bits 5"), ((8, 1), "activation bits 1"),
                                         ((8.0, 8), "weight bits 8.0"), ((True, 8), "weight bits True")])
def test_unsupported_bits_name_the_layer_and_the_allowed_set(bits, what):
    with pytest.raises(UserError) as info:
        QuantPolicy({"blocks.0.dw_conv": bits})
    msg = str(info.value)
    assert "'blocks.0.dw_conv'" in msg and what in msg
    assert "2, 3, 4, 6, 8, 32" in msg
    assert "\n" not in msg


def test_validate_rechecks_bits_edited_in_place(subnet):
    policy = uniform(subnet, 8, 8)
    policy.bits["head_conv"] = (8, 7)
    with pytest.raises(UserError, match="layer 'head_conv' has activation bits 7; expected one of 2, 3, 4, 6, 8, 32"):
        policy.validate(subnet)
    with pytest.raises(UserError, match="layer 'head_conv' has activation bits 7"):
        quantize_model(subnet, policy)


def test_validate_unknown_and_missing_layers(subnet):
    good = uniform(subnet, 8, 8)
    assert good.validate(subnet) is good
    unknown = good.with_bits({"blocks.99.dw_conv": (8, 8)})
    with pytest.raises(UserError, match=r"names layer 'blocks.99.dw_conv', which the model does not have; "
                                        r"its quantizable \(Conv2d/Linear\) layers are: stem_conv"):
        unknown.validate(subnet)
    missing = QuantPolicy({n: b for n, b in good.bits.items() if n != "classifier"})
    with pytest.raises(UserError, match="no bit-widths for layer 'classifier' of the model"):
        missing.validate(subnet)


def test_first_last_8bit_and_average_weight_bits(space):
    layers = space.layers(space.smallest())
    policy = first_last_8bit(uniform(layers, 4, 8))
    assert policy["stem_conv"] == (8, 8) and policy["classifier"] == (8, 8)
    assert policy["head_conv"] == (4, 8)
    quant = [layer for layer in layers if layer.op in ("conv", "linear")]
    first_last = quant[0].weight_count + quant[-1].weight_count
    total = sum(layer.weight_count for layer in quant)
    expected = (8 * first_last + 4 * (total - first_last)) / total
    assert average_weight_bits(policy, layers) == pytest.approx(expected)
    assert average_weight_bits(uniform(layers, 32, 32), layers) == 32


def test_apply_to_layers_prices_the_policy(space):
    layers = space.layers(space.largest())
    priced = apply_to_layers(uniform(layers, 4, 8), layers)
    assert [layer.name for layer in priced] == [layer.name for layer in layers]
    assert all((layer.w_bits, layer.a_bits) == (4, 8) for layer in priced if layer.op in ("conv", "linear"))
    assert all(layer.w_bits == 32 for layer in priced if layer.op not in ("conv", "linear"))
    assert bops(priced) == sum(layer.macs for layer in layers) * 32
    assert model_size_bytes(priced) < model_size_bytes(layers) / 4 * 1.6
    # per-layer costs add up to the totals
    assert sum(layer_cost(layer, "size") for layer in priced) == pytest.approx(model_size_bytes(priced), abs=1)
    assert sum(layer_cost(layer, "bops") for layer in priced) == bops(priced)
    assert weight_bits_budget_bytes(layers, 4) == pytest.approx(model_size_bytes(priced), abs=1)
    with pytest.raises(UserError, match="names layer 'nope'"):
        apply_to_layers(QuantPolicy({"nope": (8, 8)}), layers)


def test_apply_to_layers_needs_every_conv(space):
    layers = [Layer("c", "conv", 3, 8, 3, in_h=8, in_w=8), Layer("fc", "linear", 8, 2)]
    with pytest.raises(UserError, match="no bit-widths for layer 'fc'"):
        apply_to_layers(QuantPolicy({"c": (8, 8)}), layers)


def test_quantize_model_leaves_the_input_model_unchanged(subnet):
    before = _state(subnet)
    modules_before = [type(m) for m in subnet.modules()]
    qmodel = quantize_model(subnet, first_last_8bit(uniform(subnet, 4, 8)))
    assert qmodel is not subnet
    assert [type(m) for m in subnet.modules()] == modules_before
    assert all(torch.equal(v, subnet.state_dict()[k]) for k, v in before.items())
    # the quantized copy keeps the qualified names
    assert type(qmodel.get_submodule("blocks.0.expand_conv")).__name__ == "QuantConv2d"
    assert type(qmodel.get_submodule("classifier")).__name__ == "QuantLinear"
    assert isinstance(qmodel.get_submodule("blocks.0.expand_bn"), nn.Identity)


@pytest.mark.parametrize("make_bad", [
    lambda p: p.with_bits({"not_a_layer": (8, 8)}),
    lambda p: QuantPolicy({n: b for n, b in p.bits.items() if n != "head_conv"}),
])
def test_bad_policy_raises_and_leaves_the_model_unchanged(subnet, make_bad):
    before = copy.deepcopy(subnet.state_dict())
    with pytest.raises(UserError):
        quantize_model(subnet, make_bad(uniform(subnet, 8, 8)))
    assert all(torch.equal(v, subnet.state_dict()[k]) for k, v in before.items())
    assert not any("Quant" in type(m).__name__ for m in subnet.modules())


def test_supported_bits_are_the_documented_set():
    assert SUPPORTED_BITS == (2, 3, 4, 6, 8, 32)
