"""Where the screening sampler's hypervolume at a small budget is lost, per device and seed of a
development block (development data only; issue 47, session 39 of ``search_nb201.md``).

For each device of a block (``search_nb201_predicted``'s blocks: A, P, B, ...) and seed, one
default screening search runs to the largest checkpoint. Per search:

* the hypervolume ratio at every checkpoint, and the missed hypervolume by latency third at each;
* at the last checkpoint, the true-front cells not evaluated, split into *hidden* ones (an
  evaluated cell is at least as accurate and no slower in the latency the sampler sees:
  session 33's mechanism, which the layered trials address) and the others, which would raise
  the front the sampler sees; per group their number and the hypervolume each would add alone
  (summed, so overlapping);
* for the not-hidden ones, after the last trial, the quantile of their true accuracy and of the
  sampler's own GP mean within their +-5 % seen-latency band of free cells, the quantile of the
  sampler's own acquisition among all free cells (0 = the top) and their posterior deviation
  over the median one;
* the length factor and noise the marginal likelihood chose at every hyper-parameter refit
  from ``--refits-from`` evaluations on (counted at the grid's largest factor).

It reads the sampler's private state (its GP, pool and acquisition) after the search: a
diagnosis, not an interface.

    python benchmarks/search_nb201_gap.py --blocks P A --seeds 10 --fold-cache DIR
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import numpy as np

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import search_nb201 as nb
    import search_nb201_predicted as pred
except ModuleNotFoundError:
    from benchmarks import search_nb201 as nb
    from benchmarks import search_nb201_predicted as pred
from hwnas.search.pareto import front_layers  # noqa: E402
from hwnas.search.screening import ScreeningConfig  # noqa: E402
from hwnas.supernet.spaces import get_space  # noqa: E402

from hwnas.core.errors import UserError  # noqa: E402


def hidden_split(rows: np.ndarray, lat: np.ndarray, acc: np.ndarray, seen: np.ndarray,
                 front: Any) -> tuple[list[int], list[int], float, float]:
    """The true-front cells not in ``rows``: (not hidden, hidden, hv the not-hidden would add
    each alone (summed), the same for the hidden), hidden meaning dominated in the seen world
    (``seen`` latency, true ``acc``) by the evaluated cells' first layer."""
    first = rows[front_layers(seen[rows], acc[rows], 1)[0]]
    base = nb.hv_ratio(rows, lat, acc, front)
    out: tuple[list[int], list[int]] = ([], [])
    gain = [0.0, 0.0]
    for y in sorted(set(nb.front_indices_2d(lat, acc).tolist()) - set(rows.tolist())):
        h = int(np.any((seen[first] <= seen[y]) & (acc[first] >= acc[y])))
        out[h].append(y)
        gain[h] += nb.hv_ratio(np.append(rows, y), lat, acc, front) - base
    return out[0], out[1], gain[0], gain[1]


def diagnose(space: Any, p: Any, seed: int, checkpoints: list[int], options: dict[str, Any],
             refits_from: int) -> dict[str, Any]:
    """One default search on ``p`` and what it missed (module docstring)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    row = {a: i for i, a in enumerate(p.archs)}
    sampler = nb.make_study_sampler("screening", seed, space, p, 0.0, options)
    evaluated: list[int] = []
    refits: list[tuple[int, float, float]] = []

    def objective(trial: Any) -> tuple[float, float]:
        i = row[space.to_string(space.suggest(trial))]
        evaluated.append(i)
        return float(p.accuracy[i]), float(p.seen_latency[i])

    def after(study: Any, trial: Any) -> None:  # a refit happened while choosing this trial
        gps = sampler._gps
        if gps and (not refits or refits[-1][0] != sampler._last_refit):
            refits.append((sampler._last_refit, gps[0].two_l2 / gps[0].d2_scale, gps[0].noise))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
        study.optimize(objective, n_trials=max(checkpoints), callbacks=[after])
        directions = list(study.directions)
        sampler._update_history([t for t in study.get_trials() if t.values is not None])
        rng = np.random.default_rng(0)
        score = sampler._acquisition(directions, rng)
        (mu, sd), = sampler._fit(directions, rng)[0]
    lat, acc, seen = p.latency, p.accuracy, p.seen_latency
    rows = np.asarray(evaluated)
    out: dict[str, Any] = {"device": p.device, "seed": seed}
    for n in checkpoints:
        out[f"hv_{n}"] = round(nb.hv_ratio(rows[:n], lat, acc, p.front), 4)
        out[f"missed_{n}"] = nb.missed_by_latency(rows[:n], lat, acc, p.front)
    free_cells, hidden, gain_free, gain_hidden = hidden_split(rows, lat, acc, seen, p.front)
    pool_rows = np.array([row[k] for k in sampler._pool.keys])
    at = np.empty(len(pool_rows), int)
    at[pool_rows] = np.arange(len(pool_rows))
    free = np.ones(len(pool_rows), bool)
    free[at[rows]] = False
    ranks = []
    for y in free_cells:
        j = at[y]
        band = free & (np.abs(np.log(seen[pool_rows] / seen[y])) < 0.05)
        ranks.append((np.mean(acc[pool_rows][band] > acc[y]), np.mean(mu[band] > mu[j]),
                      np.mean(score[free] > score[j]), sd[j] / np.median(sd[free])))
    r = np.median(ranks, axis=0) if ranks else [np.nan] * 4
    edge = max(ScreeningConfig(**options).length_factors)
    late = [f for n, f, _ in refits if n >= refits_from]
    out.update({"front_size": int(p.front.size), "missed_not_hidden": len(free_cells),
                "missed_hidden": len(hidden), "gain_not_hidden": round(gain_free, 4),
                "gain_hidden": round(gain_hidden, 4),
                "not_hidden_true_rank": round(float(r[0]), 4),
                "not_hidden_mean_rank": round(float(r[1]), 4),
                "not_hidden_acquisition_rank": round(float(r[2]), 4),
                "not_hidden_sd_ratio": round(float(r[3]), 3),
                "refits": [[n, round(f, 3), lam] for n, f, lam in refits],
                "refits_late": len(late),
                "refits_late_at_top": int(np.sum(np.isclose(late, edge)))})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = pred.diagnosis_parser(__doc__, seeds=10, checkpoints=[15, 20, 40, 50, 60, 80, 100])
    ap.add_argument("--refits-from", type=int, default=40)
    return nb.run_main("search_nb201_gap", _main, ap.parse_args(argv), argv)


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    if args.seeds < 1 or any(c < 1 for c in args.checkpoints):
        raise UserError("--seeds and every --checkpoints must be >= 1")
    checkpoints = sorted(set(args.checkpoints))
    options = nb.screening_options(args.screening_option)
    space = get_space("nb201")
    accuracy = nb.shared_accuracy(space)
    rows = []
    for block in args.blocks:
        for p in pred.problems_of(block, space, accuracy, args.fold_cache):
            for seed in range(args.seeds):
                rows.append({"block": block, **diagnose(space, p, seed, checkpoints, options,
                                                        args.refits_from)})
                print(f"{block} {p.device} seed {seed} done", file=sys.stderr, flush=True)
    summary = []
    last = checkpoints[-1]
    print("block device          hv @" + "/".join(map(str, checkpoints))
          + f"  missed fast/middle/slow @{last}  not hidden / hidden (cells; hv alone)"
          + "  true / mean / acquisition rank, sd ratio  late refits at the grid's top")
    for block in args.blocks:
        sel_b = [r for r in rows if r["block"] == block]
        for device in dict.fromkeys(r["device"] for r in sel_b):
            sel = [r for r in sel_b if r["device"] == device]
            s = {"block": block, "device": device, "seeds": len(sel)}
            for n in checkpoints:
                s[f"hv_{n}"] = round(float(np.mean([r[f"hv_{n}"] for r in sel])), 4)
                s[f"missed_{n}"] = np.round(np.mean([r[f"missed_{n}"] for r in sel], 0),
                                            4).tolist()
            s[f"hv_{last}_worst_seed"] = min(r[f"hv_{last}"] for r in sel)
            for k in ("missed_not_hidden", "missed_hidden", "gain_not_hidden", "gain_hidden"):
                s[k] = round(float(np.mean([r[k] for r in sel])), 4)
            for k in ("not_hidden_true_rank", "not_hidden_mean_rank",
                      "not_hidden_acquisition_rank", "not_hidden_sd_ratio"):
                s[k] = round(float(np.nanmedian([r[k] for r in sel])), 4)
            s["refits_late_at_top"] = [int(sum(r["refits_late_at_top"] for r in sel)),
                                       int(sum(r["refits_late"] for r in sel))]
            summary.append(s)
            print(f"{block:5} {device:15} " + "/".join(f"{s[f'hv_{n}']:.3f}" for n in checkpoints)
                  + "  " + "/".join(f"{v:.3f}" for v in s[f"missed_{last}"])
                  + f"  {s['missed_not_hidden']:.1f} / {s['missed_hidden']:.1f}"
                  f" ({s['gain_not_hidden']:.3f} / {s['gain_hidden']:.3f})"
                  f"  {s['not_hidden_true_rank']:.3f} / {s['not_hidden_mean_rank']:.3f} / "
                  f"{s['not_hidden_acquisition_rank']:.3f}, {s['not_hidden_sd_ratio']:.2f}"
                  f"  {s['refits_late_at_top'][0]}/{s['refits_late_at_top'][1]}")
    if args.out is not None:
        pred.write_diagnosis(args.out, "search_nb201_gap.py", argv, options, summary, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
