"""supernet.train: schedule presets, restricted choices, augmentation of the config, subnet loss
weighting and compiled fixed subnets (checkpoints and resume: test_train_resume.py)."""


from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hwnas.supernet.evaluate import (
    bn_calibration_loader,
)
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import (
    SCHEDULES,
    TrainConfig,
    TrainStage,
    deps_config,
    load_checkpoint,
    progressive_config,
    sandwich_config,
    schedule_config,
    subnet_loss_weights,
    train_supernet,
    with_training_augment,
)
from torch import nn
from train_support import fresh, same_weights

from hwnas.core.errors import UserError


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


def test_training_samples_only_allowed_choices(two_step_digits, monkeypatch):
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
    train_supernet(net, space, two_step_digits, config, progress=False)
    per_epoch = 2 * 4  # steps x (largest, smallest, 2 random)
    first, second = seen[:per_epoch], seen[per_epoch:2 * per_epoch]
    assert all(a.depths == (3, 3, 3) and {e for st in a.stages for _, e in st} == {6}
               and {k for st in a.stages for k, _ in st} <= {3, 7} for a in first)
    assert any(k == 3 for a in first for st in a.stages for k, _ in st)
    assert all(set(a.depths) <= {2, 3} and {e for st in a.stages for _, e in st} <= {4, 6}
               for a in second)
    assert any(k == 5 for a in second for st in a.stages for k, _ in st)  # kernel unrestricted
    bad = TrainConfig(stages=[TrainStage("x", 1, choices={"kernel": [9]})])
    with pytest.raises(UserError, match="kernel"):
        train_supernet(net, space, two_step_digits, bad, progress=False)


def test_sort_channels_stage_calls_supernet(two_step_digits, monkeypatch):
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    net = space.build_supernet()
    calls = []
    monkeypatch.setattr(net, "sort_channels",
                        lambda trained=None, optimizer=None: calls.append((trained, optimizer)))
    config = TrainConfig(stages=[TrainStage("a", 1, choices={"expand": [6]}),
                                 TrainStage("skip", 0, sort_channels=True),
                                 TrainStage("b", 1, choices={"expand": [4, 6]}, sort_channels=True)])
    train_supernet(net, space, two_step_digits, config, progress=False)
    assert len(calls) == 1  # the 0-epoch stage is skipped
    assert calls[0][0] == {"expand": [6]} and isinstance(calls[0][1], torch.optim.SGD)


# --------------------------------------------------------------------------------------------
# exact resume, budgets, checkpoints of training state
# --------------------------------------------------------------------------------------------


def test_config_augment_overrides_the_datasets(two_step_digits):
    """TrainConfig.augment replaces the dataset's augmentation for the training batches: the
    same training as on a copy of the data with that augmentation, unlike the dataset's own."""
    space = get_space("mbv3-tiny")
    assert two_step_digits.augment == "shift"
    by_config = fresh(space)
    train_supernet(by_config, space, two_step_digits,
                   sandwich_config(1, batch_size=64, augment="none"), progress=False)
    by_data = fresh(space)
    train_supernet(by_data, space, dataclasses.replace(two_step_digits, augment="none"),
                   sandwich_config(1, batch_size=64), progress=False)
    shifted = fresh(space)
    train_supernet(shifted, space, two_step_digits, sandwich_config(1, batch_size=64),
                   progress=False)
    assert same_weights(by_config, by_data)
    assert not same_weights(by_config, shifted)


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


def _one_step_delta(space, data, config) -> dict[str, torch.Tensor]:
    net = fresh(space)
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


def test_compile_runs_only_the_fixed_subnets_compiled(two_step_digits, monkeypatch):
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
    ref = fresh(space)
    train_supernet(ref, space, two_step_digits, config, progress=False)
    net = fresh(space)
    train_supernet(net, space, two_step_digits, config, progress=False, compile=True)
    assert same_weights(net, ref)
    largest, smallest = space.to_string(space.largest()), space.to_string(space.smallest())
    assert seen.count(largest) == 4 and seen.count(smallest) == 2  # 2 steps per epoch
    assert set(seen) == {largest, smallest}
