"""Roll training back over a stretch of steps whose gradients went non-finite.

Why: one overflowing step (a loss spike under bf16 autocast, a too-high learning rate) turns
every weight into NaN through the optimizer, and a long run then goes on training NaN for
hours and saves it. The guard keeps the running maximum of the gradient norm on the device (no
per-step host synchronisation) and, every ``every`` steps, reads it once: finite, the current
weights and optimizer state become the snapshot; not finite, they are restored from it, the
stretch's batches are skipped, and training goes on, as a loss scaler skips an overflowing step.
Gradients are averaged over processes before the norm, so every process decides the same.
After ``max_rollbacks`` roll-backs the run stops with :class:`UserError` (the weights are the last
finite ones) instead of looping on a learning rate that keeps diverging.
"""

from __future__ import annotations

import torch
from torch import nn

from hwnas.core.errors import UserError

__all__ = ["DivergenceGuard"]


class DivergenceGuard:
    """Snapshot / roll-back of a model and its optimizer around non-finite gradient norms."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 every: int = 25, max_rollbacks: int = 3) -> None:
        if every < 1 or max_rollbacks < 0:
            raise ValueError("every must be >= 1 and max_rollbacks >= 0")
        self.model, self.optimizer = model, optimizer
        self.every, self.max_rollbacks = every, max_rollbacks
        self.rollbacks: list[dict[str, float | int]] = []
        self._worst = torch.zeros((), dtype=torch.float32, device=device)
        self._model_snap: list[torch.Tensor] = []
        self._opt_snap: dict[int, dict] = {}
        self.snapshot_step = -1
        self.extra: object = None

    def observe(self, grad_norm: torch.Tensor) -> None:
        """Fold one step's total gradient norm into the stretch's maximum (NaN and inf stay)."""
        self._worst = torch.maximum(self._worst, grad_norm.detach().float())

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def snapshot(self, step: int, extra: object = None) -> None:
        """Make the current state (and ``extra``, e.g. the epoch's loss sums) the roll-back point.
        The copies go into the previous snapshot's buffers where the tensors match, with one
        multi-tensor copy (a few launches on a GPU instead of one or more per tensor)."""
        tensors = list(self.model.state_dict().values())
        self._model_snap = _copy_into(self._model_snap, tensors)
        snap: dict[int, dict] = {}
        for p, state in self.optimizer.state.items():
            old = self._opt_snap.get(id(p), {})
            snap[id(p)] = {k: old.get(k) if torch.is_tensor(v) else v for k, v in state.items()}
        pairs = [(snap[id(p)], k, v) for p, state in self.optimizer.state.items()
                 for k, v in state.items() if torch.is_tensor(v)]
        copied = _copy_into([s[k] for s, k, _ in pairs], [v for _, _, v in pairs])
        for (s, k, _), c in zip(pairs, copied):
            s[k] = c
        self._opt_snap = snap
        self.snapshot_step, self.extra = step, extra

    def check(self, step: int, epoch: int, lr: float, extra: object = None) -> bool:
        """Read the stretch since the last check (one host synchronisation). True: it was finite
        and a new snapshot is taken (with ``extra``). False: the state was rolled back to the
        snapshot (the caller restores its ``extra``). :class:`UserError` once the roll-backs
        exceed ``max_rollbacks``."""
        finite = bool(torch.isfinite(self._worst))
        self._worst.zero_()
        if finite:
            self.snapshot(step, extra)
            return True
        if self.snapshot_step < 0:
            raise RuntimeError("DivergenceGuard.check before the first snapshot")
        self._restore()
        self.rollbacks.append({"step": step, "epoch": epoch, "back_to": self.snapshot_step,
                               "lr": lr})
        if len(self.rollbacks) > self.max_rollbacks:
            raise UserError(
                f"training diverged: the gradients went non-finite {len(self.rollbacks)} times "
                f"(last between steps {self.snapshot_step} and {step}, epoch {epoch + 1}, "
                f"learning rate {lr:.3g}); train again with a lower --lr (or a smaller "
                f"--grad-clip)")
        return False

    def _restore(self) -> None:
        with torch.no_grad():
            for saved, t in zip(self._model_snap, self.model.state_dict().values()):
                t.copy_(saved)
            for p, state in self.optimizer.state.items():  # state begun since: starts again
                saved = self._opt_snap.get(id(p), {})
                state.clear()
                state.update({k: v.clone() if torch.is_tensor(v) else v for k, v in saved.items()})


def _copy_into(saved: list, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Detached copies of ``tensors``: written into ``saved``'s tensors (one ``_foreach_copy_`` per
    device and dtype) where each has the same shape, dtype and device, else fresh clones."""
    out = list(saved) if len(saved) == len(tensors) else [None] * len(tensors)
    reuse = [i for i, (s, t) in enumerate(zip(out, tensors))
             if s is not None and s.shape == t.shape and s.dtype == t.dtype
             and s.device == t.device]
    groups: dict[tuple, list[int]] = {}  # the multi-tensor kernel wants one device and dtype
    for i in reuse:
        groups.setdefault((tensors[i].device, tensors[i].dtype), []).append(i)
    with torch.no_grad():
        for group in groups.values():
            torch._foreach_copy_([out[i] for i in group], [tensors[i].detach() for i in group])
    fresh = set(range(len(tensors))) - set(reuse)
    for i in fresh:
        out[i] = tensors[i].detach().clone()
    return out
