"""Score few-shot latency predictors on a device of a latency table: Spearman vs measurements.

A latency table (:mod:`hwnas.latency.tables`) holds the true latency of many architectures on a
device; this module plays "a new device" with it: pick the ``n`` architectures a user would
measure (:func:`choose_measurements`), adapt a predictor to their latencies, predict every
architecture of the table and score the ranking with Spearman's rho (:func:`fewshot_scores`).
It is the protocol of ``benchmarks/latency_fewshot.py`` (its ``all`` score) as a library, so
that notebooks and user code can draw the curves without copying the benchmark's loop. Without
a table, :func:`leave_one_out` scores a predictor on a user's own measurements and says whether
more would likely help (what ``hwnas latency adapt`` prints).

Importing this module needs numpy only (scipy is imported to compute Spearman's rho).
"""

from __future__ import annotations

import copy
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

__all__ = ["FewShotScore", "LeaveOneOut", "choose_measurements", "fewshot_scores",
           "leave_one_out", "spearman"]

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
    ``SEED_OFFSET + seed``: one permutation per seed, so the 5-measurement sample contains the
    2-measurement one and every predictor gets the same rows. ``reference=False`` makes a
    predictor with reference architectures (the meta predictor) use the random rows too (the
    benchmark's ``meta[random]`` ablation).

    Examples:
        >>> from hwnas.latency import choose_measurements, load_pretrained, load_shared_table
        >>> table = load_shared_table("nb201")
        >>> rows = choose_measurements(load_pretrained("nb201"), table, 5, seed=0)
        >>> len(rows)
        5
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

    Examples:
        >>> from hwnas.latency import fewshot_scores, load_shared_table
        >>> from hwnas.supernet import get_space
        >>> table = load_shared_table("nb201")
        >>> scores = fewshot_scores(get_space("nb201"), table, "pixel3", predictors=("flops",),
        ...                         ns=(5,), seeds=1, eval_rows=range(2000))
        >>> [(s.predictor, s.n_measurements) for s in scores], scores[0].spearman > 0.5
        ([('flops', 5)], True)
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


# --------------------------------------------------------------------------------------------
# leave-one-out on a user's measurements
# --------------------------------------------------------------------------------------------

#: Leave-one-out rank correlation below which more measurements would likely help.
LOO_MIN_SPEARMAN = 0.9
#: The error "still falls" when fitting on all but one gives less than this fraction of the
#: error when fitting on half of the measurements ...
LOO_FALLING = 0.85
#: ... and by more than this (relative error; below it the fit is at the noise floor).
LOO_MIN_GAIN = 0.01
#: Up to this many measurements each is left out in turn; beyond, they are left out in this
#: many folds (k-fold cross-validation: the cost is one adaptation per fold).
LOO_MAX_FOLDS = 10
#: ``hwnas latency adapt`` checks at most this many measurements (each fold's adaptation grows
#: faster than linearly with them, and so many rarely leave room to gain).
LOO_MAX_MEASUREMENTS = 100
#: Random half-splits of the learning-curve point.
LOO_HALF_SPLITS = 5
#: Shares of the measurements the learning curve's earlier points fit on (the half one is
#: also the point of the "error still falls" verdict).
CURVE_SHARES = (0.25, 0.5)
#: ``adapt`` reports what this many more measurements would likely bring ...
MORE_MEASUREMENTS = 20
#: ... and says they pay when the held-out Spearman would likely rise by this much or the
#: median relative error fall by this much (absolute).
PAYS_SPEARMAN = 0.01
PAYS_ERROR = 0.01
#: The curve's extrapolated gain is scaled by these (median relative error, Spearman) before it
#: is reported: the raw extrapolation is optimistic (the held-out Spearman is over the
#: measurements, a narrower and noisier set than the architectures a user ranks). Least squares
#: on the 38 NB-201 and FBNet leave-one-family-out families, chosen and checked out of family
#: (``benchmarks/latency_adapt_gain.py``, ``benchmarks/latency_lofo.md`` session 34).
GAIN_SHRINK = (0.49, 0.38)
#: The calibrated gain's typical miss on those families: ``(measurements, Spearman, median
#: relative error)``, the median |expected - actual| change from 20 more at that many
#: measurements; ``gain_line`` quotes the row nearest (in log) to the user's count.
GAIN_MISS = ((10, 0.032, 0.0125), (20, 0.013, 0.0059), (50, 0.0035, 0.0026))
#: The same two when the measurements start with the predictor's reference architectures (its
#: first 10, or all of them below 10: ``adapt``'s recommended start): the curve, whose smaller
#: fits lose reference architectures, is then steeper than what 20 random ones more bring (the
#: raw extrapolation 3-7x the real change on NB-201), so it is shrunk more.
GAIN_SHRINK_REFERENCE = (0.15, 0.22)
GAIN_MISS_REFERENCE = ((10, 0.011, 0.0066), (20, 0.0071, 0.0041), (50, 0.0020, 0.0019))


#: ``hwnas latency adapt`` notes an unsettled execution variant when none reaches this posterior.
EXECUTION_SETTLED = 0.9


def execution_note(predictor: Any, space_name: str) -> str | None:
    """One line when an adapted predictor's measurements leave open which network the device
    runs (its execution variants' posterior, e.g. whether the runtime drops operations whose
    output is unused, all below :data:`EXECUTION_SETTLED`), else ``None``. Random architectures
    often leave it open where the reference ones, chosen to tell the variants apart, settle it;
    on the measured NB-201 tables this is most of what random measurements lose
    (``benchmarks/latency_lofo.md``)."""
    explain = getattr(predictor, "explain", None)
    post = explain().get("execution_posterior", {}) if callable(explain) else {}
    if len(post) < 2 or max(post.values()) >= EXECUTION_SETTLED:
        return None
    shares = ", ".join(f"{v} {p:.2f}" for v, p in sorted(post.items(), key=lambda kv: -kv[1]))
    return (f"note: the measurements do not settle which network the device runs (execution "
            f"variants {shares}; a runtime may drop operations whose output is unused), so the "
            f"predictions average them; the reference architectures are chosen to tell them "
            f"apart: hwnas latency reference --space {space_name} --n 10 --export DIR")


#: How many architectures ``adapt`` proposes to settle an open execution variant: on the
#: NB-201 LOFO families 10 random + 3 of them ranked at 0.929 against 0.923 for 13 random and
#: 0.931 for the 10 reference ones (``benchmarks/latency_lofo.md``).
SETTLE_MEASUREMENTS = 3
#: Random architectures of the space the proposals are chosen among.
SETTLE_POOL = 2000


def settling_suggestions(predictor: Any, space: Any, measured: Sequence[str], *,
                         n: int = SETTLE_MEASUREMENTS, seed: int = 0) -> list[str]:
    """Up to ``n`` architectures (canonical strings; none already ``measured``) whose
    measurement would settle which network the device runs, among :data:`SETTLE_POOL` seeded
    random ones of ``space`` (:meth:`MetaPredictor.settling_archs`); empty for a predictor
    without execution variants."""
    settle = getattr(predictor, "settling_archs", None)
    if not callable(settle):
        return []
    rng = np.random.default_rng(SEED_OFFSET + int(seed))
    seen = set(measured)
    pool = [k for k in dict.fromkeys(space.to_string(space.sample(rng))
                                     for _ in range(SETTLE_POOL)) if k not in seen]
    return settle(pool, n)


@dataclass(frozen=True)
class LeaveOneOut:
    """Held-out scores of a predictor on ``n`` measurements, each predicted by the predictor
    adapted without it (``folds == n``: leave-one-out; fewer: k-fold, each fit on ``n_fit``):
    ``spearman`` of those predictions against the measured latencies, ``median_rel_error``
    (median |pred - y| / y), the same error when fitting on ``n_half`` (about half) of them
    (``half_rel_error``: the learning curve's earlier point, ``None`` when there are too few),
    and the verdict: ``more_would_help`` with its one-line ``reason``; :attr:`curve` and
    :meth:`gain_line` give the learning curve of those held-out scores and what
    :data:`MORE_MEASUREMENTS` (20) more measurements would likely bring (what
    ``hwnas latency adapt`` prints)."""

    n: int
    folds: int
    n_fit: int
    spearman: float
    median_rel_error: float
    n_half: int | None
    half_rel_error: float | None
    more_would_help: bool
    reason: str
    #: the learning curve: ``(measurements fitted on, median relative error, Spearman)`` of the
    #: held-out predictions, smallest first, its last point the leave-one-out one
    curve: tuple[tuple[int, float, float], ...] = ()
    #: the measurements start with the predictor's reference architectures (the calibration
    #: of :meth:`expected_gain` depends on it)
    reference_start: bool = False

    def expected_gain(self, more: int = MORE_MEASUREMENTS,
                      shrink: tuple[float, float] | None = None) -> tuple[float, float] | None:
        """What ``more`` measurements would likely change: ``(median relative error, held-out
        Spearman)``, the slope of :attr:`curve`'s last two points (per log of the measurements
        fitted on: curves flatten, so the latest slope, not an earlier steeper one) carried to
        ``n_fit + more`` and scaled by ``shrink`` (default: the calibration,
        :data:`GAIN_SHRINK_REFERENCE` after a :attr:`reference_start`, else
        :data:`GAIN_SHRINK`); never a loss, never below 0 error or above 1 Spearman. None with
        fewer than 2 points."""
        if len(self.curve) < 2:
            return None
        if shrink is None:
            shrink = GAIN_SHRINK_REFERENCE if self.reference_start else GAIN_SHRINK
        (m0, e0, r0), (m1, e1, r1) = self.curve[-2:]
        step = np.log((self.n_fit + more) / self.n_fit) / np.log(m1 / m0)
        d_err = min(shrink[0] * (e1 - e0) * step, 0.0)
        d_rho = max(shrink[1] * (r1 - r0) * step, 0.0)
        return max(d_err, -self.median_rel_error), min(d_rho, 1.0 - self.spearman)

    def gain_line(self, more: int = MORE_MEASUREMENTS) -> str | None:
        """One line: the learning curve and what ``more`` measurements would likely bring."""
        gain = self.expected_gain(more)
        if gain is None:
            return None
        d_err, d_rho = gain
        points = "; ".join(f"{m}: {100 * e:.1f}%, {r:.3f}" for m, e, r in self.curve)
        pays = d_rho >= PAYS_SPEARMAN or -d_err >= PAYS_ERROR
        misses = GAIN_MISS_REFERENCE if self.reference_start else GAIN_MISS
        n_miss, miss_rho, miss_err = min(misses, key=lambda row: abs(np.log(row[0] / self.n)))
        return (f"learning curve (measurements fitted on: median held-out error, Spearman) "
                f"{points}; expected from {more} more (an estimate: the curve's last slope, "
                f"calibrated on the development families, where it typically missed the real "
                f"change by {miss_rho:.3f} Spearman and {100 * miss_err:.1f} error points at "
                f"{n_miss} measurements): error "
                f"{100 * (self.median_rel_error + d_err):.1f}% ({100 * d_err:+.1f} points), "
                f"Spearman {self.spearman + d_rho:.3f} ({d_rho:+.3f}): "
                + ("measuring them likely pays" if pays else "measuring them likely pays little"))

    def summary(self) -> str:
        """One line: the held-out scores."""
        how = (f"leave-one-out on the {self.n} measurements (each predicted after adapting to "
               f"the other {self.n_fit})" if self.folds == self.n else
               f"{self.folds}-fold cross-validation on the {self.n} measurements (each "
               f"predicted after adapting to {self.n_fit} others)")
        return (f"{how}: Spearman {self.spearman:.3f}, median error "
                f"{100 * self.median_rel_error:.1f}%")


def leave_one_out(predictor: Any, archs: Sequence[Any], latency_ms: Sequence[float] | np.ndarray,
                  *, seed: int = 0) -> LeaveOneOut:
    """Score ``predictor`` (not yet adapted; left untouched: copies are adapted) on the user's
    measurements: re-adapt it without each one in turn and predict the one left out (beyond
    :data:`LOO_MAX_FOLDS` measurements, without each of that many seeded folds); plus the
    learning curve's earlier point, fitting on about half of the measurements
    (:data:`LOO_HALF_SPLITS` seeded splits, every other measurement predicted).

    More measurements would likely help when the held-out ranking is poor (Spearman below
    :data:`LOO_MIN_SPEARMAN`) or the error still falls (the full fits' error below
    :data:`LOO_FALLING` × the half error, and by more than :data:`LOO_MIN_GAIN`). Needs
    ``min_samples + 1`` measurements, and at least 3.
    """
    y = np.asarray(latency_ms, dtype=np.float64)
    n = len(y)
    if len(archs) != n:
        raise UserError(f"leave_one_out got {len(archs)} architectures and {n} latencies")
    min_samples = int(getattr(predictor, "min_samples", 1))
    if n < max(3, min_samples + 1):
        raise UserError(f"leave-one-out needs at least {max(3, min_samples + 1)} measurements "
                        f"for this predictor, got {n}")
    archs = list(archs)
    rng = np.random.default_rng(SEED_OFFSET + int(seed))

    def predicted(fit: np.ndarray, rest: np.ndarray) -> np.ndarray:
        clone = copy.deepcopy(predictor)
        clone.adapt([archs[i] for i in fit], y[fit], seed=seed)
        return np.asarray(clone.predict([archs[i] for i in rest]), dtype=np.float64)

    folds = n if n <= LOO_MAX_FOLDS else LOO_MAX_FOLDS
    parts = np.array_split(np.arange(n) if folds == n else rng.permutation(n), folds)
    if min(n - len(p) for p in parts) < min_samples:  # k-fold leaves too few to fit
        folds, parts = n, np.array_split(np.arange(n), n)
    pred = np.empty(n)
    for part in parts:
        pred[part] = predicted(np.setdiff1d(np.arange(n), part), part)
    n_fit = n - max(len(p) for p in parts)
    rho, err = spearman(pred, y), float(np.median(np.abs(pred - y) / y))

    n_half = max(min_samples, (n + 1) // 2)
    half_err = None
    curve = []
    sizes = sorted({max(min_samples, 3, int(round(share * n))) for share in CURVE_SHARES}
                   | {n_half})
    for size in sizes:
        if size >= n_fit:
            continue
        errors, rhos = [], []
        for _ in range(LOO_HALF_SPLITS):
            order = rng.permutation(n)
            fit, rest = order[:size], order[size:]
            p = predicted(fit, rest)
            errors.append(np.abs(p - y[rest]) / y[rest])
            rhos.append(spearman(p, y[rest]) if len(rest) >= 3 else np.nan)
        e = float(np.median(np.concatenate(errors)))
        curve.append((size, e, float(np.nanmean(rhos)) if np.isfinite(rhos).any() else rho))
        if size == n_half:
            half_err = e
    curve.append((n_fit, err, rho))
    falling = half_err is not None and err < LOO_FALLING * half_err and \
        half_err - err > LOO_MIN_GAIN
    if rho < LOO_MIN_SPEARMAN:
        more, reason = True, (f"more measurements would likely help: the held-out ranking "
                              f"(Spearman {rho:.2f}) is below {LOO_MIN_SPEARMAN}")
    elif falling:
        more, reason = True, (f"more measurements would likely help: the error still falls with "
                              f"more of them ({100 * half_err:.1f}% fitting on {n_half}, "
                              f"{100 * err:.1f}% on {n_fit})")
    elif half_err is None:
        more, reason = False, (f"too few measurements to see a trend; the held-out ranking "
                               f"(Spearman {rho:.2f}) is good")
    else:
        more, reason = False, (f"more measurements would likely not help much: the held-out "
                               f"ranking is good (Spearman {rho:.2f}) and the error no longer "
                               f"falls ({100 * half_err:.1f}% fitting on {n_half}, "
                               f"{100 * err:.1f}% on {n_fit})")
    refs = list(getattr(predictor, "reference_archs", None) or [])
    measured = {a for a in archs if isinstance(a, str)}
    reference_start = bool(refs) and set(refs[:min(n, 10)]) <= measured
    return LeaveOneOut(n, folds, n_fit, rho, err, n_half if half_err is not None else None,
                       half_err, more, reason, tuple(curve), reference_start)
