"""PTQ and QAT on a small CNN trained on the digits (BN, a residual block, a linear head):
int8 keeps accuracy, 2-bit weights lose it, observers differ on heavy tails, LSQ recovers
accuracy, bad calibration data is refused without touching the model."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hwnas.quant.observers import (
    ActivationObserver,
    affine_qparams,
    fake_quant_affine,
    weight_qparams,
)
from hwnas.quant.policy import first_last_8bit, uniform
from hwnas.quant.ptq import PTQConfig, calibrate, policy_of, ptq, quantize_model
from hwnas.quant.qat import QATConfig, qat
from hwnas.supernet.data import BatchLoader, load_dataset
from hwnas.supernet.evaluate import accuracy
from torch import nn

from hwnas.core.errors import UserError


class _Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.block = _Block(16)
        self.down, self.bn2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = F.relu(self.block(x))
        x = F.relu(self.bn2(self.down(x)))
        return self.fc(x.mean((2, 3)))


@pytest.fixture(scope="module")
def setup():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = load_dataset("digits", seed=0)
    train = BatchLoader(data.train, batch_size=64, mean=data.mean, std=data.std, shuffle=True,
                        augment="shift", seed=0)
    model = _Net()
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    for _ in range(6):
        model.train()
        for x, y in train:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    model.eval()
    calib = BatchLoader(data.train, batch_size=128, mean=data.mean, std=data.std, shuffle=True, seed=1)
    # val + test together: 718 images, so one image is 0.14 points
    held_out = [b for split in (data.val, data.test)
                for b in BatchLoader(split, batch_size=512, mean=data.mean, std=data.std)]
    yield {"model": model, "train": train, "calib": calib, "eval": held_out,
           "fp32": accuracy(model, held_out)}
    torch.set_num_threads(threads)


def test_float_model_is_trained(setup):
    assert setup["fp32"] > 85.0


@pytest.mark.parametrize("observer", ["minmax", "percentile", "mse"])
def test_ptq_int8_keeps_accuracy_within_one_point(setup, observer):
    model = setup["model"]
    qmodel = ptq(model, uniform(model, 8, 8), setup["calib"], PTQConfig(act_observer=observer))
    assert accuracy(qmodel, setup["eval"]) >= setup["fp32"] - 1.0
    assert policy_of(qmodel) == uniform(model, 8, 8)


def test_two_bit_weights_are_much_worse_than_eight(setup):
    model = setup["model"]
    w8 = accuracy(ptq(model, uniform(model, 8, 8), setup["calib"]), setup["eval"])
    w2 = accuracy(ptq(model, uniform(model, 2, 8), setup["calib"], PTQConfig(bias_correction=False)),
                  setup["eval"])
    assert w2 < w8 - 10.0


def test_ptq_does_not_change_the_float_model(setup):
    model = setup["model"]
    before = copy.deepcopy(model.state_dict())
    ptq(model, uniform(model, 4, 4), setup["calib"], PTQConfig(act_observer="mse", weight_observer="mse"))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert accuracy(model, setup["eval"]) == setup["fp32"]


def test_bias_correction_removes_the_mean_output_shift(setup):
    model = setup["model"]
    cfg = dict(act_observer="minmax", weight_observer="minmax")
    xs = torch.cat([x for x, _ in setup["calib"]])[:512]
    with torch.no_grad():
        ref = model(xs).mean(0)
        shifts = []
        for bc in (False, True):
            q = ptq(model, uniform(model, 3, 8), [(xs, None)], PTQConfig(bias_correction=bc, **cfg))
            shifts.append(float((q(xs).mean(0) - ref).abs().mean()))
    assert shifts[1] < 0.5 * shifts[0]


@pytest.mark.parametrize("batches, fragment", [
    ([], "calibration data is empty"),
    ([(torch.zeros(0, 1, 8, 8), torch.zeros(0))], "calibration data is empty"),
    ([(torch.randn(4, 3, 8, 8), None)], "shape (4, 3, 8, 8) does not fit the model"),
    ([(torch.randn(4, 64), None)], "shape (4, 64) does not fit the model"),
    ([(torch.randn(4, 1, 8, 8), None), (torch.randn(4, 1, 9, 9), None)], "disagree in shape"),
    ([(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), None)], "must be float tensors"),
    ([("not a tensor", None)], "must be tensors or (inputs, labels) pairs"),
])
def test_bad_calibration_data_raises_and_leaves_the_model_unchanged(setup, batches, fragment):
    model = setup["model"]
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(UserError) as info:
        ptq(model, uniform(model, 8, 8), batches)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_calibrate_failure_leaves_quantizers_enabled(setup):
    qmodel = quantize_model(setup["model"], uniform(setup["model"], 8, 8))
    with pytest.raises(UserError):
        calibrate(qmodel, [(torch.randn(2, 3, 8, 8), None)])
    assert all(q.enabled for n, q in qmodel.named_modules() if type(q).__name__ == "FakeQuantize")


def test_percentile_and_mse_observers_clip_heavy_tails():
    g = torch.Generator().manual_seed(0)
    # Student-t-like heavy tail: mostly N(0, 1) plus rare huge outliers
    x = torch.randn(200_000, generator=g)
    x[torch.randint(0, x.numel(), (20,), generator=g)] = 80.0
    obs = ActivationObserver(samples_per_update=1 << 20, seed=0)
    obs.update(x)
    lo_mm, hi_mm = obs.range("minmax", 8)
    lo_p, hi_p = obs.range("percentile", 8, percentile=99.99)
    lo_m, hi_m = obs.range("mse", 4)
    assert hi_mm == pytest.approx(80.0)
    assert hi_p < 10.0 and hi_m < 20.0
    assert lo_p == pytest.approx(float(x.kthvalue(21).values), rel=0.05)

    def err(lo_, hi_):  # the MSE range really has the lower error on these values
        s, z = affine_qparams(lo_, hi_, 4)
        return float(((fake_quant_affine(x, s, z, 4) - x) ** 2).mean())
    assert err(lo_m, hi_m) < 0.75 * err(lo_mm, hi_mm)
    # weights: per-channel MSE clips a channel with an outlier, min-max does not
    w = torch.randn(2, 1000, generator=g)
    w[0, 0] = 15.0
    mm, mse = weight_qparams(w, 4, "minmax"), weight_qparams(w, 4, "mse")
    assert mse[0] < mm[0] / 2
    assert mse[1] <= mm[1]


def test_lsq_qat_recovers_low_bit_accuracy(setup):
    """2-bit weights lose ~10-20 points after PTQ; a short LSQ + KD fine-tune must win points
    back (PTQ ~76-87 %, QAT after 3 epochs 83-93 % depending on the CPU's kernels, FP32 ~94 %);
    W4A8 must not degrade."""
    model, calib, train, held_out = setup["model"], setup["calib"], setup["train"], setup["eval"]
    ptq_cfg = PTQConfig(act_observer="mse", weight_observer="mse")
    policy = uniform(model, 2, 8)
    q_ptq = ptq(model, policy, calib, ptq_cfg)
    acc_ptq = accuracy(q_ptq, held_out)
    result = qat(model, policy, train, calib, QATConfig(epochs=3, seed=0), init=q_ptq, progress=False)
    acc_qat = accuracy(result.model, held_out)
    assert acc_qat > acc_ptq + 3.0
    assert result.steps == 3 * len(train)
    assert all(not q.scale.requires_grad for n, q in result.model.named_modules()
               if type(q).__name__ == "FakeQuantize")
    w4 = first_last_8bit(uniform(model, 4, 8))
    q4 = ptq(model, w4, calib, ptq_cfg)
    r4 = qat(model, w4, train, calib, QATConfig(epochs=1, seed=0), init=q4, progress=False)
    assert accuracy(r4.model, held_out) >= accuracy(q4, held_out) - 1.0
    assert accuracy(model, held_out) == setup["fp32"]  # teacher untouched


def test_qat_config_errors():
    with pytest.raises(UserError, match="at least one epoch"):
        QATConfig(epochs=0).validate()
    with pytest.raises(UserError, match="unknown QAT optimizer"):
        QATConfig(optimizer="lamb").validate()
    with pytest.raises(UserError, match="unknown activation observer 'max'"):
        PTQConfig(act_observer="max").validate()


def test_qat_refuses_empty_data_and_a_mismatched_init(setup):
    model, calib = setup["model"], setup["calib"]
    q8 = ptq(model, uniform(model, 8, 8), calib)
    with pytest.raises(UserError, match="QAT training data is empty"):
        qat(model, uniform(model, 8, 8), [], calib, init=q8, progress=False)
    with pytest.raises(UserError, match="another policy"):
        qat(model, uniform(model, 4, 8), setup["train"], calib, init=q8, progress=False)


def test_qat_keeps_the_state_that_validates_best(setup):
    """A fine-tune that wrecks the model (absurd learning rates) must hand back its PTQ start
    when validation batches are given, and record the validation accuracy of every state."""
    model, calib, train, held_out = setup["model"], setup["calib"], setup["train"], setup["eval"]
    policy = first_last_8bit(uniform(model, 4, 8))
    q4 = ptq(model, policy, calib, PTQConfig(act_observer="mse", weight_observer="mse"))
    start = accuracy(q4, held_out)
    wild = QATConfig(epochs=2, lr=5.0, scale_lr=5.0, grad_clip=None, seed=0)
    wrecked = qat(model, policy, train, calib, wild, init=q4, progress=False)
    assert accuracy(wrecked.model, held_out) < start - 10.0  # the fine-tune really is harmful
    kept = qat(model, policy, train, calib, wild, init=q4, progress=False, val_batches=held_out)
    vals = [h["val"] for h in kept.history]
    assert [h["epoch"] for h in kept.history] == [0, 1, 2] and vals[0] == start
    assert kept.kept_epoch == vals.index(max(vals)) == 0
    assert accuracy(kept.model, held_out) == start
    assert all(not q.scale.requires_grad for n, q in kept.model.named_modules()
               if type(q).__name__ == "FakeQuantize")
