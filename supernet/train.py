"""Supernet training with the sandwich rule and in-place distillation.

Each step trains the largest subnet on the labels, then the smallest and ``num_random`` random
subnets on the largest one's soft predictions (in-place knowledge distillation, as in BigNAS /
Once-for-All), accumulating the gradients of all of them into one optimizer step. The schedule
is data: a list of :class:`TrainStage`, so progressive shrinking or delayed shrinking are
further stage lists rather than new code paths.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from supernet.data import BatchLoader, DatasetSplits
from supernet.errors import UserError
from supernet.space import SearchSpace


@dataclass
class TrainStage:
    """One phase of the schedule.

    ``sandwich``: also train the smallest subnet and ``num_random`` random ones each step
    (otherwise only the largest, e.g. a warm-up of the full network before shrinking starts).
    """

    name: str
    epochs: int
    sandwich: bool = True
    num_random: int = 2
    distill: bool = True


@dataclass
class TrainConfig:
    stages: list[TrainStage] = field(default_factory=lambda: [TrainStage("sandwich", 20)])
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    warmup_epochs: float = 1.0
    grad_clip: float = 5.0
    seed: int = 0

    @property
    def epochs(self) -> int:
        return sum(s.epochs for s in self.stages)

    def validate(self) -> None:
        if not self.stages or any(s.epochs < 0 for s in self.stages) or self.epochs <= 0:
            raise UserError(f"training needs a positive number of epochs, got {self.epochs}")
        if self.batch_size <= 0:
            raise UserError(f"batch size must be positive, got {self.batch_size}")
        if self.lr <= 0:
            raise UserError(f"learning rate must be positive, got {self.lr}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        d = dict(d)
        d["stages"] = [TrainStage(**s) for s in d.get("stages", [])]
        return cls(**d)


def sandwich_config(epochs: int, **kwargs: Any) -> TrainConfig:
    """The default schedule: one sandwich stage of ``epochs`` epochs."""
    return TrainConfig(stages=[TrainStage("sandwich", epochs)], **kwargs)


def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    return -(target_probs * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


@dataclass
class TrainResult:
    epochs: int
    seconds: float
    images_per_s: float
    history: list[dict[str, float]]


def train_supernet(
    supernet: nn.Module,
    space: SearchSpace,
    data: DatasetSplits,
    config: TrainConfig,
    *,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> TrainResult:
    """Train ``supernet`` in place following ``config``; returns timing and per-epoch losses."""
    config.validate()
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    supernet.to(device).train()
    loader = BatchLoader(data.train, batch_size=config.batch_size, mean=data.mean, std=data.std,
                         shuffle=True, augment=data.augment, seed=config.seed, device=device,
                         drop_last=len(data.train) > config.batch_size)
    steps_per_epoch = len(loader)
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = int(config.warmup_epochs * steps_per_epoch)
    decay, no_decay = [], []
    for name, p in supernet.named_parameters():
        (no_decay if p.ndim <= 1 or "transforms" in name else decay).append(p)
    optimizer = torch.optim.SGD(
        [{"params": decay, "weight_decay": config.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, momentum=config.momentum, nesterov=True,
    )

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return config.lr * (step + 1) / warmup_steps
        t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * config.lr * (1 + math.cos(math.pi * t))

    largest, smallest = space.largest(), space.smallest()
    history: list[dict[str, float]] = []
    step, images, start = 0, 0, time.perf_counter()
    bar = tqdm(total=total_steps, desc="train supernet", unit="step", disable=not progress,
               leave=False)
    for stage in config.stages:
        for epoch in range(stage.epochs):
            sums = {"loss_largest": 0.0, "loss_sub": 0.0}
            for x, y in loader:
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(step)
                optimizer.zero_grad(set_to_none=True)
                supernet.set_active(largest)
                logits = supernet(x)
                loss = F.cross_entropy(logits, y, label_smoothing=config.label_smoothing)
                loss.backward()
                sums["loss_largest"] += loss.item()
                if stage.sandwich:
                    soft = F.softmax(logits.detach(), dim=1)
                    subnets = [smallest] + [space.sample(rng) for _ in range(stage.num_random)]
                    for arch in subnets:
                        supernet.set_active(arch)
                        out = supernet(x)
                        if stage.distill:
                            sub_loss = soft_cross_entropy(out, soft)
                        else:
                            sub_loss = F.cross_entropy(out, y, label_smoothing=config.label_smoothing)
                        sub_loss.backward()
                        sums["loss_sub"] += sub_loss.item() / len(subnets)
                if config.grad_clip:
                    nn.utils.clip_grad_norm_(supernet.parameters(), config.grad_clip)
                optimizer.step()
                step += 1
                images += x.size(0)
                bar.update(1)
                bar.set_postfix(stage=stage.name, loss=f"{loss.item():.3f}")
            history.append({"stage": stage.name, "epoch": len(history) + 1,
                            **{k: v / steps_per_epoch for k, v in sums.items()}})
    bar.close()
    supernet.set_active(largest)
    seconds = time.perf_counter() - start
    return TrainResult(config.epochs, seconds, images / max(seconds, 1e-9), history)


# -- checkpoints -----------------------------------------------------------------------------------

def save_checkpoint(path: str | Path, supernet: nn.Module, space: SearchSpace, *,
                    dataset: str, train_config: TrainConfig | None = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Save the supernet's weights with everything needed to rebuild it (written atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": "hwnas-supernet-1",
        "space": space.name,
        "space_config": space.config(),
        "dataset": dataset,
        "train_config": train_config.to_dict() if train_config else None,
        "extra": extra or {},
        "state_dict": {k: v.detach().cpu() for k, v in supernet.state_dict().items()},
    }
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu"):
    """Load a supernet checkpoint; returns (space, supernet, payload)."""
    from supernet.spaces import get_space

    path = Path(path)
    if not path.is_file():
        raise UserError(f"supernet checkpoint {path} does not exist; expected a file written by "
                        f"'hwnas train' or 'hwnas run'")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a corrupt or foreign file
        raise UserError(f"cannot read supernet checkpoint {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(payload, dict) or payload.get("format") != "hwnas-supernet-1":
        raise UserError(f"{path} is not an hwnas supernet checkpoint (no 'hwnas-supernet-1' format tag)")
    space = get_space(payload["space"], config=payload["space_config"])
    supernet = space.build_supernet()
    try:
        supernet.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        raise UserError(f"checkpoint {path} does not match space {space.name}: "
                        f"{str(exc).splitlines()[0]}") from None
    return space, supernet.to(device), payload


def history_json(result: TrainResult) -> str:
    return json.dumps(asdict(result), indent=1)
