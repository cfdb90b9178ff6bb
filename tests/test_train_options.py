"""``hwnas train``'s options: each reaches the TrainConfig or TrainOptions it names, a bad one
is one ``hwnas: error:`` line with exit status 2 and nothing on disk, and AdamW trains a vision
transformer resumably."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import (
    TrainConfig,
    TrainResult,
    TrainStage,
    _make_optimizer,
    default_config,
    load_checkpoint,
)
from hwnas.supernet.train_options import TrainOptions
from hwnas.supernet.train_run import settings_from_args, train_config
from torch import nn

from hwnas.cli import main, parse_args
from hwnas.core.errors import UserError


def _config(*args: str, space: str = "mbv3-tiny") -> TrainConfig:
    return train_config(settings_from_args(parse_args(["train", *args])), get_space(space))


@pytest.mark.parametrize(("args", "check"), [
    (["--epochs", "7"], lambda c: c.epochs == 7),
    (["--batch-size", "32"], lambda c: c.batch_size == 32),
    (["--lr", "0.2"], lambda c: c.lr == 0.2),
    (["--weight-decay", "0.001"], lambda c: c.weight_decay == 0.001),
    (["--label-smoothing", "0"], lambda c: c.label_smoothing == 0.0),
    (["--warmup-epochs", "3"], lambda c: c.warmup_epochs == 3.0),
    (["--grad-clip", "0"], lambda c: c.grad_clip == 0.0),
    (["--num-random", "3"], lambda c: c.stages[0].num_random == 3),
    (["--subnet-loss", "mean"], lambda c: c.subnet_loss == "mean"),
    (["--augment", "none"], lambda c: c.augment == "none"),
    (["--seed", "5"], lambda c: c.seed == 5),
    (["--optimizer", "adamw"], lambda c: c.optimizer == "adamw"),
    (["--schedule", "sandwich"], lambda c: [s.name for s in c.stages] == ["sandwich"]),
    (["--schedule", "deps", "--epochs", "8"],
     lambda c: [(s.name, s.epochs, s.sandwich) for s in c.stages]
     == [("full", 4, False), ("shrink", 4, True)]),
    (["--schedule", "deps", "--epochs", "8", "--full-fraction", "0.25"],
     lambda c: [s.epochs for s in c.stages] == [2, 6]),
    (["--schedule", "progressive", "--epochs", "20"],
     lambda c: c.stages[0].name == "full" and len(c.stages) > 3 and c.epochs == 20),
    (["--standalone", "largest", "--epochs", "3"],
     lambda c: [(s.name, s.epochs, s.sandwich) for s in c.stages] == [("standalone", 3, False)]),
])
def test_each_option_reaches_the_training_config(args, check):
    config = _config(*args)
    assert check(config), config


def test_defaults_are_the_spaces_as_before():
    """No recipe option: the space's training defaults, exactly what ``hwnas train`` trained
    before it took them (a transformer gets DEpS at its lower learning rate)."""
    for name in ("mbv3-tiny", "vit"):
        space = get_space(name)
        assert _config(space=name) == default_config(space, 30, seed=0, augment=None)
    vit = _config("--lr", "0.003", space="vit")
    assert vit.lr == 0.003 and [s.name for s in vit.stages] == ["full", "shrink"]
    assert _config("--schedule", "sandwich", space="vit").stages[0].name == "sandwich"
    alone = _config("--standalone", "largest", space="vit")  # the recipe without the DEpS share
    assert [s.name for s in alone.stages] == ["standalone"] and alone.optimizer == "adamw"


def test_run_options_reach_train_options(tmp_path, monkeypatch, capsys):
    """--device, --precision, --channels-last, --compile (and its scope; auto: model on a CPU) and
    --quiet reach the TrainOptions of the training call (recorded by a stand-in for
    train_supernet)."""
    import hwnas.supernet.train as train_module

    calls = []

    def fake(supernet, space, data, config, options=None, *, teacher=None, **overrides):
        calls.append(TrainOptions.of(options, **overrides))
        return TrainResult(epochs=config.epochs, seconds=1.0, images_per_s=64.0, history=[],
                           step=2, total_steps=2, images=128)

    monkeypatch.setattr(train_module, "train_supernet", fake)
    assert main(["train", "--limit-train", "128", "--bench-steps", "2", "--precision", "bf16",
                 "--channels-last", "on", "--compile", "max-autotune", "--quiet",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "64 images/s" in out and "compiled max-autotune, scope model" in out  # auto on a CPU
    opts = calls[-1]
    assert (str(opts.device), opts.precision, opts.channels_last, opts.compile, opts.progress,
            opts.max_steps) == ("cpu", "bf16", True, "max-autotune", False, 2)
    assert main(["train", "--limit-train", "128", "--bench-steps", "2", "--compile", "off",
                 "--quiet"]) == 0
    assert calls[-1].compile is False and calls[-1].channels_last is None
    assert calls[-1].compile_scope == "model"
    assert main(["train", "--limit-train", "128", "--bench-steps", "2", "--compile",
                 "--compile-scope", "step", "--quiet", "--device", "cpu"]) == 0
    assert (calls[-1].compile, calls[-1].compile_scope) == ("default", "step")


@pytest.mark.parametrize(("args", "message"), [
    (["--lr", "0"], "expected a positive number"),
    (["--lr", "nan"], "expected a positive number"),
    (["--weight-decay", "-1"], "expected a number >= 0"),
    (["--num-random", "-1"], "expected an integer >= 0"),
    (["--epochs", "0"], "positive integer"),
    (["--schedule", "oneshot"], "invalid choice: 'oneshot'"),
    (["--optimizer", "adam"], "invalid choice: 'adam'"),
    (["--subnet-loss", "max"], "invalid choice: 'max'"),
    (["--compile", "fast"], "invalid choice: 'fast'"),
    (["--precision", "fp16"], "invalid choice: 'fp16'"),
    (["--resume", "--overwrite"], "not allowed with argument"),
    (["--full-fraction", "0.3"], "applies to --schedule deps only"),
    (["--schedule", "deps", "--full-fraction", "1.5"], "full_fraction must be in [0, 1)"),
    (["--label-smoothing", "1.5"], "label_smoothing must be in [0, 1)"),
    (["--space", "nope"], "unknown space 'nope'"),
    (["--device", "cuda:7"], "--device cuda:7"),
    (["--augment", "trivial_crop_flip_cutout"], "needs RGB images"),
    (["--resume"], "holds no run (no run.json)"),
    (["--out", "model.txt"], "ending in .pt or a run directory"),
    (["--out", "m.pt", "--resume"], "--resume needs a run directory"),
    (["--out", "m.pt", "--eval"], "--eval needs a run directory"),
    (["--out", "m.pt", "--max-minutes", "3"], "--max-minutes needs a run directory"),
])
def test_bad_values_are_one_line_and_write_nothing(args, message, tmp_path, monkeypatch, capsys):
    if torch.cuda.device_count() > 7 and args[:1] == ["--device"]:
        pytest.skip("this machine has a cuda:7")
    monkeypatch.chdir(tmp_path)
    out = [] if "--out" in args else ["--out", "run"]
    try:
        code = main(["train", *args, *out, "--limit-train", "64", "--quiet"])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hwnas") and "error:" in err and message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_train_options_validate():
    assert TrainOptions.of(progress=False, max_steps=3).max_steps == 3
    for bad, message in (({"max_seconds": -1.0}, "max_seconds"),
                         ({"checkpoint_every_s": 0}, "checkpoint_every_s"),
                         ({"max_steps": 1.5}, "max_steps"), ({"precision": "fp8"}, "precision"),
                         ({"compile": "fastest"}, "compile mode")):
        with pytest.raises(UserError, match=message):
            TrainOptions.of(**bad)
    with pytest.raises(TypeError, match="unknown training option"):
        TrainOptions.of(epochs=3)
    assert {f.name for f in fields(TrainOptions)} >= {"device", "resume_from", "dist", "compile"}


def test_adamw_groups_and_settings():
    """AdamW with betas (0.9, 0.999); norms, biases and position embeddings get no decay."""
    class WithPositions(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = get_space("vit").build_supernet()
            self.pos_embed = nn.Parameter(torch.zeros(1, 4, 8))

    model = WithPositions()
    opt = _make_optimizer(model, TrainConfig(optimizer="adamw", lr=0.01, weight_decay=0.05))
    assert isinstance(opt, torch.optim.AdamW)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert decay["betas"] == (0.9, 0.999)
    skipped = {id(p) for p in no_decay["params"]}
    norms = [p for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()]
    assert norms and all(id(p) in skipped for p in norms)
    assert id(model.pos_embed) in skipped
    assert all(p.ndim > 1 for p in decay["params"])
    sgd = _make_optimizer(model, TrainConfig())
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["nesterov"]
    # older checkpoints record no optimizer: they were SGD
    old = TrainConfig(stages=[TrainStage("s", 1)]).to_dict()
    del old["optimizer"]
    assert TrainConfig.from_dict(old).optimizer == "sgd"
    with pytest.raises(UserError, match="optimizer must be one of"):
        TrainConfig(optimizer="lion").validate()


def test_adamw_trains_the_vit_space_resumably(tmp_path, capsys, one_torch_thread):
    """One tiny epoch of the vit supernet on digits with AdamW, stopped after a step and
    resumed: the run records the optimizer and the checkpoint holds AdamW's state."""
    out = tmp_path / "vit"
    base = ["train", "--space", "vit", "--optimizer", "adamw", "--lr", "0.001",
            "--schedule", "sandwich", "--num-random", "0", "--limit-train", "64",
            "--limit-eval", "32", "--batch-size", "32", "--epochs", "1", "--out", str(out),
            "--quiet"]
    assert main([*base, "--max-minutes", "1e-6"]) == 0
    assert "not finished" in capsys.readouterr().out
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["train_config"]["optimizer"] == "adamw"
    state = ckpt["train_state"]["optimizer"]["state"]
    assert state and all("exp_avg_sq" in s for s in state.values())
    assert ckpt["train_state"]["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 0
    log = json.loads((out / "train_log.json").read_text())
    assert log["completed"] and log["step"] == 2 and log["settings"]["optimizer"] == "adamw"
    space, _, payload = load_checkpoint(out / "supernet.pt")
    assert space.name == "vit" and payload["train_config"]["optimizer"] == "adamw"
    assert all(torch.isfinite(torch.tensor(h["loss_largest"])) for h in log["history"])
