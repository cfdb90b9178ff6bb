"""Quantization-aware training: LSQ step sizes, initialised from PTQ, with distillation.

:func:`qat` starts from PTQ (:func:`hwnas.quant.ptq.ptq`), makes every active quantizer's scale
trainable (Learned Step Size Quantization, Esser et al. 2020: :func:`enable_lsq`) and fine-tunes
by knowledge distillation from the float model or a given teacher (:func:`distill`, which also
fine-tunes float models), keeping the best state on held-out validation data.

Device-agnostic: the float teacher is copied to the device of the batches; on CUDA the
forward passes run under bf16 autocast (``amp``), the quantizers themselves in float32 (see
:class:`hwnas.quant.fake_quant.FakeQuantize`). ``model`` is never modified.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from hwnas.quant.fake_quant import lsq_grad_scale, quantizers
from hwnas.quant.policy import QuantPolicy
from hwnas.quant.ptq import PTQConfig, _model_device, policy_of, ptq
from hwnas.supernet.evaluate import accuracy
from torch import nn
from tqdm.auto import tqdm

from hwnas.core.errors import UserError

__all__ = ["QATConfig", "QATResult", "distill", "enable_lsq", "qat"]


@dataclass
class QATConfig:
    """Fine-tuning settings. ``epochs`` passes over ``train_batches`` (``max_steps`` caps the
    total). ``lr`` for weights/biases, ``scale_lr`` for the step sizes; ``optimizer`` "sgd" (Nesterov
    momentum 0.9, as in LSQ; LSQ's gradient scale only matters with SGD, Adam normalises it
    away) or "adam"; linear warm-up over ``warmup_frac`` of the steps, then cosine decay.
    ``temperature``/``kd_weight``/``label_weight``: the loss ``kd_weight * T^2 * softCE +
    label_weight * CE``. ``scale_lr`` equals ``lr`` by default, as in LSQ (its gradient scale
    makes step sizes and weights learn at one rate): at 1e-2 the step sizes of 2-bit layers
    drifted and a mixed 2/4/6/8-bit policy of the run-7 CIFAR-10 smallest subnet fell from 93.5
    to 88.6 % validation top-1 in two epochs; at 3e-3 it stayed at 93.6. ``amp``: bf16
    autocast on CUDA (off by default: on an H200 the fake-quantized MobileNetV3 subnets,
    launch-bound, ran 100 steps in 20.9 s with it and 15.1 s without).

    Examples:
        >>> from hwnas.quant import QATConfig
        >>> config = QATConfig(epochs=3, lr=0.003)   # for hwnas.quant.qat.qat(model, policy, ...)
        >>> config.epochs, config.optimizer
        (3, 'sgd')
    """

    epochs: int = 3
    max_steps: int | None = None
    optimizer: str = "sgd"
    lr: float = 3e-3
    scale_lr: float = 3e-3
    warmup_frac: float = 0.1
    weight_decay: float = 0.0
    temperature: float = 1.0
    kd_weight: float = 1.0
    label_weight: float = 0.0
    grad_clip: float | None = 1.0
    amp: bool = False
    seed: int = 0

    def validate(self) -> None:
        if self.epochs < 1:
            raise UserError(f"QAT needs at least one epoch, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise UserError(f"max_steps must be positive, got {self.max_steps}")
        if self.lr <= 0 or self.scale_lr <= 0:
            raise UserError(f"QAT learning rates must be positive, got lr={self.lr}, "
                            f"scale_lr={self.scale_lr}")
        if not 0.0 <= self.warmup_frac < 1.0:
            raise UserError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if self.optimizer not in ("sgd", "adam"):
            raise UserError(f"unknown QAT optimizer {self.optimizer!r}; expected 'sgd' or 'adam'")
        if self.temperature <= 0:
            raise UserError(f"distillation temperature must be positive, got {self.temperature}")
        if self.kd_weight < 0 or self.label_weight < 0 or self.kd_weight + self.label_weight == 0:
            raise UserError("QAT loss weights must be non-negative and not both zero, got "
                            f"kd_weight={self.kd_weight}, label_weight={self.label_weight}")


@dataclass
class QATResult:
    """The fine-tuned model, its cost and per-epoch history. ``kept_epoch``: which state was
    returned when validation data was given (0 = the PTQ start), else the last epoch."""

    model: nn.Module
    seconds: float
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    kept_epoch: int = 0


def enable_lsq(qmodel: nn.Module) -> list[nn.Parameter]:
    """Make the scale of every active quantizer trainable with LSQ's gradient scale; returns
    those scale parameters.

    The gradient is scaled by ``g = 1 / sqrt(numel * Qp)``: ``numel`` = weights per output
    channel (per-channel weight scales) or activation elements per sample, ``Qp`` = the largest
    quantized level (``2^(b-1)-1`` for weights, ``2^b-1`` for activations). Activation zero
    points stay at their calibrated values."""
    scales = []
    for _, q in quantizers(qmodel):
        if not q.active or not q.calibrated:
            continue
        numel = q.numel_per_sample or 1
        q.grad_scale = lsq_grad_scale(numel, q.qmax)
        q.scale.requires_grad_(True)
        scales.append(q.scale)
    return scales


def _kd_loss(student: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor | None,
             config: QATConfig) -> torch.Tensor:
    t = config.temperature
    loss = student.new_zeros(())
    if config.kd_weight:
        soft = F.softmax(teacher.float() / t, dim=1)
        loss = loss + config.kd_weight * t * t * -(soft * F.log_softmax(student.float() / t, dim=1)).sum(1).mean()
    if config.label_weight and y is not None:
        loss = loss + config.label_weight * F.cross_entropy(student.float(), y)
    return loss


def qat(model: nn.Module, policy: QuantPolicy, train_batches: Iterable, calib_batches: Iterable,
        config: QATConfig | None = None, ptq_config: PTQConfig | None = None, *,
        init: nn.Module | None = None, progress: bool = True, val_batches: Iterable | None = None,
        on_epoch: Callable[[int, nn.Module], dict[str, float] | None] | None = None,
        teacher: nn.Module | None = None) -> QATResult:
    """Quantization-aware fine-tuning of ``model`` under ``policy``:

    1. PTQ (:func:`hwnas.quant.ptq.ptq`) gives the starting point: BN folded, weights and
       activation ranges calibrated (LSQ from a good init converges in a few epochs; from
       scratch it needs many).
    2. Every active quantizer's scale becomes trainable (:func:`enable_lsq`).
    3. The folded weights, biases and scales are fine-tuned for a few epochs with knowledge
       distillation from the float model (or ``teacher``): soft cross-entropy against its
       temperature-``T`` softmax (times ``T^2``), plus optionally a label term (:func:`distill`).
    4. With ``val_batches``, the start and every epoch are scored on them and the best state is
       returned: fine-tuning a well-trained network can lose accuracy (low-bit layers oscillate
       between grid points), and a QAT that makes the model worse than its PTQ start on
       validation data should not be the result.

    ``train_batches``: re-iterable ``(x, y)`` batches (e.g. a shuffled, augmented BatchLoader),
    one pass per epoch. ``init``: an already PTQ-quantized model to start from (copied) instead
    of running PTQ. ``val_batches``: re-iterable held-out ``(x, y)`` batches; the start and each
    epoch are scored on them (``val`` in the history) and the best state is returned.
    ``on_epoch(epoch, qmodel)`` may return metrics to record in the history. ``teacher``: the
    network distilled from (default ``model``, the float model itself; e.g. a supernet's
    largest subnet).
    """
    config = config or QATConfig()
    config.validate()
    if init is not None:
        if policy_of(init).bits != policy.bits:
            raise UserError("QAT init model was quantized with another policy than the one given")
        qmodel = copy.deepcopy(init)
    else:
        qmodel = ptq(model, policy, calib_batches, ptq_config)
    scales = enable_lsq(qmodel)
    try:
        return distill(qmodel, teacher if teacher is not None else model, train_batches, config,
                       scales=scales, progress=progress, val_batches=val_batches,
                       on_epoch=on_epoch, desc="QAT")
    finally:
        for _, q in quantizers(qmodel):  # scales frozen again: the result is a plain PTQ-style model
            q.grad_scale = None
            q.scale.requires_grad_(False)


def _distill_optimizer(qmodel: nn.Module, scales: list[nn.Parameter],
                       config: QATConfig) -> tuple[torch.optim.Optimizer, list[nn.Parameter]]:
    """The optimizer of :func:`distill` and the parameters it trains at ``lr`` (every one of
    ``qmodel`` but the quantizer scales; the LSQ ``scales`` at ``scale_lr``)."""
    all_scales = {id(q.scale) for _, q in quantizers(qmodel)}  # unused (float) scales stay frozen
    weights = [p for p in qmodel.parameters() if id(p) not in all_scales]
    for p in weights:
        p.requires_grad_(True)
    groups = [{"params": weights, "lr": config.lr, "weight_decay": config.weight_decay}]
    if scales:
        groups.append({"params": scales, "lr": config.scale_lr, "weight_decay": 0.0})
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, momentum=0.9, nesterov=True), weights
    return torch.optim.Adam(groups), weights


def _distill_steps(train_batches: Iterable, config: QATConfig) -> tuple[int | None, int | None]:
    """(steps per epoch, where the batches have a length; steps of the whole schedule)."""
    try:
        steps_per_epoch = len(train_batches)  # type: ignore[arg-type]
    except TypeError:
        steps_per_epoch = None
    total = config.epochs * steps_per_epoch if steps_per_epoch else config.max_steps
    if config.max_steps is not None:
        total = min(total, config.max_steps) if total else config.max_steps
    return steps_per_epoch, total


def _set_lr(optimizer: torch.optim.Optimizer, base_lrs: list[float], step: int, total: int,
            config: QATConfig) -> None:
    """Linear warm-up over ``warmup_frac`` of the ``total`` steps, then cosine decay."""
    warm = int(config.warmup_frac * total)
    if step < warm:
        factor = (step + 1) / warm
    else:
        factor = 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))
    for g, lr in zip(optimizer.param_groups, base_lrs):
        g["lr"] = lr * factor


def _batch(batch: Any, device: torch.device,
           config: QATConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs, labels or None) of a batch, on ``device``."""
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    y = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else None
    x = x.to(device)
    y = y.to(device) if y is not None else None
    if y is None and config.label_weight:
        raise UserError("QAT with label_weight > 0 needs (inputs, labels) batches")
    return x, y


def distill(student: nn.Module, teacher: nn.Module, train_batches: Iterable,
            config: QATConfig | None = None, *, scales: Iterable[nn.Parameter] = (),
            progress: bool = True, val_batches: Iterable | None = None,
            on_epoch: Callable[[int, nn.Module], dict[str, float] | None] | None = None,
            desc: str = "fine-tune") -> QATResult:
    """Fine-tune ``student`` in place by knowledge distillation from ``teacher`` (copied to the
    student's device, frozen): the loss, optimizer, warm-up and cosine schedule of ``config``,
    one pass over ``train_batches`` per epoch, the best validation state kept (see :func:`qat`).
    ``scales``: LSQ step sizes (learned at ``scale_lr`` and kept positive); every other
    parameter of ``student`` except frozen quantizer scales is trained at ``lr``. QAT and the
    float fine-tuning of a chosen subnet share this loop."""
    config = config or QATConfig()
    config.validate()
    qmodel = student
    device = _model_device(qmodel)
    teacher = copy.deepcopy(teacher).to(device).eval().requires_grad_(False)
    scales = list(scales)
    optimizer, weights = _distill_optimizer(qmodel, scales, config)
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    steps_per_epoch, total = _distill_steps(train_batches, config)
    amp = config.amp and device.type == "cuda"
    torch.manual_seed(config.seed)
    history: list[dict[str, float]] = []
    best: tuple[float, int, dict] | None = None  # (val accuracy, epoch, state) of the best so far
    if val_batches is not None:
        val = accuracy(qmodel, val_batches)
        history.append({"epoch": 0, "val": val})
        best = (val, 0, copy.deepcopy(qmodel.state_dict()))
    step, start = 0, time.perf_counter()
    for epoch in range(config.epochs):
        qmodel.train()
        loss_sum, n = torch.zeros((), device=device), 0
        bar = tqdm(total=steps_per_epoch, desc=f"{desc} epoch {epoch + 1}/{config.epochs}",
                   unit="step", disable=not progress, leave=False)
        for batch in train_batches:
            if config.max_steps is not None and step >= config.max_steps:
                break
            x, y = _batch(batch, device, config)
            if total:
                _set_lr(optimizer, base_lrs, step, total, config)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                with torch.no_grad():
                    t_out = teacher(x)
                loss = _kd_loss(qmodel(x), t_out, y, config)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip:
                nn.utils.clip_grad_norm_(weights, config.grad_clip)
            optimizer.step()
            if scales:  # LSQ step sizes stay positive
                with torch.no_grad():
                    torch._foreach_clamp_min_(scales, 1e-8)
            loss_sum, n, step = loss_sum + loss.detach(), n + 1, step + 1  # no sync per step
            bar.update(1)
        bar.close()
        best = _end_epoch(qmodel, epoch, config, loss_sum, n, val_batches, best, on_epoch,
                          history, progress, desc)
        if config.max_steps is not None and step >= config.max_steps:
            break
    kept = history[-1]["epoch"]
    if best is not None:
        kept = best[1]
        qmodel.load_state_dict(best[2])
    qmodel.eval()
    return QATResult(qmodel, time.perf_counter() - start, step, history, kept_epoch=int(kept))


def _end_epoch(qmodel: nn.Module, epoch: int, config: QATConfig, loss_sum: torch.Tensor, n: int,
               val_batches: Iterable | None, best: tuple[float, int, dict] | None,
               on_epoch: Callable | None, history: list[dict[str, float]], progress: bool,
               desc: str) -> tuple[float, int, dict] | None:
    """The epoch's record (mean loss, validation accuracy, ``on_epoch``'s figures) appended to
    ``history`` and shown; returns the best (val accuracy, epoch, state) so far."""
    qmodel.eval()
    if n == 0:
        raise UserError("QAT training data is empty; expected (inputs, labels) batches")
    record = {"epoch": epoch + 1, "loss": float(loss_sum) / n}
    if val_batches is not None:
        record["val"] = accuracy(qmodel, val_batches)
        if record["val"] > best[0]:
            best = (record["val"], epoch + 1, copy.deepcopy(qmodel.state_dict()))
    if on_epoch is not None:
        record.update(on_epoch(epoch + 1, qmodel) or {})
    history.append(record)
    if progress:
        shown = "".join(f" {k} {v:.4g}" for k, v in record.items() if k != "epoch")
        print(f"{desc} epoch {epoch + 1}/{config.epochs}:{shown}", file=sys.stderr, flush=True)
    return best
