"""hwnas: hardware-aware neural architecture search.

Subpackages, each importing only those listed before it: :mod:`hwnas.supernet` (search spaces,
supernets, data, training), :mod:`hwnas.latency` and :mod:`hwnas.quant` (devices and latency
predictors; quantization), :mod:`hwnas.search` (the multi-objective study and its run
directory), :mod:`hwnas.export` (ONNX files and the per-device recommendation), then
:mod:`hwnas.cli`. ARCHITECTURE.md has the map.

The notebook entry points are attributes here, imported on first use so that ``import hwnas``
stays light (no torch), and :class:`UserError`, what every bad input raises: :func:`load_run` (a finished run: trials, fronts, models, latency,
export; :mod:`hwnas.export.run_api`) and :mod:`search <hwnas.search>` (``hwnas.search.run``).
"""

from __future__ import annotations

from hwnas.core.errors import UserError
from hwnas.core.version import __version__

__all__ = ["UserError", "__version__", "load_run"]


def __getattr__(name: str):
    """The lazy facade (allowed by tests/test_import_direction.py): ``hwnas.load_run``."""
    if name == "load_run":
        from hwnas.export.run_api import load_run

        return load_run
    raise AttributeError(f"module 'hwnas' has no attribute {name!r}")
