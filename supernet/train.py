"""Supernet training (sandwich rule, in-place distillation, progressive and delayed shrinking)
and standalone training of static subnets, with exact resume, time budgets and data parallelism.

Each sandwich step trains the largest subnet on the labels, then the smallest and
``num_random`` random subnets on the largest one's soft predictions (in-place distillation, as
in BigNAS / Once-for-All), their gradients combined as :attr:`TrainConfig.subnet_loss` says.
The schedule is data (:mod:`hwnas.supernet.recipes`), checkpoints are files of
:mod:`hwnas.supernet.checkpoint_io`; this module is the loop. One learning-rate schedule
(linear warm-up, cosine decay) spans all stages. ``resume_from`` continues bit-exactly (CPU);
``max_seconds`` / ``max_steps`` stop early with a checkpoint; a stretch of non-finite gradients
is rolled back (:class:`hwnas.supernet.divergence.DivergenceGuard`). On a GPU: bf16 autocast,
channels-last, data augmented on the device, fused AdamW; with ``compile`` only each stage's
largest and smallest subnet run compiled (two graphs), the random ones eagerly; with
``compile_scope="step"`` also the batches' normalisation (on the CPU their augmentation) and a
standalone network's loss. Several processes (``torchrun``): :mod:`hwnas.supernet.distributed`.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
# the recipes, the checkpoint files and MAX_EPOCHS stay importable from here, as before the split
from hwnas.supernet.checkpoint_io import (  # noqa: F401
    STANDALONE_FORMAT,
    SUPERNET_FORMAT,
    load_checkpoint,
    load_for_resume,
    load_network,
    load_standalone,
    rng_state,
    save_checkpoint,
    save_standalone,
    set_rng_state,
    with_training_augment,
)
from hwnas.supernet.data import BatchLoader, DatasetSplits
from hwnas.supernet.data.mix import mix_batch
from hwnas.supernet.distributed import DistContext, agree, all_reduce_gradients, broadcast_state, shard
from hwnas.supernet.divergence import DivergenceGuard
from hwnas.supernet.fingerprint import training_record
from hwnas.supernet.recipes import (  # noqa: F401
    TrainConfig,
    TrainStage,
    default_config,
    deps_config,
    progressive_config,
    sandwich_config,
    schedule_config,
    space_recipe,
    standalone_config,
)
from hwnas.supernet.space import SearchSpace
from hwnas.supernet.train_options import (  # noqa: F401
    CUDA_GRAPH_MODES,
    MAX_EPOCHS,
    OPTIMIZERS,
    SCHEDULES,
    SUBNET_LOSSES,
    TrainOptions,
)
from torch import nn

from hwnas.core.errors import UserError
from hwnas.core.progress import progress_bar

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


# -- the training loop shared by supernets and standalone subnets --------------------------------

def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 for ``bf16``, and for ``auto`` on CUDA; None (fp32) otherwise."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _amp(device: torch.device, dtype: torch.dtype | None):
    """The autocast context of ``dtype`` on ``device``; none for fp32 (``dtype`` None)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


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
        return _compiled(teacher, opts.compile)
    return teacher


def _compiled(fn: Callable, compile: bool | str) -> Callable:
    """``fn`` under ``torch.compile`` in the mode ``compile`` names (True: the default mode)."""
    return torch.compile(fn, mode=None if compile is True else str(compile))


def _teacher_logits(teacher: nn.Module | None, x: torch.Tensor,
                    amp: Callable) -> torch.Tensor | None:
    """The teacher's logits as a tensor of their own: under a CUDA-graph compile mode the
    compiled teacher's output lives in the graphs' memory pool, and the student's next replay
    overwrites it before the loss reads it."""
    if teacher is None:
        return None
    with torch.no_grad(), amp():
        return teacher(x).float().clone()


#: Parameter names that are never decayed besides 1-d ones (norms, biases): NB201's edge
#: transforms and position embeddings.
_NO_DECAY_NAMES = ("transforms", "pos_embed", "position")


def _make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        skip = not config.decay_all and (p.ndim <= 1 or any(k in name for k in _NO_DECAY_NAMES))
        (no_decay if skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "adamw":
        # one fused kernel per step on a GPU instead of a launch per parameter group and op
        fused = all(p.is_cuda for p in model.parameters()) or None
        return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999), fused=fused)
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, nesterov=True)


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


class _Loop:
    """One training call (:func:`_train`): the data, optimizer, schedule and resumed state it
    set up, the step and epoch bookkeeping, divergence checks and checkpoints."""

    def __init__(self, job: _Job, data: DatasetSplits, config: TrainConfig,
                 opts: TrainOptions) -> None:
        self.job, self.data, self.config, self.opts = job, data, config, opts
        self.ctx = ctx = opts.dist or DistContext()
        self.device = device = torch.device(opts.device)
        self.amp_dtype = _autocast_dtype(opts.precision, device)
        self.use_cl = _channels_last(opts, device)
        if config.batch_size % ctx.world_size:
            raise UserError(f"batch size {config.batch_size} is not divisible by the "
                            f"{ctx.world_size} processes; use a multiple of {ctx.world_size}")
        model = job.model
        if opts.resume_from is None:
            torch.manual_seed(config.seed)
        model.to(device).train()
        if self.use_cl:
            model.to(memory_format=torch.channels_last)
        self.loader = BatchLoader(data.train, batch_size=config.batch_size, mean=data.mean,
                                  std=data.std, shuffle=True, augment=config.augment or data.augment,
                                  seed=config.seed, device=device,
                                  drop_last=len(data.train) > config.batch_size,
                                  compile=bool(opts.compile) and opts.compile_scope == "step")
        self.steps_per_epoch = len(self.loader)
        self.total_steps = self.steps_per_epoch * config.epochs
        self.warmup_steps = int(config.warmup_epochs * self.steps_per_epoch)
        self.optimizer = _make_optimizer(model, config)
        self.step, self.history, self.prior_seconds, self.partial = 0, [], 0.0, None
        if opts.resume_from is not None:
            self._resume()
        broadcast_state(model, ctx)  # identical start on every rank
        # global epoch -> stage index; the first epoch of each stage
        self.epoch_stage = [i for i, s in enumerate(config.stages) for _ in range(s.epochs)]
        self.stage_first_epoch: dict[int, int] = {}
        for e, i in enumerate(self.epoch_stage):
            self.stage_first_epoch.setdefault(i, e)
        self.bar = progress_bar(self.total_steps, job.desc,
                                disable=not (opts.progress and ctx.is_main), initial=self.step)
        self.start = self.last_save = time.perf_counter()
        self.images = 0
        self.sums = torch.zeros(len(job.loss_names), dtype=torch.float64, device=device)
        self.counted = 0  # steps whose losses are in sums (fewer than the epoch's after a roll-back)
        self.guard = DivergenceGuard(model, self.optimizer, device)
        self.guard.snapshot(self.step)
        self.record = (training_record(data) if opts.checkpoint_path is not None and ctx.is_main
                       else None)

    def amp(self):
        return _amp(self.device, self.amp_dtype)

    def lr_at(self, step: int) -> float:
        config, warmup = self.config, self.warmup_steps
        if step < warmup:
            return config.lr * (step + 1) / warmup
        t = (step - warmup) / max(1, self.total_steps - warmup)
        return 0.5 * config.lr * (1 + math.cos(math.pi * t))

    def _resume(self) -> None:
        job = self.job
        payload = load_for_resume(self.opts.resume_from, job.kind, job.model, job.space, job.arch,
                                  self.config, self.steps_per_epoch, len(self.data.train))
        ts = payload["train_state"]
        self.optimizer.load_state_dict(ts["optimizer"])
        set_rng_state(ts["rng"], self.device, job.rng)
        self.step, self.history = int(ts["step"]), list(ts["history"])
        self.prior_seconds, self.partial = float(ts["seconds"]), ts["partial_sums"]

    def check_finite(self, epoch: int, lr: float) -> bool:
        """The guard's check; after a roll-back the epoch's loss sums go back with the weights."""
        guard = self.guard
        if guard.check(self.step, epoch, lr, extra=(self.sums.clone(), self.counted)):
            return True
        back = guard.snapshot_step
        if (back // self.steps_per_epoch == epoch and back % self.steps_per_epoch
                and guard.extra is not None):
            self.sums, self.counted = guard.extra[0].clone(), guard.extra[1]
        else:
            self.sums, self.counted = torch.zeros_like(self.sums), 0
        r = guard.rollbacks[-1]
        print(f"warning: non-finite gradients between steps {r['back_to']} and {r['step']} "
              f"(epoch {epoch + 1}, learning rate {lr:.3g}); rolled back to step {r['back_to']} "
              f"and went on ({len(guard.rollbacks)} of at most {guard.max_rollbacks})",
              file=sys.stderr, flush=True)
        return False

    def save(self) -> None:
        """The resumable checkpoint (rank 0, where the options name one)."""
        opts, ctx, job = self.opts, self.ctx, self.job
        if opts.checkpoint_path is not None and ctx.is_main:
            train_state = {
                "step": self.step, "total_steps": self.total_steps,
                "steps_per_epoch": self.steps_per_epoch, "train_size": len(self.data.train),
                "world_size": ctx.world_size, "optimizer": self.optimizer.state_dict(),
                "rng": rng_state(self.device, job.rng), "history": self.history,
                "seconds": self.prior_seconds + time.perf_counter() - self.start,
                "partial_sums": [float(v) for v in self.sums.tolist()],
            }
            _save(opts.checkpoint_path, job, opts.dataset or self.data.name, self.config,
                  train_state, self.record)
        self.last_save = time.perf_counter()

    def run(self) -> TrainResult:
        stop = self.opts.max_steps is not None and self.step >= self.opts.max_steps
        while self.step < self.total_steps and not stop:
            stop = self._epoch()
        return self._finish()

    def _epoch(self) -> bool:
        """The rest of the current epoch; True when a budget stopped it."""
        epoch, skip = divmod(self.step, self.steps_per_epoch)
        stage_i = self.epoch_stage[epoch]
        stage = self.config.stages[stage_i]
        if (skip == 0 and self.stage_first_epoch[stage_i] == epoch
                and self.job.on_stage_start is not None):
            self.job.on_stage_start(stage_i, self.optimizer)
        if skip and self.partial is not None:
            self.sums = torch.tensor(self.partial, dtype=torch.float64, device=self.device)
            self.counted = skip
        else:
            self.sums, self.counted = torch.zeros_like(self.sums), 0
        self.guard.extra = (self.sums.clone(), self.counted)
        self.partial = None
        self.loader.set_epoch(epoch)
        batches = iter(self.loader)
        for _ in range(skip):  # replay the epoch's random stream up to where it stopped
            next(batches)
        every = self.opts.checkpoint_every_s
        for x, y in batches:
            lr = self._step(x, y, stage_i)
            if self.guard.due(self.step) or self.step % self.steps_per_epoch == 0:
                self.check_finite(epoch, lr)
            if self.step % self.steps_per_epoch == 0:
                self._log_epoch(epoch, stage)
            if self._budget_spent() and self.step < self.total_steps:
                return True
            if every is not None and time.perf_counter() - self.last_save >= every:
                self.check_finite(epoch, lr)
                self.save()
        return False

    def _step(self, x: torch.Tensor, y: torch.Tensor, stage_i: int) -> float:
        """One optimizer step on a batch; returns its learning rate."""
        ctx, config, model, optimizer = self.ctx, self.config, self.job.model, self.optimizer
        x, y = shard(x, ctx), shard(y, ctx)
        if config.mixup > 0 or config.cutmix > 0:
            x, y = mix_batch(x, y, self.data.num_classes, mixup=config.mixup,
                             cutmix=config.cutmix, seed=config.seed, step=self.step)
        if self.use_cl:
            x = x.contiguous(memory_format=torch.channels_last)
        lr = self.lr_at(self.step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        losses = self.job.step_fn(x, y, stage_i, self.amp)
        self.sums += losses.to(torch.float64)
        self.counted += 1
        all_reduce_gradients(model.parameters(), ctx)
        if config.grad_clip:
            self.guard.observe(nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
        else:
            self.guard.observe(nn.utils.get_total_norm(
                [p.grad for p in model.parameters() if p.grad is not None]))
        optimizer.step()
        self.step += 1
        self.images += x.size(0) * ctx.world_size
        self.bar.update(1)
        return lr

    def _log_epoch(self, epoch: int, stage: TrainStage) -> None:
        means = (self.sums / max(1, self.counted)).tolist()
        # .tolist() above waited for the GPU, so the clock is the epoch's true end
        self.history.append({"stage": stage.name, "epoch": epoch + 1,
                             **dict(zip(self.job.loss_names, means)),
                             "seconds": round(self.prior_seconds + time.perf_counter()
                                              - self.start, 3)})
        self.bar.set_postfix(stage=stage.name, loss=f"{means[0]:.3f}")

    def _budget_spent(self) -> bool:
        """Whether max_steps or max_seconds (agreed by all ranks) says stop here."""
        opts = self.opts
        want = opts.max_steps is not None and self.step >= opts.max_steps
        if opts.max_seconds is not None and (not self.ctx.enabled or self.step % 10 == 0):
            elapsed = time.perf_counter() - self.start
            want = want or agree(elapsed >= opts.max_seconds, self.ctx, self.device)
        return want

    def _finish(self) -> TrainResult:
        step, device = self.step, self.device
        if step % self.guard.every and step % self.steps_per_epoch:  # the last stretch, before it is saved
            self.check_finite(step // self.steps_per_epoch, self.lr_at(max(0, step - 1)))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - self.start
        self.bar.close()
        broadcast_state(self.job.model, self.ctx)  # BatchNorm statistics of rank 0 everywhere
        self.save()
        return TrainResult(
            epochs=self.config.epochs, seconds=seconds,
            images_per_s=self.images / max(seconds, 1e-9), history=self.history,
            completed=self.step >= self.total_steps, step=self.step, total_steps=self.total_steps,
            total_seconds=self.prior_seconds + seconds, images=self.images,
            rollbacks=list(self.guard.rollbacks),
        )


def _save(path, job: _Job, dataset: str, config: TrainConfig, train_state: dict[str, Any],
          data_record: dict[str, Any] | None) -> None:
    if job.kind == SUPERNET_FORMAT:
        save_checkpoint(path, job.model, job.space, dataset=dataset, train_config=config,
                        train_state=train_state, data_record=data_record)
    else:
        save_standalone(path, job.model, job.space, job.arch, dataset=dataset,
                        train_config=config, train_state=train_state, data_record=data_record)


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
    compiled = masked = None
    if compile:
        compiled = _compiled(supernet, compile)
    if compile and opts.compile_scope == "subnets":
        if not hasattr(supernet, "forward_masked"):
            raise UserError(f"compile scope 'subnets' needs a supernet with forward_masked "
                            f"(vit, cct); the {space.name} supernet has none: use 'model'")
        masked = _compiled(supernet.forward_masked, compile)
    sandwich = _SandwichStep(supernet, config, restricted, rng, teacher, compiled, masked,
                             graphed=compiled is not None and compile in CUDA_GRAPH_MODES)
    job = _Job(SUPERNET_FORMAT, supernet, space, None, ("loss_largest", "loss_sub"), sandwich,
               rng, sandwich.on_stage_start, desc=f"train supernet {space.name}")
    try:
        return _Loop(job, data, config, opts).run()
    finally:
        supernet.set_active(space.largest())


class _SandwichStep:
    """A supernet's step (the job's ``step_fn``): the stage's largest subnet on the labels,
    then (sandwich stages) its smallest and ``num_random`` random ones, distilled in place
    (with the space's regularisers unless ``config.regularise`` is ``"largest"``);
    the largest and smallest run through ``compiled`` where given (fixed shapes), the others
    through ``masked`` (the compiled ``forward_masked``) where given; ``graphed``: they replay
    CUDA graphs (:data:`~hwnas.supernet.train_options.CUDA_GRAPH_MODES`)."""

    def __init__(self, supernet: nn.Module, config: TrainConfig, restricted: list[SearchSpace],
                 rng: np.random.Generator, teacher: nn.Module | None, compiled: Callable | None,
                 masked: Callable | None = None, graphed: bool = False) -> None:
        self.supernet, self.config, self.restricted, self.rng = supernet, config, restricted, rng
        self.teacher, self.compiled, self.masked, self.graphed = teacher, compiled, masked, graphed
        self.tops = [(sub.largest(), sub.smallest()) for sub in restricted]

    def forward(self, x: torch.Tensor, arch: Any, fixed: tuple[Any, Any]) -> torch.Tensor:
        if self.masked is not None and arch not in fixed:
            return self.masked(x, self.supernet.arch_masks(arch, x.device))
        self.supernet.set_active(arch)
        runner = self.compiled if self.compiled is not None and arch in fixed else self.supernet
        return runner(x)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, stage_i: int,
                 amp: Callable) -> torch.Tensor:
        config = self.config
        stage, sub = config.stages[stage_i], self.restricted[stage_i]
        largest, smallest = fixed = self.tops[stage_i]
        # the subnets of this step (sampled before any forward pass, so the random stream does
        # not depend on the loss weighting) and the weight of each one's loss
        subnets = ([smallest] + [sub.sample(self.rng) for _ in range(stage.num_random)]
                   if stage.sandwich else [])
        weight, sub_weight = subnet_loss_weights(config.subnet_loss, len(subnets))
        taught = _teacher_logits(self.teacher, x, amp)
        with amp():
            logits = self.forward(x, largest, fixed).float()
        loss = label_loss(logits, y, config, taught)
        (loss * weight if weight != 1.0 else loss).backward()
        sub_total = torch.zeros((), device=x.device)
        for p in self.supernet.parameters() if subnets and self.graphed else ():
            p.grad = None if p.grad is None else p.grad.clone()  # later passes add in place
        if subnets:  # distilled from the largest, in place
            soft = F.softmax(logits.detach(), dim=1)
            self.supernet.regularise = config.regularise == "all"
            try:
                for arch in subnets:
                    with amp():
                        out = self.forward(x, arch, fixed).float()
                    if stage.distill:
                        sub_loss = soft_cross_entropy(out, soft)
                    else:
                        sub_loss = F.cross_entropy(out, y, label_smoothing=config.label_smoothing)
                    (sub_loss * sub_weight if sub_weight != 1.0 else sub_loss).backward()
                    sub_total = sub_total + sub_loss.detach() / len(subnets)
            finally:
                self.supernet.regularise = True
        return torch.stack([loss.detach(), sub_total])

    def on_stage_start(self, stage_i: int, optimizer: torch.optim.Optimizer) -> None:
        stages = self.config.stages
        if stages[stage_i].sort_channels:
            trained = next((s.choices for s in reversed(stages[:stage_i]) if s.epochs > 0), None)
            self.supernet.sort_channels(trained=trained, optimizer=optimizer)


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
    """Fresh weights for training from scratch: the model's own ``init_weights(generator)``
    where it has one (the transformers: CCT's initialisation, not the convolutional networks'),
    else convolutions He-normal (fan-out), BatchNorm and LayerNorm 1 and 0, linear layers
    N(0, 0.01) with zero bias (the usual MobileNet initialisation)."""
    gen = torch.Generator().manual_seed(seed)
    if hasattr(model, "init_weights"):
        model.init_weights(gen)
        return model
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
    if compile and opts.compile_scope != "step":  # "subnets": as "model" (no random subnets)
        runner = _compiled(model, compile)
    teacher = _prepare_teacher(teacher, config, opts)

    device = torch.device(opts.device)
    amp_dtype = _autocast_dtype(opts.precision, device)  # the loop's (_Loop.amp)

    def forward_loss(x: torch.Tensor, y: torch.Tensor, taught: torch.Tensor | None) -> torch.Tensor:
        with _amp(device, amp_dtype):
            logits = runner(x).float()
        return label_loss(logits, y, config, taught)

    loss_of = forward_loss
    if compile and opts.compile_scope == "step":  # the network and its loss: one graph
        loss_of = _compiled(forward_loss, compile)

    def step_fn(x: torch.Tensor, y: torch.Tensor, stage_i: int, amp: Callable) -> torch.Tensor:
        loss = loss_of(x, y, _teacher_logits(teacher, x, amp))
        loss.backward()
        return loss.detach().reshape(1)

    job = _Job(STANDALONE_FORMAT, model, space, arch_str, ("loss",), step_fn, None,
               desc=f"train {arch_str or 'model'}")
    return _Loop(job, data, config, opts).run()
