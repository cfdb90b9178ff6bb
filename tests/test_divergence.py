"""The divergence guard: roll-back over non-finite gradients, in isolation and in training."""

from __future__ import annotations

import math

import pytest
import torch
from hwnas.supernet.divergence import DivergenceGuard
from hwnas.supernet.train import TrainConfig, TrainStage, train_standalone
from torch import nn

from hwnas.core.errors import UserError


def _setup():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, DivergenceGuard(model, opt, torch.device("cpu"), every=2, max_rollbacks=1)


def _step(model, opt, guard, poison: bool = False):
    opt.zero_grad()
    loss = model(torch.ones(2, 4)).pow(2).sum() * (math.nan if poison else 1.0)
    loss.backward()
    guard.observe(nn.utils.clip_grad_norm_(model.parameters(), 5.0))
    opt.step()


def test_finite_stretch_takes_a_snapshot_and_a_nan_one_rolls_back():
    model, opt, guard = _setup()
    guard.snapshot(0)
    _step(model, opt, guard)
    _step(model, opt, guard)
    assert guard.check(2, 0, 0.1)  # finite: snapshot at step 2
    good = {k: v.clone() for k, v in model.state_dict().items()}
    good_avg = opt.state[model.weight]["exp_avg"].clone()
    _step(model, opt, guard)
    _step(model, opt, guard, poison=True)
    assert not torch.isfinite(model.weight).all()
    assert not guard.check(4, 0, 0.1)
    assert all(torch.equal(good[k], v) for k, v in model.state_dict().items())
    assert torch.equal(opt.state[model.weight]["exp_avg"], good_avg)
    assert int(opt.state[model.weight]["step"]) == 2
    assert guard.rollbacks == [{"step": 4, "epoch": 0, "back_to": 2, "lr": 0.1}]
    _step(model, opt, guard)  # training goes on from the finite state
    assert guard.check(5, 0, 0.1) and torch.isfinite(model.weight).all()


def test_optimizer_state_begun_after_the_snapshot_starts_again():
    model, opt, guard = _setup()
    guard.snapshot(0)  # before the first step: AdamW has no state yet
    _step(model, opt, guard, poison=True)
    assert not guard.check(1, 0, 0.1)
    assert len(opt.state[model.weight]) == 0
    _step(model, opt, guard)
    assert torch.isfinite(model.weight).all() and int(opt.state[model.weight]["step"]) == 1


def test_too_many_rollbacks_stop_with_one_clear_error():
    model, opt, guard = _setup()
    guard.snapshot(0)
    _step(model, opt, guard, poison=True)
    assert not guard.check(1, 0, 0.1)
    _step(model, opt, guard, poison=True)
    with pytest.raises(UserError, match=r"diverged.*2 times.*lower --lr"):
        guard.check(2, 3, 0.1)
    assert torch.isfinite(model.weight).all()  # the last finite weights stay


def test_check_needs_a_snapshot_and_sane_settings():
    model, opt, guard = _setup()
    guard.observe(torch.tensor(math.inf))
    with pytest.raises(RuntimeError, match="snapshot"):
        guard.check(1, 0, 0.1)
    with pytest.raises(ValueError):
        DivergenceGuard(model, opt, torch.device("cpu"), every=0)


class _PoisonOnce(nn.Module):
    """A small digits classifier whose output is NaN on its ``at``-th training call."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.calls, self.at = 0, at

    def forward(self, x):
        out = self.net(x)
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                out = out * math.nan
        return out


def test_training_rolls_back_a_nan_step_and_finishes_finite(digits, capsys):
    torch.manual_seed(0)
    model = _PoisonOnce(at=7)
    config = TrainConfig(stages=[TrainStage("full", 2, sandwich=False)], lr=0.05)
    result = train_standalone(model, digits, config=config, progress=False)
    assert result.completed and len(result.rollbacks) == 1
    assert result.rollbacks[0]["step"] > 6 >= result.rollbacks[0]["back_to"]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(math.isfinite(h["loss"]) for h in result.history), result.history
    assert "non-finite gradients" in capsys.readouterr().err
    # without the poison the same run has no roll-back
    torch.manual_seed(0)
    clean = train_standalone(_PoisonOnce(at=-1), digits, config=config, progress=False)
    assert clean.rollbacks == []
