"""Keep freed memory in the process for a while (glibc), so that large buffers are reused
instead of being mapped and page-faulted afresh.

PyTorch's CPU tensors come straight from ``malloc``. glibc serves blocks above its mmap
threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps them on ``free``, and returns the
top of the heap to the system once more than its trim threshold is free. A pass of a CIFAR-size
network over 64 images allocates activations of 10-150 MB per op, so every op maps and
page-faults new memory: in an export on this kind of machine a third of the CPU time was system
time and ~40 M minor faults (benchmarks/export_speed.md, Session 31). :func:`retained_heap` turns
both off for its body (every block from the heap, nothing trimmed), so freed activations are
reused as they are; the arithmetic is untouched. On exit it sets glibc's own maximum thresholds
(what its dynamic thresholds reach in such a process) and gives the free memory back
(``malloc_trim``). Elsewhere (musl, macOS, Windows) it does nothing. The cost is peak memory
(about +0.6 GB in a CIFAR-10 export, +1.8 GB in a CIFAR-10 search on the CPU):
``HWNAS_RETAIN_HEAP=0`` turns it off for a machine short of memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterator

__all__ = ["retain_freed_memory", "retained_heap", "supported"]

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
#: what is set on exit: glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64 bits, the ceiling of its
#: dynamic threshold, twice that to trim (its dynamic rule), and its default mmap count
_MMAP_THRESHOLD_AFTER = 32 * 1024 * 1024
_TRIM_THRESHOLD_AFTER = 2 * _MMAP_THRESHOLD_AFTER
_MMAP_MAX_AFTER = 65536
#: the environment variable that turns the setting off ("0")
ENV = "HWNAS_RETAIN_HEAP"
#: "never trim" for the body: the largest threshold mallopt's int can express (2 GiB)
_TRIM_NEVER = 2**31 - 1

_libc: ctypes.CDLL | None | bool = False  # False: not looked up yet
#: bodies of :func:`retained_heap` now open (only the outermost sets and restores glibc), and
#: whether :func:`retain_freed_memory` set it for the whole process (then nothing restores it)
_depth = 0
_forever = False
_lock = threading.Lock()


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has ``mallopt`` and ``malloc_trim``), else None."""
    global _libc
    if _libc is False:
        _libc = None
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") \
                    and hasattr(lib, "gnu_get_libc_version"):
                lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                lib.mallopt.restype = ctypes.c_int
                lib.malloc_trim.argtypes = [ctypes.c_size_t]
                lib.malloc_trim.restype = ctypes.c_int
                _libc = lib
        except OSError:
            pass
    return _libc or None


def supported() -> bool:
    """Whether this process's allocator can be told to keep freed memory (glibc)."""
    return _glibc() is not None


def _retain() -> bool:
    """Serve every block from the heap and never trim it; True when that took effect."""
    lib = _glibc()
    if lib is None or os.environ.get(ENV, "1").strip() == "0":
        return False
    return bool(lib.mallopt(_M_MMAP_MAX, 0)) and bool(lib.mallopt(_M_TRIM_THRESHOLD, _TRIM_NEVER))


def retain_freed_memory() -> bool:
    """Serve every block from the heap and never trim it, for the rest of the process (a worker
    process that only exports); True when it took effect."""
    global _forever
    with _lock:
        _forever = _forever or _retain()
        return _forever


@contextlib.contextmanager
def retained_heap() -> Iterator[bool]:
    """For the body, freed memory stays in the process and is reused (see the module
    docstring); yields whether that took effect. On exit, glibc's maximum dynamic thresholds
    are set and the free memory is returned to the system. Bodies nest (a PTQ inside a search):
    only the outermost sets and restores, and nothing restores what
    :func:`retain_freed_memory` set for the whole process."""
    global _depth
    with _lock:
        outer = _depth > 0 or _forever
        active = True if outer else _retain()
        if active:
            _depth += 1
    try:
        yield active
    finally:
        if active:
            with _lock:
                _depth -= 1
                if _depth == 0 and not _forever:
                    lib = _glibc()
                    lib.mallopt(_M_MMAP_MAX, _MMAP_MAX_AFTER)
                    lib.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_AFTER)
                    lib.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_AFTER)
                    lib.malloc_trim(0)
