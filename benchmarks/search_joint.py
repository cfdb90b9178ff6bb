"""Samplers on the joint architecture + bit-policy search of ``hwnas run``, over an exact table.

``hwnas run`` with its defaults searches mbv3-tiny on digits jointly with one weight width per
layer group (about 10^16 candidates), for three objectives: accuracy (max), latency on
``cpu-ort-1t`` (min, measured on this CPU) and model size (min). That space has no known front,
so this benchmark fixes one: a table of a few thousand (architecture, policy) pairs, each
evaluated exactly as a trial of that search is, on one fixed supernet:

* the run's own objects (:mod:`hwnas.search.runner`): ``SearchConfig`` at its defaults with
  ``supernet=`` the checkpoint, the splits the run replays (validation disjoint from the
  supernet's training images), the run's :class:`~hwnas.search.evaluator.TrialEvaluator`
  (BatchNorm recalibration, PTQ under the policy, validation accuracy; latency on the run's
  devices; size), and the run's seed trials (largest/smallest float and int8, the Hessian
  policies), which are table members;
* the other candidates drawn reproducibly, stratified over the space: architectures in equal
  numbers from equal-width bins of log FLOPs (so the small and large ends, where the front
  lies, are not left to the thin tails of random draws), each with one uniform policy (the
  width rotating over the choices) and independent per-group draws.

The search space of the benchmark *is* the table (a lookup-only search): every sampler proposes
through the joint space's own Optuna parameters, and a trial evaluates the table member nearest
to the proposal (:class:`TableSpace`: the proposal itself when it is a member),
so no candidate outside the table is ever scored. The run's seeds are enqueued first, as the run
does. Score: hypervolume of every evaluated candidate / that of the table's front, over the
search's three objectives, reference point as ``../shared/BENCHMARKS.md`` defines it for each
objective (accuracy: lowest front value - 1 point; latency and size: highest front value x
1.01); the two-objective (accuracy, latency) ratio of BENCHMARKS.md beside it. ``--objectives``
searches other columns of the table (``accuracy,latency:fpga-zcu102-est``: the two-objective
view with a cheap latency of the benchmark this one replaced, ``search_mbv3_bits.py``);
``--misses`` lists the front points each search missed.

    python benchmarks/search_joint.py --build-table --supernet CKPT   # resumable, see --help
    python benchmarks/search_joint.py
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import gzip
import hashlib
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import search_nb201 as nb201
except ModuleNotFoundError:
    from benchmarks import search_nb201 as nb201
from hwnas.search.bits import ArchBits, ArchBitsSpace  # noqa: E402
from hwnas.search.pareto import hypervolume_2d  # noqa: E402

from hwnas.core.errors import UserError  # noqa: E402
from hwnas.core.io import file_sha256  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT_JSON = Path(__file__).with_suffix(".json")
TABLE = HERE / "results" / "search_joint" / "table.csv.gz"
SAMPLER_CHOICES = ("auto", "auto-pool", "tpe", "nsga2", "random", "gp")
#: Optuna's GP sampler is left out by default: on this space (33 categorical parameters, three
#: objectives) one search of 100 evaluations took 525 s on a synthetic 400-row table
DEFAULT_SAMPLERS = ("auto", "auto-pool", "tpe", "nsga2", "random")
#: table columns besides the objectives' (the candidate and the run's seed label, if a seed)
KEY_COLUMNS = ("candidate", "seed")


# ------------------------------------------------------------------------------------------------
# scoring
# ------------------------------------------------------------------------------------------------


def to_losses(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    """Objective values (rows x objectives) as losses: maximised columns negated."""
    sign = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
    return np.asarray(values, dtype=np.float64) * sign


def nondominated(losses: np.ndarray) -> np.ndarray:
    """Indices of the rows no other row dominates (all losses <=, one <); duplicates: the
    first."""
    losses = np.asarray(losses, dtype=np.float64)
    keep = []
    for i, p in enumerate(losses):
        le = np.all(losses <= p, axis=1)
        lt = np.any(losses < p, axis=1)
        dominated = np.any(le & lt)
        same_before = np.any(np.all(losses[:i] == p, axis=1))
        if not dominated and not same_before:
            keep.append(i)
    return np.asarray(keep, dtype=int)


def hypervolume(losses: np.ndarray, ref: np.ndarray) -> float:
    """Exact hypervolume dominated by ``losses`` (minimised, 2 or 3 columns) and bounded by
    ``ref``; points not strictly better than ``ref`` in every objective add nothing. Three
    objectives: slices along the last one, each a 2-D area
    (:func:`hwnas.search.pareto.hypervolume_2d`)."""
    losses = np.asarray(losses, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    losses = losses[np.all(losses < ref, axis=1)]
    if len(losses) == 0:
        return 0.0
    if losses.shape[1] == 2:
        return hypervolume_2d(losses[:, 1], -losses[:, 0], ref[1], -ref[0])
    if losses.shape[1] != 3:
        raise ValueError(f"hypervolume of {losses.shape[1]} objectives: expected 2 or 3")
    losses = losses[nondominated(losses)]
    levels = np.unique(losses[:, 2])
    bounds = np.append(levels[1:], ref[2])
    total = 0.0
    for z, z_next in zip(levels, bounds):
        below = losses[losses[:, 2] <= z]
        total += (z_next - z) * hypervolume_2d(below[:, 1], -below[:, 0], ref[1], -ref[0])
    return float(total)


@dataclasses.dataclass(frozen=True)
class Front:
    """The table's front over some objectives, and the scoring reference point (losses)."""

    columns: tuple[str, ...]
    ref: np.ndarray
    hypervolume: float
    size: int


def true_front(table: dict[str, Any], columns: Sequence[str],
               directions: Sequence[str]) -> Front:
    """Front of the whole table; reference point as BENCHMARKS.md: accuracy = lowest front
    accuracy - 1 point, every minimised objective = its highest front value x 1.01."""
    losses = to_losses(np.stack([table[c] for c in columns], 1), directions)
    idx = nondominated(losses)
    worst = losses[idx].max(0)
    ref = np.array([w + 1.0 if d == "maximize" else w * 1.01 for w, d in zip(worst, directions)])
    return Front(tuple(columns), ref, hypervolume(losses[idx], ref), len(idx))


def hv_ratio(rows: Sequence[int], table: dict[str, Any], front: Front,
             directions: Sequence[str]) -> float:
    """Hypervolume of the table rows ``rows`` (repeats allowed) / that of the front."""
    rows = np.unique(np.asarray(rows, dtype=int))
    if len(rows) == 0:
        return 0.0
    losses = to_losses(np.stack([table[c][rows] for c in front.columns], 1), directions)
    return hypervolume(losses, front.ref) / front.hypervolume


def front_misses(rows: Sequence[int], table: dict[str, Any], front: Front,
                 directions: Sequence[str]) -> dict[str, list[int]]:
    """The table's front points that the evaluated ``rows`` neither hold nor weakly dominate,
    split by what the search lacked: ``"policy"`` (the point's architecture was evaluated, under
    another policy) and ``"architecture"`` (never evaluated under any policy)."""
    losses = to_losses(np.stack([table[c] for c in front.columns], 1), directions)
    seen = np.unique(np.asarray(rows, dtype=int))
    archs = {table["candidate"][i].partition(ArchBitsSpace.SEPARATOR)[0] for i in seen}
    out: dict[str, list[int]] = {"policy": [], "architecture": []}
    for i in nondominated(losses):
        if not np.any(np.all(losses[seen] <= losses[i], axis=1)):
            arch = table["candidate"][i].partition(ArchBitsSpace.SEPARATOR)[0]
            out["policy" if arch in archs else "architecture"].append(int(i))
    return out


# ------------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------------


class TableSpace:
    """The table's candidates with the interface the samplers read (``suggest``, ``to_params``,
    ``sample``, ``to_string`` / ``from_string``, ``encode``; ``all_architectures`` unless
    ``enumerable`` is off). ``suggest`` snaps the joint space's suggestion to the nearest
    member (squared distance of the min-max scaled encodings), so that samplers proposing free
    parameter values search the table and nothing outside it is ever scored."""

    def __init__(self, joint: ArchBitsSpace, keys: Sequence[str], *, enumerable: bool = True):
        self.joint = joint
        self.keys = list(keys)
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.members = [joint.from_string(k) for k in self.keys]
        F = np.stack([joint.encode(c) for c in self.members]).astype(np.float64)
        self._lo = F.min(0)
        self._span = np.where(np.ptp(F, 0) > 1e-12, np.ptp(F, 0), 1.0)
        self._F = (F - self._lo) / self._span
        self._sq = (self._F ** 2).sum(1)
        self.name = f"{joint.name}-table"
        if enumerable:
            self.all_architectures = lambda: iter(self.members)

    def row(self, cand: ArchBits) -> int:
        """The table row of ``cand``, or of its nearest member."""
        i = self.index.get(self.joint.to_string(cand))
        if i is not None:
            return i
        f = (np.asarray(self.joint.encode(cand), np.float64) - self._lo) / self._span
        return int(np.argmin(self._sq - 2.0 * self._F @ f))

    def suggest(self, trial: Any) -> ArchBits:
        return self.members[self.row(self.joint.suggest(trial))]

    def sample(self, rng: np.random.Generator) -> ArchBits:
        return self.members[int(rng.integers(len(self.members)))]

    def to_params(self, cand: ArchBits) -> dict[str, Any]:
        return self.joint.to_params(cand)

    def to_string(self, cand: ArchBits) -> str:
        return self.joint.to_string(cand)

    def from_string(self, text: str) -> ArchBits:
        return self.joint.from_string(text)

    def encode(self, cand: ArchBits) -> np.ndarray:
        return self.joint.encode(cand)


def joint_space(cfg: Any, data: Any) -> ArchBitsSpace:
    """The joint candidates of the search ``cfg`` on ``data`` (its space, its bit choices)."""
    from hwnas.supernet.spaces import get_space

    h, _ = data.image_size
    space = get_space(cfg.space, in_channels=data.in_channels, image_size=h,
                      num_classes=data.num_classes)
    return ArchBitsSpace(space, cfg.bit_choices)


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` (``--shard``) as (I, N), 0 <= I < N."""
    i, sep, n = text.partition("/")
    try:
        index, count = int(i), int(n)
    except ValueError:
        index, count = -1, 0
    if not sep or not 0 <= index < count:
        raise UserError(f"--shard {text!r}: expected I/N with 0 <= I < N, e.g. 0/4")
    return index, count


def build_settings(table: Path) -> dict[str, Any]:
    """The run settings a table was built with (its build record beside it: space, dataset,
    objectives), so that a table of another checkpoint is scored as built; {} without one."""
    record = table.with_suffix("").with_suffix(".json")
    if not record.is_file():
        return {}
    try:
        return dict(json.loads(record.read_text()).get("settings") or {})
    except (ValueError, AttributeError):
        raise UserError(f"{record}: not a build record (JSON with 'settings')") from None


def load_table(path: Path, columns: Sequence[str]) -> dict[str, Any]:
    """The table as columns (``candidate`` and ``seed`` as lists, the others as arrays)."""
    if not path.is_file():
        raise UserError(f"table {path} not found; build it with --build-table")
    try:
        with gzip.open(path, "rt", newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, EOFError, csv.Error) as exc:
        raise UserError(f"{path}: not a gzip-compressed CSV table ({exc})") from None
    need = [*KEY_COLUMNS, *columns]
    if not rows or any(c not in rows[0] for c in need):
        raise UserError(f"{path}: expected the columns {', '.join(need)}")
    out: dict[str, Any] = {c: [r[c] for r in rows] for c in KEY_COLUMNS}
    for c in rows[0]:
        if c not in KEY_COLUMNS:
            try:
                out[c] = np.array([float(r[c]) for r in rows])
            except ValueError:
                raise UserError(f"{path}: column {c} holds a value that is not a number") from None
    if len(set(out["candidate"])) != len(rows):
        raise UserError(f"{path}: a candidate appears twice")
    return out


def run_config(supernet: Path | str | None, objectives: str | None = None, **fields: Any) -> Any:
    """The settings of ``hwnas run`` at its defaults, on the checkpoint ``supernet``, with
    ``objectives`` and other :class:`~hwnas.search.config.SearchConfig` ``fields`` (space,
    dataset, devices, torch_device) instead of the default ones where given (not None)."""
    from hwnas.search.config import SearchConfig

    cfg = SearchConfig(supernet=None if supernet is None else str(supernet))
    given = {"objectives": objectives, **fields}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in given.items() if v is not None})
    cfg.validate()
    return cfg


def open_run(cfg: Any) -> tuple[Any, Any, Any, Any]:
    """(space, supernet, data, evaluator) exactly as ``hwnas run`` builds them for ``cfg``:
    the checkpoint loaded and checked, the splits replayed (validation disjoint from the
    supernet's training images, the scoring budget), the trial evaluator on the run's devices."""
    from hwnas.search import runner  # its private steps on purpose: the run's path, not a copy
    from hwnas.supernet.data.sources import load_dataset

    data = load_dataset(cfg.dataset, seed=cfg.data_seed)
    with tempfile.TemporaryDirectory() as tmp:  # no run directory: nothing of it is read
        sn, data = runner._supernet_and_data(cfg, data, Path(tmp) / "run", False, False,
                                             lambda *_: None)
    evaluator = runner._evaluator(cfg, sn.space, sn.supernet, data)
    return sn.space, sn.supernet, data, evaluator


def seed_candidates(joint: ArchBitsSpace, seeds: Sequence[tuple[dict, str]]
                    ) -> list[tuple[ArchBits, str]]:
    """The run's seed trials (``runner.seed_trials``: params, label) as joint candidates."""
    import optuna

    return [(joint.suggest(optuna.trial.FixedTrial(params)), label) for params, label in seeds]


def plan_candidates(joint: ArchBitsSpace, n_archs: int, policies: int, seed: int, *,
                    bins: int = 16, pool_factor: int = 40) -> list[ArchBits]:
    """``n_archs`` distinct architectures, stratified: a random pool of ``pool_factor`` x
    ``n_archs`` draws is cut into ``bins`` equal-width bins of log FLOPs and the bins are taken
    in turn, one random member each, until enough are chosen (a bin that runs dry drops out).
    Each architecture gets one uniform policy (the width rotating over the choices, so every
    uniform width spans the FLOPs range) and ``policies - 1`` independent per-group draws
    (duplicates of one model dropped). Deterministic in ``seed``."""
    space = joint.space
    rng = np.random.default_rng(seed)
    pool: dict[str, Any] = {}
    for _ in range(pool_factor * n_archs):
        a = space.sample(rng)
        pool.setdefault(space.to_string(a), a)
    archs = list(pool.values())
    logf = np.log(np.array([space.flops(a) for a in archs], dtype=np.float64))
    edges = np.linspace(logf.min(), logf.max(), bins + 1)
    which = np.clip(np.searchsorted(edges, logf, side="right") - 1, 0, bins - 1)
    members = [list(rng.permutation(np.flatnonzero(which == b))) for b in range(bins)]
    chosen: list[Any] = []
    while len(chosen) < min(n_archs, len(archs)):
        for b in range(bins):
            if members[b] and len(chosen) < n_archs:
                chosen.append(archs[members[b].pop()])
    out: list[ArchBits] = []
    n_groups, choices = len(joint.groups), joint.choices
    for i, arch in enumerate(chosen):
        cands = {}
        uniform = ArchBits(arch, (choices[i % len(choices)],) * n_groups)
        cands[joint.to_string(uniform)] = uniform
        for _ in range(20 * policies):
            if len(cands) >= policies:
                break
            c = ArchBits(arch, tuple(choices[int(j)] for j in
                                     rng.integers(0, len(choices), n_groups)))
            cands.setdefault(joint.to_string(c), c)
        out.extend(cands.values())
    return out


def build_table(path: Path, supernet: Path, n_archs: int, policies: int, seed: int, *,
                work: Path, max_minutes: float, progress: bool, space: str | None = None,
                dataset: str | None = None, objectives: str | None = None,
                devices: Sequence[str] | None = None, torch_device: str | None = None,
                shard: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """Evaluate the planned candidates (the run's seeds first) with the run's own evaluator
    (``space``, ``dataset``, ``objectives``, ``devices``, ``torch_device``: the run's settings
    where given), one ``evaluator(arch, policy)`` call per candidate, appending rows to
    ``work``'s partial CSV after each; a second call resumes there. ``shard = (i, n)``: this
    call evaluates every n-th planned candidate from the i-th, into its own partial CSV, so
    that n processes share the work (the first call computes the seeds alone). Stops after
    ``max_minutes`` (rerun to go on); the table is written (atomically) by the call that finds
    every candidate evaluated, by any shard. Returns the build's record (also written beside
    the table as JSON)."""
    from hwnas.search import runner
    from hwnas.search.evaluator import metric_columns
    from tqdm import tqdm

    from hwnas.core.io import write_json

    cfg = run_config(supernet, objectives, space=space, dataset=dataset,
                     devices=None if devices is None else list(devices), torch_device=torch_device)
    space, net, data, evaluator = open_run(cfg)
    joint = ArchBitsSpace(space, cfg.bit_choices)
    checkpoint_sha = file_sha256(supernet)
    work.mkdir(parents=True, exist_ok=True)
    seeds_file = work / f"seeds-{checkpoint_sha[:12]}.json"
    if seeds_file.is_file():  # the Hessian seeds take a while: computed once per checkpoint
        seeds = [(s["params"], s["label"]) for s in json.loads(seeds_file.read_text())]
    else:
        seeds = runner.seed_trials(space, net, data, cfg, log=lambda *_: None)
        write_json(seeds_file, [{"params": p, "label": lab} for p, lab in seeds])
    labelled = seed_candidates(joint, seeds)
    plan: dict[str, tuple[ArchBits, str]] = {}
    for cand, label in labelled:
        plan.setdefault(joint.to_string(cand), (cand, label))
    for cand in plan_candidates(joint, n_archs, policies, seed):
        plan.setdefault(joint.to_string(cand), (cand, ""))
    columns = metric_columns(cfg.all_devices)
    header = [*KEY_COLUMNS, *columns]
    tag = hashlib.sha256(",".join(header).encode()).hexdigest()[:8]  # the columns evaluated
    stem = f"partial-{checkpoint_sha[:12]}-{n_archs}x{policies}-s{seed}-{tag}"
    index, count = shard
    partial = work / (f"{stem}-shard{index}of{count}.csv" if count > 1 else f"{stem}.csv")
    rows = _partial_rows(work, stem)  # every shard's rows: each evaluates its own slice
    todo = [(k, c, lab) for j, (k, (c, lab)) in enumerate(plan.items())
            if j % count == index and k not in rows]
    t0 = time.time()
    evaluated = 0
    new_file = not partial.is_file()
    if not new_file:  # a row cut off by a killed call: dropped, so the next one starts a line
        text = partial.read_bytes()
        if text and not text.endswith(b"\n"):
            partial.write_bytes(text[:text.rfind(b"\n") + 1])
    with partial.open("a", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        if new_file:
            w.writerow(header)
        for key, cand, label in tqdm(todo, desc="candidates", disable=not progress):
            if time.time() - t0 > 60 * max_minutes:
                break
            m = evaluator(cand.arch, joint.policy(cand))
            w.writerow([key, label, *(repr(float(m[c])) for c in columns)])
            fh.flush()
            evaluated += 1
    seconds = time.time() - t0
    rows = _partial_rows(work, stem)
    left = sum(k not in rows for k in plan)
    calls_file = partial.with_suffix(".calls.json")  # every call's time, for the record
    calls = json.loads(calls_file.read_text()) if calls_file.is_file() else []
    calls.append({"seconds": round(seconds, 1), "evaluations": evaluated})
    write_json(calls_file, calls)
    calls = [{**c, "shard": f.name[len(stem):-len(".calls.json")].lstrip("-") or "all"}
             for f in sorted(work.glob(f"{stem}*.calls.json"),  # every shard's, for the record
                             key=lambda f: (f.name != f"{stem}.calls.json", f.name))
             for c in json.loads(f.read_text())]
    record = {"checkpoint": str(supernet), "checkpoint_sha256": checkpoint_sha,
              "settings": {k: v for k, v in cfg.to_dict().items() if k != "supernet"},
              "eval_settings": dataclasses.asdict(evaluator.settings),
              "validation_images": len(data.val),
              "architectures": n_archs, "policies_per_architecture": policies, "seed": seed,
              "seed_trials": [lab for _, lab in labelled], "pairs": len(plan),
              "calls": calls, "evaluation_seconds": round(sum(c["seconds"] for c in calls), 1),
              "left": left}
    if left:
        print(f"{left} of {len(plan)} candidates left; rerun the same command to go on")
        return record
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", newline="", encoding="utf-8", compresslevel=9) as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for key in plan:  # plan order: seeds, then the strata
            r = rows[key]
            w.writerow([r["candidate"], r["seed"], *(_short(r[c]) for c in columns)])
    tmp.replace(path)
    record.update(machine=nb201.machine(),
                  date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  table_sha256=file_sha256(path))
    write_json(path.with_suffix("").with_suffix(".json"), record)
    return record


def _partial_rows(work: Path, stem: str) -> dict[str, dict[str, str]]:
    """The rows evaluated so far by every call (all shards) of the build ``stem``, by
    candidate: a row cut off mid-write (no newline yet) is left out and evaluated again."""
    rows: dict[str, dict[str, str]] = {}
    for f in sorted(work.glob(f"{stem}*.csv")):
        text = f.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines = lines[:-1]
        for r in csv.DictReader(lines):
            rows[r["candidate"]] = r
    return rows


def _short(text: str) -> str:
    """A table value with 7 significant digits (accuracies are multiples of 100/N exactly
    enough; latency and size keep far more than their noise)."""
    v = float(text)
    return "nan" if np.isnan(v) else f"{v:.7g}"


# ------------------------------------------------------------------------------------------------
# searching the table
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Problem:
    """The table as the search sees it: its candidates (lookup-only), the objectives of the run
    (``hwnas.search.objectives.Metric``), the run's seeds and its screening problem."""

    table: dict[str, Any]
    joint: ArchBitsSpace
    objectives: list[Any]
    seeds: list[tuple[dict, str]]
    screening: Any  # hwnas.search.samplers.ScreeningProblem over ArchBitsSpace

    @property
    def columns(self) -> list[str]:
        return [m.column for m in self.objectives]

    @property
    def directions(self) -> list[str]:
        return [m.direction for m in self.objectives]


def make_problem(table: dict[str, Any], joint: ArchBitsSpace, cfg: Any) -> Problem:
    """The search problem of ``cfg`` (the run's objectives, its screening problem: the cheap
    objectives computed by the search's own :class:`~hwnas.search.evaluator.CheapMetrics`) over
    the table's candidates; the run's seeds are the rows with a seed label."""
    from hwnas.latency.devices import get_device
    from hwnas.search.samplers import screening_problem

    objectives = cfg.objective_metrics
    devices = {d: get_device(d, joint.space) for d in cfg.all_devices}
    screening = screening_problem(joint.space, objectives, cfg.constraint_list, devices,
                                  bits=cfg.bits, bit_choices=cfg.bit_choices)
    seeds = [(joint.to_params(joint.from_string(k)), label)
             for k, label in zip(table["candidate"], table["seed"]) if label]
    return Problem(table, joint, objectives, seeds, screening)


def make_study_sampler(name: str, seed: int, space: Any, problem: Problem, n_seeds: int,
                       options: dict[str, Any] | None = None):
    """The sampler ``hwnas run`` builds for ``name`` (``auto`` resolved on the run's
    objectives; ``auto-pool`` is ``auto`` on a table that hides its enumeration), with the
    screening problem's candidates replaced by the table; ``options``: a screening variant's
    :class:`~hwnas.search.candidates.ScreeningConfig` fields (``--screening-option``)."""
    from hwnas.search.samplers import make_sampler, resolve_sampler

    resolved = resolve_sampler("auto" if name == "auto-pool" else name, problem.objectives)
    screening = (dataclasses.replace(problem.screening, space=space)
                 if resolved == "screening" else None)
    return make_sampler(resolved, seed, n_seeds=n_seeds, problem=screening,
                        screening_options=options if resolved == "screening" else None)


def run_search(problem: Problem, sampler: str, seed: int, n: int,
               options: dict[str, Any] | None = None) -> list[int]:
    """One lookup-only search of ``n`` evaluations, as ``hwnas run`` runs its study: the
    seeds enqueued once, the sampler built with them counted (``runner._start_study``), the
    run's trial loop (:func:`hwnas.search.study.run_trials`). Returns the table rows
    evaluated, in order (repeats included)."""
    import optuna
    from hwnas.search.study import enqueue_once, open_study, run_trials, sampler_seed

    space = TableSpace(problem.joint, problem.table["candidate"],
                       enumerable=sampler != "auto-pool")
    values = np.stack([problem.table[c] for c in problem.columns], 1)
    evaluated: list[int] = []

    def objective(trial: optuna.Trial) -> tuple[float, ...]:
        i = space.row(space.suggest(trial))
        evaluated.append(i)
        return tuple(float(v) for v in values[i])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = open_study(optuna.storages.InMemoryStorage(), "bench",
                           make_study_sampler(sampler, seed, space, problem, 0, options), seed,
                           problem.objectives)
        n_seeds = enqueue_once(study, problem.seeds)
        study.sampler = make_study_sampler(sampler, sampler_seed(seed, 0), space, problem,
                                           n_seeds, options)
        run_trials(study, objective, n, progress=False)
    return evaluated


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-table", action="store_true",
                    help=f"evaluate the table's candidates (resumable) and write {TABLE.name}")
    ap.add_argument("--supernet", type=Path, default=None,
                    help="--build-table: the mbv3-tiny digits checkpoint (hwnas train --space "
                         "mbv3-tiny --dataset digits --seed 0 --out DIR: DIR/supernet.pt)")
    ap.add_argument("--space", default=None,
                    help="--build-table: the checkpoint's space (default: the run's, mbv3-tiny); "
                         "a table's own is read from its build record")
    ap.add_argument("--dataset", default=None,
                    help="--build-table: the checkpoint's dataset (default: the run's, digits)")
    ap.add_argument("--devices", nargs="+", default=None,
                    help="--build-table: the devices reported beside the objectives' (default: "
                         "the run's; estimators only keep a build free of timing noise)")
    ap.add_argument("--torch-device", default=None, help="--build-table: e.g. cuda")
    ap.add_argument("--shard", default="0/1", metavar="I/N",
                    help="--build-table: evaluate every N-th candidate from the I-th (N "
                         "processes at once, after one call has computed the seeds)")
    ap.add_argument("--archs", type=int, default=500, help="--build-table: architectures")
    ap.add_argument("--policies", type=int, default=6,
                    help="--build-table: bit policies per architecture")
    ap.add_argument("--max-minutes", type=float, default=9.0,
                    help="--build-table: stop after this long; rerun to go on")
    ap.add_argument("--work", type=Path,
                    default=Path(tempfile.gettempdir()) / "hwnas-search-joint",
                    help="--build-table: where the partial table and the seeds are kept")
    ap.add_argument("--table", type=Path, default=TABLE)
    ap.add_argument("--objectives", default=None,
                    help="search these objectives of the table instead of the run's defaults, "
                         "e.g. accuracy,latency:fpga-zcu102-est (the two-objective view with a "
                         "cheap latency that the screening sampler knows for every candidate)")
    ap.add_argument("--samplers", nargs="+", default=list(DEFAULT_SAMPLERS),
                    choices=list(SAMPLER_CHOICES))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budgets", nargs="+", type=int, default=[50, 100, 300])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--misses", action="store_true",
                    help="print, per search and budget, the front points it missed and the "
                         "hypervolume ratio it would have with them: those whose architecture "
                         "it evaluated under another policy, and those whose architecture it "
                         "never evaluated")
    ap.add_argument("--screening-option", action="append", default=[], metavar="NAME=VALUE",
                    help="a ScreeningConfig field of the screening sampler (auto included), "
                         "e.g. reference_sd=0: the variant compared (repeatable)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        return _main(args, argv if argv is not None else sys.argv[1:])
    except UserError as exc:
        print(f"search_joint: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    from tqdm import tqdm

    if args.seeds < 1 or any(b < 1 for b in args.budgets) or args.archs < 1 \
            or args.policies < 1 or not args.max_minutes > 0:
        raise UserError("--seeds, --budgets, --archs, --policies and --max-minutes must be "
                        "positive")
    if args.build_table:
        if args.supernet is None or not args.supernet.is_file():
            raise UserError(f"--build-table needs --supernet, a trained mbv3-tiny digits "
                            f"checkpoint (got {args.supernet})")
        record = build_table(args.table, args.supernet, args.archs, args.policies, 0,
                             work=args.work, max_minutes=args.max_minutes,
                             progress=not args.quiet, space=args.space, dataset=args.dataset,
                             objectives=args.objectives, devices=args.devices,
                             torch_device=args.torch_device, shard=parse_shard(args.shard))
        print(json.dumps(record, indent=1))
        if record["left"]:
            return 0
    from hwnas.supernet.data.sources import load_dataset

    options = nb201.screening_options(args.screening_option)
    built = build_settings(args.table)
    cfg = run_config(None, args.objectives or built.get("objectives"), space=built.get("space"),
                     dataset=built.get("dataset"))
    joint = joint_space(cfg, load_dataset(cfg.dataset, seed=cfg.data_seed))
    table = load_table(args.table, [m.column for m in cfg.objective_metrics])
    problem = make_problem(table, joint, cfg)
    budgets = sorted(set(args.budgets))
    fronts = {"joint": true_front(table, problem.columns, problem.directions),
              "accuracy-latency": true_front(table, problem.columns[:2], problem.directions[:2])}
    rows = []
    seconds: dict[str, list[float]] = {}
    t_start = time.time()
    bar = tqdm(total=len(args.samplers) * args.seeds, desc="searches", disable=args.quiet)
    for name in args.samplers:
        scores: dict[tuple[str, int], list[float]] = {}
        repeats = []
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            traj = run_search(problem, name, seed, max(budgets), options)
            seconds.setdefault(name, []).append(time.perf_counter() - t0)
            for kind, front in fronts.items():
                d = problem.directions[:len(front.columns)]
                for b in budgets:
                    scores.setdefault((kind, b), []).append(hv_ratio(traj[:b], table, front, d))
            repeats.append(len(traj) - len(set(traj)))
            if args.misses:
                print_misses(name, seed, traj, budgets, table, fronts["joint"],
                             problem.directions)
            bar.update(1)
        for b in budgets:
            v = np.asarray(scores[("joint", b)])
            w = np.asarray(scores[("accuracy-latency", b)])
            rows.append({"space": "mbv3-tiny+bits", "device": cfg.all_devices[0],
                         "sampler": name, "evaluations": b,
                         "hv_ratio_mean": round(float(v.mean()), 4),
                         "hv_ratio_std": round(float(v.std()), 4),
                         "hv_ratio_min": round(float(v.min()), 4), "seeds": len(v),
                         "hv_ratio_per_seed": [round(float(x), 4) for x in v],
                         "hv2_ratio_mean": round(float(w.mean()), 4),
                         "hv2_ratio_min": round(float(w.min()), 4),
                         "repeated_evaluations_mean": round(float(np.mean(repeats)), 1)})
    bar.close()
    elapsed = time.time() - t_start
    print_table(rows, args.samplers, budgets, fronts, len(table["candidate"]), args.seeds)
    standard = (args.table == TABLE and args.objectives is None
                and args.samplers == list(DEFAULT_SAMPLERS)
                and args.seeds == 5 and budgets == [50, 100, 300] and not options)
    out = args.out or (OUT_JSON if standard else None)
    if out is not None:
        from hwnas.search.samplers import DEFAULT_SAMPLER

        build = args.table.with_suffix("").with_suffix(".json")
        nb201.write_json(out, {
            "command": "python benchmarks/search_joint.py " + " ".join(argv),
            "machine": nb201.machine(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "default_sampler": DEFAULT_SAMPLER,
            "objectives": [m.key for m in cfg.objective_metrics],
            "table": str(args.table.relative_to(HERE.parent)) if args.table.is_relative_to(
                HERE.parent) else str(args.table),
            "table_sha256": file_sha256(args.table),
            "table_build": json.loads(build.read_text()) if build.is_file() else None,
            "candidates": len(table["candidate"]), "seed_trials": len(problem.seeds),
            "true_front_size": {k: f.size for k, f in fronts.items()},
            "reference_point": {k: dict(zip(f.columns, (round(float(x), 6) for x in f.ref)))
                                for k, f in fronts.items()},
            "reference_point_note": "as losses: accuracy negated",
            "elapsed_seconds": round(elapsed, 1),
            "seconds_per_search_mean": {k: round(float(np.mean(v)), 2)
                                        for k, v in seconds.items()},
            "screening_options": options,
            "results": rows,
        })
        print(f"wrote {out}")
    return 0


def print_misses(name: str, seed: int, traj: Sequence[int], budgets: Sequence[int],
                 table: dict[str, Any], front: Front, directions: Sequence[str]) -> None:
    """One line per budget: the ratio, and what adding the missed front points of each kind
    would give (rows: the table's, 0-based after the header)."""
    for b in budgets:
        miss = front_misses(traj[:b], table, front, directions)
        r = hv_ratio(traj[:b], table, front, directions)
        with_p = hv_ratio([*traj[:b], *miss["policy"]], table, front, directions)
        with_a = hv_ratio([*traj[:b], *miss["architecture"]], table, front, directions)
        print(f"{name} seed {seed} @{b}: {r:.4f}; +missed policies of evaluated architectures "
              f"{with_p - r:+.4f} {miss['policy']}; +missed architectures {with_a - r:+.4f} "
              f"{miss['architecture']}")


def print_table(rows: list[dict], samplers: Sequence[str], budgets: Sequence[int],
                fronts: dict[str, Front], n: int, seeds: int) -> None:
    print(f"\n{n} candidates; front of the run's objectives {fronts['joint'].size} points, "
          f"of (accuracy, latency) {fronts['accuracy-latency'].size}")
    print(f"hv_ratio over the run's objectives, mean ± std over {seeds} seeds (worst seed); "
          f"[accuracy-latency mean]")
    print(f"{'sampler':<10}" + "".join(f"{f'@{b}':>33}" for b in budgets))
    for name in samplers:
        cells = [r for r in rows if r["sampler"] == name]
        print(f"{name:<10}" + "".join(
            f"{c['hv_ratio_mean']:>10.4f}±{c['hv_ratio_std']:.4f} ({c['hv_ratio_min']:.3f}) "
            f"[{c['hv2_ratio_mean']:.3f}]" for c in cells))


if __name__ == "__main__":
    raise SystemExit(main())
