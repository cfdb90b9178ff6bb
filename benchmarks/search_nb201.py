"""Multi-objective search on NAS-Bench-201, scored exactly: hypervolume ratio per budget.

For each of HELP's six unseen NAS-Bench-201 devices (``titan_rtx_256, gold_6226, fpga, pixel2,
raspi4, eyeriss``) and each sampler, an in-memory Optuna study maximises accuracy and minimises
latency over the 15,625 cells:

* **latency** is seen by the search only through the default few-shot predictor of
  :mod:`hwnas.latency.predictors` (the shipped meta-trained ``nb201`` predictor, ``load_pretrained``),
  adapted to the device with ``--n-measurements`` (10) measurements: the device's table latency
  of the predictor's first 10 reference architectures, as ``benchmarks/latency_fewshot.py``
  does. Those 10 table values are everything the search learns from the table; it never reads
  it otherwise. (``--latency-source table`` shows the search the true latency instead: the
  calibration setting of the issue, not the benchmark.)
* **accuracy** is the NAS-Bench-201 CIFAR-100 test accuracy, looked up; each look-up is one
  evaluation and repeats count (a sampler that suggests an architecture again pays again).

Score (``../shared/BENCHMARKS.md``): ``hv_ratio`` = hypervolume of every architecture evaluated
so far, scored with its TRUE accuracy and TRUE latency, / hypervolume of the true front of all
15,625 architectures; reference point = (lowest accuracy on the true front - 1 point, highest
latency on the true front x 1.01). Each run is one trajectory of ``max(--budgets)`` evaluations,
read at every budget (100, 300, 1000); mean ± std over ``--seeds`` seeds (the sampler's seed,
``--seed-start`` to ``--seed-start + --seeds - 1``: a fresh-seed confirmation run).
Each row also says where the missed hypervolume lies (``missed_hv_by_latency``: the fast, middle
and slow third of the latency axis, :func:`missed_by_latency`), so that a shortfall can be told
apart as the low-latency end, the high-accuracy end or the whole front.

Samplers: ``auto`` (the default of ``hwnas run``, built by :func:`hwnas.search.samplers.make_sampler`
with the run's settings: here the screening sampler, which sees the predicted latency and its
deviation, flagged predicted as ``hwnas run`` flags an adapted device's, so that its layered
trials run; with ``--latency-source table`` the latency is exact and they do not), ``tpe``
(multivariate TPE), ``nsga2``, ``random`` and ``gp`` (Optuna's GPSampler, a baseline on
request: not in the default run) from
:mod:`hwnas.search.samplers`, and
``screening`` (:class:`hwnas.search.screening.ScreeningSampler`: a GP surrogate of accuracy screens the
whole space, whose predicted latency and its uncertainty are free, by expected hypervolume
improvement). Every sampler sees the predicted latency as the second objective value; the
screening sampler also gets the predictor's standard deviation, which its default settings
ignore (``--latency-std-scale`` uses it).

``--validation`` searches HELP's validation devices too (rows tagged ``split``, a summary per
split); ``--screening-option NAME=VALUE`` runs a :class:`ScreeningConfig` variant of the
``screening`` sampler (how the development comparisons of ``search_nb201.md`` are made), and
``--paired-with JSON`` prints and writes the paired difference (same device and seed) to a
previous run's rows.

``--predictor-holdout FAMILY`` (development only): latency from a meta predictor trained without
that device family (``latency_lofo.py``'s families; HELP's test devices never enter), adapted with
10 measurements like the shipped one, on that family's devices: the shipped predictor's errors on
a device it has not seen, which a meta-training device searched with it cannot show.

``--latency-csv PATH --device COLUMN`` scores a new device table (same CSV layout as the shared
table; it must hold every NAS-Bench-201 architecture, since the front is the whole space's).

    python benchmarks/search_nb201.py
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime as _dt
import math
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import latency_fewshot as shared
except ModuleNotFoundError:
    from benchmarks import latency_fewshot as shared
machine, write_json = shared.machine, shared.write_json
from hwnas.latency.predictors import load_pretrained  # noqa: E402
from hwnas.latency.tables import (  # noqa: E402
    LatencyTable,
    help_protocol,
    load_latency_table,
    load_shared_table,
)
from hwnas.search.pareto import front_indices_2d, hypervolume_2d  # noqa: E402
from hwnas.search.screening import ScreeningConfig, ScreeningSampler  # noqa: E402
from hwnas.supernet.spaces import get_space  # noqa: E402

from hwnas.core.errors import UserError  # noqa: E402

OUT_JSON = Path(__file__).with_suffix(".json")
SAMPLER_CHOICES = ("auto", "tpe", "nsga2", "random", "screening", "gp")
#: the samplers of the standard run; ``gp`` (Optuna's GPSampler, minutes per search) on request
DEFAULT_SAMPLERS = SAMPLER_CHOICES[:5]
BEST_METHOD = "screening"
ACCURACY_FILE = Path("nb201") / "nb201_cifar100_accuracy.csv"


# ------------------------------------------------------------------------------------------------
# scoring (BENCHMARKS.md)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrueFront:
    """The true accuracy-latency front of one device and the scoring reference point."""

    ref_latency: float
    ref_accuracy: float
    hypervolume: float
    size: int


def true_front(latency: np.ndarray, accuracy: np.ndarray) -> TrueFront:
    """Front of all architectures; reference = (max front latency x 1.01, min front accuracy
    - 1 point), exactly as ``../shared/BENCHMARKS.md`` defines it."""
    idx = front_indices_2d(latency, accuracy)
    ref_lat = float(latency[idx].max()) * 1.01
    ref_acc = float(accuracy[idx].min()) - 1.0
    hv = hypervolume_2d(latency[idx], accuracy[idx], ref_lat, ref_acc)
    return TrueFront(ref_lat, ref_acc, hv, len(idx))


def hv_ratio(rows: Sequence[int], latency: np.ndarray, accuracy: np.ndarray,
             front: TrueFront) -> float:
    """Hypervolume of the architectures ``rows`` (true values) / that of the true front."""
    rows = np.asarray(rows, dtype=int)
    if len(rows) == 0:
        return 0.0
    hv = hypervolume_2d(latency[rows], accuracy[rows], front.ref_latency, front.ref_accuracy)
    return hv / front.hypervolume


#: the parts of the latency axis the missed hypervolume is split into (``--breakdown``)
BREAKDOWN_PARTS = ("fast", "middle", "slow")


def missed_by_latency(rows: Sequence[int], latency: np.ndarray, accuracy: np.ndarray,
                      front: TrueFront, parts: int = len(BREAKDOWN_PARTS)) -> list[float]:
    """Where the hypervolume a search missed lies: the area between the true front's staircase
    and that of the evaluated ``rows`` (true values), as fractions of the true front's
    hypervolume, in ``parts`` equal slices of the latency axis from the fastest front cell to
    the reference latency (first slice: the low-latency end; last: the high-accuracy end). The
    slices sum to ``1 - hv_ratio``."""
    idx = front_indices_2d(latency, accuracy)
    lo, hi = float(latency[idx].min()), front.ref_latency
    edges = np.linspace(lo, hi, parts + 1)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        # each slice's area = hypervolume of the points clipped to the slice's latency range
        area = [hypervolume_2d(np.maximum(latency[r], a), accuracy[r], b, front.ref_accuracy)
                for r in (idx, np.asarray(rows, dtype=int))]
        out.append(round((area[0] - area[1]) / front.hypervolume, 4))
    return out


def score_trajectory(rows: Sequence[int], budgets: Sequence[int], latency: np.ndarray,
                     accuracy: np.ndarray, front: TrueFront) -> dict[int, float]:
    """``hv_ratio`` after the first ``b`` evaluations of one trajectory, for every budget."""
    if len(rows) < max(budgets):
        raise ValueError(f"trajectory has {len(rows)} evaluations, budgets go to {max(budgets)}")
    return {b: hv_ratio(rows[:b], latency, accuracy, front) for b in budgets}


# ------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------


def shared_accuracy(space: Any, hint: str = "") -> dict[str, float]:
    """:func:`load_accuracy` of the table in the shared data directory (``hint``: what else
    the caller accepts, for the error)."""
    from hwnas.supernet.data import shared_data_dir

    root = shared_data_dir()
    if root is None:
        raise UserError(f"the shared data directory was not found; set $HWNAS_SHARED_DATA{hint}")
    return load_accuracy(root / ACCURACY_FILE, space)


def load_accuracy(path: Path, space: Any) -> dict[str, float]:
    """Canonical architecture string -> CIFAR-100 test accuracy (%)."""
    if not path.is_file():
        raise UserError(f"NAS-Bench-201 accuracy table {path} not found; set $HWNAS_SHARED_DATA "
                        f"to the directory holding {ACCURACY_FILE}")
    out: dict[str, float] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            try:
                acc = float(row["cifar100_test_acc"])
                key = space.to_string(space.from_string(row["arch"]))
            except (KeyError, ValueError, TypeError) as exc:
                raise UserError(f"{path} line {line}: expected columns arch and "
                                f"cifar100_test_acc ({exc})") from None
            if not math.isfinite(acc):
                raise UserError(f"{path} line {line}: cifar100_test_acc is {acc}; expected a "
                                f"finite accuracy in %")
            out[key] = acc
    return out


@dataclass
class Problem:
    """One device: true values of every architecture and the latency the search may see."""

    device: str
    archs: list[str]
    accuracy: np.ndarray
    latency: np.ndarray          # true (scoring only)
    seen_latency: np.ndarray     # what the search sees: predicted, or true for calibration
    seen_latency_std: np.ndarray | None  # the predictor's standard deviation (None: exact)
    front: TrueFront
    measured: int                # latency measurements taken from the table
    spearman: float              # of the seen latency against the true one
    predicted: bool = False      # the seen latency is the predictor's (else the true, exact)


def make_problem(space: Any, table: LatencyTable, device: str, accuracy: dict[str, float],
                 n_measurements: int, latency_source: str, predictor: Any = None) -> Problem:
    """``predictor``: the un-adapted meta predictor to adapt (default: the shipped one)."""
    missing = [a for a in accuracy if a not in table]
    if missing:
        raise UserError(f"latency table {table.path} lacks {len(missing)} of the "
                        f"{len(accuracy)} NAS-Bench-201 architectures (e.g. {missing[0]!r}); the "
                        f"true front is the whole space's, so every architecture needs a latency")
    archs = sorted(accuracy)
    rows = table.rows(archs)
    lat = table.column(device)[rows]
    acc = np.array([accuracy[a] for a in archs])
    if latency_source == "table":
        seen, std, measured = lat.copy(), None, len(archs)
    else:
        predictor = copy.deepcopy(predictor) if predictor is not None \
            else load_pretrained(space.name)
        refs = predictor.reference_archs[:n_measurements]
        if len(refs) < n_measurements:
            raise UserError(f"the {space.name} predictor has {len(refs)} reference "
                            f"architectures; --n-measurements {n_measurements} is too many")
        predictor.adapt(refs, table.column(device)[table.rows(refs)], seed=0)
        seen, std = predictor.predict_with_std(archs)
        measured = len(refs)
    from scipy.stats import spearmanr

    return Problem(device, archs, acc, lat, np.asarray(seen, float), std,
                   true_front(lat, acc), measured, float(spearmanr(seen, lat)[0]),
                   latency_source != "table")


def holdout_predictor(space: Any, fam: str, cache: Path | None,
                      training: str = "lofo") -> tuple[Any, list[str]]:
    """A meta predictor trained WITHOUT the device family ``fam`` (``--predictor-holdout``), and
    that family's devices: the development proxy of the shipped predictor on an unseen device.
    The fold of ``latency_residual_select.fold_predictor`` on ``latency_lofo``'s device tables
    (HELP's and the measured ones, families by ``latency_lofo.family``), less HELP's test
    devices, which never enter development (neither trained on nor searched). ``training``
    ``"shipped"``: only the shipped predictor's meta-training devices (HELP's), less ``fam``."""
    try:
        import latency_residual_select as select
    except ModuleNotFoundError:
        from benchmarks import latency_residual_select as select
    lofo = select.lofo
    test = set(help_protocol(space.name).test)
    devices, _ = lofo.load_devices(space)
    keep = set(help_protocol(space.name).meta_train) if training == "shipped" else None
    devices = {d: v for d, v in devices.items()
               if d not in test and (keep is None or d in keep)}
    folds = select.held_out_folds(devices)
    if fam not in folds:
        raise UserError(f"--predictor-holdout {fam!r}: no such device family; families: "
                        f"{', '.join(folds)}")
    # the cached fold is of this device set (not latency_lofo's, which keeps HELP's test devices)
    sub = None if cache is None else cache / ("without-help-test" if training == "lofo"
                                              else "help-meta-train")
    return select.fold_predictor(space, devices, fam, folds[fam], sub), sorted(folds[fam])


# ------------------------------------------------------------------------------------------------
# one search
# ------------------------------------------------------------------------------------------------


def screening_options(texts: Sequence[str]) -> dict[str, Any]:
    """``NAME=VALUE`` settings of :class:`ScreeningConfig` (``--screening-option``), typed by
    the field's default: the variants compared on the development devices."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(ScreeningConfig)}
    out: dict[str, Any] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or name not in fields or name == "cheap_std_scale":
            raise UserError(f"--screening-option {text!r}: expected NAME=VALUE with NAME one of "
                            f"{sorted(set(fields) - {'cheap_std_scale'})} "
                            f"(the deviation's scale is --latency-std-scale)")
        default = fields[name].default
        try:
            if isinstance(default, bool):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                out[name] = value.lower() in ("true", "1")
            elif isinstance(default, tuple):
                out[name] = tuple(float(v) for v in value.split(","))
            else:
                out[name] = type(default)(value)
        except ValueError:
            raise UserError(f"--screening-option {text!r}: {value!r} is not a "
                            f"{type(default).__name__}") from None
    ScreeningConfig(**out)  # a bad value is one clear error now, not in the first search
    return out


def make_study_sampler(name: str, seed: int, space: Any, problem: Problem,
                       std_scale: float = 0.0, options: dict[str, Any] | None = None):
    from hwnas.search.samplers import ScreeningProblem, make_sampler

    row = {a: i for i, a in enumerate(problem.archs)}
    # a predicted latency is flagged as `hwnas run` flags an adapted device's; the table's is exact
    predicted = (problem.predicted,)

    def cheap(archs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray | None]:
        """The latency predictor's mean and standard deviation (free per query; None for the
        table), as `hwnas run`'s CheapMetrics gives an adapted device's; the sampler's default
        ``cheap_std_scale`` = 0 ignores the deviation."""
        rows = [row[space.to_string(a)] for a in archs]
        std = problem.seen_latency_std
        return problem.seen_latency[rows], (None if std is None else std[rows])

    if name == "auto":  # the default of `hwnas run`, built as the run builds it
        return make_sampler("screening", seed, problem=ScreeningProblem(
            space=space, directions=("maximize", "minimize"), cheap=cheap, cheap_indices=(1,),
            cheap_predicted=predicted))
    if name == "screening":
        return ScreeningSampler(space, cheap, (1,), seed=seed,
                                directions=("maximize", "minimize"),
                                config=ScreeningConfig(cheap_std_scale=std_scale,
                                                       **(options or {})),
                                cheap_predicted=predicted)
    return make_sampler(name, seed)


def run_search(space: Any, problem: Problem, sampler: str, seed: int, n_evals: int,
               std_scale: float = 0.0, options: dict[str, Any] | None = None) -> list[int]:
    """One in-memory study of ``n_evals`` trials; the rows it evaluated, in order."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    row = {a: i for i, a in enumerate(problem.archs)}
    evaluated: list[int] = []

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        i = row[space.to_string(space.suggest(trial))]
        evaluated.append(i)  # one accuracy look-up = one evaluation, repeats included
        return float(problem.accuracy[i]), float(problem.seen_latency[i])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(directions=["maximize", "minimize"],
                                    sampler=make_study_sampler(sampler, seed, space, problem,
                                                               std_scale, options))
        study.optimize(objective, n_trials=n_evals)
    return evaluated


# ------------------------------------------------------------------------------------------------
# the benchmark
# ------------------------------------------------------------------------------------------------


def run_benchmark(space: Any, problems: list[Problem], samplers: list[str], seeds: int,
                  budgets: list[int], progress: bool = True, std_scale: float = 0.0,
                  options: dict[str, Any] | None = None,
                  seed_start: int = 0) -> tuple[list[dict], dict]:
    from tqdm import tqdm

    rows: list[dict] = []
    seconds: dict[str, list[float]] = {s: [] for s in samplers}
    bar = tqdm(total=len(problems) * len(samplers) * seeds, desc="searches", disable=not progress)
    for p in problems:
        for name in samplers:
            scores: dict[int, list[float]] = {b: [] for b in budgets}
            missed: dict[int, list[list[float]]] = {b: [] for b in budgets}
            repeats = []
            for seed in range(seed_start, seed_start + seeds):
                t0 = time.perf_counter()
                traj = run_search(space, p, name, seed, max(budgets), std_scale, options)
                seconds[name].append(time.perf_counter() - t0)
                for b, v in score_trajectory(traj, budgets, p.latency, p.accuracy,
                                             p.front).items():
                    scores[b].append(v)
                    missed[b].append(missed_by_latency(traj[:b], p.latency, p.accuracy,
                                                       p.front))
                repeats.append(len(traj) - len(set(traj)))
                bar.update(1)
            for b in budgets:
                v = np.asarray(scores[b])
                rows.append({"device": p.device, "sampler": name, "evaluations": b,
                             "hv_ratio_mean": round(float(v.mean()), 4),
                             "hv_ratio_std": round(float(v.std()), 4), "seeds": len(v),
                             "seed_start": seed_start,
                             "hv_ratio_per_seed": [round(float(x), 4) for x in v],
                             "missed_hv_by_latency": dict(zip(
                                 BREAKDOWN_PARTS,
                                 np.round(np.mean(missed[b], axis=0), 4).tolist())),
                             "latency_measurements": p.measured,
                             "repeated_evaluations_mean": round(float(np.mean(repeats)), 1)})
    bar.close()
    timing = {s: {"seconds_per_search_mean": round(float(np.mean(t)), 2),
                  "seconds_total": round(float(np.sum(t)), 1)} for s, t in seconds.items()}
    return rows, timing


def summarize(rows: list[dict], devices: list[str]) -> list[dict]:
    """Mean over devices of each (sampler, budget)."""
    out = []
    keys = sorted({(r["sampler"], r["evaluations"]) for r in rows},
                  key=lambda k: (_order(k[0]), k[1]))
    for sampler, b in keys:
        sel = [r for r in rows if r["sampler"] == sampler and r["evaluations"] == b]
        if len(sel) != len(devices):
            continue
        out.append({"sampler": sampler, "evaluations": b,
                    "hv_ratio_mean_over_devices": round(float(np.mean(
                        [r["hv_ratio_mean"] for r in sel])), 4),
                    "hv_ratio_min_over_devices": round(min(r["hv_ratio_mean"] for r in sel), 4),
                    "worst_device": min(sel, key=lambda r: r["hv_ratio_mean"])["device"],
                    "hv_ratio_worst_seed": round(min(min(r["hv_ratio_per_seed"])
                                                     for r in sel), 4)})
    return out


def _order(sampler: str) -> int:
    return SAMPLER_CHOICES.index(sampler) if sampler in SAMPLER_CHOICES else 99


def print_tables(rows: list[dict], problems: list[Problem], budgets: list[int]) -> None:
    by = {(r["device"], r["sampler"], r["evaluations"]): r for r in rows}
    samplers = sorted({r["sampler"] for r in rows}, key=_order)
    devices = [p.device for p in problems]
    for b in budgets:
        print(f"\nhv_ratio after {b} evaluations (mean ± std over seeds)")
        print(f"{'sampler':<11}" + "".join(f"{d:>16}" for d in devices) + f"{'mean':>9}")
        for s in samplers:
            cells = [by[(d, s, b)] for d in devices]
            print(f"{s:<11}" + "".join(f"{c['hv_ratio_mean']:>9.4f}±{c['hv_ratio_std']:.4f}"
                                       for c in cells)
                  + f"{np.mean([c['hv_ratio_mean'] for c in cells]):>9.4f}")
    print("\nmissed hypervolume (fraction of the true front's) in the fast / middle / slow "
          "third of the latency axis, mean over seeds")
    for b in budgets:
        print(f"@{b}")
        for s in samplers:
            print(f"  {s:<11}" + "".join(
                f"{d:>16} " + "/".join(f"{by[(d, s, b)]['missed_hv_by_latency'][k]:.3f}"
                                      for k in BREAKDOWN_PARTS) for d in devices))
    print("\nmean over devices (worst device's mean, worst seed of any device)")
    print(f"{'sampler':<11}" + "".join(f"{f'@{b}':>26}" for b in budgets))
    for s in samplers:
        cells = [[by[(d, s, b)] for d in devices] for b in budgets]
        print(f"{s:<11}" + "".join(
            f"{np.mean([c['hv_ratio_mean'] for c in cs]):>10.4f}"
            f" ({min(c['hv_ratio_mean'] for c in cs):.4f}, "
            f"{min(min(c['hv_ratio_per_seed']) for c in cs):.4f})" for cs in cells))
    print("\ndevices: " + ", ".join(
        f"{p.device} (front {p.front.size}, seen-latency Spearman {p.spearman:.3f})"
        for p in problems))


def paired_differences(rows: list[dict], base_rows: list[dict]) -> list[dict]:
    """Per sampler and budget: this run's block mean against a baseline run's rows of the same
    devices, sampler and seeds (``--paired-with``): the paired difference per seed (mean over
    the devices), its mean, standard error and the seeds where this run is ahead. Rows without
    ``seed_start`` (runs before it existed) started at seed 0."""
    base = {(r["device"], r["sampler"], r["evaluations"], r.get("seed_start", 0)):
            r["hv_ratio_per_seed"] for r in base_rows}
    out = []
    for sampler, b in sorted({(r["sampler"], r["evaluations"]) for r in rows},
                             key=lambda k: (_order(k[0]), k[1])):
        sel = [r for r in rows if r["sampler"] == sampler and r["evaluations"] == b]
        pairs = [(np.asarray(r["hv_ratio_per_seed"]),
                  base.get((r["device"], sampler, b, r.get("seed_start", 0)))) for r in sel]
        n = min([len(v) for v, w in pairs] + [len(w) for v, w in pairs if w is not None])
        if any(w is None for _, w in pairs) or n < 1:
            raise UserError(f"--paired-with: the baseline lacks {sampler} @{b} on a device of "
                            f"this run, or its seeds (the same --seed-start)")
        new = np.mean([v[:n] for v, _ in pairs], axis=0)
        old = np.mean([np.asarray(w[:n]) for _, w in pairs], axis=0)
        d = new - old
        se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
        out.append({"sampler": sampler, "evaluations": b, "seeds": n,
                    "baseline_mean": round(float(old.mean()), 4),
                    "mean": round(float(new.mean()), 4),
                    "paired_difference": round(float(d.mean()), 4),
                    "standard_error": round(se, 4), "seeds_ahead": int(np.sum(d > 0))})
    return out


def previous_runs(path: Path) -> list[dict]:
    """The runs a JSON file already holds (its own, then those it kept), to keep beside a new
    run: rows of other predictors and settings stay comparable across commits."""
    if not path.is_file():
        return []
    import json

    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(f"{path} exists but is not a JSON file; move it away or pass "
                        f"another --out") from None
    keep = ("command", "date", "default_sampler", "screening_startup", "latency_source",
            "budgets", "devices", "summary", "summary_validation", "results",
            "development_runs")
    return [{k: old[k] for k in keep if k in old}, *old.get("previous_runs", [])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samplers", nargs="+", default=list(DEFAULT_SAMPLERS),
                    choices=list(SAMPLER_CHOICES))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seed-start", type=int, default=0,
                    help="the first seed (default 0): --seed-start 10 --seeds 10 runs seeds 10-19")
    ap.add_argument("--budgets", nargs="+", type=int, default=[100, 300, 1000])
    ap.add_argument("--devices", nargs="+", default=None,
                    help="columns of the shared table (default: HELP's six unseen test devices)")
    ap.add_argument("--validation", action="store_true",
                    help="also search HELP's validation devices (the development devices the "
                         "settings are chosen on); their rows say split: validation and get "
                         "their own summary")
    ap.add_argument("--latency-csv", type=Path, help="a new device table (same CSV layout)")
    ap.add_argument("--device", help="the device column of --latency-csv")
    ap.add_argument("--accuracy-csv", type=Path, default=None,
                    help=f"default: <shared data>/{ACCURACY_FILE}")
    ap.add_argument("--n-measurements", type=int, default=10,
                    help="latency measurements the predictor is adapted with (default 10)")
    ap.add_argument("--latency-source", choices=["predictor", "table"], default="predictor",
                    help="what the search sees: the adapted predictor (the benchmark) or the "
                         "true table latency (calibration only)")
    ap.add_argument("--predictor-holdout", metavar="FAMILY", default=None,
                    help="latency from a meta predictor trained without this device family "
                         "(latency_lofo.py's families, e.g. phone; HELP's test devices left "
                         "out), adapted like the shipped one; searches that family's devices "
                         "(--devices: a subset of them): the unseen-device development proxy")
    ap.add_argument("--fold-training", choices=["lofo", "shipped"], default=None,
                    help="--predictor-holdout's meta-training devices: latency_lofo.py's tables "
                         "(default) or only the shipped predictor's (HELP's meta-training set)")
    ap.add_argument("--fold-cache", type=Path, default=None,
                    help="directory caching --predictor-holdout's meta-training (seconds to a "
                         "minute per family)")
    ap.add_argument("--latency-std-scale", type=float, default=0.0,
                    help="screening: multiplier of the latency predictor's standard deviation "
                         "in the acquisition (default 0: trust the predicted latency)")
    ap.add_argument("--screening-option", action="append", default=[], metavar="NAME=VALUE",
                    help="a ScreeningConfig setting of the 'screening' sampler (repeatable), "
                         "e.g. startup=random: the variants compared on development devices")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"JSON to write (default {OUT_JSON.name} for the standard run; "
                         f"nothing otherwise)")
    ap.add_argument("--paired-with", type=Path, default=None, metavar="JSON",
                    help="a previous run's JSON of the same devices and seeds: print and write "
                         "the paired difference per budget (mean over devices, per seed)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return run_main("search_nb201", _main, ap.parse_args(argv), argv)


def run_main(name: str, body: Callable[[argparse.Namespace, list[str]], int],
             args: argparse.Namespace, argv: list[str] | None) -> int:
    """``body(args, argv)`` with a UserError as one line ``NAME: error: ...`` and exit 2: the
    entry of this script and of the NB-201 diagnoses built on it."""
    try:
        return body(args, argv if argv is not None else sys.argv[1:])
    except UserError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    if args.seeds < 1 or args.n_measurements < 1 or any(b < 1 for b in args.budgets):
        raise UserError("--seeds, --n-measurements and --budgets must be positive")
    if args.seed_start < 0:
        raise UserError(f"--seed-start {args.seed_start}; expected >= 0")
    if not args.latency_std_scale >= 0:
        raise UserError(f"--latency-std-scale {args.latency_std_scale}; expected >= 0")
    budgets = sorted(set(args.budgets))
    options = screening_options(args.screening_option)
    base_rows = None
    if args.paired_with is not None:
        import json

        try:
            base_rows = json.loads(args.paired_with.read_text(encoding="utf-8"))["results"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"--paired-with {args.paired_with}: not a search_nb201 JSON with "
                            f"results") from None
    space = get_space("nb201")
    held = fold = None
    if args.predictor_holdout is not None:
        if args.latency_csv is not None or args.validation or args.latency_source != "predictor":
            raise UserError("--predictor-holdout searches the held-out family's shared-table "
                            "devices with predicted latency; it does not go with --latency-csv, "
                            "--validation or --latency-source table")
        args.fold_training = args.fold_training or "lofo"
        fold, held = holdout_predictor(space, args.predictor_holdout, args.fold_cache,
                                       args.fold_training)
    elif args.fold_cache is not None or args.fold_training is not None:
        raise UserError("--fold-cache and --fold-training are --predictor-holdout's; pass it")
    if args.latency_csv is not None:
        if not args.device:
            raise UserError("--latency-csv needs --device COLUMN (the device column to score)")
        if args.devices or args.validation:
            raise UserError("--devices and --validation name shared-table columns; with "
                            "--latency-csv use --device")
        table = load_latency_table(args.latency_csv, space=space, devices=[args.device])
        devices = [args.device]
    else:
        if args.device:
            raise UserError("--device needs --latency-csv (use --devices for shared columns)")
        table = load_shared_table("nb201", space=space)
        devices = list(args.devices or held or help_protocol("nb201").test)
        if held is not None and not set(devices) <= set(held):
            raise UserError(f"--predictor-holdout {args.predictor_holdout}: searches only the "
                            f"held-out family's devices ({', '.join(held)}); got "
                            f"{', '.join(d for d in devices if d not in held)}")
        if args.validation:
            devices = [d for d in help_protocol("nb201").validation if d not in devices] \
                + devices
        table.check_devices(devices)
    accuracy = (shared_accuracy(space, f" or pass --accuracy-csv (the {ACCURACY_FILE} layout)")
                if args.accuracy_csv is None else load_accuracy(Path(args.accuracy_csv), space))
    protocol = help_protocol("nb201")
    for d in devices:
        if d in protocol.meta_train and fold is None:
            print(f"note: {d} is a meta-training device of the latency predictor; it is not "
                  f"unseen")
    t_start = time.time()
    problems = [make_problem(space, table, d, accuracy, args.n_measurements,
                             args.latency_source, fold) for d in devices]
    rows, timing = run_benchmark(space, problems, args.samplers, args.seeds, budgets,
                                 progress=not args.quiet, std_scale=args.latency_std_scale,
                                 options=options, seed_start=args.seed_start)
    elapsed = time.time() - t_start
    validation = set(protocol.validation) if args.validation else set()
    for r in rows:
        r["split"] = "validation" if r["device"] in validation else "test"
    splits = {"validation": [d for d in devices if d in validation],
              "test": [d for d in devices if d not in validation]}
    for split, names in splits.items():
        if names and validation:
            print(f"\n== {split} devices ==")
        if names:
            print_tables([r for r in rows if r["split"] == split],
                         [p for p in problems if p.device in names], budgets)
    print("\nseconds per search (mean): " + ", ".join(
        f"{s} {t['seconds_per_search_mean']:.1f}" for s, t in timing.items()))
    print(f"total {elapsed:.0f} s")
    paired = None if base_rows is None else paired_differences(rows, base_rows)
    for p in paired or ():
        print(f"paired with {args.paired_with.name}: {p['sampler']} @{p['evaluations']} "
              f"{p['baseline_mean']:.4f} -> {p['mean']:.4f}, {p['paired_difference']:+.4f} ± "
              f"{p['standard_error']:.4f} ({p['seeds_ahead']}/{p['seeds']} seeds ahead)")
    standard = (args.latency_csv is None and args.latency_source == "predictor"
                and fold is None and args.devices is None and args.latency_std_scale == 0
                and not options)
    out = args.out or (OUT_JSON if standard else None)
    if out is not None:
        from hwnas.search.samplers import DEFAULT_SAMPLER

        write_json(out, {
            "command": "python benchmarks/search_nb201.py " + " ".join(argv),
            "machine": machine(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "default_sampler": DEFAULT_SAMPLER,
            "screening_startup": ScreeningConfig().startup,
            "best_method": BEST_METHOD,
            "latency_source": (f"meta predictor meta-trained ({args.fold_training} devices) "
                               f"without the family {args.predictor_holdout!r} and HELP's test "
                               f"devices, adapted "
                               f"with {args.n_measurements} table measurements" if fold is not None
                               else "meta predictor (load_pretrained('nb201')) adapted with "
                               f"{args.n_measurements} table measurements"
                               if args.latency_source == "predictor"
                               else "true table latency (calibration)"),
            "latency_csv": str(args.latency_csv) if args.latency_csv else None,
            "screening_latency_std_scale": args.latency_std_scale,
            "screening_options": options,
            "budgets": budgets,
            "elapsed_seconds": round(elapsed, 1),
            "timing": timing,
            "devices": [{"device": p.device, "true_front_size": p.front.size,
                         "reference_point": {"accuracy": round(p.front.ref_accuracy, 4),
                                             "latency_ms": round(p.front.ref_latency, 6)},
                         "latency_measurements": p.measured,
                         "seen_latency_spearman": round(p.spearman, 4)} for p in problems],
            "summary": summarize([r for r in rows if r["split"] == "test"], splits["test"]),
            **({"summary_validation": summarize([r for r in rows if r["split"] == "validation"],
                                                splits["validation"])} if validation else {}),
            "results": rows,
            **({"paired_with": {"path": str(args.paired_with), "differences": paired}}
               if paired is not None else {}),
            "previous_runs": previous_runs(out),
        })
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
