"""The layer list of both MobileNetV3 spaces against the static model their supernet extracts
(supernet.nn.mbv3): names and shapes, FLOPs measured with forward hooks, parameters with
BatchNorm folded."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.supernet.spaces import get_space

# --------------------------------------------------------------------------------------------
# layers vs the extracted static model
# --------------------------------------------------------------------------------------------


def _archs_for_model_checks(space):
    rng = np.random.default_rng(1)
    return [space.smallest(), space.largest(), *(space.sample(rng) for _ in range(3))]


@pytest.fixture(scope="module", params=["mbv3-tiny", "mbv3"])
def space_and_net(request):
    """Both registered MobileNetV3 spaces (the tiny one; OFA's with SE, first block and
    feature-mix layer) with a supernet."""
    torch = pytest.importorskip("torch")
    sp = get_space(request.param)
    torch.manual_seed(0)
    return sp, sp.build_supernet().eval()


def test_layer_names_and_shapes_match_static_model(space_and_net):
    from torch import nn

    space, supernet_model = space_and_net
    for arch in _archs_for_model_checks(space):
        model = supernet_model.extract(arch)
        modules = {
            name: m for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))
        }
        layers = [layer for layer in space.layers(arch) if layer.op in ("conv", "linear")]
        assert [layer.name for layer in layers] == list(modules)
        for layer in layers:
            m = modules[layer.name]
            if layer.op == "conv":
                assert isinstance(m, nn.Conv2d), layer.name
                assert (m.in_channels, m.out_channels) == (layer.in_channels, layer.out_channels)
                assert m.kernel_size == (layer.kernel, layer.kernel), layer.name
                assert m.stride == (layer.stride, layer.stride), layer.name
                assert m.groups == layer.groups, layer.name
                assert m.padding == (layer.kernel // 2, layer.kernel // 2), layer.name
            else:
                assert isinstance(m, nn.Linear), layer.name
                assert (m.in_features, m.out_features) == (layer.in_channels, layer.out_channels)
                assert (m.bias is not None) == layer.bias, layer.name
        # one 'add' layer per residual block
        adds = [layer.name for layer in space.layers(arch) if layer.op == "add"]
        blocks = [(f"blocks.{i}", blk) for i, blk in enumerate(model.blocks)]
        if model.first_block is not None:
            blocks.insert(0, ("first_block", model.first_block))
        assert adds == [f"{name}.add" for name, blk in blocks if blk.residual]
        # one SE (pool, reduce, expand, mul) per block that has one
        muls = [layer.name for layer in space.layers(arch) if layer.op == "mul"]
        assert muls == [f"{name}.se.mul" for name, blk in blocks if blk.se is not None]


def test_layer_flops_match_forward_hooks(space_and_net):
    import torch
    from torch import nn

    space, supernet_model = space_and_net
    for arch in _archs_for_model_checks(space):
        model = supernet_model.extract(arch)
        measured: dict[str, tuple[int, tuple, tuple]] = {}

        def hook(module, inputs, output, name):
            per_image_outputs = output[0].numel()
            if isinstance(module, nn.Conv2d):
                k = module.kernel_size[0] * module.kernel_size[1]
                macs = per_image_outputs * (module.in_channels // module.groups) * k
            else:
                macs = per_image_outputs * module.in_features
            measured[name] = (macs, tuple(inputs[0].shape[2:]), tuple(output.shape[2:]))

        handles = [
            m.register_forward_hook(lambda mod, i, o, name=name: hook(mod, i, o, name))
            for name, m in model.named_modules()
            if isinstance(m, (nn.Conv2d, nn.Linear))
        ]
        with torch.no_grad():
            model(torch.randn(2, *space.input_shape))
        for h in handles:
            h.remove()

        layers = space.layers(arch)
        by_name = {layer.name: layer for layer in layers if layer.op in ("conv", "linear")}
        assert set(by_name) == set(measured)
        for name, layer in by_name.items():
            macs, in_hw, out_hw = measured[name]
            assert layer.macs == macs, name
            if layer.op == "conv":
                assert in_hw == (layer.in_h, layer.in_w), name
                assert out_hw == (layer.out_h, layer.out_w), name
        assert space.flops(arch) == 2 * sum(m for m, _, _ in measured.values())


def test_layer_params_match_static_model_with_bn_folded(space_and_net):
    from torch import nn

    space, supernet_model = space_and_net
    for arch in _archs_for_model_checks(space):
        model = supernet_model.extract(arch)
        expected = 0
        for name, m in model.named_modules():
            if isinstance(m, nn.Conv2d):
                # a conv followed by BN has no bias (it comes from the folded BN); SE convs do
                assert (m.bias is not None) == (".se." in name), name
                expected += m.weight.numel() + (m.bias.numel() if m.bias is not None else 0)
            elif isinstance(m, nn.Linear):
                expected += m.weight.numel() + (m.bias.numel() if m.bias is not None else 0)
            elif isinstance(m, nn.BatchNorm2d):
                expected += m.num_features
        assert space.params(arch) == expected
