"""How the meta predictor's execution-variant posterior does at few measurements (issue 48).

On each cached LOFO fold (``latency_residual_select.py --cache``) every held-out device is
adapted on its ``ref`` measurements (the fold's reference architectures, topped up at random,
as ``latency_design_select.py``) three ways: the default (members of every execution variant,
weighed by their evidence), and pinned to each variant (``MetaPredictor.pin_execution``). Each
row holds the posterior over variants and the Spearman of each adaptation on 1,000 unmeasured
architectures: how often the posterior is confident in a variant that ranks the device worse,
and what an oracle variant choice would give (the most any lever on the posterior can gain).
A variant ``name:key=value;...`` sets MetaPredictor attributes before adapting (as
``latency_design_select.py``). Development folds only.

    OMP_NUM_THREADS=1 python benchmarks/latency_variant_posterior.py --space nb201 \\
        --cache /tmp/folds --n 10 100 --out posterior.json.gz
"""

from __future__ import annotations

import copy
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

try:
    import latency_blend_schedule as blend
    import latency_design_select as design
    import latency_lofo as lofo
    import latency_residual_select as sel
except ImportError:  # pragma: no cover
    from benchmarks import latency_blend_schedule as blend
    from benchmarks import latency_design_select as design
    from benchmarks import latency_lofo as lofo
    from benchmarks import latency_residual_select as sel

from hwnas.latency.predictors.residual import RESIDUAL_MIN
from hwnas.supernet.spaces import get_space


def main(argv=None) -> int:
    ap = sel.fold_arguments(__doc__)
    ap.add_argument("--kinds", nargs="+", default=None, choices=sorted(lofo.KINDS))
    ap.add_argument("--variants", nargs="+", default=["default"])
    ap.add_argument("--no-pinned", action="store_true", help="skip the pinned adaptations")
    ap.add_argument("--save-predictions", type=Path, default=None,
                    help="also write each pinned adaptation's predictions and the measured "
                         "latencies (npz, not committed) for reweighing the variants offline")
    ap.add_argument("--reweigh", action="store_true",
                    help="also score reweighings of the two variants offline (below)")
    ap.add_argument("--out", type=Path, required=True)
    ap.set_defaults(n=[10, 100], draws=0)  # --draws D: also D random draws of n
    args = ap.parse_args(argv)
    space = get_space(args.space)
    devices, _ = lofo.load_devices(space)
    devices = {d: v for d, v in devices.items() if lofo.family(d) not in args.without}
    folds = sel.held_out_folds(devices, args.families, args.kinds)
    variants = [design.parse_variant(v) for v in args.variants]
    rows, preds = [], {}
    for fam, held in folds.items():
        t0 = time.perf_counter()
        meta = sel.fold_predictor(space, devices, fam, held, args.cache)
        for name, over in variants:
            m = copy.deepcopy(meta)
            for k, v in over.items():
                if not hasattr(m, k):
                    raise SystemExit(f"MetaPredictor has no setting {k!r}")
                setattr(m, k, v)
            for d in blend.scored_devices(held, args.max_devices):
                archs, y = devices[d]
                for n, kind, s, rows_k, sc in sel.measurement_draws(m, archs, args.n, args.draws,
                                                                    args.score_subsample):
                    fit = ([archs[i] for i in rows_k], y[rows_k])
                    test = [archs[i] for i in sc]
                    m.pin_execution(None).adapt(*fit, seed=s)
                    row = {"fold": fam, "family": lofo.family(d), "device": d, "n": n,
                           "kind": kind, "draw": s, "variant": name,
                           "spearman": lofo.spearman(m.predict(test), y[sc]),
                           "posterior": m.explain()["execution_posterior"],
                           "prior": dict(m.execution_prior_), "offset": getattr(m, "execution_offset", 0.0)}
                    if not args.no_pinned:
                        row["pinned"] = {}
                        for v in m.variants:
                            m.pin_execution(v).adapt(*fit, seed=s)
                            p = m.predict(test)
                            row["pinned"][v] = lofo.spearman(p, y[sc])
                            preds[f"{name}|{d}|{n}|{kind}{s}|{v}"] = p
                        preds[f"{name}|{d}|{n}|{kind}{s}|y"] = y[sc]
                        m.pin_execution(None)
                    rows.append(row)
        print(f"{fam}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    for n, kind in sorted({(r["n"], r["kind"]) for r in rows}):
        for name, _ in variants:
            print(f"n={n} {kind} {name}: " + report([r for r in rows if r["n"] == n and r[
                "kind"] == kind and r["variant"] == name]))
    if args.reweigh:
        for n in sorted({r["n"] for r in rows if r["n"] < RESIDUAL_MIN}):
            reweigh([r for r in rows if r["n"] == n and r["kind"] == "ref"
                     and r["variant"] == variants[0][0]], preds)
    if args.save_predictions:
        np.savez_compressed(args.save_predictions, **preds)
    payload = {"space": args.space, "command": " ".join(sys.argv), "rows": rows}
    with gzip.open(args.out, "wt") as f:
        json.dump(payload, f)
    return 0


def family_mean(rows, key) -> float:
    """Mean over families of the mean over their devices (and draws) of ``key(row)``."""
    fam: dict = {}
    for r in rows:
        fam.setdefault(r["family"], []).append(key(r))
    return float(np.mean([np.mean(v) for v in fam.values()]))


def report(rows) -> str:
    """The mean over families of the default, each pinned variant and the oracle (the better
    pinned variant per device), and the devices whose posterior puts > 0.8 on a variant that
    ranks them worse than another (by > 0.005)."""
    out = f"default {family_mean(rows, lambda r: r['spearman']):.4f}"
    if not rows or "pinned" not in rows[0]:
        return out
    for v in rows[0]["pinned"]:
        out += f"  pinned {v} {family_mean(rows, lambda r: r['pinned'][v]):.4f}"
    out += f"  oracle {family_mean(rows, lambda r: max(r['pinned'].values())):.4f}"
    wrong = [r for r in rows if max(r["posterior"].values()) > 0.8
             and r["pinned"][max(r["posterior"], key=r["posterior"].get)]
             < max(r["pinned"].values()) - 0.005]
    out += f"  confident-wrong {len(wrong)}/{len(rows)}: " + ", ".join(
        f"{r['device']} ({max(r['posterior'].values()):.2f} "
        f"{max(r['posterior'], key=r['posterior'].get)})" for r in wrong)
    return out


def _logit(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)
    return float(np.log(p / (1 - p)))


def reweigh(rows, preds) -> None:
    """Print how reweighing ``raw`` against ``pruned`` would score (mean over families, change,
    worst family). Below RESIDUAL_MIN there is no residual learner, so the prediction is the
    posterior mix ``w raw + (1 - w) pruned`` of the pinned predictions (first line: the
    adaptation's own ``w``, a check): tempered evidence (``tau``), mixed in log latency or rank,
    the MAP variant, a shift of ``raw``'s log-odds, and that shift fitted leave-one-family-out
    (logistic intercept on the log-odds, labelled by the better pinned variant)."""
    from scipy.optimize import minimize_scalar
    from scipy.stats import rankdata

    data = []
    for r in rows:
        key = f"{r['variant']}|{r['device']}|{r['n']}|{r['kind']}{r['draw']}|"
        lp = _logit(r["prior"]["raw"]) - r["offset"]  # prior log-odds of raw, as adapted
        data.append((r, _logit(r["posterior"]["raw"]), lp, preds[key + "raw"],
                     preds[key + "pruned"], preds[key + "y"]))
    labelled = [(r["family"], lo, float(r["pinned"]["raw"] > r["pinned"]["pruned"]))
                for r, lo, *_ in data if abs(r["pinned"]["raw"] - r["pinned"]["pruned"]) >= 0.005]

    def intercept(without: str) -> float:
        fit = [(lo, lab) for f, lo, lab in labelled if f != without]
        return float(minimize_scalar(lambda c: sum(np.logaddexp(0, -(lo + c)) if lab else
                                                   np.logaddexp(0, lo + c) for lo, lab in fit),
                                     bounds=(-10, 10), method="bounded").x)

    lofo_c = {f: intercept(f) for f in {r["family"] for r in rows}}
    sig = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731
    cands = {"as adapted (check)": (lambda r, lo, lp: sig(lo), "lin"),
             "MAP variant": (lambda r, lo, lp: float(lo > 0), "lin"),
             "shift fitted leave-one-family-out": (
                 lambda r, lo, lp: sig(lo + lofo_c[r["family"]]), "lin")}
    for tau, space in ((0.5, "lin"), (0.75, "lin"), (0.5, "log"), (0.5, "rank"), (1.0, "rank")):
        cands[f"tempered {tau}, {space}"] = (
            lambda r, lo, lp, t=tau: sig(t * (lo - lp) + lp), space)
    for c in (-1.5, -2.0, -2.5):
        cands[f"raw log-odds shifted {c}"] = (lambda r, lo, lp, c=c: sig(lo + c), "lin")
    base = {f: np.mean([r["spearman"] for r in rows if r["family"] == f])
            for f in {r["family"] for r in rows}}
    print(f"n={rows[0]['n']} offline reweighing, default {np.mean(list(base.values())):.4f}; "
          f"leave-one-family-out shifts {min(lofo_c.values()):.2f}..{max(lofo_c.values()):.2f}, "
          f"all families {intercept(''):.2f}")
    for label, (weight, space) in cands.items():
        fam: dict = {}
        for r, lo, lp, a, b, y in data:
            a, b = {"lin": (a, b), "log": (np.log(a), np.log(b)),
                    "rank": (rankdata(a), rankdata(b))}[space]
            w = weight(r, lo, lp)
            fam.setdefault(r["family"], []).append(lofo.spearman(w * a + (1 - w) * b, y))
        per = {f: float(np.mean(v)) for f, v in fam.items()}
        worst = min(per, key=lambda f: per[f] - base[f])
        mean = float(np.mean(list(per.values())))
        print(f"  {label:<36} {mean:.4f} {mean - np.mean(list(base.values())):+.4f}  "
              f"worst {worst} {per[worst] - base[worst]:+.3f}")


if __name__ == "__main__":
    sys.exit(main())
