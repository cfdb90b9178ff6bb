"""A one-line description of the machine a measurement or benchmark ran on (no torch)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 ``flags`` or Arm ``Features`` of /proc/cpuinfo); empty
    where the file is absent."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def describe_machine(extra: str = "") -> str:
    """``"<CPU model>, <N> threads[, extra]"`` for the ``machine`` key of benchmark JSON."""
    text = f"{cpu_model()}, {os.cpu_count()} threads"
    return f"{text}, {extra}" if extra else text
