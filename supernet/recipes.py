"""Training recipes as data: :class:`TrainStage` (one phase of a schedule), :class:`TrainConfig`
(what a training computes; every checkpoint records it) and the presets that build them
(:func:`schedule_config`: ``sandwich``, ``deps``, ``progressive``; :func:`default_config`: the
preset and settings a space asks for; :func:`standalone_config`). Torch-free, so the command
line reads its defaults from here without loading torch.

* ``sandwich`` -- one sandwich stage over the whole space (BigNAS-style).
* ``deps`` -- delayed shrinking (DEpS, Annavajjala et al., ECCV 2024): the first half of the
  epochs trains only the full network (``sandwich=False``), then sandwich training of the
  whole space. (DEpS's incremental per-subnet learning-rate heuristic is not implemented.)
* ``progressive`` -- Once-for-All's progressive shrinking: the full network, then elastic
  kernel, then depth (two steps), then expand ratio (two steps, channels sorted by importance
  before each), every step distilled in place from the largest subnet.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from hwnas.supernet.train_options import (
    AUGMENT_KINDS,
    MAX_EPOCHS,
    OPTIMIZERS,
    REGULARISE,
    SCHEDULES,
    SUBNET_LOSSES,
    TEACHER_MODES,
)

from hwnas.core.errors import UserError
from hwnas.core.io import first_line

if TYPE_CHECKING:
    from hwnas.supernet.space import SearchSpace

#: The share of a ``deps`` schedule's epochs that train only the full network (DEpS: ~half).
DEPS_FULL_FRACTION = 0.5

__all__ = ["TrainConfig", "TrainStage", "default_config", "deps_config", "progressive_config",
           "sandwich_config", "schedule_config", "space_recipe", "standalone_config"]


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
    #: Decay every parameter, norms, biases and position embeddings too, as CCT's original
    #: training script (``model.parameters()`` to AdamW) did for its published CIFAR figures;
    #: False: only weights (timm's and DeiT's filter).
    decay_all: bool = False
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
    #: Which subnets of a sandwich step the space's regularisers (dropout, stochastic depth)
    #: act on: ``"all"``, or ``"largest"`` only (BigNAS's "regularise only the biggest child":
    #: the smaller subnets, which under-fit rather than over-fit, train without them).
    regularise: str = "all"

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
        if self.regularise not in REGULARISE:
            raise UserError(f"regularise must be one of {list(REGULARISE)}, got "
                            f"{self.regularise!r}")
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
            # files of sessions 46-48 record teacher_scope: "largest" is what training does
            scope = d.pop("teacher_scope", "largest")
            d["stages"] = [TrainStage(**s) for s in d.get("stages", [])]
            config = cls(**d)
            config.validate()
        except (TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"not a training configuration: {first_line(exc)}") from None
        if scope != "largest":
            raise UserError(f"not a training configuration of this version: teacher_scope "
                            f"{scope!r} (every subnet learning from the teacher) was taken out")
        return config


def sandwich_config(epochs: int, *, num_random: int = 2, **kwargs: Any) -> TrainConfig:
    """The default schedule: one sandwich stage of ``epochs`` epochs.

    Examples:
        >>> from hwnas.supernet import sandwich_config
        >>> config = sandwich_config(epochs=30, lr=0.1)
        >>> [(s.name, s.epochs) for s in config.stages], config.lr
        ([('sandwich', 30)], 0.1)
    """
    return TrainConfig(stages=[TrainStage("sandwich", epochs, num_random=num_random)], **kwargs)


def deps_config(epochs: int, *, full_fraction: float = DEPS_FULL_FRACTION, num_random: int = 2,
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


def standalone_config(epochs: int, **kwargs: Any) -> TrainConfig:
    """Plain training of one network: a single stage without subnets."""
    return TrainConfig(stages=[TrainStage("standalone", epochs, sandwich=False)], **kwargs)
