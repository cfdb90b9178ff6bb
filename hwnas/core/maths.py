"""Small statistics shared by every package (SciPy imported on first use)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hwnas.core.errors import UserError

__all__ = ["spearman"]


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (0.0 when either is constant).

    Examples:
        >>> from hwnas.latency import spearman
        >>> round(spearman([1, 2, 3, 4], [10, 20, 40, 30]), 3)
        0.8
    """
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise UserError(f"spearman needs two 1-d arrays of equal length >= 2, got shapes "
                        f"{a.shape} and {b.shape}")
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    return float(spearmanr(a, b)[0])
