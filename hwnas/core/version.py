"""``__version__``: the installed distribution's version, for the layers that record it (run
settings, ONNX metadata) without importing the package facade ``hwnas``."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("hwnas")
except PackageNotFoundError:  # imported from a source tree that was not installed
    __version__ = "0+unknown"
