"""Tests for supernet.evaluate (BN recalibration, accuracy) and supernet.train (sandwich training,
configs, checkpoints)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from supernet.data import load_dataset
from supernet.errors import UserError
from supernet.evaluate import accuracy, evaluate_subnet, recalibrate_bn
from supernet.spaces import get_space
from supernet.train import (
    TrainConfig,
    TrainStage,
    load_checkpoint,
    sandwich_config,
    save_checkpoint,
    train_supernet,
)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


# --------------------------------------------------------------------------------------------
# recalibrate_bn
# --------------------------------------------------------------------------------------------


def _conv_bn(momentum: float = 0.3) -> nn.Sequential:
    conv = nn.Conv2d(1, 2, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([2.0, -1.0]).view(2, 1, 1, 1))
    bn = nn.BatchNorm2d(2, momentum=momentum)
    with torch.no_grad():  # stale statistics that must be thrown away
        bn.running_mean.fill_(5.0)
        bn.running_var.fill_(7.0)
        bn.num_batches_tracked.fill_(10)
    return nn.Sequential(conv, bn)


def test_recalibrate_bn_computes_exact_mean_over_batches():
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(4, 1, 3, 3, generator=g)
    x2 = torch.randn(4, 1, 3, 3, generator=g) * 2 + 3
    x3 = torch.full((4, 1, 3, 3), 100.0)  # beyond max_batches: must be ignored
    model = _conv_bn().eval()
    out = recalibrate_bn(model, [(x1, None), (x2, None), (x3, None)], max_batches=2)
    assert out is model

    bn = model[1]
    bn_inputs = [torch.cat([2 * x, -x], dim=1) for x in (x1, x2)]  # what the BN saw
    expected_mean = torch.cat(bn_inputs).mean(dim=(0, 2, 3))  # equal batch sizes
    expected_var = torch.stack([t.var(dim=(0, 2, 3), unbiased=True) for t in bn_inputs]).mean(0)
    assert torch.allclose(bn.running_mean, expected_mean, atol=1e-5)
    assert torch.allclose(bn.running_var, expected_var, atol=1e-5)
    assert int(bn.num_batches_tracked) == 2
    assert bn.momentum == 0.3  # restored
    assert not model.training
    assert not any(m.training for m in model.modules())


def test_recalibrate_bn_restores_state_on_error():
    model = _conv_bn(momentum=0.2)

    def batches():
        yield torch.randn(4, 1, 3, 3), None
        raise RuntimeError("loader failed")

    with pytest.raises(RuntimeError, match="loader failed"):
        recalibrate_bn(model, batches())
    assert model[1].momentum == 0.2
    assert not model.training


def test_recalibrate_bn_on_supernet_matches_extracted_subnet():
    """Recalibrating the supernet with a subnet active gives the same statistics as
    recalibrating the extracted subnet (the sliced BatchNorm must honour momentum=None)."""
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    net = space.build_supernet()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 1, 8, 8, generator=g) * 2 + 1, None) for _ in range(3)]
    arch = space.smallest()
    model = recalibrate_bn(net.extract(arch), batches)
    net.set_active(arch)
    recalibrate_bn(net, batches)
    x = batches[0][0]
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4)
        assert torch.allclose(net.extract(arch)(x), model(x), atol=1e-4)


# --------------------------------------------------------------------------------------------
# accuracy
# --------------------------------------------------------------------------------------------


class _FirstPixelClassifier(nn.Module):
    """Predicts the class written in the first pixel of each image."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(x[:, 0, 0, 0].long(), 3).float()


def _images(classes: list[int]) -> torch.Tensor:
    x = torch.zeros(len(classes), 1, 2, 2)
    x[:, 0, 0, 0] = torch.tensor(classes, dtype=torch.float32)
    return x


def test_accuracy_counts_samples_not_batches():
    model = _FirstPixelClassifier().train()
    batches = [
        (_images([0, 1, 2, 1]), torch.tensor([0, 1, 2, 1])),  # 4/4 right
        (_images([2]), torch.tensor([0])),                     # 0/1 right
    ]
    assert accuracy(model, batches) == pytest.approx(80.0)  # per-batch averaging would give 50
    assert not model.training
    assert accuracy(model, [(_images([1, 2]), torch.tensor([0, 0]))]) == 0.0
    assert accuracy(model, [(_images([1, 2]), torch.tensor([1, 2]))]) == 100.0


def test_accuracy_without_samples_raises():
    with pytest.raises(ValueError, match="no samples"):
        accuracy(_FirstPixelClassifier(), [])


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------


def test_train_supernet_learns(digits):
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    net = space.build_supernet()
    config = TrainConfig(
        stages=[TrainStage("warmup", 1, sandwich=False), TrainStage("sandwich", 1, num_random=1)]
    )
    result = train_supernet(net, space, digits, config, progress=False)

    assert result.epochs == 2
    assert result.seconds > 0 and result.images_per_s > 0
    assert [h["stage"] for h in result.history] == ["warmup", "sandwich"]
    assert [h["epoch"] for h in result.history] == [1, 2]
    for h in result.history:
        assert math.isfinite(h["loss_largest"]) and h["loss_largest"] > 0
    assert result.history[0]["loss_sub"] == 0.0  # no subnets trained in the warm-up
    assert result.history[1]["loss_sub"] > 0.0
    # one image per training sample per epoch (drop_last loses less than one batch)
    per_epoch = result.images_per_s * result.seconds / 2
    assert len(digits.train) - config.batch_size < per_epoch <= len(digits.train)
    json.dumps(result.history)  # history is plain data

    # it learned: the largest subnet's loss falls and it beats chance (10 %) clearly
    assert result.history[-1]["loss_largest"] < result.history[0]["loss_largest"] - 0.2
    assert net.active_arch() == space.largest()
    acc, model = evaluate_subnet(net, space.largest(), digits, calib_batches=5)
    assert acc > 40.0
    assert isinstance(model, nn.Module) and not model.training


def test_train_config_validate():
    sandwich_config(1).validate()  # fine
    with pytest.raises(UserError, match="epochs"):
        sandwich_config(0).validate()
    with pytest.raises(UserError, match="epochs"):
        TrainConfig(stages=[]).validate()
    with pytest.raises(UserError, match="epochs"):
        TrainConfig(stages=[TrainStage("a", 2), TrainStage("b", -1)]).validate()
    with pytest.raises(UserError, match="learning rate"):
        sandwich_config(1, lr=-0.1).validate()
    with pytest.raises(UserError, match="learning rate"):
        sandwich_config(1, lr=0.0).validate()
    with pytest.raises(UserError, match="batch size"):
        sandwich_config(1, batch_size=0).validate()


def test_train_supernet_rejects_bad_config(digits):
    space = get_space("mbv3-tiny")
    with pytest.raises(UserError):
        train_supernet(space.build_supernet(), space, digits, sandwich_config(0), progress=False)


def test_train_config_round_trip():
    config = TrainConfig(
        stages=[TrainStage("warmup", 3, sandwich=False), TrainStage("shrink", 7, num_random=4,
                                                                   distill=False)],
        batch_size=32, lr=0.01, momentum=0.8, weight_decay=1e-4, label_smoothing=0.0,
        warmup_epochs=0.5, grad_clip=0.0, seed=7,
    )
    d = config.to_dict()
    assert TrainConfig.from_dict(d) == config
    assert TrainConfig.from_dict(json.loads(json.dumps(d))) == config
    assert config.epochs == 10
    assert TrainConfig.from_dict(TrainConfig().to_dict()) == TrainConfig()


# --------------------------------------------------------------------------------------------
# checkpoints
# --------------------------------------------------------------------------------------------


def _nontrivial_supernet(space):
    torch.manual_seed(0)
    net = space.build_supernet()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
        net.train()
        for arch in (space.largest(), space.smallest()):
            net.set_active(arch)
            net(torch.randn(8, *space.input_shape, generator=gen))
    return net.eval()


def test_checkpoint_round_trip(tmp_path):
    space = get_space("mbv3-tiny", num_classes=7)  # non-default config must be restored
    net = _nontrivial_supernet(space)
    config = sandwich_config(3, lr=0.02)
    path = save_checkpoint(tmp_path / "sub" / "ckpt.pt", net, space, dataset="digits",
                           train_config=config, extra={"note": "hello"})
    assert path.is_file()
    assert [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]  # no temp file left behind

    space2, net2, payload = load_checkpoint(path)
    assert space2.name == space.name
    assert space2.config() == space.config()
    assert space2.num_classes == 7
    assert payload["dataset"] == "digits"
    assert payload["extra"] == {"note": "hello"}
    assert TrainConfig.from_dict(payload["train_config"]) == config
    net2.eval()
    x = torch.randn(5, *space.input_shape, generator=torch.Generator().manual_seed(4))
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for arch in (space.largest(), space.smallest(), space.sample(rng)):
            net.set_active(arch)
            net2.set_active(arch)
            assert torch.equal(net(x), net2(x))
    # a fresh supernet differs, so the equality above is meaningful
    fresh = space.build_supernet().eval()
    with torch.no_grad():
        assert not torch.allclose(fresh(x), net2(x))


def test_load_checkpoint_missing_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(UserError, match="does not exist"):
        load_checkpoint(tmp_path)  # a directory is not a checkpoint


def test_load_checkpoint_random_bytes(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(UserError, match="cannot read supernet checkpoint"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "payload",
    [
        {"state_dict": {}},
        {"format": "something-else", "state_dict": {}},
        torch.zeros(3),
    ],
    ids=["no-tag", "wrong-tag", "tensor"],
)
def test_load_checkpoint_without_format_tag(tmp_path, payload):
    path = tmp_path / "other.pt"
    torch.save(payload, path)
    with pytest.raises(UserError, match="not an hwnas supernet checkpoint"):
        load_checkpoint(path)


def test_load_checkpoint_mismatched_weights(tmp_path):
    space = get_space("mbv3-tiny")
    net = space.build_supernet()
    path = save_checkpoint(tmp_path / "ckpt.pt", net, space, dataset="digits")
    payload = torch.load(path, weights_only=True)
    payload["state_dict"].pop("classifier.weight")
    torch.save(payload, path)
    with pytest.raises(UserError, match="does not match"):
        load_checkpoint(path)


def test_checkpoint_copy_is_independent_of_later_training(tmp_path):
    space = get_space("mbv3-tiny")
    net = _nontrivial_supernet(space)
    path = save_checkpoint(tmp_path / "ckpt.pt", net, space, dataset="digits")
    reference = copy.deepcopy(net)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
    _, loaded, _ = load_checkpoint(path)
    for (name, a), b in zip(reference.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
