"""Score the meta predictor's reference design on the family protocol (issue 48).

Which architectures a user is asked to measure first (``MetaPredictor``'s reference design,
``greedy_design`` over a pool of the meta-training architectures) is chosen at meta-training;
this redesigns each cached LOFO fold (``latency_residual_select.py --cache``) under a setting
and scores only the ``ref`` measurements (the fold's reference architectures, topped up at
random) of every held-out device: the cheap way to compare designs at 10 measurements without
meta-training again. A variant is ``name:key=value;key=value`` of MetaPredictor attributes
(``pool_size=15625``; ``seed=1``: another pool draw of the design; session 40's
``design_variants=1`` needs commit ``f4e012b``, where that option existed); ``default`` redesigns with the fold's own settings
(it must give the cached reference architectures back: checked). Development folds only.

    OMP_NUM_THREADS=1 python benchmarks/latency_design_select.py --space nb201 \\
        --cache /tmp/folds --n 10 100 --variants default "pool:pool_size=15625"
"""

from __future__ import annotations

import copy
import gzip
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

try:
    import latency_blend_schedule as blend
    import latency_lofo as lofo
    import latency_residual_select as sel
except ImportError:  # pragma: no cover
    from benchmarks import latency_blend_schedule as blend
    from benchmarks import latency_lofo as lofo
    from benchmarks import latency_residual_select as sel

from hwnas.supernet.spaces import get_space


def parse_variant(text: str) -> tuple[str, dict]:
    """``name:key=value;...`` -> (name, attribute overrides); numbers and comma tuples parsed."""
    name, _, rest = text.partition(":")
    over = {}
    for item in filter(None, rest.split(";")):
        k, _, v = item.partition("=")
        vals = [float(x) for x in v.split(",")]
        over[k] = tuple(vals) if "," in v else (int(vals[0]) if vals[0].is_integer()
                                                 and k in ("pool_size", "n_reference", "seed",
                                                           "design_delta_after") else vals[0])
    return name, over


def redesigned(meta, over: dict, train_archs, common):
    """A copy of the fold predictor whose reference architectures are designed again under
    the overrides, as ``fold_predictor`` designs them (all training architectures first, the
    held-out devices' common ones if that picks one they lack)."""
    over = dict(over)
    seed = int(over.pop("seed", 0))  # the design's pool draw (0: the folds' own)
    m = copy.deepcopy(meta)
    for k, v in over.items():
        if not hasattr(m, k):
            raise SystemExit(f"MetaPredictor has no setting {k!r}")
        setattr(m, k, v)
    m.redesign(train_archs, seed=seed)
    return sel.held_out_design(m, train_archs, common, seed)


def main(argv=None) -> int:
    ap = sel.fold_arguments(__doc__)
    ap.add_argument("--kinds", nargs="+", default=None, choices=sorted(lofo.KINDS))
    ap.add_argument("--variants", nargs="+", default=["default"])
    ap.add_argument("--out", type=Path, required=True)
    ap.set_defaults(n=[10, 100])
    args = ap.parse_args(argv)
    space = get_space(args.space)
    devices, _ = lofo.load_devices(space)
    devices = {d: v for d, v in devices.items() if lofo.family(d) not in args.without}
    folds = sel.held_out_folds(devices, args.families, args.kinds)
    variants = [parse_variant(v) for v in args.variants]
    rows = []
    for fam, held in folds.items():
        t0 = time.perf_counter()
        meta = sel.fold_predictor(space, devices, fam, held, args.cache)
        _, train_archs, common = sel.fold_archs(devices, held)
        for name, over in variants:
            m = redesigned(meta, over, train_archs, common)
            if name == "default" and m.reference_archs != meta.reference_archs:
                raise SystemExit(f"{fam}: redesigning with the fold's settings did not give "
                                 f"its reference architectures back")
            for d in blend.scored_devices(held, args.max_devices):
                archs, y = devices[d]
                for n, _k, s, rows_k, sc in sel.measurement_draws(m, archs, args.n, 0,
                                                                  args.score_subsample):
                    m.adapt([archs[i] for i in rows_k], y[rows_k], seed=s)
                    rho = lofo.spearman(m.predict([archs[i] for i in sc]), y[sc])
                    rows.append({"fold": fam, "family": lofo.family(d), "device": d, "n": n,
                                 "variant": name, "spearman": rho})
        print(f"{fam}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    table = summarize(rows)
    for n, line in table.items():
        print(f"n={n} " + "  ".join(f"{v} {x['mean']:.4f}" for v, x in line.items()))
    payload = {"space": args.space, "command": " ".join(sys.argv), "rows": rows,
               "summary": table}
    with gzip.open(args.out, "wt") as f:
        json.dump(payload, f)
    return 0


def summarize(rows) -> dict:
    """Per n and variant: the mean over families of the mean over their scored devices (in
    the kinds view too, as ``latency_blend_schedule``: a family lies in one kind fold)."""
    out: dict = {}
    for n in sorted({r["n"] for r in rows}):
        out[n] = {}
        for v in dict.fromkeys(r["variant"] for r in rows):
            fam = defaultdict(list)
            for r in rows:
                if r["n"] == n and r["variant"] == v:
                    fam[r["family"]].append(r["spearman"])
            per = {f: float(np.mean(x)) for f, x in sorted(fam.items())}
            out[n][v] = {"mean": float(np.mean(list(per.values()))), "per_family": per}
    return out


if __name__ == "__main__":
    sys.exit(main())
