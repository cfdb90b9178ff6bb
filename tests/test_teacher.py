"""supernet.teacher and the teacher's part of training: the loss, the checks on the teacher's
data, and that the taught network follows the teacher."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hwnas.supernet.fingerprint import training_record
from hwnas.supernet.spaces import get_space
from hwnas.supernet.teacher import check_teacher_data, load_teacher
from hwnas.supernet.train import (
    TrainConfig,
    _SandwichStep,
    label_loss,
    sandwich_config,
    soft_cross_entropy,
    save_checkpoint,
    save_standalone,
    standalone_config,
    train_standalone,
)
from torch import nn

from hwnas.core.errors import UserError


class _Constant(nn.Module):
    """A 'teacher' that always answers class ``k``, whatever the image."""

    def __init__(self, classes: int, k: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.full((classes,), -5.0).index_fill(0, torch.tensor(k), 5.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.size(0), -1)


def _nb201(data):
    return get_space("nb201", in_channels=data.in_channels, image_size=data.image_size[0],
                     num_classes=data.num_classes)


def test_label_loss_mixes_labels_and_teacher():
    torch.manual_seed(0)
    logits, t = torch.randn(8, 10), torch.randn(8, 10)
    y = torch.randint(0, 10, (8,))
    plain = TrainConfig(label_smoothing=0.1)
    ce = F.cross_entropy(logits, y, label_smoothing=0.1)
    assert torch.allclose(label_loss(logits, y, plain), ce)
    soft = replace(plain, teacher="t.pt:x", teacher_weight=1.0, teacher_mode="soft")
    taught = -(F.softmax(t, 1) * F.log_softmax(logits, 1)).sum(1).mean()
    assert torch.allclose(label_loss(logits, y, soft, t), taught)
    hard = replace(soft, teacher_mode="hard", teacher_weight=0.25)
    want = 0.75 * ce + 0.25 * F.cross_entropy(logits, t.argmax(1), label_smoothing=0.1)
    assert torch.allclose(label_loss(logits, y, hard, t), want)


@pytest.mark.parametrize("field,value", [("teacher_weight", 0.0), ("teacher_weight", 1.5),
                                         ("teacher_mode", "kl")])
def test_teacher_settings_validated(field, value):
    with pytest.raises(UserError, match=field):
        replace(TrainConfig(), **{field: value}).validate()


def test_with_a_teacher_the_other_subnets_still_learn_from_the_largest(digits):
    """In a sandwich step with an external teacher, the largest subnet learns from the labels
    and the teacher mixed, the smallest from the largest one's probabilities (session 46's
    lever, every subnet from the teacher, failed its rule and was taken out)."""
    space = _nb201(digits)
    torch.manual_seed(0)
    supernet, teacher = space.build_supernet(), _Constant(digits.num_classes, 3)
    config = sandwich_config(1, num_random=0, batch_size=8, teacher="const:3",
                             teacher_weight=0.5)
    x, y = torch.randn(8, digits.in_channels, *digits.image_size), torch.randint(0, 10, (8,))
    with torch.no_grad():
        outs = {}
        for role in ("largest", "smallest"):
            supernet.set_active(getattr(space, role)())
            outs[role] = supernet(x)
    want = soft_cross_entropy(outs["smallest"], F.softmax(outs["largest"], 1))
    step = _SandwichStep(supernet, config, [space], np.random.default_rng(0), teacher, None)
    losses = step(x, y, 0, contextlib.nullcontext)
    assert torch.allclose(losses[1], want)
    assert torch.allclose(losses[0], label_loss(outs["largest"], y, config, teacher(x)))


def test_taught_network_follows_the_teacher(digits):
    """Hard distillation from a teacher that always says class 3, with no weight on the labels:
    the network learns to say 3 (a network that ignored the teacher would learn the digits)."""
    space = _nb201(digits)
    torch.manual_seed(0)
    model = space.build_supernet().extract(space.smallest())
    teacher = _Constant(digits.num_classes, 3)
    config = standalone_config(2, lr=0.05, teacher="const:3", teacher_weight=1.0,
                               teacher_mode="hard")
    train_standalone(model, digits, config=config, progress=False, teacher=teacher)
    model.eval()
    with torch.no_grad():
        x = (digits.val.images.float() / 255 - torch.tensor(digits.mean).view(1, -1, 1, 1)) \
            / torch.tensor(digits.std).view(1, -1, 1, 1)
        said = model(x).argmax(1)
    assert (said == 3).float().mean() > 0.9
    assert not teacher.logits.requires_grad  # frozen by the training call


def test_training_refuses_a_teacher_the_config_does_not_name(digits):
    space = _nb201(digits)
    model = space.build_supernet().extract(space.smallest())
    with pytest.raises(UserError, match="no teacher network was passed"):
        train_standalone(model, digits, config=standalone_config(1, teacher="t.pt:x"),
                         progress=False)
    with pytest.raises(UserError, match="names none"):
        train_standalone(model, digits, config=standalone_config(1), progress=False,
                         teacher=_Constant(digits.num_classes, 0))


def _standalone_ckpt(tmp_path, data, trained_on):
    space = _nb201(data)
    arch = space.smallest()
    path = tmp_path / "teacher.pt"
    save_standalone(path, space.build_supernet().extract(arch), space, arch, dataset=data.name,
                    data_record=training_record(trained_on))
    return path, space.to_string(arch)


def test_teacher_trained_on_validation_images_is_refused(tmp_path, digits):
    leaky = replace(digits, train=digits.val)
    path, _ = _standalone_ckpt(tmp_path, digits, leaky)
    with pytest.raises(UserError, match=r"trained on \d+ of the \d+ val images"):
        load_teacher(path, digits, log=lambda m: None)


def test_teacher_of_other_classes_is_refused(tmp_path, digits):
    other = replace(digits, classes=[f"c{i}" for i in range(digits.num_classes)])
    path, _ = _standalone_ckpt(tmp_path, digits, other)
    with pytest.raises(UserError, match="was trained on classes c0"):
        load_teacher(path, digits, log=lambda m: None)


def test_teacher_without_record_warns(digits):
    said = []
    check_teacher_data({}, digits, "old.pt", log=said.append)
    assert len(said) == 1 and said[0].startswith("warning: teacher old.pt does not record")


def test_standalone_teacher_loads_and_reports(tmp_path, digits):
    path, arch = _standalone_ckpt(tmp_path, digits, digits)
    said = []
    net, name = load_teacher(path, digits, log=said.append)
    assert name == f"teacher.pt:{arch}"
    assert not any(p.requires_grad for p in net.parameters()) and not net.training
    assert said and said[-1].startswith(f"teacher {name}: ") and "validation images" in said[-1]
    with pytest.raises(UserError, match="holds the standalone subnet"):
        load_teacher(path, digits, arch="largest", log=lambda m: None)


def test_supernet_teacher_takes_its_subnet(tmp_path, digits):
    space = get_space("mbv3-tiny")
    path = tmp_path / "sn.pt"
    save_checkpoint(path, space.build_supernet(), space, dataset=digits.name,
                    data_record=training_record(digits))
    net, name = load_teacher(path, digits, arch="smallest", log=lambda m: None)
    assert name == f"sn.pt:{space.to_string(space.smallest())}"
    with pytest.raises(UserError, match="--teacher-arch 'nope'"):
        load_teacher(path, digits, arch="nope", log=lambda m: None)


def test_teacher_that_does_not_fit_the_data_is_refused(tmp_path, digits):
    space = get_space("nb201", in_channels=3, image_size=digits.image_size[0],
                      num_classes=digits.num_classes)  # RGB; the digits are grey
    arch = space.smallest()
    path = tmp_path / "rgb.pt"
    save_standalone(path, space.build_supernet().extract(arch), space, arch, dataset=digits.name,
                    data_record=training_record(digits))
    with pytest.raises(UserError, match="does not fit"):
        load_teacher(path, digits, log=lambda m: None)


def test_cli_trains_with_a_teacher_and_resumes(tmp_path, digits_checkpoint, capsys):
    """``hwnas train --teacher``: the run records the teacher; a resumed chunk reloads it."""
    from hwnas.cli import main

    out = tmp_path / "run"
    common = ["train", "--space", "mbv3-tiny", "--epochs", "2", "--out", str(out), "--quiet"]
    assert main([*common, "--teacher", str(digits_checkpoint), "--teacher-mode", "hard",
                 "--standalone", "smallest", "--max-minutes", "0.0001"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["train_config"]["teacher"].startswith("supernet.pt:")
    assert run["train_config"]["teacher_mode"] == "hard"
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 0
    assert (out / "model.pt").is_file()
    capsys.readouterr()
    assert main(["train", "--epochs", "1", "--out", str(tmp_path / "x.pt"),
                 "--teacher-mode", "hard"]) == 2
    assert "--teacher-mode applies with --teacher only" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()


def test_a_recorded_teacher_scope_loads_as_the_largest_and_all_is_refused():
    """Checkpoints of sessions 46-48 record ``teacher_scope``: ``largest`` is what training
    does, so they load; ``all`` was taken out, so its runs are refused with one line."""
    recorded = TrainConfig().to_dict()
    assert TrainConfig.from_dict({**recorded, "teacher_scope": "largest"}) == TrainConfig()
    with pytest.raises(UserError, match="teacher_scope 'all'") as err:
        TrainConfig.from_dict({**recorded, "teacher_scope": "all"})
    assert "\n" not in str(err.value)
