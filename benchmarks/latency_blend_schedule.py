"""A blend of the meta-prior and the device's own model whose weight grows with n (issue 48).

On ``latency_residual_select.py``'s folds, draws and scoring (one family held out at a time,
or with ``--kinds`` every family of one processor kind at once: the "device unlike ours"
view; HELP's test devices are never in it), each held-out device is adapted by the default
meta predictor, and beside it are recorded:

* the package's residual learners (``--residuals``: ``MetaPredictor(residual=...)``,
  ``blend`` included);
* the simple baselines of ``latency_residual_select.py`` (``--baselines``: ``opcount``,
  ``gp``; the ``gbm`` baseline is the own model ``gbm`` at weight 1);
* for each own model (``gbm``: ``latency_lofo.gbm_baseline`` on the architecture features;
  ``rgbm``: gradient-boosted trees on what the prior misses, the log ratio of each measurement
  to the prior's leave-one-out prediction, on the package's ``gbm`` residual features), the
  Spearman of the log-space blend ``(1 - w) log prior + w log own`` at every ``w`` of
  ``GRID`` (so any schedule ``w(n)`` is scored offline, ``--from``), and the weights the device's
  own 5-fold leave-out picks (``cv-err``: log error; ``cv-rank``: Spearman).

Offline (``--from``), the schedules ``w = n / (n + n0)`` and ``w = cv-rank x n / (n + n0)``
for a grid of ``n0``, each row's ``w`` rounded to ``GRID``; mean over families per n, the
worst / best family's change against the default and the worst family. An ``--out`` ending in
``.gz`` is written gzip-compressed; ``--from`` reads either.

    OMP_NUM_THREADS=1 python benchmarks/latency_blend_schedule.py --space nb201 \\
        --cache /tmp/folds --kinds arm-like gpu accelerator x86-cpu --n 20 50 100 --out k.json.gz
    python benchmarks/latency_blend_schedule.py --from k.json.gz f.json
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from hwnas.core.io import write_atomic
from hwnas.latency.machine import describe_machine
from hwnas.latency.predictors.residual import RESIDUALS
from hwnas.supernet.spaces import get_space

try:
    import latency_lofo as lofo
    import latency_residual_select as select
except ImportError:  # pragma: no cover
    from benchmarks import latency_lofo as lofo
    from benchmarks import latency_residual_select as select

GRID = np.round(np.arange(0.0, 1.001, 0.05), 2)
N0S = (10, 25, 50, 100, 200, 400, 800, 1600)


def _rgbm(meta, prior_of: dict, seed: int):
    """Own model ``rgbm``: trees on the prior's log misses (the package's ``gbm`` residual
    learner's features and settings), returned as predicted latency."""
    def fit_predict(space, archs, y, query, s):
        meta.residual = "gbm"
        Xa, Xq = meta._residual_features(list(archs)), meta._residual_features(list(query))
        pa = np.array([prior_of[a] for a in archs])
        pq = np.array([prior_of[a] for a in query])
        model = meta._residual_model(Xa, np.log(y) - np.log(pa), seed)
        meta.residual = "off"
        return pq * np.exp(model.predict(Xq))
    return fit_predict


def score_row(space, meta, m_archs, m_y, q, yq, s, residuals, owns, baselines=()) -> dict:
    sp = lofo.spearman
    meta.residual = "off"
    t0 = time.perf_counter()
    meta.adapt(m_archs, m_y, seed=s)
    out = {"seconds[off]": time.perf_counter() - t0}
    p0 = meta.predict(q)
    out["off"] = sp(p0, yq)
    loo = meta.loo_predictions()
    prior_of = {**dict(zip(m_archs, loo)), **dict(zip(q, p0))}
    n = len(m_y)
    parts = np.array_split(np.random.default_rng(s).permutation(n), 5)
    for own in owns:
        fn = _rgbm(meta, prior_of, s) if own == "rgbm" else lofo.gbm_baseline
        oof = np.empty(n)
        for part in parts:
            fit = np.setdiff1d(np.arange(n), part)
            oof[part] = fn(space, [m_archs[i] for i in fit], m_y[fit],
                           [m_archs[i] for i in part], s)
        la, lo, ly = np.log(loo), np.log(oof), np.log(m_y)
        err = [float(np.mean(((1 - w) * la + w * lo - ly) ** 2)) for w in GRID]
        rank = [sp((1 - w) * la + w * lo, ly) for w in GRID]
        out[f"cv-err[{own}]"] = float(GRID[int(np.argmin(err))])
        out[f"cv-rank[{own}]"] = float(GRID[int(np.argmax(rank))])
        out[f"cv-rank-gain[{own}]"] = float(max(rank) - rank[0])
        po = fn(space, m_archs, m_y, q, s)
        out[f"grid[{own}]"] = [sp((1 - w) * np.log(p0) + w * np.log(po), yq) for w in GRID]
    for res in residuals:
        meta.residual = res
        t0 = time.perf_counter()
        meta.adapt(m_archs, m_y, seed=s)
        out[f"seconds[{res}]"] = time.perf_counter() - t0
        out[res] = sp(meta.predict(q), yq)
        r = meta._post.get("residual")
        out[f"weight[{res}]"] = r["weight"] if r else 0.0
    meta.residual = "off"
    for b in baselines:
        out[f"baseline[{b}]"] = sp(select.baseline_predict(space, b, m_archs, m_y, q, s), yq)
    return out


def scored_devices(held: list[str], max_devices: int | None) -> list[str]:
    """At most ``max_devices`` devices of each family in the fold (the first, sorted)."""
    by = defaultdict(list)
    for d in sorted(held):
        by[lofo.family(d)].append(d)
    return [d for f in sorted(by) for d in by[f][:max_devices]]


def run(argv) -> int:
    ap = select.fold_arguments(__doc__)
    ap.add_argument("--kinds", nargs="+", default=None, choices=sorted(lofo.KINDS))
    ap.add_argument("--residuals", nargs="*", default=[])
    ap.add_argument("--own", nargs="*", default=["gbm", "rgbm"], choices=["gbm", "rgbm"])
    ap.add_argument("--baselines", nargs="*", default=["opcount", "gp"],
                    choices=["opcount", "gbm", "gp"])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    space = get_space(args.space)
    devices, _ = lofo.load_devices(space)
    devices = {d: v for d, v in devices.items() if lofo.family(d) not in args.without}
    folds = select.held_out_folds(devices, args.families, args.kinds)
    rows = []
    c0, t_start = time.process_time(), time.perf_counter()
    for fold, held in folds.items():
        meta = select.fold_predictor(space, devices, fold, held, args.cache)
        for d in scored_devices(held, args.max_devices):
            archs, y = devices[d]
            for n, kind, s, rk, sc in select.measurement_draws(meta, archs, args.n, args.draws,
                                                               args.score_subsample):
                rows.append({"fold": fold, "family": lofo.family(d), "device": d, "n": n,
                             "kind": kind, "draw": s,
                             **score_row(space, meta, [archs[i] for i in rk], y[rk],
                                         [archs[i] for i in sc], y[sc], s, args.residuals,
                                         args.own, args.baselines)})
        print(f"{fold}: {time.perf_counter() - t_start:.0f} s wall, "
              f"{time.process_time() - c0:.0f} s CPU", file=sys.stderr, flush=True)
    write_rows(args.out, {"space": args.space, "rows": rows, "grid": GRID.tolist(),
                          "cpu_s": time.process_time() - c0,
                          "command": "OMP_NUM_THREADS=1 python benchmarks/"
                                     "latency_blend_schedule.py " + " ".join(argv),
                          "machine": describe_machine("no GPU used"),
                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return 0


def write_rows(path: Path, obj: dict) -> None:
    """JSON, gzip-compressed when ``path`` ends in ``.gz`` (no timestamp: same rows, same
    bytes); the row files run to megabytes."""
    text = json.dumps(obj, indent=1, default=str) + "\n"
    write_atomic(path, gzip.compress(text.encode(), mtime=0) if path.suffix == ".gz" else text)


def read_rows(path: str | Path) -> dict:
    """What :func:`write_rows` wrote, compressed or not."""
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def candidates(row: dict) -> dict[str, float]:
    """Every candidate's Spearman on one row (the schedules read off the grid)."""
    out = {"off": row["off"]}
    for k in row:
        if k in RESIDUALS and k != "off":
            out[f"residual:{k}"] = row[k]
        elif k.startswith("baseline["):
            out[f"baseline:{k[9:-1]}"] = row[k]
    for own in ("gbm", "rgbm"):
        g = row.get(f"grid[{own}]")
        if g is None:
            continue
        at = lambda w: g[int(np.argmin(np.abs(GRID - w)))]  # noqa: E731
        out[f"own:{own}"] = g[-1]
        out[f"cv-err:{own}"] = at(row[f"cv-err[{own}]"])
        out[f"cv-rank:{own}"] = at(row[f"cv-rank[{own}]"])
        for n0 in N0S:
            sh = row["n"] / (row["n"] + n0)
            out[f"sched:{own}:{n0}"] = at(sh)
            out[f"cv-rank*sched:{own}:{n0}"] = at(row[f"cv-rank[{own}]"] * sh)
        for w in (0.1, 0.2, 0.3):
            out[f"fixed:{own}:{w}"] = at(w)
    return out


def summarize(rows: list[dict]) -> dict:
    """Per (kind, n) and candidate: the mean over families (each the mean of its rows), the
    worst and best family's difference to ``off``, and the worst family (its mean, its name)."""
    table = {}
    for kind in ("ref", "random"):
        for n in sorted({r["n"] for r in rows}):
            sel = [r for r in rows if r["kind"] == kind and r["n"] == n]
            if not sel:
                continue
            fam = defaultdict(lambda: defaultdict(list))
            for r in sel:
                for k, v in candidates(r).items():
                    fam[r["family"]][k].append(v)
            means = {f: {k: float(np.mean(v)) for k, v in c.items()} for f, c in fam.items()}
            keys = next(iter(means.values())).keys()
            table[f"{kind} {n}"] = {
                k: (float(np.mean([m[k] for m in means.values()])),
                    float(min(m[k] - m["off"] for m in means.values())),
                    float(max(m[k] - m["off"] for m in means.values())),
                    *min((m[k], f) for f, m in means.items())) for k in keys}
    return table


def ceilings(rows: list[dict], space: str, paths: list[str]) -> dict[str, tuple[float, float]]:
    """Per family of ``rows``, the mean over its scored devices of the ceilings stored by
    ``latency_lofo.py --ceiling-only`` runs (``paths``, the first file naming a device wins):
    ``(5-fold, stated)``, 5-fold being ``most`` where computed, else the split-half ``fit``
    (HELP's tables), stated the sessions' figure where averaged, else that one."""
    got: dict[str, dict[str, float]] = defaultdict(dict)
    for p in paths:
        for r in lofo.ceiling_rows_from(Path(p), [space], None):
            got[r["device"]].setdefault(r["measurements"], r["spearman_mean"])
    fam = defaultdict(list)
    for d in sorted({(r["family"], r["device"]) for r in rows}):
        c = got[d[1]]
        five = c.get("most", c.get("fit", np.nan))
        fam[d[0]].append((five, c.get("stated", five)))
    return {f: tuple(float(x) for x in np.mean(v, axis=0)) for f, v in fam.items()}


def report(paths: list[str]) -> int:
    """``--from ROWS... [--ceiling LOFO_JSON...]``: the tables (and the families' ceilings)."""
    ceiling_paths = paths[paths.index("--ceiling") + 1:] if "--ceiling" in paths else []
    paths = paths[:paths.index("--ceiling")] if "--ceiling" in paths else paths
    for p in paths:
        data = read_rows(p)
        print(f"== {p}: {len(data['rows'])} rows, {data.get('cpu_s', 0):.0f} s CPU")
        if ceiling_paths:
            ceil = ceilings(data["rows"], data["space"], ceiling_paths)
            print("ceiling (5-fold / stated), mean over families: " + " / ".join(
                f"{np.mean([c[i] for c in ceil.values()]):.3f}" for i in (0, 1)) + "; " +
                ", ".join(f"{f} {c[0]:.3f}/{c[1]:.3f}" for f, c in sorted(ceil.items())))
        table = summarize(data["rows"])
        cols = list(table)
        print("candidate | " + " | ".join(cols))
        for k in table[cols[0]]:
            cells = []
            for c in cols:
                m, lo, hi, worst, fam = table[c].get(k, (np.nan, np.nan, np.nan, np.nan, "-"))
                cells.append(f"{m:.4f} ({lo:+.3f}/{hi:+.3f}; {fam} {worst:.3f})")
            print(f"{k} | " + " | ".join(cells))
        # the simple baselines: op counts, GP and GBM (the own model ``gbm`` at weight 1)
        base = [k for k in table[cols[0]] if k.startswith("baseline:") or k == "own:gbm"]
        best = [max((table[c][k][0], k) for k in base) for c in cols]
        print("best baseline | " + " | ".join(f"{m:.4f} ({k})" for m, k in best))
        ahead = [max((table[c][k][2], k) for k in base) for c in cols]
        print("a baseline's most over the default on a family | " + " | ".join(
            f"{d:+.3f} ({k})" for d, k in ahead))
        if any("blend" in r for r in data["rows"]):
            cells = []
            for c in cols:
                kind, n = c.split()
                d = np.array([r["blend"] - r["off"] for r in data["rows"]
                              if r["kind"] == kind and r["n"] == int(n)])
                cells.append(f"{d.mean():+.4f} ± {d.std(ddof=1) / np.sqrt(len(d)):.4f} "
                             f"({(d > 1e-4).sum()} / {(d < -1e-4).sum()} of {len(d)})")
            print("blend - default, paired over rows (± s.e.; rows gaining / losing) | "
                  + " | ".join(cells))
        per_group(data["rows"], cols)


def per_group(rows: list[dict], cols: list[str]) -> None:
    """The default, ``blend`` and the best baseline per fold (a kind fold: the mean over its
    families) and per family, at each column's kind and n."""
    for key in ("fold", "family"):
        groups = sorted({r[key] for r in rows})
        if key == "fold" and len(groups) == len({r["family"] for r in rows}):
            continue  # one family per fold: the family lines say it
        for g in groups:
            cells = []
            for c in cols:
                kind, n = c.split()
                table = summarize([r for r in rows if r[key] == g and r["kind"] == kind
                                   and r["n"] == int(n)])[c]
                best = max((table[k][0], k) for k in table
                           if k.startswith("baseline:") or k == "own:gbm")
                cells.append(f"{table['off'][0]:.3f} / {table.get('residual:blend', [np.nan])[0]:.3f}"
                             f" / {best[0]:.3f} {best[1].split(':')[-1]}")
            print(f"{key} {g} (default / blend / best baseline) | " + " | ".join(cells))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--from":
        return report(argv[1:])
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
