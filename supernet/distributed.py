"""Data-parallel training over several processes (``torchrun``), without DDP's reducer.

Why not ``DistributedDataParallel``: a sandwich step runs several subnets forward and backward
before one optimizer step, each using a different subset of the supernet's parameters, and
DDP's reducer is built for one forward/backward per step over a fixed parameter set. Here the
gradients of the whole step are averaged once, in one flat all-reduce, just before the
optimizer step (:func:`all_reduce_gradients`): one collective per step, no graph traversal, and
correct for any subset of used parameters.

Every rank samples the same subnets (the subnet sampler is seeded identically on all ranks)
and takes a disjoint shard of each global batch (:func:`shard`), so W processes with a global
batch B follow the single-process schedule with batch B. Only rank 0 writes checkpoints and
logs. Launch with ``torchrun --nproc_per_node=N -m hwnas train ...``; the same code runs
single-process when ``WORLD_SIZE`` is unset.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

from hwnas.core.errors import UserError

if dist.is_available():
    # imported before any process group exists, on purpose: this module binds ``group.WORLD``
    # into its functions' default arguments when first imported (torch 2.13 imports it lazily,
    # with torch._dynamo, at the first optimizer). Imported after init_process_group, those
    # defaults hold the group for good: destroy_process_group cannot free it, gloo's worker
    # threads outlive main(), and one that drops its last finished work while the interpreter
    # shuts down needs the GIL and aborts ("terminate called without an active exception").
    import torch.distributed.nn.functional  # noqa: F401


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in a (possibly single-process) job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_from_env(device: str | None = None, *, backend: str | None = None,
                  timeout_s: float = 600.0) -> tuple[DistContext, torch.device]:
    """Join the process group that ``torchrun`` describes in the environment (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``), or return a
    single-process context when ``WORLD_SIZE`` is unset or 1.

    ``device``: ``"cuda"`` (one GPU per process, ``cuda:LOCAL_RANK``, backend NCCL), ``"cpu"``
    (backend gloo), or None for CUDA when available. Returns the context and this process's
    device.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    want_cuda = torch.cuda.is_available() if device is None else str(device).startswith("cuda")
    if want_cuda and not torch.cuda.is_available():
        raise UserError(f"device {device!r} asked for, but torch sees no CUDA device")
    if world <= 1:
        if want_cuda:
            return DistContext(), torch.device(device if device and ":" in str(device) else "cuda")
        return DistContext(), torch.device(device or "cpu")
    if want_cuda:
        if local >= torch.cuda.device_count():
            raise UserError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA devices")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if want_cuda else "gloo"),
                                timeout=datetime.timedelta(seconds=timeout_s))
    return DistContext(rank=rank, world_size=world, local_rank=local), dev


def shutdown(ctx: DistContext, *, ok: bool = True) -> None:
    """Leave the process group (a no-op for a single process).

    After a run that ended well, every rank waits at a barrier so that all leave together,
    then destroys the group, which frees it and joins gloo's worker threads here, while the
    interpreter is whole (see the import of ``torch.distributed.nn.functional`` above for what
    kept it alive and aborted a rank at exit now and then). After a failure there is no
    barrier (the other ranks may be stuck or gone) and the group is left as it is: the
    launcher ends the job.
    """
    if not (ctx.enabled and dist.is_initialized()):
        return
    if ok:
        dist.barrier()
        dist.destroy_process_group()


def shard(batch: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """This rank's contiguous share of a global batch (the batch size must divide evenly).
    BatchNorm statistics are then per shard, as with DDP without SyncBatchNorm."""
    if not ctx.enabled:
        return batch
    n = batch.shape[0] // ctx.world_size
    return batch[ctx.rank * n:(ctx.rank + 1) * n]


@torch.no_grad()
def all_reduce_gradients(params: Iterable[nn.Parameter], ctx: DistContext) -> None:
    """Average every parameter's gradient over the ranks in one flat all-reduce.

    Every parameter has a slot in the flat buffer (zeros where this rank has no gradient), so
    the collective has the same size on every rank whatever was used. A parameter without a
    gradient here keeps ``grad = None`` (the optimizer skips it, as in single-process
    training); since all ranks sample the same subnets, the set of such parameters is the same
    on every rank. No host-device synchronisation happens here.

    Why not DDP's reducer: with subnets (largest, smallest, random ones) it needs
    ``find_unused_parameters=True`` (a graph traversal after every forward), ``no_sync()``
    around all but the last backward, and it then still communicates once per backward.
    """
    if not ctx.enabled:
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                      for p in params])
    dist.all_reduce(flat)
    flat.div_(ctx.world_size)
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is not None:
            p.grad.copy_(flat[offset:offset + n].view_as(p))
        offset += n


@torch.no_grad()
def broadcast_state(module: nn.Module, ctx: DistContext, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers (BatchNorm statistics) to every rank."""
    if not ctx.enabled:
        return
    for t in [*module.parameters(), *module.buffers()]:
        dist.broadcast(t.data, src)


def agree(flag: bool, ctx: DistContext, device: torch.device, src: int = 0) -> bool:
    """Rank ``src``'s ``flag`` on every rank (e.g. "the time budget is spent: stop now"), so
    that all ranks stop at the same step."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.broadcast(t, src)
    return bool(t.item() > 0)


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()
