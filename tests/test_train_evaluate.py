"""Tests for supernet.evaluate (BN recalibration, accuracy) and supernet.train (sandwich training,
configs, checkpoints)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from hwnas.supernet.data import load_dataset
from hwnas.supernet.evaluate import (
    accuracy,
    bn_calibration_loader,
    calibration_loader,
    evaluate_subnet,
    recalibrate_bn,
    recalibrated_subnet,
)
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import (
    TrainConfig,
    TrainStage,
    load_checkpoint,
    sandwich_config,
    save_checkpoint,
    subnet_loss_weights,
    train_supernet,
    with_training_augment,
)
from torch import nn

from hwnas.core.errors import UserError


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




def test_bn_recalibration_uses_training_augmentation(digits):
    """Subnets are recalibrated on augmented training batches (the statistics their weights
    were trained against); quantization calibration stays on clean images."""
    assert bn_calibration_loader(digits).augment == digits.augment != "none"
    assert calibration_loader(digits).augment == "none"
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    net = space.build_supernet()
    arch = space.smallest()
    got = recalibrated_subnet(net, arch, digits, calib_batches=3, calib_batch_size=32, seed=4)
    aug = recalibrate_bn(net.extract(arch), bn_calibration_loader(digits, batch_size=32, seed=4), 3)
    clean = recalibrate_bn(net.extract(arch), calibration_loader(digits, batch_size=32, seed=4), 3)

    def means(m):
        return torch.cat([b.running_mean for b in m.modules() if isinstance(b, nn.BatchNorm2d)])

    assert torch.equal(means(got), means(aug))
    assert not torch.allclose(means(got), means(clean))
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


# --------------------------------------------------------------------------------------------
# schedules: presets, restricted choices, channel sorting
# --------------------------------------------------------------------------------------------

from hwnas.supernet.train import (  # noqa: E402
    SCHEDULES,
    deps_config,
    load_standalone,
    progressive_config,
    reinitialize,
    save_standalone,
    schedule_config,
    standalone_config,
    train_standalone,
)
from hwnas.supernet.train_cifar import load_data  # noqa: E402


@pytest.fixture(scope="module")
def small_digits():
    """320 training images: 5 steps of 64 per epoch."""
    return load_data("digits", limit_train=320, limit_eval=100)


def test_schedule_presets():
    space = get_space("mbv3")
    assert SCHEDULES == ("sandwich", "progressive", "deps")
    sandwich = schedule_config("sandwich", space, 10, lr=0.2)
    assert [(s.name, s.epochs, s.sandwich) for s in sandwich.stages] == [("sandwich", 10, True)]
    assert sandwich.lr == 0.2
    deps = schedule_config("deps", space, 12)
    assert [(s.name, s.epochs, s.sandwich) for s in deps.stages] == [("full", 6, False),
                                                                      ("shrink", 6, True)]
    assert deps_config(12, full_fraction=0.25).stages[0].epochs == 3
    prog = schedule_config("progressive", space, 50)
    assert prog.epochs == 50
    names = [s.name for s in prog.stages]
    assert names == ["full", "kernel", "depth-1", "depth-2", "expand-1", "expand-2"]
    assert [s.epochs for s in prog.stages] == [9, 9, 5, 9, 9, 9] or sum(
        s.epochs for s in prog.stages) == 50
    assert prog.stages[0].choices == {"kernel": [7], "depth": [4], "expand": [6]}
    assert not prog.stages[0].sandwich and all(s.sandwich for s in prog.stages[1:])
    assert prog.stages[1].choices == {"kernel": [3, 5, 7], "depth": [4], "expand": [6]}
    assert prog.stages[2].choices["depth"] == [3, 4]
    assert prog.stages[4].choices == {"kernel": [3, 5, 7], "depth": [2, 3, 4], "expand": [4, 6]}
    assert prog.stages[5].choices["expand"] == [3, 4, 6]
    assert [s.sort_channels for s in prog.stages] == [False] * 4 + [True] * 2
    # each stage's choices contain the previous stage's (nothing trained is locked out again)
    for a, b in zip(prog.stages, prog.stages[1:]):
        assert all(set(a.choices[d]) <= set(b.choices[d]) for d in a.choices)
    assert TrainConfig.from_dict(json.loads(json.dumps(prog.to_dict()))) == prog
    small = progressive_config(space, 3)
    assert sum(s.epochs for s in small.stages) == 3
    with pytest.raises(UserError, match="unknown schedule 'fast'"):
        schedule_config("fast", space, 3)
    with pytest.raises(UserError, match="full_fraction"):
        deps_config(4, full_fraction=1.0)


def test_progressive_needs_elastic_dimensions():
    class Plain:
        name = "plain"

    with pytest.raises(UserError, match="declares no elastic dimensions"):
        progressive_config(Plain(), 4)


def test_training_samples_only_allowed_choices(small_digits, monkeypatch):
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    net = space.build_supernet()
    seen: list = []
    original = type(net).set_active

    def record(self, arch):
        arch = original(self, arch)
        seen.append(arch)
        return arch

    monkeypatch.setattr(type(net), "set_active", record)
    config = TrainConfig(stages=[
        TrainStage("k", 1, num_random=2, choices={"kernel": [3, 7], "depth": [3], "expand": [6]}),
        TrainStage("d", 1, num_random=2, choices={"depth": [2, 3], "expand": [4, 6]}),
    ])
    train_supernet(net, space, small_digits, config, progress=False)
    per_epoch = 5 * 4  # steps x (largest, smallest, 2 random)
    first, second = seen[:per_epoch], seen[per_epoch:2 * per_epoch]
    assert all(a.depths == (3, 3, 3) and {e for st in a.stages for _, e in st} == {6}
               and {k for st in a.stages for k, _ in st} <= {3, 7} for a in first)
    assert any(k == 3 for a in first for st in a.stages for k, _ in st)
    assert all(set(a.depths) <= {2, 3} and {e for st in a.stages for _, e in st} <= {4, 6}
               for a in second)
    assert any(k == 5 for a in second for st in a.stages for k, _ in st)  # kernel unrestricted
    bad = TrainConfig(stages=[TrainStage("x", 1, choices={"kernel": [9]})])
    with pytest.raises(UserError, match="kernel"):
        train_supernet(net, space, small_digits, bad, progress=False)


def test_sort_channels_stage_calls_supernet(small_digits, monkeypatch):
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    net = space.build_supernet()
    calls = []
    monkeypatch.setattr(net, "sort_channels",
                        lambda trained=None, optimizer=None: calls.append((trained, optimizer)))
    config = TrainConfig(stages=[TrainStage("a", 1, choices={"expand": [6]}),
                                 TrainStage("skip", 0, sort_channels=True),
                                 TrainStage("b", 1, choices={"expand": [4, 6]}, sort_channels=True)])
    train_supernet(net, space, small_digits, config, progress=False)
    assert len(calls) == 1  # the 0-epoch stage is skipped
    assert calls[0][0] == {"expand": [6]} and isinstance(calls[0][1], torch.optim.SGD)


# --------------------------------------------------------------------------------------------
# exact resume, budgets, checkpoints of training state
# --------------------------------------------------------------------------------------------


def _fresh(space):
    torch.manual_seed(0)
    return space.build_supernet()


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_config_augment_overrides_the_datasets(small_digits):
    """TrainConfig.augment replaces the dataset's augmentation for the training batches: the
    same training as on a copy of the data with that augmentation, unlike the dataset's own."""
    space = get_space("mbv3-tiny")
    assert small_digits.augment == "shift"
    by_config = _fresh(space)
    train_supernet(by_config, space, small_digits, sandwich_config(1, batch_size=64, augment="none"),
                   progress=False)
    by_data = _fresh(space)
    train_supernet(by_data, space, dataclasses.replace(small_digits, augment="none"),
                   sandwich_config(1, batch_size=64), progress=False)
    shifted = _fresh(space)
    train_supernet(shifted, space, small_digits, sandwich_config(1, batch_size=64), progress=False)
    assert _same_weights(by_config, by_data)
    assert not _same_weights(by_config, shifted)


def test_with_training_augment(small_digits):
    """A checkpoint's recorded augmentation replaces the dataset's (for BN recalibration);
    nothing recorded, or the same one, leaves the data as it is."""
    d = small_digits
    for recorded in (None, {}, {"augment": None}, {"augment": d.augment},
                     sandwich_config(1).to_dict()):
        assert with_training_augment(d, recorded) is d
    got = with_training_augment(d, sandwich_config(1, augment="none").to_dict())
    assert got.augment == "none" and got.train is d.train and got.test is d.test
    assert bn_calibration_loader(got).augment == "none"


def test_shipped_checkpoint_records_its_training_augmentation():
    """The shipped CIFAR-10 supernet was trained with TrivialAugment and cutout; its checkpoint
    must say so, or every search would recalibrate BatchNorm without them (up to 2 points lower,
    benchmarks/supernet_cifar10.md)."""
    from hwnas.supernet.checkpoints import CIFAR10_CLASSES, shipped_checkpoint

    path = shipped_checkpoint("mbv3", CIFAR10_CLASSES)
    assert path is not None, "supernet/checkpoints/mbv3_cifar10.pt is not shipped"
    _, _, payload = load_checkpoint(path)
    assert TrainConfig.from_dict(payload["train_config"]).augment == "trivial_crop_flip_cutout"


def test_resume_is_exact(small_digits, tmp_path):
    """2 epochs in one go == 1 epoch, checkpoint, resume, 1 epoch; also across a mid-epoch stop
    and a channel-sorting stage boundary."""
    space = get_space("mbv3-tiny")
    config = TrainConfig(stages=[TrainStage("full", 1, sandwich=False),
                                 TrainStage("shrink", 2, choices={"expand": [4, 6]}, num_random=1,
                                            sort_channels=True)],
                         batch_size=64, warmup_epochs=0.5)
    ref = _fresh(space)
    r_ref = train_supernet(ref, space, small_digits, config, progress=False)
    assert r_ref.completed and r_ref.step == r_ref.total_steps == 15

    ckpt = tmp_path / "ckpt.pt"
    net = _fresh(space)
    r1 = train_supernet(net, space, small_digits, config, progress=False, checkpoint_path=ckpt,
                        max_steps=5)  # exactly one epoch, before the sorting stage starts
    assert not r1.completed and r1.step == 5 and len(r1.history) == 1
    assert not _same_weights(net, ref)
    for stop in (8, None):  # mid-epoch, then to the end
        net = _fresh(space)  # a fresh process: everything comes from the checkpoint
        r = train_supernet(net, space, small_digits, config, progress=False, checkpoint_path=ckpt,
                           resume_from=ckpt, max_steps=stop)
    assert r.completed and r.step == 15
    assert _same_weights(net, ref)
    def losses(history):  # the per-epoch clock differs between the two runs
        return [{k: v for k, v in h.items() if k != "seconds"} for h in history]

    assert losses(r.history) == losses(r_ref.history)
    times = [h["seconds"] for h in r.history]
    assert times == sorted(times) and times[0] > 0  # the clock runs on across resumed calls
    assert r.images == 7 * 64  # this call's images only
    assert r.total_seconds >= r.seconds


def test_max_seconds_stops_with_checkpoint(small_digits, tmp_path):
    space = get_space("mbv3-tiny")
    ckpt = tmp_path / "c.pt"
    net = _fresh(space)
    r = train_supernet(net, space, small_digits, sandwich_config(2, batch_size=64), progress=False,
                       checkpoint_path=ckpt, max_seconds=0)
    assert not r.completed and r.step == 1 and r.history == []
    payload = torch.load(ckpt, weights_only=True)
    assert payload["train_state"]["step"] == 1
    assert payload["train_state"]["total_steps"] == 10
    space2, net2, _ = load_checkpoint(ckpt)  # an ordinary supernet checkpoint too
    assert _same_weights(net, net2)


def test_resume_rejects_other_space_config_or_data(small_digits, tmp_path, digits):
    space = get_space("mbv3-tiny")
    ckpt = tmp_path / "c.pt"
    config = sandwich_config(1, batch_size=64)
    train_supernet(_fresh(space), space, small_digits, config, progress=False,
                   checkpoint_path=ckpt, max_steps=1)
    other = get_space("mbv3-tiny", num_classes=7)
    with pytest.raises(UserError, match="another configuration.*num_classes"):
        train_supernet(other.build_supernet(), other, small_digits, config, progress=False,
                       resume_from=ckpt)
    ofa = get_space("mbv3", in_channels=1, image_size=8)
    with pytest.raises(UserError, match="holds space 'mbv3-tiny', not 'mbv3'"):
        train_supernet(ofa.build_supernet(), ofa, small_digits, config, progress=False,
                       resume_from=ckpt)
    with pytest.raises(UserError, match="holds space 'mbv3-tiny', not 'mbv3'"):
        load_checkpoint(ckpt, space=ofa)
    with pytest.raises(UserError, match="another training configuration"):
        train_supernet(_fresh(space), space, small_digits, sandwich_config(2, batch_size=64),
                       progress=False, resume_from=ckpt)
    with pytest.raises(UserError, match="trained on 320 images"):
        train_supernet(_fresh(space), space, digits, config, progress=False, resume_from=ckpt)
    final = save_checkpoint(tmp_path / "final.pt", _fresh(space), space, dataset="digits",
                            train_config=config)
    with pytest.raises(UserError, match="no training state"):
        train_supernet(_fresh(space), space, small_digits, config, progress=False,
                       resume_from=final)


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


def test_bad_precision(small_digits):
    space = get_space("mbv3-tiny")
    with pytest.raises(UserError, match="precision"):
        train_supernet(_fresh(space), space, small_digits, sandwich_config(1), progress=False,
                       precision="fp8")


def test_progress_without_tqdm(monkeypatch, capsys):
    import builtins

    from hwnas.supernet import train

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError("no tqdm here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    bar = train.progress_bar(3, "demo", disable=False)
    assert isinstance(bar, train._PrintProgress)
    bar.set_postfix(loss="1.0")
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert "demo: 3/3 steps (100%) loss=1.0" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# standalone subnets
# --------------------------------------------------------------------------------------------


def test_train_standalone_learns_and_resumes(small_digits, tmp_path):
    space = get_space("mbv3-tiny")
    arch = space.sample(np.random.default_rng(0))

    def fresh_model():
        torch.manual_seed(0)
        return reinitialize(space.build_supernet().extract(arch).train(), seed=1)

    config = standalone_config(3, batch_size=64, lr=0.1)
    ref = fresh_model()
    r = train_standalone(ref, small_digits, config=config, progress=False)
    assert r.completed and [h["stage"] for h in r.history] == ["standalone"] * 3
    assert r.history[-1]["loss"] < r.history[0]["loss"]
    ckpt = tmp_path / "s.pt"
    m = fresh_model()
    train_standalone(m, small_digits, config=config, space=space, arch=arch, progress=False,
                     checkpoint_path=ckpt, max_steps=7)
    m = fresh_model()
    train_standalone(m, small_digits, config=config, space=space, arch=arch, progress=False,
                     checkpoint_path=ckpt, resume_from=ckpt)
    assert _same_weights(m, ref)
    space2, arch2, loaded, payload = load_standalone(ckpt)
    assert arch2 == arch and payload["arch"] == space.to_string(arch)
    assert _same_weights(loaded, ref)
    with pytest.raises(UserError, match="standalone subnet checkpoint, not a supernet"):
        load_checkpoint(ckpt)
    other = space.smallest()
    with pytest.raises(UserError, match="holds subnet"):
        train_standalone(fresh_model(), small_digits, config=config, space=space, arch=other,
                         progress=False, resume_from=ckpt)
    with pytest.raises(UserError, match="space and arch"):
        train_standalone(fresh_model(), small_digits, 1, checkpoint_path=ckpt, progress=False)
    save_standalone(tmp_path / "plain.pt", ref, space, arch, dataset="digits")
    assert _same_weights(load_standalone(tmp_path / "plain.pt")[2], ref)


def test_reinitialize_is_seeded():
    space = get_space("mbv3-tiny")
    a = reinitialize(space.build_supernet().extract(space.largest()), seed=3)
    b = reinitialize(space.build_supernet().extract(space.largest()), seed=3)
    assert _same_weights(a, b)
    assert torch.all(a.blocks[0].expand_bn.weight == 1)


# --------------------------------------------------------------------------------------------
# the entry point supernet.train_cifar (CPU smoke runs)
# --------------------------------------------------------------------------------------------

from hwnas.supernet import train_cifar  # noqa: E402


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "digits-decoded.npz"
    assert train_cifar.main(["prepare", "--source", "digits", "--out", str(path)]) == 0
    return path


def test_prepare_round_trip(decoded, digits):
    data = train_cifar.load_decoded(decoded)
    assert train_cifar.is_decoded(decoded)
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(data, split).images, getattr(digits, split).images)
        assert torch.equal(getattr(data, split).labels, getattr(digits, split).labels)
    assert (data.classes, data.mean, data.std, data.augment, data.name) == (
        digits.classes, digits.mean, digits.std, digits.augment, digits.name)
    small = train_cifar.load_data(str(decoded), limit_train=100, limit_eval=50)
    assert len(small.train) == 100 and len(small.test) == 50
    assert len(set(small.train.labels.tolist())) == 10  # a random subset, not the first 100


def _cli(*args: str) -> int:
    return train_cifar.main([*args, "--quiet"])


def test_entry_point_train_resume_eval(decoded, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "256",
            "--limit-eval", "100", "--batch-size", "64", "--out", str(out)]
    # a budget of ~nothing: one step, checkpointed, "not finished"
    assert _cli(*base, "--epochs", "2", "--max-minutes", "1e-6", "--eval") == 0
    text = capsys.readouterr().out
    assert "not finished" in text and "eval skipped" in text
    log = json.loads((out / "train_log.json").read_text())
    assert not log["completed"] and log["step"] == 1 and (out / "checkpoint.pt").is_file()
    # starting again without --resume is refused; --resume needs only --out
    assert _cli(*base, "--epochs", "2") == 2
    assert "already holds a run" in capsys.readouterr().err
    assert _cli("--out", str(out), "--resume", "--eval") == 0
    text = capsys.readouterr().out
    assert "images/s" in text and "largest" in text
    log = json.loads((out / "train_log.json").read_text())
    assert log["completed"] and log["step"] == log["total_steps"] == 8 and len(log["chunks"]) == 2
    assert [h["epoch"] for h in log["history"]] == [1, 2]
    result = json.loads((out / "eval.json").read_text())
    assert [r["role"] for r in result["subnets"]] == ["largest", "smallest", "random1", "random2",
                                                      "random3"]
    assert all(0.0 <= r["top1"] <= 100.0 for r in result["subnets"])
    assert result["images"] == 100 and result["bn_recalibration"]
    space, net, payload = load_checkpoint(out / "supernet.pt")
    assert space.name == "mbv3-tiny" and "train_state" not in payload
    # evaluating a finished run again trains nothing; it reads the final weights, so the
    # resumable checkpoint may be gone (a run directory downloaded without it)
    (out / "checkpoint.pt").unlink()
    (out / "eval.json").unlink()
    assert _cli("--out", str(out), "--resume", "--eval", "--calib-batches", "1",
                "--calib-batch-size", "16") == 0
    assert "already complete" in capsys.readouterr().out
    again = json.loads((out / "eval.json").read_text())
    assert again["bn_recalibration"] == {"batches": 1, "batch_size": 16, "augmented": True}


def test_entry_point_standalone_and_bench(decoded, tmp_path, capsys):
    out = tmp_path / "sa"
    assert _cli("--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--limit-eval", "100", "--batch-size", "64", "--epochs", "1", "--standalone",
                "random2", "--out", str(out), "--eval") == 0
    result = json.loads((out / "eval.json").read_text())
    space = get_space("mbv3-tiny")
    expected = train_cifar._eval_archs(space)[3][1]  # the same random2 as --eval reports
    assert result["subnets"][0]["arch"] == space.to_string(expected)
    assert not result["bn_recalibration"]
    _, arch, model, _ = load_standalone(out / "model.pt")
    assert arch == expected
    assert _cli("--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--batch-size", "32", "--bench-steps", "3") == 0
    assert "images/s" in capsys.readouterr().out
    assert _cli("--data", str(decoded), "--space", "mbv3-tiny", "--standalone", "k3e2",
                "--out", str(tmp_path / "bad")) == 2
    err = capsys.readouterr().err
    assert "--standalone 'k3e2'" in err and "space mbv3-tiny has 3" in err and "random1" in err
    assert _cli("--data", str(decoded), "--schedule", "progressive", "--space", "nope",
                "--out", str(tmp_path / "bad2")) == 2
    assert "unknown space 'nope'" in capsys.readouterr().err


def test_entry_point_needs_only_torch_and_numpy(decoded, tmp_path):
    """What the GPU machine may lack (pandas, sklearn, optuna, matplotlib, tqdm, Pillow) is not
    needed to train from a decoded file."""
    import subprocess
    import sys
    from pathlib import Path

    blocker = (  # a module set to None in sys.modules is one that is not installed
        "import sys\n"
        "for name in ('pandas', 'sklearn', 'optuna', 'matplotlib', 'tqdm', 'PIL', 'scipy'):\n"
        "    sys.modules[name] = None\n"
        "try:\n"
        "    import tqdm\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    sys.exit(3)\n"
        "from hwnas.supernet.train_cifar import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", blocker, "--data", str(decoded), "--space", "mbv3-tiny",
         "--limit-train", "128", "--limit-eval", "64", "--batch-size", "64", "--epochs", "1",
         "--out", str(tmp_path / "r"), "--eval"],
        capture_output=True, text=True, timeout=300, cwd=repo,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "largest" in proc.stdout
    assert "test top-1" in proc.stdout


# --------------------------------------------------------------------------------------------
# subnet_loss (sum vs mean of a sandwich step's losses), compiling the fixed subnets
# --------------------------------------------------------------------------------------------


def _one_step_delta(space, data, config) -> dict[str, torch.Tensor]:
    net = _fresh(space)
    before = {k: v.detach().clone() for k, v in net.named_parameters()}
    train_supernet(net, space, data, config, progress=False, max_steps=1)
    return {k: v.detach() - before[k] for k, v in net.named_parameters()}


@pytest.mark.parametrize("sandwich", [True, False])
def test_subnet_loss_mean_averages_the_step(small_digits, sandwich):
    """Without weight decay or clipping, the first SGD step moves the weights by a fixed
    multiple of the gradient (-lr * (1 + momentum) * grad, Nesterov), so 'mean' moves them by exactly 1/(2 + num_random) of what 'sum' does on a sandwich step,
    and by the same on a step that trains the largest subnet only."""
    space = get_space("mbv3-tiny")
    common = dict(batch_size=64, lr=0.1, weight_decay=0.0, warmup_epochs=0.0,
                  grad_clip=0.0)
    stages = [TrainStage("s", 1, sandwich=sandwich, num_random=1)]
    d_sum = _one_step_delta(space, small_digits, TrainConfig(stages=stages, **common))
    d_mean = _one_step_delta(space, small_digits,
                             TrainConfig(stages=stages, subnet_loss="mean", **common))
    scale = 1.0 / 3.0 if sandwich else 1.0
    moved = [k for k, v in d_sum.items() if v.abs().max() > 0]
    assert moved
    for k in moved:
        torch.testing.assert_close(d_mean[k], d_sum[k] * scale, rtol=1e-4, atol=1e-7)


def test_subnet_loss_largest_plus_mean_keeps_the_largest_full(small_digits):
    """'largest+mean': the first step (plain SGD scale, as above) is the largest subnet's
    full step plus the mean of the other subnets' steps: with the smallest and one random
    subnet, d = d_largest + (d_sum - d_largest) / 2."""
    space = get_space("mbv3-tiny")
    common = dict(batch_size=64, lr=0.1, weight_decay=0.0, warmup_epochs=0.0, grad_clip=0.0)
    sandwich = [TrainStage("s", 1, num_random=1)]
    d_sum = _one_step_delta(space, small_digits, TrainConfig(stages=sandwich, **common))
    d_largest = _one_step_delta(space, small_digits, TrainConfig(
        stages=[TrainStage("s", 1, sandwich=False)], **common))
    d_mix = _one_step_delta(space, small_digits, TrainConfig(
        stages=sandwich, subnet_loss="largest+mean", **common))
    moved = [k for k, v in d_sum.items() if (v - d_largest[k]).abs().max() > 0]
    assert moved  # the small subnets do move some weights
    for k in d_sum:
        torch.testing.assert_close(d_mix[k], d_largest[k] + (d_sum[k] - d_largest[k]) / 2,
                                   rtol=1e-4, atol=1e-7)
    assert subnet_loss_weights("largest+mean", 3) == (1.0, 1.0 / 3)
    assert subnet_loss_weights("mean", 3) == (0.25, 0.25)
    assert subnet_loss_weights("mean", 0) == (1.0, 1.0)


def test_subnet_loss_is_validated_and_defaults_to_sum():
    assert TrainConfig().subnet_loss == "sum"
    with pytest.raises(UserError, match="subnet_loss must be one of"):
        TrainConfig(subnet_loss="max").validate()
    # configs recorded before the option existed load as "sum" (what they were trained with)
    old = TrainConfig().to_dict()
    del old["subnet_loss"]
    assert TrainConfig.from_dict(old) == TrainConfig()


def test_compile_runs_only_the_fixed_subnets_compiled(small_digits, monkeypatch):
    """compile=True sends each stage's largest and smallest subnet through the compiled module
    and the random ones through the eager supernet; the training itself is unchanged."""
    space = get_space("mbv3-tiny")
    config = TrainConfig(stages=[TrainStage("full", 1, sandwich=False),
                                 TrainStage("shrink", 1, num_random=2)],
                         batch_size=64, subnet_loss="mean")
    seen: list[str] = []

    class Recorder(nn.Module):
        def __init__(self, module: nn.Module, mode=None) -> None:
            super().__init__()
            self.module = module

        def forward(self, x):
            seen.append(space.to_string(self.module.active_arch()))
            return self.module(x)

    monkeypatch.setattr(torch, "compile", lambda module, mode=None: Recorder(module, mode))
    ref = _fresh(space)
    train_supernet(ref, space, small_digits, config, progress=False)
    net = _fresh(space)
    train_supernet(net, space, small_digits, config, progress=False, compile=True)
    assert _same_weights(net, ref)
    largest, smallest = space.to_string(space.largest()), space.to_string(space.smallest())
    assert seen.count(largest) == 10 and seen.count(smallest) == 5  # 5 steps per epoch
    assert set(seen) == {largest, smallest}


# --------------------------------------------------------------------------------------------
# train_cifar rank: Kendall tau of supernet accuracies against ground truth
# --------------------------------------------------------------------------------------------


def test_kendall_tau_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(5):
        a = rng.integers(0, 6, 30).astype(float)  # with ties
        b = a + rng.normal(0, 2, 30)
        assert train_cifar.kendall_tau(a, b) == pytest.approx(scipy_stats.kendalltau(a, b)[0])
    assert train_cifar.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(train_cifar.kendall_tau([1, 1, 1], [1, 2, 3]))


def test_entry_point_rank(decoded, tmp_path, capsys):
    out = tmp_path / "run"
    assert _cli("--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--limit-eval", "64", "--batch-size", "64", "--epochs", "1", "--out", str(out)) == 0
    space = get_space("mbv3-tiny")
    rng = np.random.default_rng(7)
    archs = {space.to_string(a) for a in (space.sample(rng) for _ in range(200))}
    truth = tmp_path / "truth.csv"
    truth.write_text("arch_idx,arch,acc\n" + "".join(
        f"{i},{a},{space.flops(space.from_string(a)) / 1e6}\n" for i, a in enumerate(sorted(archs))))
    args = ["rank", "--out", str(out), "--truth", str(truth), "--num", "4", "--seed", "7",
            "--calib-batches", "1", "--device", "cpu"]
    assert train_cifar.main(args) == 0
    assert "Kendall tau" in capsys.readouterr().out
    report = json.loads((out / "rank.json").read_text())
    assert report["num"] == 4 and report["truth_column"] == "acc"
    assert len({r["arch"] for r in report["subnets"]}) == 4
    for r in report["subnets"]:
        assert r["truth"] == pytest.approx(space.flops(space.from_string(r["arch"])) / 1e6)
        assert 0.0 <= r["supernet_top1"] <= 100.0
    assert report["kendall_tau"] == pytest.approx(train_cifar.kendall_tau(
        [r["supernet_top1"] for r in report["subnets"]], [r["truth"] for r in report["subnets"]]),
        nan_ok=True)
    # a table of other architectures is one clear error
    truth.write_text("arch,acc\nnot-an-arch,1.0\n")
    assert train_cifar.main(args) == 2
    assert "lacks 4 of the sampled architectures" in capsys.readouterr().err


def test_cudnn_autotuning_defaults_to_standalone_runs_only(tmp_path):
    """--cudnn-benchmark auto: on for a standalone network (one set of shapes), off for a
    supernet (every random subnet brings new shapes to tune), also when a run is resumed."""
    parse = train_cifar.build_parser().parse_args
    assert train_cifar._is_standalone(parse(["--standalone", "largest", "--out", str(tmp_path)]))
    assert not train_cifar._is_standalone(parse(["--out", str(tmp_path)]))
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"standalone": "smallest"}}))
    assert train_cifar._is_standalone(parse(["--out", str(tmp_path), "--resume"]))
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"standalone": None}}))
    assert not train_cifar._is_standalone(parse(["--out", str(tmp_path), "--resume"]))
    assert parse(["--out", "x"]).cudnn_benchmark == "auto"


def test_entry_point_augment_override(decoded, tmp_path, capsys, monkeypatch):
    """--augment replaces the dataset's augmentation for training and BN recalibration, is
    recorded in run.json, and a resumed run keeps it."""
    import hwnas.supernet.data as data_module

    seen = []
    real = data_module.augment_batch
    monkeypatch.setattr(data_module, "augment_batch",
                        lambda images, kind, generator, fill=None:
                        seen.append(kind) or real(images, kind, generator, fill))
    out = tmp_path / "cut"
    base = ("--data", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
            "--limit-eval", "50", "--batch-size", "64", "--out", str(out))
    assert _cli(*base, "--epochs", "2", "--augment", "crop_flip_cutout",
                "--max-minutes", "1e-6") == 0
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["augment"] == "crop_flip_cutout"
    assert seen and set(seen) == {"crop_flip_cutout"}
    seen.clear()
    assert _cli("--out", str(out), "--resume", "--eval", "--calib-batches", "1") == 0
    assert seen and set(seen) == {"crop_flip_cutout"}  # training and recalibration alike
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        _cli(*base, "--overwrite", "--augment", "rotate")
    assert exc.value.code == 2 and "--augment" in capsys.readouterr().err
