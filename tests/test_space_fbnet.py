"""Tests for the FBNet space in HW-NAS-Bench's CIFAR-100 setting (declaration, string form
against the real latency table, layer list) and its weight-sharing supernet."""

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


# --------------------------------------------------------------------------------------------
# the weight-sharing supernet (torch)
# --------------------------------------------------------------------------------------------

ATOL = 1e-5


def _model_check_archs(space) -> list[FBNetArch]:
    rng = np.random.default_rng(3)
    every_block = FBNetArch(tuple(FBNET_BLOCKS[i % 9] for i in range(N_LAYERS)))
    shifted = FBNetArch(tuple(FBNET_BLOCKS[(i + 4) % 9] for i in range(N_LAYERS)))
    return [space.largest(), space.smallest(), every_block, shifted, *(space.sample(rng) for _ in range(3))]


@pytest.fixture(scope="module")
def trained(space):
    """A supernet whose BN statistics, BN affine terms and kernel transforms are far from their
    initial values, so extraction bugs cannot hide behind identities."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = space.build_supernet()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "transforms" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    rng = np.random.default_rng(0)
    net.train()
    with torch.no_grad():
        for arch in [space.largest(), space.smallest(), *_model_check_archs(space)[2:4],
                     *(space.sample(rng) for _ in range(2))]:
            net.set_active(arch)
            net(torch.randn(8, *space.input_shape, generator=gen) * 2 + 0.5)
    net.set_active(space.largest())
    return net.eval()


@pytest.fixture(scope="module")
def x(space):
    torch = pytest.importorskip("torch")
    return torch.randn(3, *space.input_shape, generator=torch.Generator().manual_seed(2))


def test_extract_matches_supernet(trained, space, x):
    import torch
    from hwnas.supernet.nn.fbnet import FBNetNet

    outputs = []
    for arch in _model_check_archs(space):
        model = trained.extract(arch)
        assert isinstance(model, FBNetNet) and not model.training
        trained.set_active(arch)
        with torch.no_grad():
            expected, got = trained(x), model(x)
        assert got.shape == (3, 100)
        assert torch.allclose(got, expected, atol=ATOL), space.to_string(arch)
        outputs.append(expected)
    trained.set_active(space.largest())
    assert not torch.allclose(outputs[0], outputs[1], atol=1e-3)


def test_extract_keeps_active_arch_and_copies(trained, space, x):
    import torch

    arch = _model_check_archs(space)[2]
    trained.set_active(space.to_string(arch))
    assert trained.active_arch() == arch
    with torch.no_grad():
        before = trained(x)
        assert torch.allclose(trained.extract()(x), before, atol=ATOL)
        model = trained.extract(space.smallest())
        assert trained.active_arch() == arch
        for p in model.parameters():
            p.add_(1.0)
        assert torch.equal(trained(x), before)
    with pytest.raises(UserError, match="layer 0"):
        trained.set_active("-".join(["k7_e1"] + ["skip"] * 21))
    assert trained.active_arch() == arch
    trained.set_active(space.largest())


def test_weight_sharing(trained, space):
    """e1/e3/e6 slice one expand/project weight, k3 is the transformed centre of k5, the grouped
    blocks share their own weights."""
    import torch

    def block(text, i=1):
        return trained.extract(FBNetArch((text,) * N_LAYERS)).blocks[i]

    big, small, k3 = block("k5_e6"), block("k5_e1"), block("k3_e3")
    assert torch.equal(small.expand_conv.weight, big.expand_conv.weight[:16])
    assert torch.equal(k3.expand_conv.weight, big.expand_conv.weight[:48])
    assert torch.equal(k3.project_conv.weight, big.project_conv.weight[:, :48])
    assert torch.equal(small.expand_bn.running_mean, big.expand_bn.running_mean[:16])
    layer = trained.blocks[1]
    assert torch.equal(big.dw_conv.weight, layer.dw_conv.weight)
    centre = layer.dw_conv.weight[:48, :, 1:4, 1:4].reshape(48, 9) @ layer.dw_conv.transforms["3"].T
    assert torch.allclose(k3.dw_conv.weight, centre.reshape(48, 1, 3, 3), atol=1e-6)
    g3, g5 = block("k3_e1_g2"), block("k5_e1_g2")
    assert g3.expand_conv.groups == 2 and torch.equal(g3.expand_conv.weight, g5.expand_conv.weight)
    assert torch.equal(g3.project_conv.weight, g5.project_conv.weight)
    assert torch.equal(g3.dw_conv.weight,
                       layer.g_dw_conv.active_weight(16, 3).detach())


def test_only_active_weights_get_gradients(space):
    torch = pytest.importorskip("torch")
    net = space.build_supernet().train()
    net.set_active(FBNetArch(("k3_e3", "k3_e1_g2", "skip") + ("skip",) * 19))
    net(torch.randn(2, *space.input_shape)).square().sum().backward()
    first, second, third = net.blocks[0], net.blocks[1], net.blocks[2]
    assert torch.count_nonzero(first.expand_conv.weight.grad[48:]) == 0
    assert first.expand_conv.weight.grad[:48].abs().sum() > 0
    assert torch.count_nonzero(first.dw_conv.weight.grad[:, :, 0, :]) == 0  # 3x3: centre only
    assert first.g_expand_conv.weight.grad is None
    assert second.g_expand_conv.weight.grad.abs().sum() > 0
    assert second.expand_conv.weight.grad is None
    assert third.expand_conv.weight.grad is None  # identity skip: nothing trained


def test_channel_shuffle():
    torch = pytest.importorskip("torch")
    from hwnas.supernet.nn.fbnet import channel_shuffle

    x = torch.arange(6.0).reshape(1, 6, 1, 1)
    assert channel_shuffle(x, 2).flatten().tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]


def test_layer_names_and_shapes_match_static_model(trained, space):
    from torch import nn

    for arch in _model_check_archs(space):
        model = trained.extract(arch)
        modules = {n: m for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
        layers = [la for la in space.layers(arch) if la.op in ("conv", "linear")]
        assert [la.name for la in layers] == list(modules)
        for la in layers:
            m = modules[la.name]
            if la.op == "conv":
                assert (m.in_channels, m.out_channels, m.groups) == (la.in_channels, la.out_channels, la.groups)
                assert m.kernel_size == (la.kernel,) * 2 and m.stride == (la.stride,) * 2
                assert m.padding == (la.kernel // 2,) * 2
                assert m.weight.numel() == la.weight_count and la.bias  # every conv has a BN
            else:
                assert (m.in_features, m.out_features) == (la.in_channels, la.out_channels)
        adds = [la.name for la in space.layers(arch) if la.op == "add"]
        residual = [f"blocks.{i}.add" for i, b in enumerate(model.blocks) if getattr(b, "residual", False)]
        assert adds == residual


def test_layer_flops_match_forward_hooks(trained, space):
    import torch
    from torch import nn

    for arch in _model_check_archs(space)[:4]:
        model = trained.extract(arch)
        measured: dict[str, tuple[int, tuple, tuple]] = {}

        def hook(module, inputs, output, name):
            out = output[0].numel()
            if isinstance(module, nn.Conv2d):
                macs = out * (module.in_channels // module.groups) * module.kernel_size[0] * module.kernel_size[1]
            else:
                macs = out * module.in_features
            measured[name] = (macs, tuple(inputs[0].shape[2:]), tuple(output.shape[2:]))

        handles = [m.register_forward_hook(lambda mod, i, o, name=name: hook(mod, i, o, name))
                   for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        with torch.no_grad():
            model(torch.randn(2, *space.input_shape))
        for h in handles:
            h.remove()
        layers = {la.name: la for la in space.layers(arch) if la.op in ("conv", "linear")}
        assert set(layers) == set(measured)
        for name, la in layers.items():
            macs, in_hw, out_hw = measured[name]
            assert la.macs == macs, name
            if la.op == "conv":
                assert in_hw == (la.in_h, la.in_w) and out_hw == (la.out_h, la.out_w), name
        assert space.flops(arch) == 2 * sum(m for m, _, _ in measured.values())


def test_onnx_export_parity(trained, space, x):
    pytest.importorskip("onnxruntime")
    from hwnas.export.onnx_export import check_parity, onnx_bytes

    model = trained.extract(space.smallest())  # includes grouped blocks and projecting skips
    report = check_parity(onnx_bytes(model, x[:1]), model, x)
    assert report.passed, report


def test_train_evaluate_checkpoint_smoke(tmp_path):
    """A few sandwich steps on tiny random 16x16 data change the weights, and evaluate_subnet
    runs on the result."""
    torch = pytest.importorskip("torch")
    from hwnas.supernet.data import DatasetSplits, ImageSplit
    from hwnas.supernet.evaluate import evaluate_subnet
    from hwnas.supernet.train import (
        TrainConfig,
        TrainStage,
        load_checkpoint,
        save_checkpoint,
        train_supernet,
    )

    space = get_space("fbnet", image_size=16, num_classes=10)
    gen = torch.Generator().manual_seed(0)

    def split(n):
        return ImageSplit(torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8, generator=gen),
                          torch.randint(0, 10, (n,), generator=gen))

    data = DatasetSplits("random", split(32), split(16), split(16), [str(i) for i in range(10)],
                         (0.5,) * 3, (0.25,) * 3, "crop_flip")
    net = space.build_supernet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    config = TrainConfig(stages=[TrainStage("s", 1, num_random=1)], batch_size=16, warmup_epochs=0)
    result = train_supernet(net, space, data, config, progress=False)
    assert result.epochs == 1 and np.isfinite(result.history[0]["loss_largest"])
    changed = {k for k, v in net.state_dict().items() if not torch.equal(v, before[k])}
    assert {"blocks.0.expand_conv.weight", "stem.conv.weight", "classifier.weight"} <= changed
    acc, model = evaluate_subnet(net, space.smallest(), data, split="val", calib_batches=2)
    assert 0.0 <= acc <= 100.0 and not model.training
    # a checkpoint rebuilds the same space and supernet
    path = save_checkpoint(tmp_path / "supernet.pt", net, space, dataset="random")
    space2, net2, _ = load_checkpoint(path)
    assert space2.name == space.name and space2.config() == space.config()
    x = torch.randn(2, *space.input_shape, generator=gen)
    with torch.no_grad():
        assert torch.equal(net2.extract(space.smallest())(x), net.extract(space.smallest())(x))
