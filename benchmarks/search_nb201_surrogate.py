"""How well the screening sampler's accuracy surrogate ranks NAS-Bench-201 cells within a latency
band (development data only), as the evaluations grow.

The 2-D EHVI compares candidates of similar predicted latency by the surrogate's accuracy:
what decides a trial is the ranking *within* a latency level, not the global one (which latency
alone already gives). For each device of a development block (``search_nb201_predicted``'s
blocks: A, P, B, ...) and seed, the default screening search runs to the largest checkpoint;
at each checkpoint the evaluated cells so far train a surrogate of every feature set of
``--features`` (the sampler's GP settings, refitted afresh), which ranks the cells not yet
evaluated. Per surrogate and checkpoint: Spearman over all of them, the mean Spearman within
ten equal-count bands of the latency the search sees, the same within the top quarter of each
band's true accuracies (where a front lies), and the pick regret (accuracy points between the
band's best free cell and the surrogate's pick, mean over bands).

Feature sets: ``encoding`` (the space's one-hot encoding, what the sampler uses), ``executed``
(the same of the cell with its dead edges pruned, :func:`hwnas.search.features`),
``counts`` (the encoding plus how often each value occurs) and ``executed_counts``.

    python benchmarks/search_nb201_surrogate.py --blocks P A --seeds 3 --fold-cache DIR
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import numpy as np
from scipy.stats import spearmanr

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import search_nb201 as nb
    import search_nb201_predicted as pred
except ModuleNotFoundError:
    from benchmarks import search_nb201 as nb
    from benchmarks import search_nb201_predicted as pred
from hwnas.search.features import FEATURE_SETS, SurrogateEncoder  # noqa: E402
from hwnas.search.gp import PoolGP  # noqa: E402
from hwnas.search.screening import ScreeningConfig  # noqa: E402
from hwnas.supernet.spaces import get_space  # noqa: E402

from hwnas.core.errors import UserError  # noqa: E402


def band_metrics(mu: np.ndarray, acc: np.ndarray, seen: np.ndarray, free: np.ndarray,
                 bands: int = 10) -> dict[str, float]:
    """Ranking of the free cells by ``mu`` against the true ``acc``: over all, within
    ``bands`` equal-count bands of ``seen`` latency, within each band's top quarter, and the
    pick regret (points: the band's best free accuracy less that of ``mu``'s pick)."""
    idx = np.flatnonzero(free)
    order = idx[np.argsort(seen[idx], kind="stable")]
    within, top, regret = [], [], []
    for part in np.array_split(order, bands):
        if len(part) < 8:
            continue
        within.append(spearmanr(mu[part], acc[part])[0])
        q = part[acc[part] >= np.quantile(acc[part], 0.75)]
        if len(q) >= 4 and np.ptp(acc[q]) > 0:
            top.append(spearmanr(mu[q], acc[q])[0])
        regret.append(float(acc[part].max() - acc[part[int(np.argmax(mu[part]))]]))
    return {"all": float(spearmanr(mu[idx], acc[idx])[0]),
            "band": float(np.nanmean(within)), "band_top": float(np.nanmean(top)),
            "pick_regret": float(np.mean(regret))}


def diagnose(space: Any, p: Any, seed: int, checkpoints: list[int], feats: dict[str, np.ndarray],
             options: dict[str, Any]) -> list[dict[str, Any]]:
    """One default search on ``p``; at each checkpoint, each feature set's surrogate fitted to
    the cells evaluated so far, scored by :func:`band_metrics`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traj = nb.run_search(space, p, "screening", seed, max(checkpoints), options=options)
    cfg = ScreeningConfig(**options)
    out = []
    for n in checkpoints:
        rows = np.asarray(traj[:n])
        free = np.ones(len(p.accuracy), bool)
        free[rows] = False
        for name, F in feats.items():
            gp = PoolGP(F, length_factors=cfg.length_factors, noises=cfg.noises,
                        floor_quantile=cfg.floor_quantile, ard=cfg.ard, warp=cfg.output_warp)
            y = p.accuracy[rows]
            gp.refit(F[rows], y)
            mu, _ = gp.predict(y)
            m = band_metrics(mu, p.accuracy, p.seen_latency, free)
            out.append({"device": p.device, "seed": seed, "evaluations": n, "features": name,
                        **{k: round(v, 4) for k, v in m.items()}})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = pred.diagnosis_parser(__doc__, seeds=3, checkpoints=[25, 50, 100, 200])
    ap.add_argument("--features", nargs="+", default=list(FEATURE_SETS), choices=FEATURE_SETS)
    return nb.run_main("search_nb201_surrogate", _main, ap.parse_args(argv), argv)


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    if args.seeds < 1 or any(c < 5 for c in args.checkpoints):
        raise UserError("--seeds must be >= 1 and every --checkpoints >= 5")
    checkpoints = sorted(set(args.checkpoints))
    options = nb.screening_options(args.screening_option)
    space = get_space("nb201")
    accuracy = nb.shared_accuracy(space)
    archs = [space.from_string(a) for a in sorted(accuracy)]
    feats = {}
    for f in args.features:  # scaled as the sampler scales them (the whole space is its pool)
        feats[f] = SurrogateEncoder(space, f)(archs)
    rows = []
    for block in args.blocks:
        for p in pred.problems_of(block, space, accuracy, args.fold_cache):
            for seed in range(args.seeds):
                rows += [{"block": block, **r}
                         for r in diagnose(space, p, seed, checkpoints, feats, options)]
                print(f"{block} {p.device} seed {seed} done", file=sys.stderr, flush=True)
    summary = []
    keys = ("all", "band", "band_top", "pick_regret")
    print("block features       n  " + "  ".join(f"{k:>11}" for k in keys))
    for block in args.blocks:
        for name in args.features:
            for n in checkpoints:
                sel = [r for r in rows if r["block"] == block and r["features"] == name
                       and r["evaluations"] == n]
                s = {k: round(float(np.mean([r[k] for r in sel])), 4) for k in keys}
                summary.append({"block": block, "features": name, "evaluations": n, **s})
                print(f"{block:5} {name:15} {n:4}  " + "  ".join(f"{s[k]:11.4f}" for k in keys))
    if args.out is not None:
        pred.write_diagnosis(args.out, "search_nb201_surrogate.py", argv, options, summary, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
