"""hwnas: hardware-aware neural architecture search.

Subpackages, each importing only those listed before it: :mod:`hwnas.supernet` (search spaces,
supernets, data, training), :mod:`hwnas.latency` and :mod:`hwnas.quant` (devices and latency
predictors; quantization), :mod:`hwnas.search` (the multi-objective study and its run
directory), :mod:`hwnas.export` (ONNX files and the per-device recommendation), then
:mod:`hwnas.cli`. ARCHITECTURE.md has the map.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hwnas")
except PackageNotFoundError:  # imported from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
