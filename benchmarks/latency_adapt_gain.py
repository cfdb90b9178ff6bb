"""Is ``hwnas latency adapt``'s expected gain from 20 more measurements honest? (issue 48.3)

On ``latency_residual_select.py``'s leave-one-family-out folds (development families only;
HELP's test devices are never in it), each held-out device gets ``n`` random measurements (the
first ``n`` of a seeded permutation, per draw; ``--start ref``: the predictor's reference
architectures first) and then the first ``n + 20`` of the same one.
``leave_one_out`` runs on the ``n`` (what ``adapt`` prints: the learning curve and
``expected_gain(20)``); the default predictor adapted to ``n`` and to ``n + 20`` is scored on
``--score-subsample`` architectures of the table measured in neither: the actual gain. Per row
the raw curve is kept, so the calibration (:data:`hwnas.latency.fewshot.GAIN_SHRINK`) is
refitted and checked offline (``--from``): a shrink factor per quantity (Spearman, median
error) fitted on the other families and scored on the held-out one, i.e. the calibration itself
is validated out of family. Reports per ``n`` the families' ratio predicted / actual gain
(median and quartiles over families, each the ratio of its mean gains) before and after.

    OMP_NUM_THREADS=1 python benchmarks/latency_adapt_gain.py --space nb201 --cache DIR \\
        --n 10 20 50 --draws 2 --max-devices 2 \\
        --out benchmarks/results/latency_lofo/curve/gain_nb201.json
    python benchmarks/latency_adapt_gain.py \\
        --from benchmarks/results/latency_lofo/curve/gain_{nb201,fbnet}.json
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from hwnas.core.io import write_json
from hwnas.latency import fewshot
from hwnas.latency.machine import describe_machine
from hwnas.supernet.spaces import get_space

try:
    import latency_lofo as lofo
    import latency_residual_select as select
except ImportError:  # pragma: no cover
    from benchmarks import latency_lofo as lofo
    from benchmarks import latency_residual_select as select

MORE = fewshot.MORE_MEASUREMENTS


def raw_gain(curve, n_fit, rho, err, more=MORE):
    """``expected_gain`` uncalibrated (shrink 1): the quantity the calibration scales."""
    loo = fewshot.LeaveOneOut(0, 0, n_fit, rho, err, None, None, False, "", tuple(curve))
    return loo.expected_gain(more, shrink=(1.0, 1.0))


def measure(args) -> list[dict]:
    space = get_space(args.space)
    devices, _ = lofo.load_devices(space)
    devices = {d: v for d, v in devices.items() if lofo.family(d) not in args.without}
    folds = select.held_out_folds(devices, args.families)
    rows, t0 = [], time.perf_counter()
    for fam, held in folds.items():
        meta = select.fold_predictor(space, devices, fam, held, args.cache)
        for d in sorted(held)[:args.max_devices]:
            archs, y = devices[d]
            for s in range(args.draws):
                perm = np.random.default_rng(1000 + s).permutation(len(archs))
                if args.start == "ref":  # the predictor's reference archs first, then random
                    idx = {a: i for i, a in enumerate(archs)}
                    own = [idx[a] for a in meta.reference_archs if a in idx]
                    perm = np.array(lofo._top_up(own, perm, len(archs)))
                for n in args.n:
                    if n + MORE + 50 > len(archs):
                        continue
                    rest = perm[n + MORE:]
                    score = np.sort(np.random.default_rng(7).choice(
                        rest, min(args.score_subsample, len(rest)), replace=False))
                    q, yq = [archs[i] for i in score], y[score]
                    m = [archs[i] for i in perm[:n]]
                    loo = fewshot.leave_one_out(meta, m, y[perm[:n]], seed=s)
                    actual = {}
                    for k in (n, n + MORE):
                        meta.adapt([archs[i] for i in perm[:k]], y[perm[:k]], seed=s)
                        p = np.asarray(meta.predict(q))
                        actual[k] = (float(np.median(np.abs(p - yq) / yq)), lofo.spearman(p, yq))
                    rows.append({"family": fam, "device": d, "draw": s, "n": n,
                                 "n_fit": loo.n_fit, "loo_spearman": loo.spearman,
                                 "loo_error": loo.median_rel_error,
                                 "curve": [list(c) for c in loo.curve],
                                 "table_error": actual[n][0], "table_spearman": actual[n][1],
                                 "table_error_more": actual[n + MORE][0],
                                 "table_spearman_more": actual[n + MORE][1]})
        print(f"{fam} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return rows


def gains(rows, shrink=(1.0, 1.0)):
    """Per row: predicted (d_err, d_rho) at ``shrink`` and actual (d_err, d_rho)."""
    out = []
    for r in rows:
        g = raw_gain(r["curve"], r["n_fit"], r["loo_spearman"], r["loo_error"])
        if g is None:
            continue
        out.append({**r, "pred_err": shrink[0] * g[0], "pred_rho": shrink[1] * g[1],
                    "act_err": r["table_error_more"] - r["table_error"],
                    "act_rho": r["table_spearman_more"] - r["table_spearman"]})
    return out


#: the calibrations compared out of family: one shrink per quantity (``ls``: least squares
#: through the origin of the families' mean actual on mean predicted gain; ``median``: the
#: median of the families' ratios actual / predicted), or one per ``n`` (``_n``).
CALIBRATIONS = ("ls", "median", "ls_n")


def fit_shrink(rows, how="ls"):
    """``{n or None: (shrink of the error gain, shrink of the Spearman gain)}`` fitted on
    ``rows`` (each family weighs once: its means), clipped to [0, 1.5]."""
    out = {}
    for n in (sorted({r["n"] for r in rows}) if how.endswith("_n") else [None]):
        sel = [r for r in rows if n is None or r["n"] == n]
        ks = []
        for q in ("err", "rho"):
            p, a = family_means(sel, f"pred_{q}", f"act_{q}")
            ok = np.abs(p) > 1e-6
            k = (np.sum(p * a) / np.sum(p * p) if how.startswith("ls") else
                 np.median(a[ok] / p[ok])) if ok.any() else 1.0
            ks.append(float(np.clip(k, 0.0, 1.5)))
        out[n] = tuple(ks)
    return out


def shrunk(rows, k):
    """``rows`` with their predicted gains scaled by ``k`` (``fit_shrink``'s form)."""
    out = []
    for r in rows:
        kk = k.get(r["n"], k.get(None))
        out.append({**r, "pred_err": kk[0] * r["pred_err"], "pred_rho": kk[1] * r["pred_rho"]})
    return out


def family_means(rows, *keys, n=None):
    by = defaultdict(list)
    for r in rows:
        if n is None or r["n"] == n:
            by[(r["family"], r["n"])].append([r[k] for k in keys])
    m = np.array([np.mean(v, axis=0) for v in by.values()]).reshape(-1, len(keys))
    return [m[:, i] for i in range(len(keys))]


def lofo_calibrated(raw, how="ls"):
    """Each family's rows with the shrink fitted (``how``) on the other families' rows."""
    out, chosen = [], {}
    for fam in sorted({r["family"] for r in raw}):
        chosen[fam] = fit_shrink([r for r in raw if r["family"] != fam], how)
        out += shrunk([r for r in raw if r["family"] == fam], chosen[fam])
    return out, chosen


def abs_errors(rows):
    """Mean |predicted - actual| gain per row: (Spearman, median error in points)."""
    return (float(np.mean([abs(r["pred_rho"] - r["act_rho"]) for r in rows])),
            float(100 * np.mean([abs(r["pred_err"] - r["act_err"]) for r in rows])))


def report(rows, label) -> list[dict]:
    """Per n and quantity: families' ratio of mean predicted to mean actual gain (median,
    quartiles), mean |predicted - actual| per row, and the 'pays' verdicts that agree."""
    out = []
    for n in sorted({r["n"] for r in rows}):
        sel = [r for r in rows if r["n"] == n]
        line = {"calibration": label, "n": n, "rows": len(sel),
                "families": len({r["family"] for r in sel})}
        for q in ("err", "rho"):
            p, a = family_means(sel, f"pred_{q}", f"act_{q}")
            ok = np.abs(a) > 1e-9
            ratio = p[ok] / a[ok]
            line[f"{q}_ratio_median"] = float(np.median(ratio))
            line[f"{q}_ratio_q25"], line[f"{q}_ratio_q75"] = map(float, np.percentile(ratio,
                                                                                 [25, 75]))
            line[f"{q}_pred_mean"], line[f"{q}_act_mean"] = float(p.mean()), float(a.mean())
            miss = [abs(r[f"pred_{q}"] - r[f"act_{q}"]) for r in sel]
            line[f"{q}_abs_error"] = float(np.mean(miss))
            line[f"{q}_abs_error_median"] = float(np.median(miss))
        said = [r["pred_rho"] >= fewshot.PAYS_SPEARMAN or -r["pred_err"] >= fewshot.PAYS_ERROR
                for r in sel]
        paid = [r["act_rho"] >= fewshot.PAYS_SPEARMAN or -r["act_err"] >= fewshot.PAYS_ERROR
                for r in sel]
        line["pays_said"], line["pays_paid"] = int(sum(said)), int(sum(paid))
        line["agree"] = int(sum(s == p for s, p in zip(said, paid)))
        out.append(line)
    return out


def print_report(lines) -> None:
    print("| calibration | n | families | Spearman gain pred / act (mean) | ratio median [q25, q75]"
          " | error gain, points, pred / act | ratio median [q25, q75] | |pred-act| rho / err pts"
          " (median) | pays said / paid, agree |")
    print("|---|---:|---:|---|---|---|---|---|---|")
    for ln in lines:
        print(f"| {ln['calibration']} | {ln['n']} | {ln['families']} | "
              f"{ln['rho_pred_mean']:+.4f} / {ln['rho_act_mean']:+.4f} | "
              f"{ln['rho_ratio_median']:.2f} [{ln['rho_ratio_q25']:.2f}, {ln['rho_ratio_q75']:.2f}]"
              f" | {100 * ln['err_pred_mean']:+.2f} / {100 * ln['err_act_mean']:+.2f} | "
              f"{ln['err_ratio_median']:.2f} [{ln['err_ratio_q25']:.2f}, {ln['err_ratio_q75']:.2f}]"
              f" | {ln['rho_abs_error']:.4f} / {100 * ln['err_abs_error']:.2f} "
              f"({ln['rho_abs_error_median']:.4f} / {100 * ln['err_abs_error_median']:.2f}) | "
              f"{ln['pays_said']} / {ln['pays_paid']}, {ln['agree']}/{ln['rows']} |")


def analyse(rows) -> dict:
    """Before (shrink 1), each calibration fitted out of family, and the shipped shrink."""
    rows = [{**r, "family": f"{r.get('space', '')}:{r['family']}"} for r in rows]
    raw = gains(rows)
    lines = report(raw, "none")
    choice = {"none": abs_errors(raw)}
    fits = {}
    for how in CALIBRATIONS:
        cal, chosen = lofo_calibrated(raw, how)
        lines += report(cal, f"{how}, fitted out of family")
        choice[how] = abs_errors(cal)
        fits[how] = {"all_families": {str(k): v for k, v in fit_shrink(raw, how).items()},
                     "out_of_family": {f: {str(k): v for k, v in c.items()}
                                       for f, c in chosen.items()}}
    ref = {r.get("start", "random") for r in rows} == {"ref"}
    k = fewshot.GAIN_SHRINK_REFERENCE if ref else fewshot.GAIN_SHRINK
    shipped = gains(rows, k)
    lines += report(shipped, f"shipped {k}")
    choice["shipped"] = abs_errors(shipped)
    print_report(lines)
    print("mean |predicted - actual| gain over all rows (Spearman, error points), out of family:")
    for how, (e_rho, e_err) in choice.items():
        fit = fits.get(how, {}).get("all_families", "")
        print(f"  {how}: {e_rho:.4f}, {e_err:.2f}  {fit}")
    return {"summary": lines, "abs_error": choice, "fits": fits}


def main(argv=None) -> int:
    ap = select.fold_arguments(__doc__)
    ap.set_defaults(n=[10, 20, 50], draws=1, max_devices=1)
    ap.add_argument("--start", choices=["random", "ref"], default="random",
                    help="the first n measurements: random, or the predictor's reference "
                         "architectures topped up at random (the 20 more are random either way)")
    ap.add_argument("--from", dest="from_", nargs="+", type=Path, default=None,
                    help="analyse the rows of these JSON files (no measuring)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    command = "python benchmarks/latency_adapt_gain.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    if args.from_:
        rows = []
        for p in args.from_:
            import json

            d = json.loads(p.read_text())
            start = d.get("args", {}).get("start", "random")
            rows += [{**r, "space": d["space"], "start": start} for r in d["rows"]]
        result = analyse(rows)
    else:
        rows = measure(args)
        result = analyse([{**r, "space": args.space, "start": args.start} for r in rows])
    if args.out:
        write_json(args.out, {"space": None if args.from_ else args.space, "rows": rows,
                              **result, "command": command,
                              "machine": describe_machine("no GPU used"),
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "args": {k: str(v) for k, v in vars(args).items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
