"""hwnas.core.heap: freed memory is reused inside retained_heap (fewer page faults), and the
allocator is set back on exit."""

import ctypes
import resource

import pytest

from hwnas.core import heap

pytestmark = pytest.mark.skipif(not heap.supported(), reason="needs glibc (mallopt)")

SIZE = 64 * 1024 * 1024  # above glibc's largest mmap threshold (32 MiB): mapped afresh by default


def _faults(rounds: int) -> int:
    """Minor page faults of ``rounds`` malloc + touch + free cycles of SIZE bytes."""
    libc = heap._glibc()
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        p = libc.malloc(SIZE)
        assert p
        ctypes.memset(p, 1, SIZE)
        libc.free(p)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_retained_heap_reuses_freed_blocks_and_restores():
    pages = SIZE // resource.getpagesize()
    plain = _faults(4)
    assert plain >= 3 * pages  # each cycle maps and faults its block afresh
    with heap.retained_heap() as active:
        assert active
        _faults(1)  # the heap grows once
        kept = _faults(4)
    assert kept < pages // 2  # then the same block is reused: hardly a fault
    assert _faults(4) >= 3 * pages  # after the body: blocks this size are mapped again


def test_switched_off_by_the_environment(monkeypatch):
    """HWNAS_RETAIN_HEAP=0 (a machine short of memory): nothing is retained, blocks are mapped
    afresh inside the body too."""
    monkeypatch.setenv(heap.ENV, "0")
    pages = SIZE // resource.getpagesize()
    with heap.retained_heap() as active:
        assert not active
        assert _faults(4) >= 3 * pages
    assert not heap.retain_freed_memory()


def test_bodies_nest_and_only_the_outermost_restores():
    """A PTQ's body inside a search's: leaving the inner one keeps the outer one's setting."""
    pages = SIZE // resource.getpagesize()
    with heap.retained_heap() as outer:
        assert outer
        with heap.retained_heap() as inner:
            assert inner
            _faults(1)
        assert heap._depth == 1
        assert _faults(4) < pages // 2  # still retained after the inner body
    assert heap._depth == 0
    assert _faults(4) >= 3 * pages  # restored by the outermost
