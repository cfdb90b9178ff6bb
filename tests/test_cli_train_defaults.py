"""``hwnas train --help`` names the defaults of the config dataclasses (TrainConfig, TrainStage,
the deps preset, the checkpoint interval), read from them, so the help cannot drift from what a
training does."""

from __future__ import annotations

import argparse

from hwnas.supernet.recipes import DEPS_FULL_FRACTION, TrainConfig, TrainStage
from hwnas.supernet.train_options import CHECKPOINT_EVERY_S

from hwnas.cli import build_parser


def _train_help() -> dict[str, str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {opt: " ".join((action.help or "").split())
            for action in sub.choices["train"]._actions for opt in action.option_strings}


def test_train_help_names_the_dataclass_defaults():
    c, helps = TrainConfig(), _train_help()
    expected = {"--batch-size": c.batch_size, "--lr": f"{c.lr:g}",
                "--weight-decay": f"{c.weight_decay:g}",
                "--label-smoothing": f"{c.label_smoothing:g}", "--mixup": f"{c.mixup:g}",
                "--cutmix": f"{c.cutmix:g}", "--teacher-weight": f"{c.teacher_weight:g}",
                "--teacher-mode": c.teacher_mode, "--warmup-epochs": f"{c.warmup_epochs:g}",
                "--grad-clip": f"{c.grad_clip:g}", "--subnet-loss": c.subnet_loss,
                "--optimizer": c.optimizer, "--regularise": c.regularise,
                "--num-random": TrainStage("", 0).num_random,
                "--full-fraction": f"{DEPS_FULL_FRACTION:g}",
                "--checkpoint-every-s": f"{CHECKPOINT_EVERY_S:g}"}
    wrong = {flag: helps[flag] for flag, value in expected.items()
             if f"(default {value})" not in helps[flag]}
    assert not wrong
