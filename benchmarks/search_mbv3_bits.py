"""Joint architecture + bit-policy search on a fixed mbv3-tiny supernet (digits), scored exactly.

The real search a user runs (``hwnas run``: mbv3-tiny on digits, bit-widths searched) over a
space of about 10^16 (architecture, policy) candidates has no known front. This benchmark fixes
one: ``search_mbv3_bits_table.csv.gz`` holds the exact evaluation of a few thousand candidates
of that joint space (``--build-table`` writes it: a supernet trained on digits with the toolkit's
own recipe, each candidate scored by :class:`hwnas.search.evaluator.TrialEvaluator` exactly as a
trial is: BN recalibration, PTQ under the policy, validation accuracy; latency on the bit-aware
estimated FPGA ``fpga-zcu102-est``, a cheap objective as in a real search).

The search space of the benchmark is the table: every sampler suggests through the joint
space's own Optuna parameters (:class:`hwnas.search.bits.ArchBitsSpace`: the architecture's
parameters, then ``bits:<group>``), and the candidate a trial evaluates is the table's nearest
member to the suggestion (squared distance of the scaled encodings; the suggestion itself when
it is in the table). One trial = one evaluation (repeats count). Score: as
``benchmarks/search_nb201.py`` (``../shared/BENCHMARKS.md``): hypervolume of every evaluated
candidate / that of the table's front, reference point = (lowest front accuracy - 1 point,
highest front latency x 1.01).

Samplers: ``auto`` (the default of ``hwnas run``: here the screening sampler, built by
:func:`hwnas.search.samplers.make_sampler` with the search's settings; its pool is the whole
table, which enumerates itself), ``auto-pool`` (the same, but the table hides its enumeration,
so the sampler keeps the random pool of 1,000 candidates refreshed with mutations of the front
that a real search of the 10^16-candidate space uses), and Optuna's ``tpe``, ``nsga2``,
``random``.

    python benchmarks/search_mbv3_bits.py --build-table   # ~15 min on 2 CPU cores
    python benchmarks/search_mbv3_bits.py
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import gzip
import hashlib
import sys
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
from hwnas.search.bits import DEFAULT_BIT_CHOICES, ArchBits, ArchBitsSpace  # noqa: E402

from hwnas.core.errors import UserError  # noqa: E402

OUT_JSON = Path(__file__).with_suffix(".json")
TABLE = Path(__file__).with_name("search_mbv3_bits_table.csv.gz")
DEVICE = "fpga-zcu102-est"
SAMPLER_CHOICES = ("auto", "auto-pool", "tpe", "nsga2", "random")
COLUMNS = ("candidate", "accuracy", "latency_ms", "size_bytes")


# ------------------------------------------------------------------------------------------------
# the candidates: the table as a search space
# ------------------------------------------------------------------------------------------------


class TableSpace:
    """The table's candidates with the interface the samplers read (``suggest``, ``to_params``,
    ``sample``, ``to_string`` / ``from_string``, ``encode``; ``all_architectures`` unless
    ``enumerable`` is off). ``suggest`` snaps the joint space's suggestion to the nearest
    member."""

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


def load_table(path: Path) -> dict[str, np.ndarray | list[str]]:
    if not path.is_file():
        raise UserError(f"table {path} not found; build it with --build-table")
    with gzip.open(path, "rt", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows or any(c not in rows[0] for c in COLUMNS):
        raise UserError(f"{path}: expected columns {', '.join(COLUMNS)}")
    return {"candidate": [r["candidate"] for r in rows],
            **{c: np.array([float(r[c]) for r in rows]) for c in COLUMNS[1:]}}


# ------------------------------------------------------------------------------------------------
# building the table
# ------------------------------------------------------------------------------------------------


def joint_space(data: Any) -> tuple[Any, ArchBitsSpace]:
    from hwnas.supernet.spaces import get_space

    h, _ = data.image_size
    space = get_space("mbv3-tiny", in_channels=data.in_channels, image_size=h,
                      num_classes=data.num_classes)
    return space, ArchBitsSpace(space, DEFAULT_BIT_CHOICES)


def build_table(path: Path, n_archs: int, policies: int, epochs: int, seed: int,
                progress: bool, supernet_path: Path | None = None,
                settings: Any = None) -> dict[str, Any]:
    """Train the supernet (or load ``supernet_path``), draw ``n_archs`` architectures with
    ``policies`` policies each (:meth:`ArchBitsSpace.sample`'s policies: a quarter uniform),
    and evaluate every pair as :class:`TrialEvaluator` does; the BN-recalibrated float subnet
    is built once per architecture and quantized per policy (checked equal to the evaluator's
    own call on the first architecture)."""
    import torch
    from hwnas.search.evaluator import (
        COST_METRICS,
        EvalSettings,
        TrialEvaluator,
        device_latency,
        quantized_layers,
    )
    from hwnas.supernet.data.sources import load_dataset
    from hwnas.supernet.evaluate import accuracy, eval_loader
    from hwnas.supernet.train import default_config, load_checkpoint, train_supernet
    from tqdm import tqdm

    torch.manual_seed(seed)
    data = load_dataset("digits", seed=0)
    space, joint = joint_space(data)
    t0 = time.time()
    if supernet_path is not None:
        _, supernet, payload = load_checkpoint(supernet_path, space=space)
        epochs = (payload.get("train_config") or {}).get("epochs", epochs)
    else:
        supernet = space.build_supernet()
        train_supernet(supernet, space, data, default_config(space, epochs, seed=seed),
                       device="cpu", progress=progress)
    train_s = time.time() - t0
    settings = settings or EvalSettings()
    evaluator = TrialEvaluator(space, supernet, data, [DEVICE], settings=settings)
    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    groups: list[tuple[Any, list[ArchBits]]] = []
    while len(groups) < n_archs:
        a = space.sample(rng)
        if space.to_string(a) in seen:
            continue
        seen.add(space.to_string(a))
        cands: dict[str, ArchBits] = {}
        for _ in range(20 * policies):
            if len(cands) >= policies:
                break
            c = ArchBits(a, joint.sample(rng).bits)
            cands.setdefault(joint.to_string(c), c)
        groups.append((a, list(cands.values())))
    rows = []
    t0 = time.time()
    for g, (arch, cands) in enumerate(tqdm(groups, desc="architectures", disable=not progress)):
        model = evaluator.float_model(arch)
        for c in cands:
            policy = joint.policy(c)
            scored = model if policy is None else evaluator.quantized_model(model, policy)
            acc = accuracy(scored, eval_loader(data, data.val, device="cpu"))
            m = evaluator(c.arch, policy) if g == 0 else None
            if m is not None and abs(m["accuracy"] - acc) > 1e-9:
                raise RuntimeError(f"amortized accuracy {acc} != the evaluator's "
                                   f"{m['accuracy']} for {joint.to_string(c)}")
            lat, _ = device_latency(evaluator.devices[DEVICE], space, arch, policy)
            size = COST_METRICS["size_bytes"](*quantized_layers(space, arch, policy), policy)
            if m is not None and (abs(m[f"latency_ms:{DEVICE}"] - lat) > 1e-12
                                  or m["size_bytes"] != size):
                raise RuntimeError(f"latency/size differ from the evaluator's for "
                                   f"{joint.to_string(c)}")
            rows.append((joint.to_string(c), acc, lat, size))
    eval_s = time.time() - t0
    with gzip.open(path, "wt", newline="", encoding="utf-8", compresslevel=9) as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for key, acc, lat, size in rows:
            w.writerow((key, f"{acc:.4f}", f"{lat:.6g}", int(size)))
    return {"train_seconds": round(train_s, 1), "eval_seconds": round(eval_s, 1),
            "epochs": epochs, "architectures": n_archs, "policies_per_architecture": policies,
            "pairs": len(rows), "eval_settings": settings.to_dict(),
            "supernet": str(supernet_path) if supernet_path else "trained here"}


# ------------------------------------------------------------------------------------------------
# searching it
# ------------------------------------------------------------------------------------------------


def make_sampler(name: str, seed: int, space: TableSpace, table: dict) -> Any:
    from hwnas.search.samplers import ScreeningProblem, make_sampler

    if name in ("auto", "auto-pool"):
        lat = table["latency_ms"]

        def cheap(batch: Sequence[ArchBits]) -> tuple[np.ndarray, np.ndarray]:
            rows = [space.row(c) for c in batch]
            return lat[rows][:, None], np.zeros((len(rows), 1))

        problem = ScreeningProblem(space=space, directions=("maximize", "minimize"),
                                   cheap=cheap, cheap_indices=(1,))
        return make_sampler("screening", seed, problem=problem)
    return make_sampler(name, seed)


def run_search(space: TableSpace, table: dict, sampler: str, seed: int, n: int) -> list[int]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    evaluated: list[int] = []
    acc, lat = table["accuracy"], table["latency_ms"]

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        i = space.row(space.suggest(trial))
        evaluated.append(i)
        return float(acc[i]), float(lat[i])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(directions=["maximize", "minimize"],
                                    sampler=make_sampler(sampler, seed, space, table))
        study.optimize(objective, n_trials=n)
    return evaluated


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-table", action="store_true",
                    help=f"train the supernet and (re)write {TABLE.name}")
    ap.add_argument("--archs", type=int, default=750, help="--build-table: architectures")
    ap.add_argument("--policies", type=int, default=4,
                    help="--build-table: bit policies per architecture")
    ap.add_argument("--epochs", type=int, default=15, help="--build-table: supernet epochs")
    ap.add_argument("--supernet", type=Path, default=None,
                    help="--build-table: a trained mbv3-tiny digits checkpoint (default: train)")
    ap.add_argument("--calib-batches", type=int, default=None,
                    help="--build-table: BN recalibration batches (default: the evaluator's)")
    ap.add_argument("--ptq-images", type=int, default=None,
                    help="--build-table: PTQ calibration images (default: the evaluator's)")
    ap.add_argument("--table", type=Path, default=TABLE)
    ap.add_argument("--samplers", nargs="+", default=list(SAMPLER_CHOICES),
                    choices=list(SAMPLER_CHOICES))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budgets", nargs="+", type=int, default=[50, 100, 300])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        return _main(args, argv if argv is not None else sys.argv[1:])
    except UserError as exc:
        print(f"search_mbv3_bits: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    from tqdm import tqdm

    if args.seeds < 1 or any(b < 1 for b in args.budgets) or args.archs < 1 \
            or args.policies < 1 or args.epochs < 1:
        raise UserError("--seeds, --budgets, --archs, --policies and --epochs must be positive")
    build = None
    if args.build_table:
        from hwnas.search.evaluator import EvalSettings

        given = {k: v for k, v in (("calib_batches", args.calib_batches),
                                   ("ptq_images", args.ptq_images)) if v is not None}
        build = build_table(args.table, args.archs, args.policies, args.epochs, 0,
                            not args.quiet, args.supernet, EvalSettings(**given))
        print(f"wrote {args.table}: {build}")
    table = load_table(args.table)
    from hwnas.supernet.data.sources import load_dataset

    _, joint = joint_space(load_dataset("digits", seed=0))
    acc, lat = table["accuracy"], table["latency_ms"]
    front = nb201.true_front(lat, acc)
    budgets = sorted(set(args.budgets))
    rows = []
    t_start = time.time()
    bar = tqdm(total=len(args.samplers) * args.seeds, desc="searches", disable=args.quiet)
    seconds: dict[str, list[float]] = {}
    for name in args.samplers:
        space = TableSpace(joint, table["candidate"], enumerable=name != "auto-pool")
        scores: dict[int, list[float]] = {b: [] for b in budgets}
        repeats = []
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            traj = run_search(space, table, name, seed, max(budgets))
            seconds.setdefault(name, []).append(time.perf_counter() - t0)
            for b, v in nb201.score_trajectory(traj, budgets, lat, acc, front).items():
                scores[b].append(v)
            repeats.append(len(traj) - len(set(traj)))
            bar.update(1)
        for b in budgets:
            v = np.asarray(scores[b])
            rows.append({"space": "mbv3-tiny+bits", "device": DEVICE, "sampler": name,
                         "evaluations": b, "hv_ratio_mean": round(float(v.mean()), 4),
                         "hv_ratio_std": round(float(v.std()), 4),
                         "hv_ratio_min": round(float(v.min()), 4), "seeds": len(v),
                         "hv_ratio_per_seed": [round(float(x), 4) for x in v],
                         "repeated_evaluations_mean": round(float(np.mean(repeats)), 1)})
    bar.close()
    elapsed = time.time() - t_start
    print(f"\n{len(acc)} candidates, front of {front.size}; hv_ratio (mean ± std over "
          f"{args.seeds} seeds, worst seed)")
    print(f"{'sampler':<11}" + "".join(f"{f'@{b}':>24}" for b in budgets))
    for name in args.samplers:
        cells = [r for r in rows if r["sampler"] == name]
        print(f"{name:<11}" + "".join(
            f"{c['hv_ratio_mean']:>10.4f}±{c['hv_ratio_std']:.4f} ({c['hv_ratio_min']:.3f})"
            for c in cells))
    standard = (args.table == TABLE and args.samplers == list(SAMPLER_CHOICES)
                and args.seeds == 5 and budgets == [50, 100, 300])
    out = args.out or (OUT_JSON if standard else None)
    if out is not None:
        from hwnas.search.samplers import DEFAULT_SAMPLER

        nb201.write_json(out, {
            "command": "python benchmarks/search_mbv3_bits.py " + " ".join(argv),
            "machine": nb201.machine(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "default_sampler": DEFAULT_SAMPLER,
            "table": args.table.name, "table_build": build,
            "table_sha256": hashlib.sha256(args.table.read_bytes()).hexdigest(),
            "objectives": ["accuracy (max, % of the digits validation split)",
                           f"latency:{DEVICE} (min, ms; cheap)"],
            "candidates": len(acc), "true_front_size": front.size,
            "reference_point": {"accuracy": round(front.ref_accuracy, 4),
                                "latency_ms": round(front.ref_latency, 6)},
            "elapsed_seconds": round(elapsed, 1),
            "seconds_per_search_mean": {k: round(float(np.mean(v)), 2)
                                        for k, v in seconds.items()},
            "results": rows,
        })
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
