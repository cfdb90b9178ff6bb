"""Where the 100-measurement figure is lost, and what non-additive device models add (issue 48).

On ``latency_residual_select.py``'s leave-one-family-out folds, draws and scoring (HELP's test
devices are never in it), each held-out device is adapted once by the default meta predictor
(no residual learner), and these are scored beside it on the architectures it did not measure:

* ``mixed``: the existing residual learner (``residual="mixed"``, fold check 1);
* ``paths``: the same GP with NAS-Bench-201 cell-graph terms added to its whole-network block
  (:func:`path_features`: live input-output paths, convolutions on the longest path, per node
  the number of live / convolution inputs and the parallel convolutions beyond the first, i.e.
  the sum minus the max across a node's parallel edges, a parallelism bound);
* ``stack:<own>``: a shrinkage from the meta-prior to the device's own fit, the blend weight
  ``w`` (log space, 0..1 by 0.1) chosen by the predictor's own leave-out on the device's
  measurements (the prior's closed-form leave-one-out predictions against the own model's
  5-fold out-of-fold ones), so it moves to the device as its own fit gets better with n;
  ``own`` is ``ridge`` (encoding, pair products, cell-graph terms, ``RidgeCV``) or ``gbm``
  (``latency_lofo.gbm_baseline``); ``stack-rank:<own>`` chooses the weight by the Spearman of
  the blended leave-out predictions instead of their log error, and ``stack-guard:<own>``
  keeps that weight only where at least 4 of the 5 folds rank no worse with it;
* ``fixed:<own>:<w>``: the same blend at a fixed weight (a diagnostic: does any weight pay?);
* ``prior:alphas`` / ``prior:pairs`` (``--prior``): the prior itself given more room for the
  device's own fit, weighed by each adaptation's evidence like its other blocks (the GP's own
  shrinkage schedule): the device's additive encoding block with larger variances (alphas up to
  3), or a block of the device's own pair products (every two positions' choices, centred)
  with variances 0.01 / 0.03 / 0.1 beside the members of the default;
* the baselines ``opcount``, ``gbm``, ``gp``.

    OMP_NUM_THREADS=1 python benchmarks/latency_growth_variants.py --space nb201 \\
        --cache /tmp/lofo_folds --n 20 50 100 --draws 2 --max-devices 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from hwnas.core.io import write_json
from hwnas.latency.machine import describe_machine
from hwnas.latency.predictors import OpCountPredictor
from hwnas.latency.predictors.features import (
    arch_strings,
    encoding_positions,
    features,
    pair_products,
)
from hwnas.latency.predictors.residual import MixedGP, cell_features
from hwnas.supernet.spaces import get_space

try:
    import latency_ceiling as ceiling
    import latency_lofo as lofo
    import latency_residual_select as select
    from latency_ceiling import path_features
except ImportError:  # pragma: no cover
    from benchmarks import latency_ceiling as ceiling
    from benchmarks import latency_lofo as lofo
    from benchmarks import latency_residual_select as select
    from benchmarks.latency_ceiling import path_features

OUT_JSON = Path(__file__).with_suffix(".json")
#: the candidates printed per family as the run goes
SHOWN = ("off", "paths", "gp+", "trees+", "stack:ridge", "stack:gbm", "prior:alphas",
         "prior:pairs")
GRID = np.round(np.arange(0.0, 1.01, 0.1), 2)


def ridge_own(space, archs, y, query, seed):
    """The device's own fit: ridge (``RidgeCV``) of log latency on the encoding, its pair
    products and the cell-graph terms, standardized."""
    from sklearn.linear_model import RidgeCV

    def f(keys):
        E = features(space, keys, "encode")
        P = pair_products(E, encoding_positions(space)) if E.shape[1] <= 64 else np.zeros(
            (len(E), 0))
        return np.hstack([E, P, path_features(space, keys)])

    A, Q = f(archs), f(query)
    mu, sd = A.mean(0), A.std(0) + 1e-9
    m = RidgeCV(alphas=np.logspace(-2, 3, 12)).fit((A - mu) / sd, np.log(y))
    return np.exp(m.predict((Q - mu) / sd))


class _PriorVariant:
    """The fold's meta predictor with more room for the device's own fit (``prior:<kind>``):
    ``alphas``, larger variances of the additive encoding block; ``pairs``, a block ``p`` of
    the device's own centred pair products. Swaps the module's block list while it adapts."""

    PAIR_VARS = (0.0, 0.01, 0.03, 0.1)

    def __init__(self, meta, kind: str) -> None:
        from hwnas.latency.predictors import meta as meta_module

        self.mod, self.kind = meta_module, kind
        cls = type("PriorVariant", (type(meta),), {})
        base = type(meta)
        space = meta.space
        pos = encoding_positions(space)
        npairs = len(pos) * (len(pos) - 1) / 2
        centre = np.concatenate([np.full(len(pos[i]) * len(pos[j]), 1.0 / (len(pos[i])
                                                                          * len(pos[j])))
                                 for i in range(len(pos)) for j in range(i + 1, len(pos))])

        def _blocks(obj, keys, variant="raw"):
            out = base._blocks(obj, keys, variant)
            if kind == "pairs":
                X, _ek, _flag = obj._encoded(keys, variant)
                out["p"] = (pair_products(X, pos) - centre) / np.sqrt(npairs)
            else:
                out["p"] = np.zeros((len(keys), 0))
            return out

        def _members(obj, variant):
            ms = base._members(obj, variant)
            if kind == "pairs":
                return [({**s2, "p": v}, lam) for s2, lam in ms for v in self.PAIR_VARS]
            return [({**s2, "p": 0.0}, lam) for s2, lam in ms]

        cls._blocks, cls._members = _blocks, _members
        self.obj = cls.__new__(cls)
        self.obj.__dict__ = dict(meta.__dict__)
        if kind == "alphas":
            self.obj.alphas = tuple(meta.alphas) + (1.0, 3.0)

    def adapt_predict(self, archs, y, q, seed):
        old = self.mod._BLOCKS
        self.mod._BLOCKS = old + ("p",)
        try:
            t0 = time.perf_counter()
            self.obj.adapt(archs, y, seed=seed)
            dt = time.perf_counter() - t0
            return self.obj.predict(q), dt
        finally:
            self.mod._BLOCKS = old


OWN = {"ridge": ridge_own, "gbm": lambda *a: lofo.gbm_baseline(*a)}


def main(argv=None) -> int:
    ap = select.fold_arguments(__doc__)
    ap.add_argument("--own", nargs="*", default=["ridge", "gbm"], choices=sorted(OWN))
    ap.add_argument("--fixed", nargs="*", type=float, default=[0.25, 0.5])
    ap.add_argument("--baselines", nargs="*", default=["opcount", "gbm", "gp"])
    ap.add_argument("--prior", nargs="*", default=[], choices=["alphas", "pairs"])
    ap.add_argument("--no-residuals", action="store_true", help="no residual learners")
    ap.add_argument("--residuals", nargs="+", default=["mixed", "paths"],
                    choices=["mixed", "paths", *RICH_RESIDUALS],
                    help="the residual learners scored (default: mixed paths)")
    ap.add_argument("--no-variants", action="store_true",
                    help="only the default and --prior / --baselines (no residual or blends)")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    args = ap.parse_args(argv)
    space = get_space(args.space)
    devices, _ = lofo.load_devices(space)
    devices = {d: v for d, v in devices.items() if lofo.family(d) not in args.without}
    folds = select.held_out_folds(devices, args.families)
    rows = []
    t_start = time.perf_counter()
    for fam, held in folds.items():
        meta = select.fold_predictor(space, devices, fam, held, args.cache)
        meta.residual = "off"
        for d in sorted(held)[:args.max_devices]:
            archs, y = devices[d]
            for n, kind, s, rk, sc in select.measurement_draws(meta, archs, args.n, args.draws,
                                                               args.score_subsample):
                rows.append({"family": fam, "device": d, "n": n, "kind": kind, "draw": s,
                             **score_variants(space, meta, [archs[i] for i in rk], y[rk],
                                              [archs[i] for i in sc], y[sc], s, args)})
        fr = [r for r in rows if r["family"] == fam]
        print(f"{fam} ({time.perf_counter() - t_start:.0f} s): " + "  ".join(
            f"@{n} " + " ".join(f"{k} {np.mean([r[k] for r in fr if r['n'] == n]):.3f}"
                                for k in SHOWN if k in fr[0])
            for n in args.n if any(r["n"] == n for r in fr)), file=sys.stderr, flush=True)
    summary = select.summarize(rows)
    for line in summary:
        print(line["kind"], line["n"], "  ".join(f"{k} {v:.4f}" for k, v in line["mean"].items()
                                                 if not k.startswith("w[")))
    write_json(args.out, {"space": args.space, "rows": rows, "summary": summary,
                          "command": "OMP_NUM_THREADS=1 python benchmarks/"
                                     "latency_growth_variants.py "
                                     + " ".join(argv if argv is not None else sys.argv[1:]),
                          "machine": describe_machine("no GPU used"),
                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          "args": {k: str(v) for k, v in vars(args).items()}})
    return 0


def score_variants(space, meta, m_archs, m_y, q, yq, s, args) -> dict:
    sp = lofo.spearman
    t0 = time.perf_counter()
    meta.adapt(m_archs, m_y, seed=s)
    out = {"seconds[off]": time.perf_counter() - t0}
    p0 = meta.predict(q)
    out["off"] = sp(p0, yq)
    for kind in args.prior:
        p, dt = _PriorVariant(meta, kind).adapt_predict(m_archs, m_y, q, s)
        out[f"prior:{kind}"], out[f"seconds[prior:{kind}]"] = sp(p, yq), dt
    if args.no_variants:
        args = argparse.Namespace(**{**vars(args), "own": []})
    loo = meta.loo_predictions()
    n = len(m_y)
    # residual learners on the same adaptation
    for name in () if args.no_variants or args.no_residuals else args.residuals:
        res = _residual(space, meta, m_archs, m_y, loo, s, name)
        out[f"w[{name}]"] = res[0]
        out[name] = sp(p0 * res[1](q), yq) if res[0] > 0 else out["off"]
    # shrinkage to the device's own fit, the weight from the device's own leave-out
    parts = np.array_split(np.random.default_rng(s).permutation(n), 5)
    for own in args.own:
        oof = np.empty(n)
        for part in parts:
            fit = np.setdiff1d(np.arange(n), part)
            oof[part] = OWN[own](space, [m_archs[i] for i in fit], m_y[fit],
                                 [m_archs[i] for i in part], s)
        la, lo, ly = np.log(loo), np.log(oof), np.log(m_y)
        err = [float(np.mean(((1 - w) * la + w * lo - ly) ** 2)) for w in GRID]
        w = float(GRID[int(np.argmin(err))])
        po = OWN[own](space, m_archs, m_y, q, s)
        out[f"w[stack:{own}]"] = w
        out[f"stack:{own}"] = sp(np.exp((1 - w) * np.log(p0) + w * np.log(po)), yq)
        rank = [sp((1 - w) * la + w * lo, ly) for w in GRID]
        wr = float(GRID[int(np.argmax(rank))])
        blend = (1 - wr) * la + wr * lo
        ok = sum(sp(blend[q_], ly[q_]) >= sp(la[q_], ly[q_]) for q_ in parts)
        for key, wk in (("stack-rank", wr), ("stack-guard", wr if ok >= 4 else 0.0)):
            out[f"w[{key}:{own}]"] = wk
            out[f"{key}:{own}"] = sp(np.exp((1 - wk) * np.log(p0) + wk * np.log(po)), yq)
        out[f"own:{own}"] = sp(po, yq)
        for wf in args.fixed:
            out[f"fixed:{own}:{wf}"] = sp(np.exp((1 - wf) * np.log(p0) + wf * np.log(po)), yq)
    for b in args.baselines:
        if b == "opcount":
            p = OpCountPredictor(space).adapt(m_archs, m_y, seed=s).predict(q)
        else:
            p = getattr(lofo, f"{b}_baseline")(space, m_archs, m_y, q, s)
        out[b] = sp(p, yq)
    return out


def _residual(space, meta, archs, y, loo, seed, name):
    """A residual learner with the weight and fold check of ``MetaPredictor._fit_residual``
    (its own 5-fold CV on the prior's leave-one-out misses; fold check 1): the mixed GP on the
    encoding and whole-network terms, plus the cell-graph terms for ``paths``; for ``gp+`` /
    ``trees+`` the richer ceiling models (``latency_ceiling.gp_predict`` / ``trees_predict``
    on ``rich_features``: both execution variants' encodings, pair products, cell-graph and
    layer terms). Returns its weight and a function giving the factor on the prior's
    prediction."""
    from hwnas.latency.predictors.residual import RESIDUAL_FOLDS, RESIDUAL_FOLDS_AGAINST

    r = np.log(y) - np.log(loo)
    n = len(r)
    parts = np.array_split(np.random.default_rng(seed).permutation(n), min(RESIDUAL_FOLDS, n))
    if name in RICH_RESIDUALS:
        fit_predict = RICH_RESIDUALS[name]
        rich = ceiling.rich_features(space, archs)
        cv = np.empty(n)
        for part in parts:
            cv[part] = fit_predict(rich, r, np.setdiff1d(np.arange(n), part), part, seed)
    else:
        def feats(keys):
            keys = arch_strings(space, keys)
            X = np.hstack([features(space, keys, "encode"),
                           cell_features(space, keys, meta._p["l_cols"])])
            return np.hstack([X, path_features(space, keys)]) if name == "paths" else X

        X = feats(archs)
        mk = lambda: MixedGP(space.feature_dim, len(encoding_positions(space)))  # noqa: E731
        cv = np.empty(n)
        for part in parts:
            fit = np.setdiff1d(np.arange(n), part)
            cv[part] = mk().fit(X[fit], r[fit]).predict(X[part])
    w = float(np.clip((r @ cv) / max(float(cv @ cv), 1e-12), 0.0, 1.0))
    better = sum(float(np.sum(r[q] ** 2 - (r[q] - w * cv[q]) ** 2)) > 0 for q in parts)
    if better < len(parts) - RESIDUAL_FOLDS_AGAINST:
        w = 0.0
    if w == 0:
        return 0.0, None
    if name in RICH_RESIDUALS:
        def factor(q):
            both = ceiling.rich_features(space, list(archs) + list(q))
            pred = fit_predict(both, np.concatenate([r, np.zeros(len(q))]), np.arange(n),
                               np.arange(n, n + len(q)), seed)
            return np.exp(w * pred)
        return w, factor
    model = mk().fit(X, r)
    return w, lambda q: np.exp(w * model.predict(feats(q)))


#: the richer residual learners (``--residuals``), fit-and-predict functions on
#: ``latency_ceiling.rich_features`` rows (train rows, test rows)
RICH_RESIDUALS = {"gp+": ceiling.gp_predict, "trees+": ceiling.trees_predict}


if __name__ == "__main__":
    sys.exit(main())
