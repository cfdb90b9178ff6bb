"""What the screening surrogate sees of a candidate (``ScreeningConfig.surrogate_features``).

``"encoding"`` is the space's own encoding (:meth:`SearchSpace.encode`; for NAS-Bench-201 one
operation one-hot per edge, so the GP kernel is an exponentiated Hamming distance). Two things
it misses, which decide the ranking of cells of one latency level:

* **dead code**: an edge whose output reaches the cell output by no path changes nothing the
  network computes, yet counts as a difference; ``"executed"`` encodes the architecture a
  dead-code-eliminating runtime runs instead (:meth:`SearchSpace.executed` under the space's
  first variant other than ``raw``; the encoding itself where the space has none), so cells
  that compute the same function are one point to the kernel;
* **which operations, wherever they are**: ``"counts"`` appends how often each parameter value
  occurs in the candidate (``to_params``; for NAS-Bench-201 the number of 3x3 convolutions,
  1x1 convolutions, pools, skips and ``none`` edges) in units of one occurrence, so that cells
  with the same operations on other edges are near; ``"executed_counts"`` does both (the
  counts of the executed architecture).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["FEATURE_SETS", "SurrogateEncoder", "count_values", "executed_archs",
           "surrogate_features"]

#: the feature sets of :func:`surrogate_features`
FEATURE_SETS = ("encoding", "executed", "counts", "executed_counts")


def executed_archs(space: Any, archs: Sequence[Any]) -> list[Any]:
    """``archs`` as a dead-code-eliminating runtime runs them: :meth:`executed` under the
    space's first execution variant other than ``raw``; unchanged where there is none."""
    variants = [v for v in getattr(space, "execution_variants", lambda: ("raw",))()
                if v != "raw"]
    if not variants:
        return list(archs)
    return [space.executed(a, variants[0])[0] for a in archs]


def count_values(space: Any, archs: Sequence[Any], values: Sequence[str] | None = None
                 ) -> tuple[np.ndarray, list[str]]:
    """How often each parameter value (as text) occurs in each candidate's ``to_params``,
    over ``values`` (default: every value seen in ``archs``, sorted), and those values."""
    params = [[str(v) for v in space.to_params(a).values()] for a in archs]
    if values is None:
        values = sorted({v for p in params for v in p})
    col = {v: i for i, v in enumerate(values)}
    out = np.zeros((len(archs), len(values)))
    for r, p in enumerate(params):
        for v in p:
            if v in col:
                out[r, col[v]] += 1.0
    return out, list(values)


def surrogate_features(space: Any, archs: Sequence[Any], name: str,
                       values: Sequence[str] | None = None
                       ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The raw encodings of ``archs`` under feature set ``name`` (to be scaled by the caller,
    as the space's encoding is), the value counts to append unscaled (``N x 0`` without) and
    their values (see the module docstring). ``values``: the count columns (default: those
    seen in ``archs``; pass the first call's to keep the columns of later ones)."""
    if name not in FEATURE_SETS:
        raise ValueError(f"surrogate features {name!r}; expected one of {FEATURE_SETS}")
    run = executed_archs(space, archs) if name.startswith("executed") else list(archs)
    enc = np.stack([np.asarray(space.encode(a), dtype=np.float64) for a in run])
    if not name.endswith("counts"):
        return enc, np.zeros((len(run), 0)), []
    counts, values = count_values(space, run, values)
    return enc, counts, values


class SurrogateEncoder:
    """The screening surrogate's inputs for feature set ``name``: the encodings scaled to
    [0, 1] by the first call's range (the first pool's), then the value counts, unscaled, over
    the first call's count columns."""

    def __init__(self, space: Any, name: str) -> None:
        self.space, self.name = space, name
        self._scale: tuple[np.ndarray, np.ndarray] | None = None
        self._values: list[str] | None = None

    def __call__(self, archs: Sequence[Any]) -> np.ndarray:
        enc, counts, self._values = surrogate_features(self.space, archs, self.name,
                                                       self._values)
        if self._scale is None:
            lo, hi = enc.min(0), enc.max(0)
            self._scale = (lo, np.where(hi - lo > 1e-12, hi - lo, 1.0))
        lo, span = self._scale
        return np.hstack([(enc - lo) / span, counts])
