"""Score few-shot latency predictors on a device of a latency table: Spearman vs measurements.

A latency table (:mod:`hwnas.latency.tables`) holds the true latency of many architectures on a
device; this module plays "a new device" with it: pick the ``n`` architectures a user would
measure, adapt a predictor to their latencies, predict every architecture of the table and
score the ranking with Spearman's rho. It is the protocol of ``benchmarks/latency_fewshot.py``
(its ``all`` score) as a library, so that notebooks and user code can draw the curves without
copying the benchmark's loop:

* which architectures are measured (:func:`choose_measurements`): a predictor with reference
  architectures (the meta predictor) measures its first ``n`` of them, the others ``n`` drawn
  at random with the seed from ``pool_rows`` (the first ``n`` of one seeded permutation, so the
  5-measurement sample contains the 2-measurement one, and every predictor gets the same rows);
  ``reference=False`` makes the meta predictor use the random rows too (the benchmark's
  ``meta[random]`` ablation);
* :func:`fewshot_scores`: every predictor × number of measurements × seed, as
  :class:`FewShotScore` records.

Importing this module needs numpy only (scipy is imported to compute Spearman's rho).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hwnas.latency.predictors import available_predictors, get_predictor
from hwnas.latency.predictors.base import LatencyPredictor
from hwnas.latency.tables import LatencyTable

from hwnas.core.errors import UserError
from hwnas.core.maths import spearman

__all__ = ["FewShotScore", "choose_measurements", "fewshot_scores", "spearman"]

#: Offset of the seeds of the random measurement draw (the benchmark's, so numbers match).
SEED_OFFSET = 10_000


@dataclass(frozen=True)
class FewShotScore:
    """One adaptation of one predictor: ``spearman`` between its predictions and the table's
    latencies on ``device`` after ``n_measurements`` measurements drawn with ``seed``.
    ``predictor`` is the registry name, with ``[random]`` appended when a predictor that has
    reference architectures was adapted on random ones instead."""

    predictor: str
    device: str
    n_measurements: int
    seed: int
    spearman: float
    adapt_seconds: float


def _uses_reference(predictor: LatencyPredictor, reference: bool) -> bool:
    return reference and bool(predictor.reference_archs)


def choose_measurements(predictor: LatencyPredictor, table: LatencyTable, n: int, *, seed: int,
                        pool_rows: Sequence[int] | np.ndarray | None = None,
                        reference: bool = True) -> np.ndarray:
    """Rows of ``table`` to measure on the new device before adapting ``predictor``.

    With ``reference`` and a predictor that has reference architectures: the rows of its first
    ``n`` (a :class:`UserError` when it has fewer than ``n`` or the table lacks one). Otherwise
    the first ``n`` of a permutation of ``pool_rows`` (default: every row) seeded with
    ``SEED_OFFSET + seed``.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise UserError(f"number of measurements must be a positive integer, got {n!r}")
    if _uses_reference(predictor, reference):
        refs = predictor.reference_archs
        if len(refs) < n:
            raise UserError(f"the {predictor.name} predictor has {len(refs)} reference "
                            f"architectures; cannot measure {n} of them (use reference=False)")
        return table.rows(refs[:n])
    pool = np.arange(len(table)) if pool_rows is None else np.asarray(pool_rows, dtype=np.int64)
    if pool.ndim != 1 or (len(pool) and (pool.min() < 0 or pool.max() >= len(table))):
        raise UserError(f"pool_rows must be row indices of the table (0..{len(table) - 1})")
    if len(pool) < n:
        raise UserError(f"cannot draw {n} measurements from a pool of {len(pool)} architectures")
    return np.random.default_rng(SEED_OFFSET + int(seed)).permutation(pool)[:n]


def fewshot_scores(space: Any, table: LatencyTable, device: str, *,
                   predictors: Sequence[str] = ("flops", "lut", "mlp", "meta"),
                   ns: Sequence[int] = (2, 5, 10, 20), seeds: int = 3,
                   pool_rows: Sequence[int] | np.ndarray | None = None,
                   eval_rows: Sequence[int] | np.ndarray | None = None,
                   reference: bool = True, progress: bool = False) -> list[FewShotScore]:
    """Adapt each predictor (a fresh :func:`~latency.predictors.get_predictor` of ``space``:
    the shipped meta-trained one for ``meta``) to ``n`` measurements of ``device`` for each
    ``n`` in ``ns`` and each seed in ``range(seeds)``, and score its predictions over
    ``eval_rows`` (default: every architecture of the table) with :func:`spearman`.

    Combinations that cannot run are left out, as in the benchmark: ``n`` below the
    predictor's ``min_samples``, or more reference architectures than the predictor has (or
    one the table lacks). A predictor measured on its reference architectures gives the same
    score for every seed (its measurements do not depend on the seed).
    """
    table.check_devices([device])
    unknown = [p for p in predictors if p not in available_predictors()]
    if unknown or not predictors:
        raise UserError(f"unknown latency predictor {unknown[0] if unknown else None!r}; "
                        f"expected some of {available_predictors()}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise UserError(f"seeds must be a positive integer, got {seeds!r}")
    for n in ns:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise UserError(f"number of measurements must be a positive integer, got {n!r}")
    y = table.column(device)
    ev = np.arange(len(table)) if eval_rows is None else np.asarray(eval_rows, dtype=np.int64)
    eval_archs = [table.archs[i] for i in ev]
    from tqdm import tqdm

    out: list[FewShotScore] = []
    bar = tqdm(total=len(predictors) * len(ns) * seeds, desc=f"few-shot {device}",
               disable=not progress, leave=False)
    for name in predictors:
        for n in ns:
            for seed in range(seeds):
                bar.update(1)
                predictor = get_predictor(name, space)
                if n < predictor.min_samples:
                    continue
                refs = predictor.reference_archs if _uses_reference(predictor, reference) else None
                if refs is not None and (len(refs) < n or any(a not in table for a in refs[:n])):
                    continue
                rows = choose_measurements(predictor, table, n, seed=seed, pool_rows=pool_rows,
                                           reference=reference)
                t0 = time.perf_counter()
                predictor.adapt([table.archs[i] for i in rows], y[rows], seed=seed)
                seconds = time.perf_counter() - t0
                label = name if refs is not None or not predictor.reference_archs else \
                    f"{name}[random]"
                out.append(FewShotScore(label, device, int(n), seed,
                                        spearman(predictor.predict(eval_archs), y[ev]), seconds))
    bar.close()
    return out
