"""hwnas: hardware-aware neural architecture search.

Subpackages, each importing only those listed before it: :mod:`hwnas.supernet` (search spaces,
supernets, data, training), :mod:`hwnas.latency` and :mod:`hwnas.quant` (devices and latency
predictors; quantization), :mod:`hwnas.search` (the multi-objective study and its run
directory), :mod:`hwnas.export` (ONNX files and the per-device recommendation), then the top
floor: this facade, :mod:`hwnas.api` and :mod:`hwnas.cli`. ARCHITECTURE.md has the map.

The notebook entry points are attributes here, imported on first use so that ``import hwnas``
stays light (no torch), and :class:`UserError`, what every bad input raises: :func:`load_run`
and :class:`Run` (a finished run: trials, fronts, models, latency, export, fine-tuning;
:mod:`hwnas.api`) and :mod:`search <hwnas.search>` (``hwnas.search.run``).
"""

from __future__ import annotations

from hwnas.core.errors import UserError
from hwnas.core.version import __version__

__all__ = ["Run", "UserError", "__version__", "load_run"]


def __getattr__(name: str):
    """The lazy facade: ``hwnas.load_run`` and ``hwnas.Run`` (:mod:`hwnas.api`, imported on
    first use)."""
    if name in ("load_run", "Run"):
        from hwnas import api

        return getattr(api, name)
    raise AttributeError(f"module 'hwnas' has no attribute {name!r}")
