"""Cooperative yield points: long passes say "a good moment to pause" between chunks.

Work that runs for seconds (a parity pass over test images, PTQ's calibration and bias
correction, one layer at a time) calls :func:`yield_point` between chunks. It does nothing
unless a hook is installed; a parallel export installs its gate's pause there, so that a worker
waiting to time a model gets the machine within one chunk of every other worker's work, not
one stage. It lives at the bottom layer so that any package (quant, export) can offer yield
points without importing the one that pauses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

__all__ = ["install", "installed", "yield_point"]

_HOOK: Callable[[], None] | None = None


def install(hook: Callable[[], None] | None) -> Callable[[], None] | None:
    """Make ``hook`` what every yield point of this process calls (None: nothing); returns the
    hook it replaces."""
    global _HOOK
    previous, _HOOK = _HOOK, hook
    return previous


@contextlib.contextmanager
def installed(hook: Callable[[], None] | None) -> Iterator[None]:
    """``hook`` installed for the body, the previous one back afterwards."""
    previous = install(hook)
    try:
        yield
    finally:
        install(previous)


def yield_point() -> None:
    """Between two chunks of long work: run the installed hook (no-op without one)."""
    hook = _HOOK
    if hook is not None:
        hook()
