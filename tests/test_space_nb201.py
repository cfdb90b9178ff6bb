"""Tests for the NAS-Bench-201 cell space (declaration, string form against the real tables,
layer list) and its weight-sharing supernet."""

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


# --------------------------------------------------------------------------------------------
# the weight-sharing supernet (torch)
# --------------------------------------------------------------------------------------------

ATOL = 1e-5
#: nodes 1 and 2 are zero tensors (no active input), yet node 3 reads them through convs
ZERO_NODE = NB201Arch(("none", "none", "none", "avg_pool_3x3", "nor_conv_1x1", "nor_conv_3x3"))


def _model_check_archs(space) -> list[NB201Arch]:
    rng = np.random.default_rng(3)
    return [space.largest(), space.smallest(), ZERO_NODE, NB201Arch(("none",) * 6),
            space.from_string(EXAMPLE), *(space.sample(rng) for _ in range(4))]


@pytest.fixture(scope="module")
def trained(space):
    """A supernet whose BN statistics and affine terms are far from their initial values (a few
    train-mode passes over several cells), so extraction bugs cannot hide behind identities."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = space.build_supernet()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    rng = np.random.default_rng(0)
    net.train()
    with torch.no_grad():
        for arch in [space.largest(), space.smallest(), *(space.sample(rng) for _ in range(3))]:
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
    from hwnas.supernet.nn.nb201 import NB201Net

    outputs = {}
    for arch in _model_check_archs(space):
        model = trained.extract(arch)
        assert isinstance(model, NB201Net) and not model.training
        trained.set_active(arch)
        with torch.no_grad():
            expected, got = trained(x), model(x)
        assert got.shape == (3, 100)
        assert torch.allclose(got, expected, atol=ATOL), space.to_string(arch)
        outputs[arch] = expected
    trained.set_active(space.largest())
    # different cells compute different functions; an unconnected cell gives a constant output
    assert not torch.allclose(outputs[space.largest()], outputs[space.smallest()], atol=1e-3)
    dead = outputs[NB201Arch(("none",) * 6)]
    assert torch.allclose(dead, dead[:1].expand_as(dead), atol=1e-6)


def test_extract_keeps_active_arch_and_copies(trained, space, x):
    import torch

    arch = space.from_string(EXAMPLE)
    trained.set_active(arch)
    with torch.no_grad():
        before = trained(x)
        assert torch.allclose(trained.extract()(x), before, atol=ATOL)  # default: the active one
        model = trained.extract(space.largest())
        assert trained.active_arch() == arch
        assert torch.equal(trained(x), before)
        for p in model.parameters():
            p.add_(1.0)
        assert torch.equal(trained(x), before)  # the copy is independent
    with pytest.raises(UserError, match="edge"):
        trained.set_active("|conv~0|+|none~0|none~1|+|none~0|none~1|none~2|")
    assert trained.active_arch() == arch
    trained.set_active(space.largest())


def test_only_active_ops_get_gradients(space):
    torch = pytest.importorskip("torch")
    net = space.build_supernet().train()
    arch = NB201Arch(("nor_conv_1x1", "none", "nor_conv_3x3", "skip_connect", "none", "avg_pool_3x3"))
    net.set_active(space.to_string(arch))
    net(torch.randn(2, *space.input_shape)).square().sum().backward()
    cell = net.cells[0]
    assert cell.edges["e1_0"]["nor_conv_1x1"].conv.weight.grad.abs().sum() > 0
    assert cell.edges["e1_0"]["nor_conv_3x3"].conv.weight.grad is None
    assert cell.edges["e2_1"]["nor_conv_3x3"].conv.weight.grad.abs().sum() > 0
    assert cell.edges["e2_0"]["nor_conv_3x3"].conv.weight.grad is None
    assert net.cells[5].conv_a.conv.weight.grad is not None  # shared reduction block


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
                assert m.weight.numel() == la.weight_count
                # BN folds into every conv except the reduction shortcut's
                assert la.bias == (not la.name.endswith("shortcut_conv")), la.name
            else:
                assert (m.in_features, m.out_features) == (la.in_channels, la.out_channels)
        pools = {n: m for n, m in model.named_modules() if isinstance(m, nn.AvgPool2d)}
        pool_layers = [la for la in space.layers(arch) if la.op == "pool"]
        assert [la.name for la in pool_layers] == list(pools)
        for la in pool_layers:
            assert (pools[la.name].kernel_size, pools[la.name].stride) == (la.kernel, la.stride)


def test_layer_flops_match_forward_hooks(trained, space):
    import torch
    from torch import nn

    for arch in [space.largest(), space.smallest(), ZERO_NODE, space.from_string(EXAMPLE)]:
        model = trained.extract(arch)
        measured: dict[str, tuple[int, tuple, tuple]] = {}

        def hook(module, inputs, output, name):
            out = output[0].numel()
            if isinstance(module, nn.Conv2d):
                macs = out * (module.in_channels // module.groups) * module.kernel_size[0] * module.kernel_size[1]
            elif isinstance(module, nn.Linear):
                macs = out * module.in_features
            else:
                macs = 0
            measured[name] = (macs, tuple(inputs[0].shape[2:]), tuple(output.shape[2:]))

        handles = [m.register_forward_hook(lambda mod, i, o, name=name: hook(mod, i, o, name))
                   for name, m in model.named_modules()
                   if isinstance(m, (nn.Conv2d, nn.Linear, nn.AvgPool2d))]
        with torch.no_grad():
            model(torch.randn(2, *space.input_shape))
        for h in handles:
            h.remove()
        layers = {la.name: la for la in space.layers(arch) if la.op in ("conv", "linear", "pool")}
        assert set(layers) == set(measured)
        for name, la in layers.items():
            macs, in_hw, out_hw = measured[name]
            assert la.macs == macs, name
            if la.op != "linear":
                assert in_hw == (la.in_h, la.in_w) and out_hw == (la.out_h, la.out_w), name
        assert space.flops(arch) == 2 * sum(m for m, _, _ in measured.values())


def test_onnx_export_parity(trained, space, x):
    pytest.importorskip("onnxruntime")
    from hwnas.export.onnx_export import check_parity, onnx_bytes

    model = trained.extract(ZERO_NODE)
    report = check_parity(onnx_bytes(model, x[:1]), model, x)
    assert report.passed, report


def test_train_evaluate_checkpoint_smoke(tmp_path):
    """A few sandwich steps on tiny random data change the weights, and evaluate_subnet runs on
    the result (a 16x16, 10-class, one-cell-per-stage space keeps it fast)."""
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

    space = get_space("nb201", image_size=16, num_classes=10,
                      config={**get_space("nb201").config(), "cells_per_stage": 1})
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
    changed = [k for k, v in net.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("cells.0.edges.e1_0.nor_conv_3x3.conv") for k in changed)
    assert "stem.conv.weight" in changed
    acc, model = evaluate_subnet(net, space.smallest(), data, split="val", calib_batches=2)
    assert 0.0 <= acc <= 100.0 and not model.training
    # a checkpoint rebuilds the same space and supernet
    path = save_checkpoint(tmp_path / "supernet.pt", net, space, dataset="random")
    space2, net2, _ = load_checkpoint(path)
    assert space2.name == space.name and space2.config() == space.config()
    x = torch.randn(2, *space.input_shape, generator=gen)
    with torch.no_grad():
        assert torch.equal(net2.extract(space.smallest())(x), net.extract(space.smallest())(x))
