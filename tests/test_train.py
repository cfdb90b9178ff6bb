"""supernet.train: sandwich training and its configuration; checkpoints."""


from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from hwnas.supernet.evaluate import (
    evaluate_subnet,
)
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import (
    TrainConfig,
    TrainStage,
    load_checkpoint,
    sandwich_config,
    save_checkpoint,
    train_supernet,
)
from torch import nn

from hwnas.core.errors import UserError

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
    with pytest.raises(UserError, match="augment must be one of .*'crop_flip_cutout'.*got 'cutmix'"):
        sandwich_config(1, augment="cutmix").validate()


def test_train_supernet_rejects_bad_config(digits):
    space = get_space("mbv3-tiny")
    with pytest.raises(UserError):
        train_supernet(space.build_supernet(), space, digits, sandwich_config(0), progress=False)


def test_train_config_round_trip():
    config = TrainConfig(
        stages=[TrainStage("warmup", 3, sandwich=False), TrainStage("shrink", 7, num_random=4,
                                                                   distill=False)],
        batch_size=32, lr=0.01, momentum=0.8, weight_decay=1e-4, label_smoothing=0.0,
        warmup_epochs=0.5, grad_clip=0.0, seed=7, augment="crop_flip_cutout",
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


def test_half_checkpoint_loads_as_float32(tmp_path):
    space = get_space("mbv3-tiny")
    net = _nontrivial_supernet(space)
    full = save_checkpoint(tmp_path / "f.pt", net, space, dataset="digits")
    half = save_checkpoint(tmp_path / "h.pt", net, space, dataset="digits", half=True)
    assert half.stat().st_size < 0.6 * full.stat().st_size
    _, loaded, payload = load_checkpoint(half)
    assert payload["state_dict"]["classifier.weight"].dtype == torch.float16
    net.set_active(space.largest())
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    x = torch.randn(4, *space.input_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(loaded.eval()(x), net.eval()(x), atol=2e-2)


def test_decay_all_decays_every_parameter():
    """--decay-all (CCT's original script) puts norms, biases and position embeddings under
    weight decay too; by default they are not decayed."""
    from hwnas.supernet.recipes import TrainConfig
    from hwnas.supernet.train import _make_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    for decay_all, decayed in ((False, 1), (True, 4)):
        opt = _make_optimizer(model, TrainConfig(weight_decay=0.03, optimizer="adamw",
                                                 decay_all=decay_all))
        n = sum(len(g["params"]) for g in opt.param_groups if g["weight_decay"] == 0.03)
        assert n == decayed
