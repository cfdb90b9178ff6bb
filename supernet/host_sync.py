"""Count the tensor reads that make the host wait for the device (``.item()``, ``.tolist()``,
``bool(t)``, ...), on any device, the CPU included: on CUDA each one is a synchronisation, so a
count taken on the CPU in CI says how many a GPU step would pay (``tests/test_train_host_syncs.py``,
``benchmarks/train_step_overhead.py``). A blocking copy from the host to another device
(``t.to("cuda")`` of a CPU tensor) also waits: PyTorch synchronises the stream after it, so
:func:`to_device` moves the small per-batch random tensors without that wait.
"""

from __future__ import annotations

import collections
import contextlib
import traceback
from collections.abc import Iterator

import torch

__all__ = ["SYNC_METHODS", "count_host_syncs", "to_device"]

#: The ``torch.Tensor`` methods that copy a value to the host (a device synchronisation on CUDA).
SYNC_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")


@contextlib.contextmanager
def count_host_syncs(where: bool = False) -> Iterator[collections.Counter]:
    """Within the block, count calls of :data:`SYNC_METHODS` from Python (``.cpu()`` only of a
    tensor not on the host) and blocking host to
    device copies (``"to(device)"``: a CPU tensor's ``.to`` onto another device without
    ``non_blocking``; the ``meta`` device shows them on a CPU-only machine); yields a Counter
    (name -> calls; with ``where``, also ``(name, file, line)`` -> calls). Not thread-safe: the
    methods are patched on ``torch.Tensor`` for the block's duration."""
    counts: collections.Counter = collections.Counter()
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS + ("to",)}

    def count(name):
        counts[name] += 1
        if where:
            frame = traceback.extract_stack(limit=3)[0]
            counts[(name, frame.filename, frame.lineno)] += 1

    def wrapped(name, original):
        def call(self, *args, **kwargs):
            if name != "cpu" or self.device.type != "cpu":  # .cpu() of a host tensor: a no-op
                count(name)
            return original(self, *args, **kwargs)
        return call

    def moved(self, *args, **kwargs):
        out = saved["to"](self, *args, **kwargs)
        if (self.device.type == "cpu" and out.device.type != "cpu"
                and not kwargs.get("non_blocking", False)):
            count("to(device)")
        return out

    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, wrapped(name, saved[name]))
        torch.Tensor.to = moved
        yield counts
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; from the host without the stream synchronisation a blocking copy
    costs on CUDA. A CPU tensor bound for CUDA is first put in pinned memory (PyTorch's caching
    host allocator, which keeps the block until the copy is done), so the copy is a true
    asynchronous one: a copy from pageable memory may wait for the stream."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
