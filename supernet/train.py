"""Supernet training (sandwich rule, in-place distillation, progressive and delayed shrinking)
and standalone training of static subnets, with exact resume, time budgets and data parallelism.

Each sandwich step trains the largest subnet on the labels, then the smallest and
``num_random`` random subnets on the largest one's soft predictions (in-place knowledge
distillation, as in BigNAS / Once-for-All), accumulating the gradients of all of them into one
optimizer step: summed (``subnet_loss="sum"``, BigNAS), averaged (``"mean"``: the step then
has one network's scale, so a standalone learning rate carries over), or the largest subnet's
loss plus the mean of the others' (``"largest+mean"``: the largest subnet keeps a standalone
network's full gradient while the smaller ones share one more). The schedule is data:
a list of :class:`TrainStage`. A stage may restrict the sampled choices (``choices``) and
re-sort channels by importance when it starts (``sort_channels``), so the three named presets
are stage lists, not code paths (:func:`schedule_config`):

* ``sandwich`` -- one sandwich stage over the whole space (BigNAS-style).
* ``deps`` -- delayed shrinking (DEpS, Annavajjala et al., ECCV 2024): the first half of the
  epochs trains only the full network (``sandwich=False``; DEpS starts shrinking once the full
  model is ~50% trained), then sandwich training of the whole space. (DEpS's incremental
  per-subnet learning-rate heuristic is not implemented.)
* ``progressive`` -- Once-for-All's progressive shrinking: the full network, then elastic
  kernel, then depth (two steps), then expand ratio (two steps, channels sorted by importance
  before each), every step distilled in place from the largest subnet.

One learning-rate schedule (linear warm-up, cosine decay) spans all stages.

Speed on a GPU (``device="cuda"``): bf16 autocast, channels-last tensors, the uint8 training
split kept on the GPU and augmented there (:class:`hwnas.supernet.data.BatchLoader`), no per-step
host synchronisation (losses are summed on the device and read once per epoch), fused AdamW.
``torch.compile``: a static subnet (:func:`train_standalone`) has fixed shapes and compiles
once. Every subnet of a supernet has other channel counts and kernel sizes, so compiling it for
every sampled subnet would recompile nearly every step; :func:`train_supernet` therefore runs
only each stage's largest and smallest subnet (the same every step: two graphs per stage, a
large share of a sandwich step's work, and all of a full-network stage's) through the compiled
module and the random subnets eagerly.

Checkpoints (:func:`save_checkpoint`) hold the space and its configuration; with
``checkpoint_path`` training also stores its full state (optimizer, step, RNG states, partial
epoch sums, history), and ``resume_from`` continues bit-exactly where it stopped (on the CPU;
on a GPU up to the nondeterminism of its kernels). ``max_seconds`` / ``max_steps`` stop a call
early with a checkpoint, so a long training fits any per-command time limit. A stretch of steps
whose gradients go non-finite is rolled back and skipped, and a run that keeps diverging stops
with one error line (:class:`hwnas.supernet.divergence.DivergenceGuard`); a checkpoint is only
written after a finite stretch.

Several processes (``torchrun``): pass a :class:`hwnas.supernet.distributed.DistContext`; see
:mod:`hwnas.supernet.distributed`.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from hwnas.supernet.data import AUGMENT_KINDS, BatchLoader, DatasetSplits
from hwnas.supernet.data.mix import mix_batch
from hwnas.supernet.distributed import (
    DistContext,
    agree,
    all_reduce_gradients,
    broadcast_state,
    shard,
)
from hwnas.supernet.divergence import DivergenceGuard
from hwnas.supernet.fingerprint import training_record
from hwnas.supernet.space import SearchSpace
from hwnas.supernet.train_options import (
    MAX_EPOCHS,
    OPTIMIZERS,
    SCHEDULES,
    SUBNET_LOSSES,
    TEACHER_MODES,
    TrainOptions,
)
from torch import nn

from hwnas.core.errors import UserError
from hwnas.core.io import first_line, write_atomic

__all__ = [
    "OPTIMIZERS",
    "SCHEDULES",
    "SUBNET_LOSSES",
    "TrainConfig",
    "TrainOptions",
    "TrainResult",
    "TrainStage",
    "default_config",
    "label_loss",
    "load_checkpoint",
    "load_network",
    "load_standalone",
    "save_checkpoint",
    "save_standalone",
    "schedule_config",
    "space_recipe",
    "standalone_config",
    "train_standalone",
    "train_supernet",
]

#: Format tags of the two checkpoint kinds.
SUPERNET_FORMAT = "hwnas-supernet-1"
STANDALONE_FORMAT = "hwnas-standalone-1"


# -- schedules as data -------------------------------------------------------------------------

@dataclass
class TrainStage:
    """One phase of the schedule.

    ``sandwich``: also train the smallest subnet and ``num_random`` random ones each step
    (otherwise only the largest, e.g. a warm-up of the full network before shrinking starts).
    ``choices``: restrict the subnets of this stage to these values per elastic dimension
    (e.g. ``{"kernel": [3, 5, 7], "depth": [4], "expand": [6]}``; unnamed dimensions keep all
    values); needs a space with ``restrict()``. ``sort_channels``: before the stage's first
    step, sort the supernet's channels by importance (Once-for-All's re-organization; needs a
    supernet with ``sort_channels()``).

    Examples:
        >>> from hwnas.supernet import TrainStage
        >>> stage = TrainStage("shrink", epochs=5, num_random=2)   # largest, smallest and 2 random subnets
        >>> stage.sandwich, stage.distill
        (True, True)
    """

    name: str
    epochs: int
    sandwich: bool = True
    num_random: int = 2
    distill: bool = True
    choices: dict[str, list[int]] | None = None
    sort_channels: bool = False


@dataclass
class TrainConfig:
    """How a supernet trains: its stages (a schedule), batch size, learning rate,
    regularisation, augmentation and teacher.

    Examples:
        >>> from hwnas.supernet import TrainConfig, TrainStage
        >>> config = TrainConfig(stages=[TrainStage("full", epochs=2, sandwich=False),
        ...                              TrainStage("sandwich", epochs=8)], lr=0.1)
        >>> config.total_epochs if hasattr(config, "total_epochs") else sum(s.epochs for s in config.stages)
        10
    """
    stages: list[TrainStage] = field(default_factory=lambda: [TrainStage("sandwich", 20)])
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    warmup_epochs: float = 1.0
    grad_clip: float = 5.0
    seed: int = 0
    #: How a sandwich step combines the losses of its subnets: ``"sum"`` (BigNAS; the
    #: gradient is the sum over the 2 + num_random subnets, so the effective step grows with
    #: their number) or ``"mean"`` (each loss weighted 1 / number of subnets of the step, so a
    #: sandwich step is as large as one network's and the standalone learning rate applies)
    #: or ``"largest+mean"`` (the largest subnet's loss with weight 1, the others' mean with
    #: weight 1: with ``"mean"`` the weights only the largest subnet uses learn at a quarter of
    #: the standalone rate, which left the largest subnet 5 points behind its standalone twin).
    #: Steps that train only the largest subnet are the same under all three.
    subnet_loss: str = "sum"
    #: Training augmentation (one of :data:`hwnas.supernet.data.AUGMENT_KINDS`); ``None``: the
    #: dataset's own (``DatasetSplits.augment``). Checkpoints record it, so that BatchNorm
    #: recalibration of the trained weights later sees batches augmented the same way
    #: (:func:`with_training_augment`).
    augment: str | None = None
    #: ``"sgd"`` (Nesterov, ``momentum``) or ``"adamw"`` (betas 0.9, 0.999, for vision
    #: transformers); either decays only weights, not norms, biases or position embeddings.
    optimizer: str = "sgd"
    #: Beta alphas of MixUp and CutMix (:func:`hwnas.supernet.data.mix.mix_batch`; 0 = off):
    #: each training batch mixed in pairs, the targets then class probabilities.
    mixup: float = 0.0
    cutmix: float = 0.0
    #: An external teacher (DeiT-style distillation, :mod:`hwnas.supernet.teacher`): the
    #: checkpoint file and subnet it is, recorded here (the network itself is passed to the
    #: training call). The network trained on the labels (a supernet's largest subnet, a
    #: standalone network) then learns ``1 - teacher_weight`` of the labels' loss plus
    #: ``teacher_weight`` of the teacher's: its probabilities (``"soft"``) or its top class
    #: (``"hard"``) as targets; the other subnets still learn from the largest one. None: none.
    teacher: str | None = None
    teacher_weight: float = 0.5
    teacher_mode: str = "soft"

    @property
    def epochs(self) -> int:
        return sum(s.epochs for s in self.stages)

    def validate(self) -> None:
        if not self.stages or any(s.epochs < 0 for s in self.stages) or self.epochs <= 0:
            raise UserError(f"training needs a positive number of epochs, got {self.epochs}")
        if self.epochs > MAX_EPOCHS:
            raise UserError(f"training asks for {self.epochs} epochs; at most {MAX_EPOCHS}")
        if self.batch_size <= 0:
            raise UserError(f"batch size must be positive, got {self.batch_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UserError(f"learning rate must be positive, got {self.lr}")
        for name, low, high in (("weight_decay", 0.0, math.inf), ("warmup_epochs", 0.0, math.inf),
                                ("grad_clip", 0.0, math.inf), ("label_smoothing", 0.0, 1.0),
                                ("momentum", 0.0, 1.0), ("mixup", 0.0, math.inf),
                                ("cutmix", 0.0, math.inf)):
            value = getattr(self, name)
            if not (low <= value < high):
                raise UserError(f"{name} must be in [{low:g}, {high:g}), got {value}")
        if any(s.num_random < 0 for s in self.stages):
            raise UserError("num_random of every stage must be >= 0")
        if self.subnet_loss not in SUBNET_LOSSES:
            raise UserError(f"subnet_loss must be one of {list(SUBNET_LOSSES)}, got "
                            f"{self.subnet_loss!r}")
        if self.augment is not None and self.augment not in AUGMENT_KINDS:
            raise UserError(f"augment must be one of {list(AUGMENT_KINDS)}, got {self.augment!r}")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if not (0.0 < self.teacher_weight <= 1.0):
            raise UserError(f"teacher_weight must be in (0, 1], got {self.teacher_weight}")
        if self.teacher_mode not in TEACHER_MODES:
            raise UserError(f"teacher_mode must be one of {list(TEACHER_MODES)}, got "
                            f"{self.teacher_mode!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """The configuration a checkpoint records; UserError if it is not one (an unknown
        key, a value of the wrong kind)."""
        try:
            d = dict(d)
            d["stages"] = [TrainStage(**s) for s in d.get("stages", [])]
            config = cls(**d)
            config.validate()
        except (TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"not a training configuration: {first_line(exc)}") from None
        return config


def check_torch_device(name: str) -> torch.device:
    """The torch device ``name`` names, if this machine has it; UserError otherwise (a typo,
    or CUDA/MPS asked for where there is none)."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise UserError(f"--device {name!r} is not a torch device; expected cpu, cuda, cuda:N "
                        f"or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: CUDA is not available on this machine; use "
                            f"--device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} "
                            f"CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {name}: MPS is not available on this machine; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {name}: expected cpu, cuda, cuda:N or mps")
    return device


def sandwich_config(epochs: int, *, num_random: int = 2, **kwargs: Any) -> TrainConfig:
    """The default schedule: one sandwich stage of ``epochs`` epochs.

    Examples:
        >>> from hwnas.supernet import sandwich_config
        >>> config = sandwich_config(epochs=30, lr=0.1)
        >>> [(s.name, s.epochs) for s in config.stages], config.lr
        ([('sandwich', 30)], 0.1)
    """
    return TrainConfig(stages=[TrainStage("sandwich", epochs, num_random=num_random)], **kwargs)


def deps_config(epochs: int, *, full_fraction: float = 0.5, num_random: int = 2,
                **kwargs: Any) -> TrainConfig:
    """Delayed shrinking (DEpS): train only the full network for the first ``full_fraction``
    of the epochs, then sandwich-train the whole space (the small subnets then start from a
    partly trained full network instead of a random one)."""
    if not 0.0 <= full_fraction < 1.0:
        raise UserError(f"full_fraction must be in [0, 1), got {full_fraction}")
    full = int(round(full_fraction * epochs))
    return TrainConfig(stages=[TrainStage("full", full, sandwich=False),
                               TrainStage("shrink", epochs - full, num_random=num_random)],
                       **kwargs)


def progressive_config(space: SearchSpace, epochs: int, *, num_random: int = 2,
                       weights: dict[str, float] | None = None, **kwargs: Any) -> TrainConfig:
    """Once-for-All's progressive shrinking as stages.

    The full network first (largest only); then each elastic dimension of the space in its
    order (``space.elastic_choices()``; for MobileNetV3 kernel, depth, expand) is opened up:
    the first dimension at once, the others in two steps (the two largest values, then all),
    every earlier dimension staying open. Stages that open the expand ratio sort channels by
    importance first. ``epochs`` is split over the stages in proportion to ``weights`` (by
    stage kind: ``full``, ``first`` -- the first dimension's stage -- ``partial`` and ``all``;
    default 2, 2, 1, 2, roughly OFA's ratios of epochs), by largest remainder, so stages may
    get 0 epochs when ``epochs`` is small (they are then skipped).
    """
    if not hasattr(space, "elastic_choices"):
        raise UserError(f"space {space.name} declares no elastic dimensions; progressive "
                        f"shrinking needs them (use the 'sandwich' or 'deps' schedule)")
    w = {"full": 2.0, "first": 2.0, "partial": 1.0, "all": 2.0, **(weights or {})}
    dims = {d: list(v) for d, v in space.elastic_choices().items()}
    current = {d: [v[-1]] for d, v in dims.items()}
    plan: list[tuple[str, dict, bool, bool, float]] = [("full", dict(current), False, False, w["full"])]
    first = True
    for dim, values in dims.items():
        if len(values) < 2:
            continue
        steps = [values] if first or len(values) == 2 else [values[-2:], values]
        for i, vals in enumerate(steps):
            current = {**current, dim: list(vals)}
            kind = "first" if first else ("all" if i == len(steps) - 1 else "partial")
            name = dim if len(steps) == 1 else f"{dim}-{i + 1}"
            plan.append((name, dict(current), True, dim == "expand", w[kind]))
        first = False
    counts = _split_epochs(epochs, [p[4] for p in plan])
    stages = [TrainStage(name, n, sandwich=sandwich, num_random=num_random,
                         choices={k: list(v) for k, v in choices.items()}, sort_channels=sort)
              for (name, choices, sandwich, sort, _), n in zip(plan, counts)]
    return TrainConfig(stages=stages, **kwargs)


def _split_epochs(epochs: int, weights: list[float]) -> list[int]:
    """``epochs`` split in proportion to ``weights`` (largest remainder; sums to ``epochs``)."""
    total = sum(weights)
    quotas = [epochs * wt / total for wt in weights]
    counts = [int(math.floor(q)) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: -(quotas[i] - counts[i]))
    for i in order[: epochs - sum(counts)]:
        counts[i] += 1
    return counts


def space_recipe(space: SearchSpace, schedule: str | None = None) -> tuple[str, dict[str, Any]]:
    """The schedule preset (``schedule`` if given, else the space's, else ``sandwich``) and
    the TrainConfig settings the space asks for (:meth:`SearchSpace.training_defaults`);
    its ``full_fraction`` only where the preset is ``deps``, the one that takes it."""
    settings = dict(space.training_defaults())
    own = settings.pop("schedule", "sandwich")
    schedule = schedule or own
    if schedule != "deps":
        settings.pop("full_fraction", None)
    return schedule, settings


def default_config(space: SearchSpace, epochs: int, *, schedule: str | None = None,
                   **kwargs: Any) -> TrainConfig:
    """The training a space asks for (:func:`space_recipe`), with ``kwargs`` that are not
    None overriding its settings; what ``hwnas train`` and a search that trains its own
    supernet use."""
    schedule, settings = space_recipe(space, schedule)
    given = {k: v for k, v in kwargs.items() if v is not None}
    return schedule_config(schedule, space, epochs, **{**settings, **given})


def schedule_config(name: str, space: SearchSpace, epochs: int, **kwargs: Any) -> TrainConfig:
    """The named preset schedule (one of :data:`SCHEDULES`) for ``epochs`` epochs."""
    if name == "sandwich":
        return sandwich_config(epochs, **kwargs)
    if name == "deps":
        return deps_config(epochs, **kwargs)
    if name == "progressive":
        return progressive_config(space, epochs, **kwargs)
    raise UserError(f"unknown schedule {name!r}; expected one of {list(SCHEDULES)}")


# -- results ---------------------------------------------------------------------------------------

def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    return -(target_probs * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


def label_loss(logits: torch.Tensor, y: torch.Tensor, config: TrainConfig,
               teacher_logits: torch.Tensor | None = None) -> torch.Tensor:
    """The loss of the network that learns from the labels (a supernet's largest subnet, a
    standalone network): cross-entropy with label smoothing, mixed with an external teacher's
    targets as :attr:`TrainConfig.teacher_mode` / ``teacher_weight`` say when one is given."""
    loss = F.cross_entropy(logits, y, label_smoothing=config.label_smoothing)
    if teacher_logits is None:
        return loss
    if config.teacher_mode == "hard":
        taught = F.cross_entropy(logits, teacher_logits.argmax(1),
                                 label_smoothing=config.label_smoothing)
    else:
        taught = soft_cross_entropy(logits, F.softmax(teacher_logits, dim=1))
    return (1.0 - config.teacher_weight) * loss + config.teacher_weight * taught


@dataclass
class TrainResult:
    """What a training call did. ``seconds``/``images_per_s``/``images`` are this call's;
    ``total_seconds`` adds the calls it resumed from. ``history``: one record per finished
    epoch, of all calls (its losses and ``seconds``, the training time at its end).
    ``completed``: False when a time or step budget stopped it early."""

    epochs: int
    seconds: float
    images_per_s: float
    history: list[dict[str, Any]]
    completed: bool = True
    step: int = 0
    total_steps: int = 0
    total_seconds: float = 0.0
    images: int = 0
    #: stretches of steps rolled back for non-finite gradients (:class:`DivergenceGuard`)
    rollbacks: list[dict[str, Any]] = field(default_factory=list)


# -- progress without a hard tqdm dependency -----------------------------------------------------

class _PrintProgress:
    """A minimal stand-in for tqdm (used where tqdm is not installed): a line every 30 s."""

    def __init__(self, total: int, desc: str, disable: bool, initial: int = 0) -> None:
        self.total, self.desc, self.disable, self.n = total, desc, disable, initial
        self.postfix: dict[str, Any] = {}
        self._last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if not self.disable and (now - self._last >= 30.0 or self.n == self.total):
            self._last = now
            extra = " ".join(f"{k}={v}" for k, v in self.postfix.items())
            print(f"{self.desc}: {self.n}/{self.total} steps ({100.0 * self.n / max(1, self.total):.0f}%) "
                  f"{extra}", file=sys.stderr, flush=True)

    def set_postfix(self, **kwargs: Any) -> None:
        self.postfix = kwargs

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, disable: bool, initial: int = 0):
    """tqdm when installed, else a plain periodic line on stderr."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _PrintProgress(total, desc, disable, initial)
    return tqdm(total=total, initial=initial, desc=desc, unit="step", disable=disable, leave=False)


# -- the training loop shared by supernets and standalone subnets --------------------------------

def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 for ``bf16``, and for ``auto`` on CUDA; None (fp32) otherwise."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _channels_last(opts: TrainOptions, device: torch.device) -> bool:
    return device.type == "cuda" if opts.channels_last is None else bool(opts.channels_last)


def _prepare_teacher(teacher: nn.Module | None, config: TrainConfig,
                     opts: TrainOptions) -> nn.Module | None:
    """The external teacher, frozen on the training device (compiled with ``opts.compile``: it
    has one set of shapes); :class:`UserError` when the configuration and the call disagree on
    whether there is one."""
    if (teacher is None) != (config.teacher is None):
        raise UserError(f"the training configuration names teacher {config.teacher!r} but no "
                        f"teacher network was passed" if teacher is None else
                        "a teacher network was passed but the training configuration names "
                        "none (set TrainConfig.teacher)")
    if teacher is None:
        return None
    device = torch.device(opts.device)
    teacher = teacher.to(device).eval().requires_grad_(False)
    if _channels_last(opts, device):
        teacher.to(memory_format=torch.channels_last)
    if opts.compile:
        return torch.compile(teacher, mode=None if opts.compile is True else str(opts.compile))
    return teacher


def _teacher_logits(teacher: nn.Module | None, x: torch.Tensor,
                    amp: Callable) -> torch.Tensor | None:
    if teacher is None:
        return None
    with torch.no_grad(), amp():
        return teacher(x).float()


#: Parameter names that are never decayed besides 1-d ones (norms, biases): NB201's edge
#: transforms and position embeddings.
_NO_DECAY_NAMES = ("transforms", "pos_embed", "position")


def _make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        skip = p.ndim <= 1 or any(k in name for k in _NO_DECAY_NAMES)
        (no_decay if skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "adamw":
        # one fused kernel per step on a GPU instead of a launch per parameter group and op
        fused = all(p.is_cuda for p in model.parameters()) or None
        return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999), fused=fused)
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, nesterov=True)


def _rng_state(rng: np.random.Generator | None, device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if rng is not None:
        state["numpy"] = rng.bit_generator.state
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], rng: np.random.Generator | None,
                   device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if rng is not None and "numpy" in state:
        rng.bit_generator.state = state["numpy"]
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


@dataclass
class _Job:
    """Everything the loop needs that differs between supernet and standalone training."""

    kind: str                       # SUPERNET_FORMAT or STANDALONE_FORMAT
    model: nn.Module                # what is saved (uncompiled)
    space: SearchSpace
    arch: str | None                # the subnet's string for standalone jobs
    loss_names: tuple[str, ...]
    #: (x, y, stage index, autocast context factory) -> detached losses; runs the backward passes
    step_fn: Callable[[torch.Tensor, torch.Tensor, int, Callable], torch.Tensor]
    rng: np.random.Generator | None
    on_stage_start: Callable[[int, torch.optim.Optimizer], None] | None = None
    desc: str = "train"


def _train(job: _Job, data: DatasetSplits, config: TrainConfig, opts: TrainOptions) -> TrainResult:
    ctx = opts.dist or DistContext()
    device = torch.device(opts.device)
    amp_dtype = _autocast_dtype(opts.precision, device)
    use_cl = _channels_last(opts, device)
    mixing = config.mixup > 0 or config.cutmix > 0
    resume_from, checkpoint_path = opts.resume_from, opts.checkpoint_path
    max_seconds, max_steps = opts.max_seconds, opts.max_steps
    if config.batch_size % ctx.world_size:
        raise UserError(f"batch size {config.batch_size} is not divisible by the {ctx.world_size} "
                        f"processes; use a multiple of {ctx.world_size}")
    model = job.model
    if resume_from is None:
        torch.manual_seed(config.seed)
    model.to(device).train()
    if use_cl:
        model.to(memory_format=torch.channels_last)
    loader = BatchLoader(data.train, batch_size=config.batch_size, mean=data.mean, std=data.std,
                         shuffle=True, augment=config.augment or data.augment, seed=config.seed,
                         device=device, drop_last=len(data.train) > config.batch_size)
    steps_per_epoch = len(loader)
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = int(config.warmup_epochs * steps_per_epoch)
    optimizer = _make_optimizer(model, config)

    def amp():
        if amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=amp_dtype)

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return config.lr * (step + 1) / warmup_steps
        t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * config.lr * (1 + math.cos(math.pi * t))

    step, history, prior_seconds, partial = 0, [], 0.0, None
    if resume_from is not None:
        payload = _load_for_resume(resume_from, job, config, steps_per_epoch, len(data.train))
        ts = payload["train_state"]
        optimizer.load_state_dict(ts["optimizer"])
        _set_rng_state(ts["rng"], job.rng, device)
        step, history = int(ts["step"]), list(ts["history"])
        prior_seconds, partial = float(ts["seconds"]), ts["partial_sums"]
    broadcast_state(model, ctx)  # identical start on every rank

    # global epoch -> stage index; the first epoch of each stage
    epoch_stage = [i for i, s in enumerate(config.stages) for _ in range(s.epochs)]
    stage_first_epoch = {}
    for e, i in enumerate(epoch_stage):
        stage_first_epoch.setdefault(i, e)
    n_losses = len(job.loss_names)
    bar = progress_bar(total_steps, job.desc, disable=not (opts.progress and ctx.is_main),
                       initial=step)
    start = last_save = time.perf_counter()
    images = 0
    stop = max_steps is not None and step >= max_steps
    sums = torch.zeros(n_losses, dtype=torch.float64, device=device)
    counted = 0  # steps whose losses are in sums (fewer than the epoch's after a roll-back)
    guard = DivergenceGuard(model, optimizer, device)
    guard.snapshot(step)

    def finite_since_check(epoch: int, lr: float) -> bool:
        """The guard's check; after a roll-back the epoch's loss sums go back with the weights."""
        nonlocal sums, counted
        if guard.check(step, epoch, lr, extra=(sums.clone(), counted)):
            return True
        back = guard.snapshot_step
        if back // steps_per_epoch == epoch and back % steps_per_epoch and guard.extra is not None:
            sums, counted = guard.extra[0].clone(), guard.extra[1]
        else:
            sums, counted = torch.zeros_like(sums), 0
        r = guard.rollbacks[-1]
        print(f"warning: non-finite gradients between steps {r['back_to']} and {r['step']} "
              f"(epoch {epoch + 1}, learning rate {lr:.3g}); rolled back to step {r['back_to']} "
              f"and went on ({len(guard.rollbacks)} of at most {guard.max_rollbacks})",
              file=sys.stderr, flush=True)
        return False

    record = training_record(data) if checkpoint_path is not None and ctx.is_main else None

    def save() -> None:
        nonlocal last_save
        if checkpoint_path is not None and ctx.is_main:
            elapsed = time.perf_counter() - start
            train_state = {
                "step": step, "total_steps": total_steps, "steps_per_epoch": steps_per_epoch,
                "train_size": len(data.train), "world_size": ctx.world_size,
                "optimizer": optimizer.state_dict(), "rng": _rng_state(job.rng, device),
                "history": history, "seconds": prior_seconds + elapsed,
                "partial_sums": [float(v) for v in sums.tolist()],
            }
            _save(checkpoint_path, job, opts.dataset or data.name, config, train_state, record)
        last_save = time.perf_counter()

    while step < total_steps and not stop:
        epoch, skip = divmod(step, steps_per_epoch)
        stage_i = epoch_stage[epoch]
        stage = config.stages[stage_i]
        if skip == 0 and stage_first_epoch[stage_i] == epoch and job.on_stage_start is not None:
            job.on_stage_start(stage_i, optimizer)
        if skip and partial is not None:
            sums, counted = torch.tensor(partial, dtype=torch.float64, device=device), skip
        else:
            sums, counted = torch.zeros(n_losses, dtype=torch.float64, device=device), 0
        guard.extra = (sums.clone(), counted)
        partial = None
        loader.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(skip):  # replay the epoch's random stream up to where it stopped
            next(batches)
        for x, y in batches:
            x, y = shard(x, ctx), shard(y, ctx)
            if mixing:
                x, y = mix_batch(x, y, data.num_classes, mixup=config.mixup,
                                 cutmix=config.cutmix, seed=config.seed, step=step)
            if use_cl:
                x = x.contiguous(memory_format=torch.channels_last)
            lr = lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            losses = job.step_fn(x, y, stage_i, amp)
            sums += losses.to(torch.float64)
            counted += 1
            all_reduce_gradients(model.parameters(), ctx)
            if config.grad_clip:
                guard.observe(nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
            else:
                guard.observe(nn.utils.get_total_norm(
                    [p.grad for p in model.parameters() if p.grad is not None]))
            optimizer.step()
            step += 1
            images += x.size(0) * ctx.world_size
            bar.update(1)
            if guard.due(step) or step % steps_per_epoch == 0:
                finite_since_check(epoch, lr)
            if step % steps_per_epoch == 0:
                means = (sums / max(1, counted)).tolist()
                # .tolist() above waited for the GPU, so the clock is the epoch's true end
                history.append({"stage": stage.name, "epoch": epoch + 1,
                                **dict(zip(job.loss_names, means)),
                                "seconds": round(prior_seconds + time.perf_counter() - start, 3)})
                bar.set_postfix(stage=stage.name, loss=f"{means[0]:.3f}")
            want = max_steps is not None and step >= max_steps
            if max_seconds is not None and (not ctx.enabled or step % 10 == 0):
                want = want or agree(time.perf_counter() - start >= max_seconds, ctx, device)
            if want and step < total_steps:
                stop = True
                break
            every = opts.checkpoint_every_s
            if every is not None and time.perf_counter() - last_save >= every:
                finite_since_check(epoch, lr)
                save()
    if step % guard.every and step % steps_per_epoch:  # the last stretch, before it is saved
        finite_since_check(step // steps_per_epoch, lr_at(max(0, step - 1)))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    bar.close()
    broadcast_state(model, ctx)  # BatchNorm statistics of rank 0 everywhere
    save()
    return TrainResult(
        epochs=config.epochs, seconds=seconds, images_per_s=images / max(seconds, 1e-9),
        history=history, completed=step >= total_steps, step=step, total_steps=total_steps,
        total_seconds=prior_seconds + seconds, images=images, rollbacks=list(guard.rollbacks),
    )


# -- supernets ---------------------------------------------------------------------------------------

def train_supernet(
    supernet: nn.Module,
    space: SearchSpace,
    data: DatasetSplits,
    config: TrainConfig,
    options: TrainOptions | None = None,
    *,
    teacher: nn.Module | None = None,
    **overrides: Any,
) -> TrainResult:
    """Train ``supernet`` in place following ``config``; returns timing and per-epoch losses.

    ``options`` (:class:`TrainOptions`; ``overrides`` replace its fields, e.g.
    ``progress=False``) say how: device, precision, budgets (``result.completed`` is False when
    one stopped it), the resumable checkpoint to write or continue from (same space,
    configuration and dataset size, else :class:`UserError`). With ``compile`` the largest and
    smallest subnet of each stage run compiled, the random ones eagerly (see the module
    docstring). ``teacher``: the external teacher network that ``config.teacher`` names
    (:func:`hwnas.supernet.teacher.load_teacher`); the largest subnet learns from it.

    Examples:
        >>> from hwnas.supernet import get_space, load_dataset
        >>> data = load_dataset("digits", seed=0)
        >>> space = get_space("mbv3-tiny")
        >>> from hwnas.supernet import TrainOptions, sandwich_config, train_supernet
        >>> supernet = space.build_supernet()
        >>> history = train_supernet(supernet, space, data, sandwich_config(epochs=1),
        ...                          TrainOptions(progress=False, max_steps=3))   # 3 steps only, here
        >>> type(history).__name__
        '...'
    """
    opts = TrainOptions.of(options, **overrides)
    compile = opts.compile
    config.validate()
    restricted = [_restricted(space, s.choices) for s in config.stages]
    if any(s.sort_channels for s in config.stages) and not hasattr(supernet, "sort_channels"):
        raise UserError(f"the schedule sorts channels, but the {space.name} supernet has no "
                        f"sort_channels()")
    teacher = _prepare_teacher(teacher, config, opts)
    rng = np.random.default_rng(config.seed)
    tops = [(sub.largest(), sub.smallest()) for sub in restricted]
    compiled: nn.Module | None = None
    if compile:
        compiled = torch.compile(supernet, mode=None if compile is True else str(compile))

    def forward(x: torch.Tensor, arch: Any, fixed: tuple[Any, Any]) -> torch.Tensor:
        supernet.set_active(arch)
        runner = compiled if compiled is not None and arch in fixed else supernet
        return runner(x)

    def step_fn(x: torch.Tensor, y: torch.Tensor, stage_i: int, amp: Callable) -> torch.Tensor:
        stage, sub = config.stages[stage_i], restricted[stage_i]
        largest, smallest = tops[stage_i]
        # the subnets of this step (sampled before any forward pass, so the random stream does
        # not depend on the loss weighting) and the weight of each one's loss
        subnets = ([smallest] + [sub.sample(rng) for _ in range(stage.num_random)]
                   if stage.sandwich else [])
        weight, sub_weight = subnet_loss_weights(config.subnet_loss, len(subnets))
        taught = _teacher_logits(teacher, x, amp)
        with amp():
            logits = forward(x, largest, tops[stage_i]).float()
        loss = label_loss(logits, y, config, taught)
        (loss * weight if weight != 1.0 else loss).backward()
        sub_total = torch.zeros((), device=x.device)
        if subnets:
            soft = F.softmax(logits.detach(), dim=1)
            for arch in subnets:
                with amp():
                    out = forward(x, arch, tops[stage_i]).float()
                if stage.distill:
                    sub_loss = soft_cross_entropy(out, soft)
                else:
                    sub_loss = F.cross_entropy(out, y, label_smoothing=config.label_smoothing)
                (sub_loss * sub_weight if sub_weight != 1.0 else sub_loss).backward()
                sub_total = sub_total + sub_loss.detach() / len(subnets)
        return torch.stack([loss.detach(), sub_total])

    def on_stage_start(stage_i: int, optimizer: torch.optim.Optimizer) -> None:
        if config.stages[stage_i].sort_channels:
            trained = next((s.choices for s in reversed(config.stages[:stage_i]) if s.epochs > 0),
                           None)
            supernet.sort_channels(trained=trained, optimizer=optimizer)

    job = _Job(SUPERNET_FORMAT, supernet, space, None, ("loss_largest", "loss_sub"), step_fn, rng,
               on_stage_start, desc=f"train supernet {space.name}")
    try:
        return _train(job, data, config, opts)
    finally:
        supernet.set_active(space.largest())


def subnet_loss_weights(mode: str, num_subnets: int) -> tuple[float, float]:
    """Loss weights (largest subnet, each other subnet) of a sandwich step with
    ``num_subnets`` subnets besides the largest (see :attr:`TrainConfig.subnet_loss`)."""
    if num_subnets == 0 or mode == "sum":
        return 1.0, 1.0
    if mode == "mean":
        return 1.0 / (1 + num_subnets), 1.0 / (1 + num_subnets)
    if mode == "largest+mean":
        return 1.0, 1.0 / num_subnets
    raise UserError(f"subnet_loss must be one of {list(SUBNET_LOSSES)}, got {mode!r}")


def _restricted(space: SearchSpace, choices: dict | None) -> SearchSpace:
    if not choices:
        return space
    if not hasattr(space, "restrict"):
        raise UserError(f"the schedule restricts choices {choices}, but space {space.name} "
                        f"cannot be restricted (it has no restrict())")
    return space.restrict(choices)


# -- standalone subnets ------------------------------------------------------------------------------

@torch.no_grad()
def reinitialize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Fresh weights for training from scratch: convolutions He-normal (fan-out), BatchNorm
    and LayerNorm 1 and 0, linear layers N(0, 0.01) with zero bias (the usual MobileNet
    initialisation)."""
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            fan_out = m.out_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
            m.weight.copy_(torch.randn(m.weight.shape, generator=gen, device="cpu") * math.sqrt(2.0 / fan_out))
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm)):
            m.reset_parameters()
        elif isinstance(m, nn.Linear):
            m.weight.copy_(torch.randn(m.weight.shape, generator=gen, device="cpu") * 0.01)
            if m.bias is not None:
                m.bias.zero_()
    return model


def standalone_config(epochs: int, **kwargs: Any) -> TrainConfig:
    """Plain training of one network: a single stage without subnets."""
    return TrainConfig(stages=[TrainStage("standalone", epochs, sandwich=False)], **kwargs)


def train_standalone(
    model: nn.Module,
    data: DatasetSplits,
    epochs: int | None = None,
    *,
    config: TrainConfig | None = None,
    space: SearchSpace | None = None,
    arch: Any = None,
    options: TrainOptions | None = None,
    teacher: nn.Module | None = None,
    **overrides: Any,
) -> TrainResult:
    """Train a static network (e.g. ``supernet.extract(arch)`` after :func:`reinitialize`) on
    the labels, with the same loop, schedule, checkpoints and budgets as the supernet.

    ``config`` defaults to :func:`standalone_config` of ``epochs``; ``options``/``overrides``
    as for :func:`train_supernet`. ``space``/``arch`` are recorded in checkpoints (needed for
    ``checkpoint_path``/``resume_from``, which rebuild the model as
    ``space.build_supernet().extract(arch)``). The saved weights are always the uncompiled
    module's. ``teacher``: as for :func:`train_supernet`.
    """
    opts = TrainOptions.of(options, **overrides)
    compile, checkpoint_path, resume_from = opts.compile, opts.checkpoint_path, opts.resume_from
    if config is None:
        if epochs is None:
            raise UserError("train_standalone needs epochs or a config")
        config = standalone_config(epochs)
    config.validate()
    if (checkpoint_path is not None or resume_from is not None) and (space is None or arch is None):
        raise UserError("standalone checkpoints need the space and arch of the model")
    arch_str = space.to_string(space.parse(arch)) if space is not None and arch is not None else None
    runner: nn.Module = model
    if compile:
        mode = None if compile is True else str(compile)
        runner = torch.compile(model, mode=mode)
    teacher = _prepare_teacher(teacher, config, opts)

    def step_fn(x: torch.Tensor, y: torch.Tensor, stage_i: int, amp: Callable) -> torch.Tensor:
        taught = _teacher_logits(teacher, x, amp)
        with amp():
            logits = runner(x).float()
        loss = label_loss(logits, y, config, taught)
        loss.backward()
        return loss.detach().reshape(1)

    job = _Job(STANDALONE_FORMAT, model, space, arch_str, ("loss",), step_fn, None,
               desc=f"train {arch_str or 'model'}")
    return _train(job, data, config, opts)


# -- checkpoints -----------------------------------------------------------------------------------

def _state_dict(module: nn.Module, half: bool) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in module.state_dict().items():
        v = v.detach().cpu()
        out[k] = v.half() if half and v.is_floating_point() else v.contiguous()
    return out


def _write(path: str | Path, payload: dict[str, Any]) -> Path:
    return write_atomic(path, lambda tmp: torch.save(payload, tmp))


def save_checkpoint(path: str | Path, supernet: nn.Module, space: SearchSpace, *,
                    dataset: str, train_config: TrainConfig | None = None,
                    extra: dict[str, Any] | None = None,
                    train_state: dict[str, Any] | None = None, half: bool = False,
                    data_record: dict[str, Any] | None = None) -> Path:
    """Save the supernet's weights with everything needed to rebuild it (written atomically).

    ``train_state`` (from the training loop) makes it resumable. ``half``: store floating
    tensors as float16 (half the size, for shipping; loading converts back to float32).
    ``data_record`` (:func:`hwnas.supernet.fingerprint.training_record`) says which images it
    trained on, so that a search can keep them out of validation."""
    payload = {
        "format": SUPERNET_FORMAT,
        "space": space.name,
        "space_config": space.config(),
        "dataset": dataset,
        "train_config": train_config.to_dict() if train_config else None,
        "extra": extra or {},
        "state_dict": _state_dict(supernet, half),
    }
    if train_state is not None:
        payload["train_state"] = train_state
    if data_record is not None:
        payload["data_record"] = data_record
    return _write(path, payload)


def save_standalone(path: str | Path, model: nn.Module, space: SearchSpace, arch: Any, *,
                    dataset: str, train_config: TrainConfig | None = None,
                    extra: dict[str, Any] | None = None,
                    train_state: dict[str, Any] | None = None,
                    data_record: dict[str, Any] | None = None) -> Path:
    """Save a standalone subnet: its space, architecture string, weights and (``data_record``)
    the images it trained on."""
    payload = {
        "format": STANDALONE_FORMAT,
        "space": space.name,
        "space_config": space.config(),
        "arch": space.to_string(space.parse(arch)),
        "dataset": dataset,
        "train_config": train_config.to_dict() if train_config else None,
        "extra": extra or {},
        "state_dict": _state_dict(model, False),
    }
    if train_state is not None:
        payload["train_state"] = train_state
    if data_record is not None:
        payload["data_record"] = data_record
    return _write(path, payload)


def _save(path: str | Path, job: _Job, dataset: str, config: TrainConfig,
          train_state: dict[str, Any], data_record: dict[str, Any] | None) -> None:
    if job.kind == SUPERNET_FORMAT:
        save_checkpoint(path, job.model, job.space, dataset=dataset, train_config=config,
                        train_state=train_state, data_record=data_record)
    else:
        save_standalone(path, job.model, job.space, job.arch, dataset=dataset,
                        train_config=config, train_state=train_state, data_record=data_record)


def _read_payload(path: str | Path, fmt: str | None) -> dict[str, Any]:
    """The checked payload of a checkpoint of format ``fmt`` (None: either kind)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; expected a file written by "
                        f"'hwnas train' or 'hwnas run'")
    what = {SUPERNET_FORMAT: "supernet", STANDALONE_FORMAT: "standalone subnet"}.get(fmt, "hwnas")
    link = f" (a symbolic link to {path.resolve()})" if path.is_symlink() else ""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise UserError(f"cannot read {what} checkpoint {path}{link}: "
                        f"{exc.strerror or first_line(exc)}") from None
    # torch.save writes a zip archive (PK..), its legacy format a pickle (0x80); nothing else is one
    if head and not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise UserError(f"cannot read {what} checkpoint {path}{link}: not a checkpoint (a file "
                        f"of another kind, starting {head!r}); expected a file written by "
                        f"'hwnas train' or 'hwnas run'")
    try:
        with warnings.catch_warnings():  # e.g. about the pickle protocol of a foreign file
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's weights-only loader refused an object
        raise UserError(f"cannot read {what} checkpoint {path}: it holds objects other than "
                        f"tensors and plain data, which hwnas never loads (they could run "
                        f"code)") from None
    except Exception as exc:  # torch raises many types for a corrupt or foreign file
        raise UserError(f"cannot read {what} checkpoint {path}{link}: {first_line(exc)}") from None
    if not isinstance(payload, dict) or payload.get("format") not in (SUPERNET_FORMAT, STANDALONE_FORMAT):
        tag = repr(fmt) if fmt else f"{SUPERNET_FORMAT!r} or {STANDALONE_FORMAT!r}"
        raise UserError(f"{path} is not an hwnas {what} checkpoint (no {tag} format tag)")
    if fmt is not None and payload["format"] != fmt:
        kinds = {SUPERNET_FORMAT: "a supernet", STANDALONE_FORMAT: "a standalone subnet"}
        raise UserError(f"{path} holds {kinds[payload['format']]} checkpoint, not "
                        f"{kinds[fmt]} checkpoint")
    return payload


def _space_of(payload: dict[str, Any], path: str | Path) -> SearchSpace:
    from hwnas.supernet.spaces import get_space

    try:
        return get_space(payload["space"], config=payload["space_config"])
    except KeyError:
        raise UserError(f"checkpoint {path} records no space") from None
    except UserError as exc:
        raise UserError(f"checkpoint {path}: {exc}") from None
    except (TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise UserError(f"checkpoint {path} records a space that cannot be built: "
                        f"{first_line(exc)}") from None


def with_training_augment(data: DatasetSplits, train_config: dict[str, Any] | None) -> DatasetSplits:
    """``data`` with the augmentation that a checkpoint's weights were trained with, where its
    ``train_config`` (the checkpoint's dict, as saved) records one.

    BatchNorm recalibration (:func:`hwnas.supernet.evaluate.bn_calibration_loader`) augments like
    ``data.augment``, and it must augment like training did: run 5's CIFAR-10 supernet, trained
    with cutout, scored 93.7 % (largest subnet) and 91.6 % (smallest) on 2,000 test images when
    recalibrated without cutout, 94.5 % and 93.2 % with it; run 7's (the shipped one, trained
    with TrivialAugment before cutout) 95.65 % and 92.50 % without TrivialAugment, 95.70 % and
    93.15 % with it."""
    if train_config is not None and not isinstance(train_config, dict):
        raise UserError(f"a checkpoint's train_config is a {type(train_config).__name__}, not a "
                        f"training configuration")
    augment = (train_config or {}).get("augment")
    if not augment or augment == data.augment:
        return data
    if augment not in AUGMENT_KINDS:
        raise UserError(f"the checkpoint was trained with augmentation {augment!r}, which this "
                        f"version does not know; expected one of {list(AUGMENT_KINDS)}")
    return replace(data, augment=augment)


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu",
                    space: SearchSpace | None = None):
    """Load a supernet checkpoint; returns (space, supernet, payload).

    With ``space``, the checkpoint must hold that space (same name and configuration), else
    :class:`UserError`."""
    payload = _read_payload(path, SUPERNET_FORMAT)
    if space is not None:
        _check_same_space(payload, space, path)
    ckpt_space, _, supernet = _network_of(payload, path)
    return ckpt_space, supernet.to(device), payload


def load_standalone(path: str | Path, *, device: str | torch.device = "cpu"):
    """Load a standalone subnet checkpoint; returns (space, arch, model in eval mode, payload)."""
    payload = _read_payload(path, STANDALONE_FORMAT)
    space, arch, model = _network_of(payload, path)
    return space, arch, model.to(device).eval(), payload


def load_network(path: str | Path, *, device: str | torch.device = "cpu"):
    """Load a checkpoint of either kind; returns (space, arch, network, payload): the supernet
    and ``arch`` None for a supernet checkpoint, the subnet (eval mode) and its architecture
    for a standalone one."""
    payload = _read_payload(path, None)
    space, arch, model = _network_of(payload, path)
    model = model.to(device)
    return space, arch, (model if arch is None else model.eval()), payload


def _network_of(payload: dict[str, Any], path: str | Path) -> tuple[SearchSpace, Any, nn.Module]:
    """(space, arch, network with the payload's weights) of a checked payload; arch is None
    for a supernet."""
    space = _space_of(payload, path)
    if payload["format"] == SUPERNET_FORMAT:
        arch, model = None, _build(space, path)
    else:
        arch = space.parse(payload["arch"])
        model = _build(space, path).extract(arch)
    _load_state(model, payload, path, space)
    return space, arch, model


def _build(space: SearchSpace, path: str | Path) -> nn.Module:
    """The supernet of a checkpoint's space; UserError when its recorded configuration cannot
    make one (a crafted file: negative class count, channels ...)."""
    try:
        return space.build_supernet()
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise UserError(f"checkpoint {path} records a space configuration that builds no "
                        f"network: {first_line(exc)}") from None


def _load_state(module: nn.Module, payload: dict[str, Any], path: str | Path,
                space: SearchSpace) -> None:
    state = payload.get("state_dict")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"checkpoint {path} holds no weights (its state_dict is not a mapping "
                        f"of tensors)")
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise UserError(f"checkpoint {path} holds non-finite weights (NaN or infinity) in "
                        f"{len(bad)} tensor(s), e.g. {bad[0]}; train it again")
    try:
        module.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError) as exc:
        raise UserError(f"checkpoint {path} does not match space {space.name}: "
                        f"{first_line(exc)}") from None


def _check_same_space(payload: dict[str, Any], space: SearchSpace, path: str | Path) -> None:
    if payload.get("space") != space.name:
        raise UserError(f"checkpoint {path} holds space {payload.get('space')!r}, not "
                        f"{space.name!r}; train a new one or pass the matching --space")
    if payload.get("space_config") != space.config():
        diff = sorted(k for k in set(space.config()) | set(payload.get("space_config") or {})
                      if (payload.get("space_config") or {}).get(k) != space.config().get(k))
        raise UserError(f"checkpoint {path} holds space {space.name!r} with another "
                        f"configuration (differs in {', '.join(diff)})")


def _load_for_resume(path: str | Path, job: _Job, config: TrainConfig, steps_per_epoch: int,
                     train_size: int) -> dict[str, Any]:
    payload = _read_payload(path, job.kind)
    _check_same_space(payload, job.space, path)
    if job.kind == STANDALONE_FORMAT and payload.get("arch") != job.arch:
        raise UserError(f"checkpoint {path} holds subnet {payload.get('arch')!r}, not {job.arch!r}")
    ts = payload.get("train_state")
    if not ts:
        raise UserError(f"checkpoint {path} holds final weights only (no training state); "
                        f"it cannot be resumed")
    if payload.get("train_config") is None or TrainConfig.from_dict(payload["train_config"]) != config:
        raise UserError(f"checkpoint {path} was trained with another training configuration; "
                        f"resume with the configuration it records (train_config)")
    if ts["train_size"] != train_size or ts["steps_per_epoch"] != steps_per_epoch:
        raise UserError(f"checkpoint {path} was trained on {ts['train_size']} images "
                        f"({ts['steps_per_epoch']} steps/epoch); this dataset has {train_size} "
                        f"({steps_per_epoch} steps/epoch)")
    try:
        job.model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        raise UserError(f"checkpoint {path} does not match space {job.space.name}: "
                        f"{first_line(exc)}") from None
    return payload
