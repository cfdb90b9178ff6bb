"""Why predicted latency makes the NAS-Bench-201 search harder (issue 47, development data only).

For each development device and latency predictor (the blocks of ``search_nb201.md``: HELP's
validation devices with the shipped predictor; the four development phones with a predictor
meta-trained without the phone family, ``--predictor-holdout phone``; the same phones with the
shipped predictor or with their true latency), this measures the predictor where the search
needs it, not over the whole space:

* Spearman of predicted vs true latency over all 15,625 cells, over the true front's cells and
  over the *band* (cells within ``--band`` accuracy points of the true front's staircase at
  their true latency: the cells a search competes among);
* how many true-front cells are dominated once latency is predicted (true accuracy, predicted
  latency), and how deep they sink (their non-dominated layer under predicted latency);
* bias and compression on the front: median log(predicted / true) on the front and over all
  cells, and the slope of log predicted on log true over the front;
* the **oracle under predicted latency**: a searcher that knows every accuracy and sees the
  predicted latency evaluates the non-dominated layers of (true accuracy, predicted latency),
  layer by layer, up to the budget (the last layer thinned evenly along predicted latency). Its
  hypervolume ratio, scored as the benchmark scores (true values, ``search_nb201.hv_ratio``), is
  what the predictor lets a sampler that trusts it reach; the first layer alone is the
  predicted front.

With ``--seeds N`` it also runs the screening sampler (``--warps``, e.g. ``none copula``; paired
seeds) and reads each trajectory twice: the benchmark's true hypervolume ratio, and the *seen*
ratio (true accuracy, predicted latency, against the predicted front's hypervolume): how well
the sampler searches the problem it is shown. A seen ratio near 1 with a true ratio near the
oracle's says the loss is the predictor's, not the sampler's.

    OMP_NUM_THREADS=1 python benchmarks/search_nb201_predicted.py --seeds 3 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import search_nb201 as nb
except ModuleNotFoundError:
    from benchmarks import search_nb201 as nb
from hwnas.latency.tables import help_protocol, load_shared_table  # noqa: E402
from hwnas.search.pareto import front_indices_2d, front_layers, hypervolume_2d  # noqa: E402
from hwnas.supernet.spaces import get_space  # noqa: E402

from hwnas.core.errors import UserError  # noqa: E402

PHONES = ["pixel3", "samsung_a50", "samsung_s7", "essential_ph_1"]
#: block -> (devices, latency source, predictor hold-out family, fold training)
BLOCKS: dict[str, tuple[list[str] | None, str, str | None, str | None]] = {
    "A": (None, "predictor", None, None),            # HELP's validation devices, shipped
    "P": (PHONES, "predictor", "phone", "lofo"),     # unseen-phone proxy
    "S": (PHONES, "predictor", "phone", "shipped"),  # the same, HELP-only meta-training
    "Bp": (PHONES, "predictor", None, None),         # phones seen in meta-training (optimistic)
    "B": (PHONES, "table", None, None),              # true latency (the search alone)
    # the true latency with its ties broken (+-0.45 of the resolution, seeded): order of the
    # levels kept, so only the quantization is gone
    "Bj": (PHONES, "jitter", None, None),
    # block P's predictions snapped to the measurements' grid (1 ms where all 10 are integral)
    "Pr": (PHONES, "rounded", "phone", "lofo"),
}


def oracle_rows(seen: np.ndarray, acc: np.ndarray, budget: int) -> np.ndarray:
    """The cells an accuracy oracle that sees ``seen`` latency evaluates with ``budget``
    evaluations: whole non-dominated layers, the last one thinned evenly along ``seen``."""
    picked: list[int] = []
    for layer in front_layers(seen, acc, budget):
        room = budget - len(picked)
        if len(layer) <= room:
            picked.extend(layer.tolist())
        else:
            layer = layer[np.argsort(seen[layer], kind="stable")]
            picked.extend(layer[np.unique(np.linspace(0, len(layer) - 1, room).round()
                                          .astype(int))].tolist())
            break
    return np.asarray(picked, dtype=int)


def band(lat: np.ndarray, acc: np.ndarray, points: float) -> np.ndarray:
    """Cells within ``points`` accuracy points of the true staircase at their true latency."""
    order = np.argsort(lat, kind="stable")
    best = np.maximum.accumulate(acc[order])
    # ties in latency: the staircase at a latency is the best of every cell that fast
    _, first_after = np.unique(lat[order], return_index=True)
    stair = np.empty_like(best)
    ends = np.append(first_after[1:], len(order)) - 1
    for s, e in zip(first_after, ends):
        stair[s:e + 1] = best[e]
    out = np.zeros(len(lat), bool)
    out[order] = acc[order] >= stair - points
    return out


def predictor_at_front(p: Any, budgets: list[int], points: float) -> dict[str, Any]:
    """The predictor's errors where the front is, and the oracle under predicted latency."""
    lat, seen, acc = p.latency, p.seen_latency, p.accuracy
    front = front_indices_2d(lat, acc)
    near = band(lat, acc, points)
    depth = np.zeros(len(lat), dtype=int)  # layer under predicted latency (1: its front)
    rest, k = np.arange(len(lat)), 0
    while (depth[front] == 0).any():
        k += 1
        layer = rest[front_indices_2d(seen[rest], acc[rest])]
        depth[layer] = k
        rest = np.setdiff1d(rest, layer, assume_unique=True)
    log_ratio = np.log(seen / lat)
    slope = float(np.polyfit(np.log(lat[front]), np.log(seen[front]), 1)[0]) \
        if np.ptp(lat[front]) > 0 else float("nan")
    seen_front = front_indices_2d(seen, acc)
    oracle = {b: nb.hv_ratio(oracle_rows(seen, acc, b), lat, acc, p.front) for b in budgets}
    return {
        "device": p.device,
        "spearman_all": round(p.spearman, 4),
        "spearman_front": round(float(spearmanr(seen[front], lat[front])[0]), 4),
        "spearman_band": round(float(spearmanr(seen[near], lat[near])[0]), 4),
        "band_cells": int(near.sum()),
        "true_front_cells": int(len(front)),
        "true_front_latency_levels": int(len(np.unique(lat[front]))),
        "true_front_dominated_under_predicted": int((depth[front] > 1).sum()),
        "true_front_depth_max": int(depth[front].max()),
        "true_front_depth_median": float(np.median(depth[front])),
        "median_log_ratio_front": round(float(np.median(log_ratio[front])), 4),
        "median_log_ratio_all": round(float(np.median(log_ratio)), 4),
        "abs_log_ratio_front": round(float(np.median(np.abs(log_ratio[front]))), 4),
        "abs_log_ratio_all": round(float(np.median(np.abs(log_ratio))), 4),
        "slope_front": round(slope, 4),
        "predicted_front_cells": int(len(seen_front)),
        "predicted_front_hv_ratio": round(nb.hv_ratio(seen_front, lat, acc, p.front), 4),
        "oracle_hv_ratio": {b: round(v, 4) for b, v in oracle.items()},
    }


def seen_ratio(rows: np.ndarray, p: Any) -> float:
    """Hypervolume of ``rows`` under (true accuracy, seen latency) / the seen front's."""
    seen, acc = p.seen_latency, p.accuracy
    f = front_indices_2d(seen, acc)
    ref_c, ref_g = float(seen[f].max()) * 1.01, float(acc[f].min()) - 1.0
    total = hypervolume_2d(seen[f], acc[f], ref_c, ref_g)
    return hypervolume_2d(seen[rows], acc[rows], ref_c, ref_g) / total


def trajectories(space: Any, p: Any, warps: list[str], seeds: int, budgets: list[int],
                 options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The screening sampler per warp and seed: true and seen ratios, front cells found."""
    front = set(front_indices_2d(p.latency, p.accuracy).tolist())
    seen_front = set(front_indices_2d(p.seen_latency, p.accuracy).tolist())
    out = []
    for warp in warps:
        for seed in range(seeds):
            t0 = time.perf_counter()
            traj = np.asarray(nb.run_search(space, p, "screening", seed, max(budgets),
                                            options={**(options or {}), "output_warp": warp}),
                              dtype=int)
            row: dict[str, Any] = {"device": p.device, "warp": warp, "seed": seed,
                                   "seconds": round(time.perf_counter() - t0, 1)}
            for b in budgets:
                got = set(traj[:b].tolist())
                row[f"true@{b}"] = round(nb.hv_ratio(traj[:b], p.latency, p.accuracy,
                                                     p.front), 4)
                row[f"seen@{b}"] = round(seen_ratio(traj[:b], p), 4)
                row[f"true_front_found@{b}"] = len(got & front)
                row[f"seen_front_found@{b}"] = len(got & seen_front)
            row["evaluated"] = traj.tolist()
            out.append(row)
    return out


def problems_of(block: str, space: Any, accuracy: dict[str, float],
                cache: Path | None) -> list[Any]:
    devices, source, fam, training = BLOCKS[block]
    table = load_shared_table("nb201", space=space)
    fold = None
    if fam is not None:
        fold, _ = nb.holdout_predictor(space, fam, cache, training)
    devices = devices or list(help_protocol("nb201").validation)
    test = set(help_protocol("nb201").test)
    if test & set(devices):  # never: development data only
        raise UserError(f"block {block} names HELP test devices {sorted(test & set(devices))}")
    probs = [nb.make_problem(space, table, d, accuracy, 10,
                             "table" if source == "jitter" else
                             "predictor" if source == "rounded" else source, fold)
             for d in devices]
    for p in probs:
        integral = bool(np.all(p.latency == np.round(p.latency)))
        if source == "jitter" and integral:
            p.seen_latency = p.latency + np.random.default_rng(0).uniform(-0.45, 0.45,
                                                                          len(p.latency))
        if source == "rounded" and integral:  # the 10 measurements are table values
            p.seen_latency = np.maximum(np.round(p.seen_latency), 1.0)
        p.spearman = float(spearmanr(p.seen_latency, p.latency)[0])
    return probs


def diagnosis_parser(doc: str, *, seeds: int, checkpoints: list[int]) -> argparse.ArgumentParser:
    """The options the per-trial diagnoses of the default search share
    (``search_nb201_surrogate.py``, ``search_nb201_gap.py``): validation blocks, seeds, the
    trial counts to look at, the fold cache, ScreeningConfig settings and the output."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--blocks", nargs="+", default=["P", "A"], choices=list(BLOCKS))
    ap.add_argument("--seeds", type=int, default=seeds)
    ap.add_argument("--checkpoints", nargs="+", type=int, default=checkpoints)
    ap.add_argument("--fold-cache", type=Path, default=None)
    ap.add_argument("--screening-option", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--out", type=Path, default=None)
    return ap


def write_diagnosis(path: Path, script: str, argv: list[str], options: dict,
                    summary: list, rows: list) -> None:
    """A per-trial diagnosis' JSON (command, machine, date, ScreeningConfig settings, summary
    and rows), as ``search_nb201_surrogate.py`` and ``search_nb201_gap.py`` write it."""
    nb.write_json(path, {
        "command": f"python benchmarks/{script} " + " ".join(argv), "machine": nb.machine(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "screening_options": options, "summary": summary, "results": rows})
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", nargs="+", default=list(BLOCKS), choices=list(BLOCKS))
    ap.add_argument("--budgets", nargs="+", type=int, default=[100, 300])
    ap.add_argument("--band", type=float, default=1.0,
                    help="accuracy points below the true staircase that count as near the front")
    ap.add_argument("--seeds", type=int, default=0, help="screening searches per warp (0: none)")
    ap.add_argument("--warps", nargs="+", default=["none", "copula"],
                    choices=["none", "copula", "power"])
    ap.add_argument("--search-blocks", nargs="+", default=None, choices=list(BLOCKS),
                    help="blocks the searches run on (default: all of --blocks)")
    ap.add_argument("--screening-option", action="append", default=[], metavar="NAME=VALUE",
                    help="a ScreeningConfig setting of the searches (as search_nb201.py's)")
    ap.add_argument("--fold-cache", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    return nb.run_main("search_nb201_predicted", _main, ap.parse_args(argv), argv)


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    if args.seeds < 0 or any(b < 1 for b in args.budgets) or not args.band > 0:
        raise UserError("--seeds must be >= 0, --budgets and --band positive")
    budgets = sorted(set(args.budgets))
    options = nb.screening_options(args.screening_option)
    space = get_space("nb201")
    accuracy = nb.shared_accuracy(space)
    rows, runs = [], []
    for block in args.blocks:
        probs = problems_of(block, space, accuracy, args.fold_cache)
        for p in probs:
            rows.append({"block": block, **predictor_at_front(p, budgets, args.band)})
        if args.seeds and block in (args.search_blocks or args.blocks):
            for p in probs:
                runs += [{"block": block, **r}
                         for r in trajectories(space, p, args.warps, args.seeds, budgets,
                                                      options)]
    print_tables(rows, runs, budgets)
    if args.out is not None:
        nb.write_json(args.out, {
            "command": "python benchmarks/search_nb201_predicted.py " + " ".join(argv),
            "machine": nb.machine(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "budgets": budgets, "band_points": args.band, "screening_options": options,
            "results": rows, "searches": runs})
        print(f"wrote {args.out}")
    return 0


def print_tables(rows: list[dict], runs: list[dict], budgets: list[int]) -> None:
    print("predictor at the true front (Spearman all / front / band; front cells dominated "
          "under predicted latency, max depth; median log(pred/true) front / all; slope on "
          "front; predicted front's cells and true hv ratio; oracle under predicted latency)")
    head = (f"{'block':<5} {'device':<15} {'rho all':>7} {'front':>6} {'band':>6} "
            f"{'front':>5} {'domin':>5} {'depth':>5} {'bias f':>7} {'bias a':>7} "
            f"{'slope':>6} {'pfront':>6} {'pf hv':>6}"
            + "".join(f"{f'or@{b}':>8}" for b in budgets))
    print(head)
    for r in rows:
        print(f"{r['block']:<5} {r['device']:<15} {r['spearman_all']:>7.3f} "
              f"{r['spearman_front']:>6.3f} {r['spearman_band']:>6.3f} "
              f"{r['true_front_cells']:>5} {r['true_front_dominated_under_predicted']:>5} "
              f"{r['true_front_depth_max']:>5} {r['median_log_ratio_front']:>7.3f} "
              f"{r['median_log_ratio_all']:>7.3f} {r['slope_front']:>6.3f} "
              f"{r['predicted_front_cells']:>6} {r['predicted_front_hv_ratio']:>6.3f}"
              + "".join(f"{r['oracle_hv_ratio'][b]:>8.3f}" for b in budgets))
    if not runs:
        return
    print("\nscreening searches: mean over seeds of the true ratio (benchmark score), the seen "
          "ratio (predicted latency, vs the predicted front) and true-front cells found")
    keys = sorted({(r["block"], r["device"], r["warp"]) for r in runs},
                  key=lambda k: (list(BLOCKS).index(k[0]), k[1], k[2]))
    print(f"{'block':<5} {'device':<15} {'warp':<7}" + "".join(
        f"{f'true@{b}':>9}{f'seen@{b}':>9}{f'found@{b}':>9}" for b in budgets))
    for k in keys:
        sel = [r for r in runs if (r["block"], r["device"], r["warp"]) == k]
        print(f"{k[0]:<5} {k[1]:<15} {k[2]:<7}" + "".join(
            f"{np.mean([r[f'true@{b}'] for r in sel]):>9.4f}"
            f"{np.mean([r[f'seen@{b}'] for r in sel]):>9.4f}"
            f"{np.mean([r[f'true_front_found@{b}'] for r in sel]):>9.1f}" for b in budgets))


if __name__ == "__main__":
    raise SystemExit(main())
