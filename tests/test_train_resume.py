"""Training checkpoints: exact resume, time budgets, refusals, standalone training."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import (
    TrainConfig,
    TrainStage,
    load_checkpoint,
    load_standalone,
    reinitialize,
    sandwich_config,
    save_checkpoint,
    save_standalone,
    standalone_config,
    train_standalone,
    train_supernet,
)
from train_support import fresh, same_weights

from hwnas.core.errors import UserError


def test_resume_is_exact(two_step_digits, tmp_path):
    """2 epochs in one go == 1 epoch, checkpoint, resume, 1 epoch; also across a mid-epoch stop
    and a channel-sorting stage boundary."""
    space = get_space("mbv3-tiny")
    config = TrainConfig(stages=[TrainStage("full", 1, sandwich=False),
                                 TrainStage("shrink", 2, choices={"expand": [4, 6]}, num_random=1,
                                            sort_channels=True)],
                         batch_size=64, warmup_epochs=0.5)
    ref = fresh(space)
    r_ref = train_supernet(ref, space, two_step_digits, config, progress=False)
    assert r_ref.completed and r_ref.step == r_ref.total_steps == 6

    ckpt = tmp_path / "ckpt.pt"
    net = fresh(space)
    r1 = train_supernet(net, space, two_step_digits, config, progress=False,
                        checkpoint_path=ckpt, max_steps=2)  # one epoch, before the sorting stage
    assert not r1.completed and r1.step == 2 and len(r1.history) == 1
    assert not same_weights(net, ref)
    for stop in (3, None):  # mid-epoch (1 of its 2 steps), then to the end
        net = fresh(space)  # a fresh process: everything comes from the checkpoint
        r = train_supernet(net, space, two_step_digits, config, progress=False,
                           checkpoint_path=ckpt, resume_from=ckpt, max_steps=stop)
    assert r.completed and r.step == 6
    assert same_weights(net, ref)
    def losses(history):  # the per-epoch clock differs between the two runs
        return [{k: v for k, v in h.items() if k != "seconds"} for h in history]

    assert losses(r.history) == losses(r_ref.history)
    times = [h["seconds"] for h in r.history]
    assert times == sorted(times) and times[0] > 0  # the clock runs on across resumed calls
    assert r.images == 3 * 64  # this call's images only
    assert r.total_seconds >= r.seconds


def test_max_seconds_stops_with_checkpoint(small_digits, tmp_path):
    space = get_space("mbv3-tiny")
    ckpt = tmp_path / "c.pt"
    net = fresh(space)
    r = train_supernet(net, space, small_digits, sandwich_config(2, batch_size=64), progress=False,
                       checkpoint_path=ckpt, max_seconds=0)
    assert not r.completed and r.step == 1 and r.history == []
    payload = torch.load(ckpt, weights_only=True)
    assert payload["train_state"]["step"] == 1
    assert payload["train_state"]["total_steps"] == 10
    space2, net2, _ = load_checkpoint(ckpt)  # an ordinary supernet checkpoint too
    assert same_weights(net, net2)


def test_resume_rejects_other_space_config_or_data(small_digits, tmp_path, digits):
    space = get_space("mbv3-tiny")
    ckpt = tmp_path / "c.pt"
    config = sandwich_config(1, batch_size=64)
    train_supernet(fresh(space), space, small_digits, config, progress=False,
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
        train_supernet(fresh(space), space, small_digits, sandwich_config(2, batch_size=64),
                       progress=False, resume_from=ckpt)
    with pytest.raises(UserError, match="trained on 320 images"):
        train_supernet(fresh(space), space, digits, config, progress=False, resume_from=ckpt)
    final = save_checkpoint(tmp_path / "final.pt", fresh(space), space, dataset="digits",
                            train_config=config)
    with pytest.raises(UserError, match="no training state"):
        train_supernet(fresh(space), space, small_digits, config, progress=False,
                       resume_from=final)


def test_bad_precision(small_digits):
    space = get_space("mbv3-tiny")
    with pytest.raises(UserError, match="precision"):
        train_supernet(fresh(space), space, small_digits, sandwich_config(1), progress=False,
                       precision="fp8")


def test_progress_without_tqdm(monkeypatch, capsys):
    import builtins

    from hwnas.core.progress import PrintProgress
    from hwnas.supernet import train

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError("no tqdm here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    bar = train.progress_bar(3, "demo", disable=False)
    assert isinstance(bar, PrintProgress)
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
    assert same_weights(m, ref)
    space2, arch2, loaded, payload = load_standalone(ckpt)
    assert arch2 == arch and payload["arch"] == space.to_string(arch)
    assert same_weights(loaded, ref)
    with pytest.raises(UserError, match="standalone subnet checkpoint, not a supernet"):
        load_checkpoint(ckpt)
    other = space.smallest()
    with pytest.raises(UserError, match="holds subnet"):
        train_standalone(fresh_model(), small_digits, config=config, space=space, arch=other,
                         progress=False, resume_from=ckpt)
    with pytest.raises(UserError, match="space and arch"):
        train_standalone(fresh_model(), small_digits, 1, checkpoint_path=ckpt, progress=False)
    save_standalone(tmp_path / "plain.pt", ref, space, arch, dataset="digits")
    assert same_weights(load_standalone(tmp_path / "plain.pt")[2], ref)


def test_reinitialize_is_seeded():
    space = get_space("mbv3-tiny")
    a = reinitialize(space.build_supernet().extract(space.largest()), seed=3)
    b = reinitialize(space.build_supernet().extract(space.largest()), seed=3)
    assert same_weights(a, b)
    assert torch.all(a.blocks[0].expand_bn.weight == 1)


# --------------------------------------------------------------------------------------------
# subnet_loss (sum vs mean of a sandwich step's losses), compiling the fixed subnets
# --------------------------------------------------------------------------------------------


def test_resume_keeps_the_runs_precision(tmp_path):
    """A run started with --precision fp32 resumes in fp32 (run.json records it), unless the
    resuming command asks for another; before, a resumed chunk fell back to bf16 on a GPU."""
    from hwnas.cli import build_parser
    from hwnas.supernet.train_run import _read_settings, settings_from_args

    parser = build_parser()
    out = str(tmp_path / "run")
    first = parser.parse_args(["train", "--space", "nb201", "--dataset", "digits", "--epochs",
                               "1", "--precision", "fp32", "--out", out])
    settings = settings_from_args(first)
    assert settings["precision"] == "fp32"
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({"settings": settings}))
    resumed = parser.parse_args(["train", "--out", out, "--resume"])
    assert _read_settings(resumed, run_file)[0]["precision"] == "fp32"
    asked = parser.parse_args(["train", "--out", out, "--resume", "--precision", "bf16"])
    assert _read_settings(asked, run_file)[0]["precision"] == "bf16"
