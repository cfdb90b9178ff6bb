"""Exporting several models in parallel processes without disturbing their timings.

Building, calibrating and verifying a model is CPU work that parallelises across models; the
paired latency timings (the int8-vs-float choice, the per-device recommendation) must not
share the machine with anything. :class:`TimingGate` lets worker processes compute side by
side and gives a timing the machine alone: a worker that wants to time (:func:`timing_slot`)
waits until every other worker has reached a yield point (:func:`hwnas.core.cooperate.yield_point`,
which long passes call between chunks of images or layers, and :func:`checkpoint` at each stage
boundary), where they wait until the timing is over; a timing thus starts within one chunk of
the others' work. In a process without a gate (the sequential export, a user's
``export_model`` call) both are no-ops.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from hwnas.latency.onnx_measure import prime_openvino

from hwnas.core import affinity, cooperate

__all__ = ["TimingGate", "auto_workers", "checkpoint", "install_gate", "timing_slot",
           "worker_cores"]

_GATE: TimingGate | None = None
_CORES: int | None = None


class TimingGate:
    """A cooperative readers-writer gate shared by processes of one multiprocessing context:
    any number of workers *compute* at once; a *timing* runs only when no worker computes, and
    a waiting timing holds new computation back so that it is not starved."""

    def __init__(self, ctx: Any) -> None:
        self.cond = ctx.Condition()
        self.active = ctx.RawValue("i", 0)  # workers computing; guarded by cond
        self.waiting = ctx.RawValue("i", 0)  # timings waiting for the machine
        self.timing = ctx.RawValue("i", 0)  # 1 while a timing runs
        self.held = ctx.RawValue("d", 0.0)  # seconds timings have held the machine, in all
        self.waited = ctx.RawValue("d", 0.0)  # seconds timings waited for it, in all
        self._local = threading.local()  # per worker (process, or thread in tests): computing?

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_local"]  # a worker's own state does not travel to another process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    @property
    def _computing(self) -> bool:
        return getattr(self._local, "computing", False)

    def enter(self) -> None:
        """Start computing (waits while a timing runs or waits)."""
        with self.cond:
            self.cond.wait_for(lambda: not self.timing.value and not self.waiting.value)
            self.active.value += 1
        self._local.computing = True

    def leave(self) -> None:
        """Stop computing."""
        self._local.computing = False
        with self.cond:
            self.active.value -= 1
            self.cond.notify_all()

    def pause_if_wanted(self) -> None:
        """At a yield point: let a waiting timing run first. Only while this worker computes
        (a yield point inside a timing, or outside any work, leaves the counts alone)."""
        if self.waiting.value and self._computing:
            self.leave()
            self.enter()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Run the body with no other worker computing or timing (the caller computes)."""
        self.leave()
        asked = time.perf_counter()
        with self.cond:
            self.waiting.value += 1
            self.cond.wait_for(lambda: not self.timing.value and self.active.value == 0)
            self.waiting.value -= 1
            self.timing.value = 1
            start = time.perf_counter()
            self.waited.value += start - asked
        try:
            yield
        finally:
            with self.cond:
                self.timing.value = 0
                self.held.value += time.perf_counter() - start
                self.cond.notify_all()
            self.enter()

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """One unit of work (a model) of a worker."""
        self.enter()
        try:
            yield
        finally:
            self.leave()


def install_gate(gate: TimingGate | None, cores: int | None = None) -> None:
    """Make ``gate`` this process's gate (a worker's initializer calls it); its pause becomes
    what every yield point of the process calls. ``cores``: the worker's share of the machine
    (:func:`worker_cores`)."""
    global _GATE, _CORES
    _GATE, _CORES = gate, cores
    cooperate.install(None if gate is None else gate.pause_if_wanted)


def worker_cores() -> int | None:
    """The cores this worker process may use: the machine's, shared among the export's workers
    (:func:`auto_workers` gives each two); None outside a parallel export."""
    return _CORES


@contextlib.contextmanager
def timing_slot(cores: int | None = None) -> Iterator[None]:
    """The machine to this process alone for a timing (no gate: nothing to wait for), its
    threads pinned to ``cores`` fixed cores meanwhile (:func:`hwnas.core.affinity.pinned`;
    None: not pinned), so that the timing does not migrate between cores. OpenVINO is primed
    first (:func:`hwnas.latency.onnx_measure.prime_openvino`): a pin must not become its
    lasting view of the machine."""
    if cores is not None:
        prime_openvino()
    gate = _GATE.exclusive() if _GATE is not None else contextlib.nullcontext()
    with gate, affinity.pinned(cores):
        yield


def checkpoint() -> None:
    """A stage boundary: a timing another worker waits for runs now (no-op without a gate)."""
    cooperate.yield_point()


def auto_workers(models: int, requested: int = 0, cores: int | None = None) -> int:
    """How many processes export ``models`` models: ``requested`` when given (>= 1), else one
    per two cores, at most 8; never more than there are models, and 1 below four cores (the
    start-up of a worker costs more than it saves there)."""
    if requested >= 1:
        return max(1, min(requested, models))
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if cores < 4:
        return 1
    return max(1, min(models, cores // 2, 8))
