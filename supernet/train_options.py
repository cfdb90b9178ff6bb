"""Training options that are checked before anything heavy is imported (no torch here): the
names the command line offers (schedules, losses, optimizers, augmentations, precisions), the
bound on epochs, and :class:`TrainOptions`, how one training call runs (device, budgets,
checkpoints), as opposed to :class:`hwnas.supernet.recipes.TrainConfig`, what it computes."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from hwnas.core.errors import UserError

__all__ = ["AUGMENT_KINDS", "CHECKPOINT_EVERY_S", "COMPILE_MODES", "COMPILE_SCOPES", "MAX_EPOCHS",
           "OPTIMIZERS", "PRECISIONS", "REGULARISE", "SCHEDULES", "SUBNET_LOSSES",
           "TEACHER_MODES", "TrainOptions", "check_augment"]

#: More epochs than any real run needs: a typo such as 1e30 fails at once instead of growing a
#: per-epoch history without end.
MAX_EPOCHS = 100_000

#: The augmentation kinds :func:`hwnas.supernet.data.augment_batch` knows.
AUGMENT_KINDS: tuple[str, ...] = (
    "shift", "crop_flip", "crop_flip_cutout", "trivial_crop_flip_cutout",
    "autoaugment_crop_flip", "none")
#: Names of the schedule presets of :func:`hwnas.supernet.recipes.schedule_config`.
SCHEDULES: tuple[str, ...] = ("sandwich", "progressive", "deps")
#: Ways a sandwich step combines its subnets' losses (``TrainConfig.subnet_loss``).
SUBNET_LOSSES: tuple[str, ...] = ("sum", "mean", "largest+mean")
#: Optimizers of ``TrainConfig.optimizer``: SGD with Nesterov momentum, or AdamW (transformers).
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")
#: What an external teacher's predictions are as targets (``TrainConfig.teacher_mode``): its
#: class probabilities, or its top class (DeiT's hard distillation).
TEACHER_MODES: tuple[str, ...] = ("soft", "hard")
#: Which subnets of a sandwich step the space's regularisers (dropout, stochastic depth) act on
#: (``TrainConfig.regularise``): every one, or the largest only (BigNAS, Yu et al. 2020).
REGULARISE: tuple[str, ...] = ("all", "largest")
#: Autocast precisions: ``auto`` = bf16 on CUDA, fp32 elsewhere.
PRECISIONS: tuple[str, ...] = ("auto", "bf16", "fp32")
#: Seconds between the checkpoints of a run directory while it trains (``hwnas train``).
CHECKPOINT_EVERY_S = 120.0
#: ``torch.compile`` modes (``off``: none; it changes speed only, so a resumed run may differ).
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "off")
#: The modes that replay CUDA graphs (inductor's cudagraph trees). A parameter's first gradient
#: of a step *is* the backward graph's output (autograd takes it over), which the next replay in
#: the same step overwrites (PyTorch issue 169545): a supernet step, several backward passes,
#: diverged at its first sandwich epoch (``benchmarks/supernet_cifar10.md``, "Session 41"), so
#: it copies its first gradients out of the graphs' memory (``train._SandwichStep``).
CUDA_GRAPH_MODES: frozenset[str] = frozenset({"reduce-overhead", "max-autotune"})
#: What ``compile`` covers (:attr:`TrainOptions.compile_scope`): ``model``, the network alone (a
#: supernet's largest and smallest subnet); ``step``, also a standalone network's loss (one graph
#: with the network, in the compile mode) and the batches' augmentation and normalisation
#: (default mode): on a GPU the eager augmentation was most of a CCT step's kernel launches
#: (``benchmarks/train_step_overhead.md``, "Session 36"); ``subnets``, ``model`` and a supernet
#: step's random subnets, as one masked graph at the largest's shapes (spaces whose supernet has
#: ``forward_masked``: vit, cct). ``hwnas train --compile-scope auto`` (its default) picks
#: ``subnets`` for those on CUDA and ``model`` otherwise (``train_run._compile_scope``).
COMPILE_SCOPES: tuple[str, ...] = ("model", "step", "subnets")


def check_augment(kind: str, channels: int | None = None) -> None:
    """:class:`UserError` unless ``kind`` is an augmentation of :data:`AUGMENT_KINDS` that
    applies to images of ``channels`` channels (TrivialAugment's colour operations need RGB;
    ``None``: the channels are not known yet, only the name is checked)."""
    if kind not in AUGMENT_KINDS:
        raise UserError(f"unknown augmentation {kind!r}; expected one of {', '.join(AUGMENT_KINDS)}")
    if kind.startswith(("trivial_", "autoaugment_")) and channels is not None and channels != 3:
        raise UserError(f"augmentation {kind!r} needs RGB images; this split has {channels} "
                        f"channel(s) (use crop_flip_cutout)")


@dataclass(frozen=True)
class TrainOptions:
    """How a training call runs, the same for supernets and standalone subnets: none of it
    changes what is computed (so a run may be resumed under other options).

    ``device``: torch device; ``precision``: one of :data:`PRECISIONS`; ``channels_last``:
    None = on for CUDA. ``resume_from``: a resumable checkpoint to continue;
    ``checkpoint_path``: where to write one (at the end, when stopped early and every
    ``checkpoint_every_s`` seconds). ``max_seconds``/``max_steps``: stop early, checkpointed.
    ``dist``: the process group (:class:`hwnas.supernet.distributed.DistContext`, torchrun);
    ``dataset``: the name checkpoints record (default the data's); ``compile``: True or a
    ``torch.compile`` mode; ``compile_scope``: what it covers (:data:`COMPILE_SCOPES`).

    Examples:
        >>> from hwnas.supernet import TrainOptions
        >>> options = TrainOptions(device="cpu", progress=False, max_seconds=600,
        ...                        checkpoint_path="run/checkpoint.pt")   # resumable chunks of 10 minutes
        >>> options.device, options.max_seconds
        ('cpu', 600)
    """

    device: Any = "cpu"
    progress: bool = True
    resume_from: str | Path | None = None
    checkpoint_path: str | Path | None = None
    checkpoint_every_s: float | None = None
    max_seconds: float | None = None
    max_steps: int | None = None
    precision: str = "auto"
    channels_last: bool | None = None
    dist: Any = None
    dataset: str | None = None
    compile: bool | str = False
    compile_scope: str = "model"

    @classmethod
    def of(cls, options: TrainOptions | None = None, **overrides: Any) -> TrainOptions:
        """``options`` (default: the defaults) with ``overrides`` (field names), validated."""
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown training option(s) {', '.join(unknown)}")
        out = replace(options or cls(), **overrides)
        out.validate()
        return out

    def validate(self) -> None:
        """One-line :class:`UserError` for a value no training can run with."""
        def number(name: str, value: Any, *, positive: bool) -> None:
            if value is None:
                return
            bad = isinstance(value, bool) or not isinstance(value, (int, float))
            if bad or math.isnan(value) or value < 0 or (positive and value == 0):
                raise UserError(f"{name} must be a number {'> 0' if positive else '>= 0'}, "
                                f"got {value!r}")

        number("max_seconds", self.max_seconds, positive=False)
        number("checkpoint_every_s", self.checkpoint_every_s, positive=True)
        if self.max_steps is not None and (isinstance(self.max_steps, bool)
                                           or not isinstance(self.max_steps, int)
                                           or self.max_steps < 0):
            raise UserError(f"max_steps must be an integer >= 0, got {self.max_steps!r}")
        if self.precision not in PRECISIONS:
            raise UserError(f"unknown precision {self.precision!r}; expected one of "
                            f"{', '.join(PRECISIONS)}")
        if self.channels_last not in (None, True, False):
            raise UserError(f"channels_last must be true, false or None, got {self.channels_last!r}")
        if self.compile_scope not in COMPILE_SCOPES:
            raise UserError(f"unknown compile scope {self.compile_scope!r}; expected one of "
                            f"{', '.join(COMPILE_SCOPES)}")
        if isinstance(self.compile, str) and self.compile not in COMPILE_MODES[:-1]:
            raise UserError(f"unknown compile mode {self.compile!r}; expected one of "
                            f"{', '.join(COMPILE_MODES[:-1])}")
