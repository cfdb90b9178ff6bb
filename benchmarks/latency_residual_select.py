"""Choose the meta predictor's residual learner on the family protocol (issue 48).

The residual learner (``MetaPredictor(residual=...)``) is fitted on what the adapted prior misses
on each measurement left out; which one, and on which architecture features, is chosen here by
leave-one-family-out over the meta-training families (``latency_lofo.py``'s folds and families;
HELP's test devices are never in the choice: they are scored only in ``latency_fewshot.py``).
One meta-training per fold (cached with ``--cache``, so that candidates can be compared
cheaply); each held-out device gets ``n`` measurements (``random``: ``--draws`` seeded draws;
``ref``: the predictor's reference architectures, topped up at random) and every candidate is
scored by Spearman on up to ``--score-subsample`` architectures it did not measure. Beside them
the simple baselines fitted on the same measurements (``opcount``, ``gbm``, ``gp`` of
``latency_lofo.py``). Prints the mean over families per candidate and n, and writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/latency_residual_select.py --space nb201 \\
        --cache /tmp/lofo_folds --n 20 50 100 --draws 2
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from hwnas.core.io import write_json
from hwnas.latency.predictors import MetaPredictor, OpCountPredictor
from hwnas.supernet.spaces import get_space

try:
    import latency_lofo as lofo
except ImportError:  # pragma: no cover
    from benchmarks import latency_lofo as lofo

OUT_JSON = Path(__file__).with_suffix(".json")


def fold_archs(devices, held) -> tuple[list[str], list[str], set]:
    """A fold's meta-training devices, their architectures (in the tables' order) and the
    architectures every held-out device measured."""
    train = [d for d in devices if d not in held]
    all_archs = list(dict.fromkeys(a for archs, _ in devices.values() for a in archs))
    train_set = {a for d in train for a in devices[d][0]}
    common = set.intersection(*(set(devices[d][0]) for d in held))
    return train, [a for a in all_archs if a in train_set], common


def held_out_design(meta: MetaPredictor, train_archs, common, seed: int = 0) -> MetaPredictor:
    """``meta`` with its first ``lofo.N`` references designed again among ``common`` where the
    design picked one a held-out device lacks (its reference measurements must exist)."""
    if not set(meta.reference_archs[:lofo.N]) <= common:
        meta.redesign([a for a in train_archs if a in common], seed=seed)
    return meta


def fold_predictor(space, devices, fam, held, cache: Path | None) -> MetaPredictor:
    """The fold's meta predictor (trained on every device outside ``held``), as latency_lofo."""
    path = None if cache is None else cache / f"{space.name}_{fam.replace(':', '_')}.pkl"
    if path is not None and path.is_file():
        meta = pickle.loads(path.read_bytes())
        for k, v in vars(MetaPredictor(space)).items():  # settings newer than the cached fold
            if not hasattr(meta, k):
                setattr(meta, k, v)
        return meta
    train, train_archs, common = fold_archs(devices, held)
    cols = lofo.nan_columns(devices, train, train_archs)
    meta = held_out_design(MetaPredictor(space).meta_fit(space, train_archs, cols, seed=0),
                           train_archs, common)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(meta))
    return meta


def baseline_predict(space, name: str, archs, y, query, seed: int) -> np.ndarray:
    """One simple baseline fitted on the measurements ``(archs, y)``, predicted on ``query``:
    ``opcount`` (the package's op-count NNLS) or ``latency_lofo``'s ``gbm`` / ``gp``."""
    if name == "opcount":
        return OpCountPredictor(space).adapt(archs, y, seed=seed).predict(query)
    return getattr(lofo, f"{name}_baseline")(space, archs, y, query, seed)


def fold_arguments(doc: str) -> argparse.ArgumentParser:
    """The command line both development scripts share: space, fold cache, measurements,
    draws, families, devices per family and the scoring subsample."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--space", default="nb201", choices=["nb201", "fbnet"])
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--n", nargs="+", type=int, default=[20, 50, 100])
    ap.add_argument("--draws", type=int, default=2)
    ap.add_argument("--families", nargs="+", default=None)
    ap.add_argument("--max-devices", type=int, default=None,
                    help="score at most this many devices per family (the first, sorted)")
    ap.add_argument("--score-subsample", type=int, default=1000)
    ap.add_argument("--without", nargs="+", default=[],
                    help="families left out of everything (meta-training and scoring), e.g. to "
                         "compare with folds cached before their tables existed")
    return ap


def held_out_folds(devices: dict, families=None, kinds=None) -> dict[str, list[str]]:
    """Fold name -> held-out devices: one family at a time (those of ``families``, or all), or
    with ``kinds`` every family of one processor kind at once (``latency_lofo --kinds``)."""
    fams = defaultdict(list)
    for d in devices:
        fams[lofo.family(d)].append(d)
    if kinds:
        import fnmatch

        return {f"kind:{k}": [d for f in sorted(fams) if any(fnmatch.fnmatch(f, pat)
                                                              for pat in lofo.KINDS[k])
                              for d in fams[f]] for k in kinds}
    return {f: fams[f] for f in sorted(fams) if not families or f in families}


def measurement_draws(meta: MetaPredictor, archs: list[str], ns, draws: int,
                      score_subsample: int):
    """The measurements of one held-out device (``latency_lofo.py --n ... --score-held-out``'s
    draws): for each ``n`` (leaving at least 50 architectures), ``ref`` (the predictor's
    reference architectures, topped up at random) and ``draws`` random draws; yields ``(n,
    kind, draw, measured rows, scored rows)``, the scored rows a seeded subsample of the
    table without the measured ones."""
    idx = {a: i for i, a in enumerate(archs)}
    score = np.sort(np.random.default_rng(7).choice(
        len(archs), min(score_subsample, len(archs)), replace=False))
    own = [idx[a] for a in meta.reference_archs if a in idx]
    for n in ns:
        if n + 50 > len(archs):
            continue
        for kind in ("ref", "random"):
            for s in range(1 if kind == "ref" else draws):
                top = np.random.default_rng(3000 + s).permutation(len(archs))
                rows = (np.array(lofo._top_up(own, top, n)) if kind == "ref" else
                        np.random.default_rng(1000 + s).permutation(len(archs))[:n])
                used = set(rows.tolist())
                yield n, kind, s, rows, np.array([i for i in score if i not in used])


def main(argv=None) -> int:
    ap = fold_arguments(__doc__)
    ap.add_argument("--residuals", nargs="+", default=None,
                    help="residual learners to compare (default: every one of RESIDUALS)")
    ap.add_argument("--baselines", nargs="*", default=["opcount", "gbm", "gp"])
    ap.add_argument("--kinds", nargs="+", default=None, choices=sorted(lofo.KINDS),
                    help="hold out every family of each processor kind at once instead")
    ap.add_argument("--folds-against", type=int, nargs="+", default=None,
                    help="score each residual learner with each of these values of "
                         "meta.RESIDUAL_FOLDS_AGAINST (default: the module's)")
    ap.add_argument("--fit-only", action="store_true", help="only meta-train (fill the cache)")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    args = ap.parse_args(argv)
    from hwnas.latency.predictors import meta as meta_module
    from hwnas.latency.predictors.meta import RESIDUALS

    residuals = args.residuals or list(RESIDUALS)
    candidates = [(res, a) for res in residuals
                  for a in ([None] if res == "off" or not args.folds_against
                            else args.folds_against)]
    space = get_space(args.space)
    devices, _ = lofo.load_devices(space)
    devices = {d: v for d, v in devices.items() if lofo.family(d) not in args.without}
    folds = held_out_folds(devices, args.families, args.kinds)
    rows = []
    for fam, held in folds.items():
        t0 = time.perf_counter()
        meta = fold_predictor(space, devices, fam, held, args.cache)
        print(f"{fam}: meta-fit/load {time.perf_counter() - t0:.0f} s", file=sys.stderr,
              flush=True)
        if args.fit_only:
            continue
        for d in sorted(held)[:args.max_devices]:
            archs, y = devices[d]
            for n, kind, s, rows_k, sc in measurement_draws(meta, archs, args.n, args.draws,
                                                            args.score_subsample):
                m_archs, m_y = [archs[i] for i in rows_k], y[rows_k]
                q, yq = [archs[i] for i in sc], y[sc]
                out = {}
                for res, against in candidates:
                    meta.residual = res
                    label = res if against is None else f"{res},against={against}"
                    if against is not None:
                        meta_module.RESIDUAL_FOLDS_AGAINST = against
                    t1 = time.perf_counter()
                    meta.adapt(m_archs, m_y, seed=s)
                    dt = time.perf_counter() - t1
                    out[f"meta[{label}]"] = lofo.spearman(meta.predict(q), yq)
                    out[f"seconds[{label}]"] = dt
                    r = meta._post.get("residual")
                    out[f"weight[{label}]"] = r["weight"] if r else 0.0
                for b in args.baselines:
                    out[b] = lofo.spearman(baseline_predict(space, b, m_archs, m_y, q, s), yq)
                rows.append({"family": fam, "device": d, "n": n, "kind": kind,
                             "draw": s, **out})
        fam_rows = [r for r in rows if r["family"] == fam]
        print(f"  {fam}: " + ", ".join(
            f"{k}@{n} {np.mean([r[k] for r in fam_rows if r['n'] == n]):.3f}"
            for n in args.n for k in fam_rows[0] if k.startswith("meta[")
            if any(r["n"] == n for r in fam_rows)), file=sys.stderr, flush=True)
    if args.fit_only:
        return 0
    summary = summarize(rows)
    for line in summary:
        print(line["kind"], line["n"], "  ".join(f"{k} {v:.4f}" for k, v in line["mean"].items()))
    write_json(args.out, {"space": args.space, "rows": rows, "summary": summary,
                          "args": {k: str(v) for k, v in vars(args).items()}})
    return 0


def summarize(rows):
    """Mean over families (each the mean over its devices and draws) per kind and n."""
    out = []
    for kind in ("ref", "random"):
        for n in sorted({r["n"] for r in rows}):
            sel = [r for r in rows if r["kind"] == kind and r["n"] == n]
            if not sel:
                continue
            keys = [k for k in sel[0] if k not in ("family", "device", "n", "kind", "draw")]
            by_fam = defaultdict(lambda: defaultdict(list))
            for r in sel:
                for k in keys:
                    by_fam[r["family"]][k].append(r[k])
            mean = {k: float(np.mean([np.mean(v[k]) for v in by_fam.values()])) for k in keys}
            worst = {k: float(min(np.mean(v[k]) for v in by_fam.values())) for k in keys}
            out.append({"kind": kind, "n": n, "families": len(by_fam), "mean": mean,
                        "worst": worst,
                        "per_family": {f: {k: float(np.mean(v[k])) for k in keys}
                                       for f, v in by_fam.items()}})
    return out


if __name__ == "__main__":
    sys.exit(main())
