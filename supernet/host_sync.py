"""Count the tensor reads that make the host wait for the device (``.item()``, ``.tolist()``,
``bool(t)``, ...), on any device, the CPU included: on CUDA each one is a synchronisation, so a
count taken on the CPU in CI says how many a GPU step would pay (``tests/test_train_host_syncs.py``,
``benchmarks/train_step_overhead.py``).
"""

from __future__ import annotations

import collections
import contextlib
import traceback
from collections.abc import Iterator

import torch

__all__ = ["SYNC_METHODS", "count_host_syncs"]

#: The ``torch.Tensor`` methods that copy a value to the host (a device synchronisation on CUDA).
SYNC_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")


@contextlib.contextmanager
def count_host_syncs(where: bool = False) -> Iterator[collections.Counter]:
    """Within the block, count calls of :data:`SYNC_METHODS` from Python; yields a Counter
    (method name -> calls; with ``where``, also ``(method, file, line)`` -> calls). Not
    thread-safe: the methods are patched on ``torch.Tensor`` for the block's duration."""
    counts: collections.Counter = collections.Counter()
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}

    def wrapped(name, original):
        def call(self, *args, **kwargs):
            counts[name] += 1
            if where:
                frame = traceback.extract_stack(limit=2)[0]
                counts[(name, frame.filename, frame.lineno)] += 1
            return original(self, *args, **kwargs)
        return call

    try:
        for name, original in saved.items():
            setattr(torch.Tensor, name, wrapped(name, original))
        yield counts
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)
