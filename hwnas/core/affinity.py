"""Pin every thread of this process to fixed cores for a while (a timing), then restore.

A latency timing that the scheduler migrates between cores mid-run picks up cold caches and
another core's load; a timing that runs alone (behind the export's gate) is steadier on a
fixed set of cores. :func:`pinned` sets the affinity of every thread of the process - those of
onnxruntime's and OpenVINO's pools included, which exist before the timing starts - to the
*last* ``cores`` cores it may use (core 0 usually takes the most interrupts and housekeeping)
and gives each thread its own affinity back afterwards. Where the platform has no
``sched_setaffinity`` (macOS, Windows) or refuses it, it does nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["free_cores", "pinned", "supported", "torch_thread_defaults"]


def supported() -> bool:
    """Whether this platform lets a process set its threads' CPU affinity."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def _thread_ids() -> list[int]:
    """Kernel ids of this process's threads (Linux); just the calling thread elsewhere."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return [0]


@contextlib.contextmanager
def pinned(cores: int | None) -> Iterator[frozenset[int] | None]:
    """Every thread pinned to the last ``cores`` allowed cores for the body (all of them when
    fewer are allowed); yields the set used, or None when nothing was pinned (``cores`` None,
    or an unsupported platform). On exit each thread gets its own affinity back; threads
    started meanwhile get the calling thread's."""
    if cores is None or not supported():
        yield None
        return
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be a positive integer or None, got {cores!r}")
    try:
        own = os.sched_getaffinity(0)
    except OSError:
        yield None
        return
    target = frozenset(sorted(own)[-cores:])
    saved: dict[int, set[int]] = {}
    for tid in _thread_ids():
        try:
            mask = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, target)
        except OSError:  # the thread ended meanwhile, or the platform refuses
            continue
        saved[tid] = mask
    try:
        yield target
    finally:
        for tid in set(_thread_ids()) | set(saved):
            try:
                os.sched_setaffinity(tid, saved.get(tid, own))
            except OSError:
                continue


#: libgomp's spins at a barrier before a thread sleeps: as fast as spinning on a quiet machine,
#: as robust as sleeping on a busy one (benchmarks/contention.md)
SPIN_COUNT = 10_000


def free_cores() -> int:
    """The cores this process may use (its affinity) that other work is not using now: the
    machine's cores less its 1-minute load average, at least 1."""
    allowed = len(os.sched_getaffinity(0)) if supported() else (os.cpu_count() or 1)
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # no load average on this platform
        load = 0.0
    return max(1, min(allowed, int((os.cpu_count() or allowed) - load + 0.5)))


def torch_thread_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What a command that trains or evaluates with torch sets before torch starts, where the
    user set nothing: one OpenMP thread per free core (:func:`free_cores`), threads that sleep
    while they wait (``OMP_WAIT_POLICY=PASSIVE``) after a short spin (``GOMP_SPINCOUNT=10000``,
    libgomp's, which torch's Linux wheels use). On a busy machine, threads spinning at every
    barrier made training about 10x slower than one thread; on a quiet one, sleeping at once
    was 1.5x slower than spinning, the short spin as fast (benchmarks/contention.md). Returns
    what it set; a variable the user set wins (either wait setting keeps both as they are)."""
    environ = os.environ if environ is None else environ
    chosen = {}
    if "OMP_NUM_THREADS" not in environ:
        chosen["OMP_NUM_THREADS"] = str(free_cores())
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        chosen["OMP_WAIT_POLICY"] = "PASSIVE"
        chosen["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    environ.update(chosen)
    return chosen
