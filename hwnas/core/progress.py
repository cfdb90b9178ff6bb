"""A progress bar without a hard tqdm dependency: tqdm when installed, else a plain line on
stderr every 30 s."""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["PrintProgress", "progress_bar"]


class PrintProgress:
    """A minimal stand-in for tqdm (used where tqdm is not installed): a line every 30 s."""

    def __init__(self, total: int, desc: str, disable: bool, initial: int = 0) -> None:
        self.total, self.desc, self.disable, self.n = total, desc, disable, initial
        self.postfix: dict[str, Any] = {}
        self._last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if not self.disable and (now - self._last >= 30.0 or self.n == self.total):
            self._last = now
            extra = " ".join(f"{k}={v}" for k, v in self.postfix.items())
            print(f"{self.desc}: {self.n}/{self.total} steps ({100.0 * self.n / max(1, self.total):.0f}%) "
                  f"{extra}", file=sys.stderr, flush=True)

    def set_postfix(self, **kwargs: Any) -> None:
        self.postfix = kwargs

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, disable: bool, initial: int = 0):
    """tqdm when installed, else a plain periodic line on stderr."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return PrintProgress(total, desc, disable, initial)
    return tqdm(total=total, initial=initial, desc=desc, unit="step", disable=disable, leave=False)
