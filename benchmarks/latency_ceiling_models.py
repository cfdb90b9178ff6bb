"""Is a table's 5-fold ceiling the table's or the models'? Richer models and session evidence.

``latency_ceiling.most_fit`` (``ceiling[most]``) is the best of three models fitted on 4/5 of a
device's table; the default predictor sits at it on the NB-201 families it misses 0.96 on
(latency_lofo.md, session 30). Two questions per device column (issue 48):

* **Do richer models go higher?** ``latency_ceiling.rich_most_fit``: a Gaussian process (Hamming
  kernel on both execution variants' encodings plus a linear kernel on cell-graph and layer
  terms), gradient-boosted trees on the encoding, its pair products and those terms, and the
  mean of the standardized predictions of these and the two of ``most`` (``ens``); the same
  folds as ``most``.
* **What do the sessions say?** For a column averaged over several measurement sessions (the
  per-session tables under ``results/latency_tables/sessions/``), on the architectures every
  session measured: each session's agreement with the others' mean and with the model's
  out-of-fold prediction (``ens``, fitted on the averaged column), the model's estimated
  correlation with the true latency (its Spearman with one session / sqrt(one session's
  reliability)), the Pearson correlation between two sessions' residuals from the model (what
  the sessions reproduce and the model misses: 0 if the model had all of it), how much of a
  residual its measurement round's other residuals predict (rounds are shared by every session
  of a table: noise they reproduce is not the architecture's), how well sessions agree on the
  differences of architectures that run the same network (identical pruned cells on a runtime
  that drops dead code: reproducible differences there are shared noise), and the sessions
  ceiling with each architecture's own number of sessions
  (``latency_ceiling.sessions_ceiling_per_arch``) beside the one of the averaged count.

    OMP_NUM_THREADS=1 python benchmarks/latency_ceiling_models.py --devices xeon-ts-1t ... \\
        --out benchmarks/results/latency_lofo/ceiling_models_nb201.json
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

from hwnas.core.errors import UserError
from hwnas.core.io import write_json
from hwnas.latency.machine import describe_machine
from hwnas.latency.predictors.features import arch_strings, executed
from hwnas.supernet.spaces import get_space

try:
    import latency_ceiling as ceiling
    import latency_lofo as lofo
except ImportError:  # pragma: no cover
    from benchmarks import latency_ceiling as ceiling
    from benchmarks import latency_lofo as lofo

OUT_JSON = Path(__file__).with_suffix(".json")
#: HELP's tables are subsampled to this many architectures (4/5 of them train, as ``most``)
MAX_ARCHS = 4000


def session_tables(space, device: str, tables_dir: Path = lofo.TABLES_DIR,
                   repo: Path = lofo.REPO) -> tuple[list[dict[str, float]], list[dict | None]]:
    """The per-session columns of a measured device (``arch -> ms``, one dict per session, from
    the table's ``<space>_<tag>_sessions.json``) and each session's measurement rounds
    (``arch -> round`` from its ``_raw`` file, None where the session kept none); empty lists
    for a column of one session."""
    for f in sorted(tables_dir.glob(f"{space.name}_*_sessions.json")):
        doc = json.loads(f.read_text())
        if device not in doc["devices"]:
            continue
        cols, rounds = [], []
        for s in doc["sessions"]:
            base = repo / s / f"{space.name}_{doc['tag']}"
            cols.append(lofo.read_gz_table(Path(f"{base}.csv.gz"), space)[device])
            raw = Path(f"{base}_raw.csv.gz")
            if raw.is_file():
                rows = csv.reader(io.StringIO(gzip.decompress(raw.read_bytes()).decode()))
                next(rows)
                rounds.append({space.to_string(space.from_string(r[0])): int(r[1])
                               for r in rows if r[1].isdigit()})
            else:
                rounds.append(None)
        return cols, rounds
    return [], []


def session_evidence(space, archs: list[str], pred: np.ndarray, cols: list[dict[str, float]],
                     rounds: list[dict | None]) -> dict:
    """The session figures of the module docstring for one device: ``pred`` is the model's
    out-of-fold prediction (any monotone scale) on ``archs``, ``cols`` / ``rounds`` as
    :func:`session_tables`."""
    sp = lofo.spearman
    k = len(cols)
    pos = {a: i for i, a in enumerate(archs)}
    common = [a for a in archs if all(a in c for c in cols)]
    L = np.log([[c[a] for a in common] for c in cols])
    f = pred[[pos[a] for a in common]]
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    rho = float(np.median([sp(L[i], L[j]) for i, j in pairs]))
    model_vs = [sp(f, L[b]) for b in range(k)]
    # residuals on the log scale of a least-squares line from the prediction to the mean
    f_log = np.polyval(np.polyfit(f, L.mean(0), 1), f)
    R = L - f_log
    R -= R.mean(1, keepdims=True)
    round_r = []
    for b, rb in enumerate(rounds):
        if rb is None:
            continue
        r_id = np.array([rb.get(a, -1) for a in common])
        others = np.array([R[b][(r_id == r_id[i]) & (np.arange(len(common)) != i)].mean()
                           if (r_id == r_id[i]).sum() > 1 else np.nan for i in range(len(common))])
        ok = np.isfinite(others) & (r_id >= 0)
        if ok.sum() > 10:
            round_r.append(float(np.corrcoef(R[b][ok], others[ok])[0, 1]))
    known = [(b, r) for b, r in enumerate(rounds) if r is not None]
    same_round = (float(np.mean([known[0][1].get(a) == known[1][1].get(a) for a in common]))
                  if len(known) >= 2 else None)
    # do the rounds' mean residuals repeat from session to session (noise every session shares)?
    round_means = []
    for b, rb in known:
        r_id = np.array([rb.get(a, -1) for a in common])
        round_means.append({g: float(R[b][r_id == g].mean()) for g in set(r_id) if g >= 0})
    shared = [np.corrcoef(*[[m[g] for g in sorted(set(m1) & set(m2))] for m in (m1, m2)])[0, 1]
              for i, m1 in enumerate(round_means) for m2 in round_means[i + 1:]
              if len(set(m1) & set(m2)) > 2]
    ek, _ = executed(space, arch_strings(space, common), "pruned")
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(ek):
        groups.setdefault(e, []).append(i)
    twins = [(g[0], j) for g in groups.values() for j in g[1:]]
    twin_r = None
    if len(twins) >= 8 and k >= 2:
        D = np.array([[L[s][i] - L[s][j] for i, j in twins] for s in range(k)])
        twin_r = float(np.mean([np.corrcoef(D[i], D[j])[0, 1] for i, j in pairs]))
    counts = np.array([sum(a in c for c in cols) for a in archs])
    return {
        "sessions": k, "architectures_in_every_session": len(common),
        "session_spearman": round(rho, 4),
        "sessions_ceiling": round(ceiling.sessions_ceiling(k, rho), 4),
        "sessions_ceiling_per_arch": round(ceiling.sessions_ceiling_per_arch(counts, rho), 4),
        "session_counts": {int(c): int((counts == c).sum()) for c in np.unique(counts)},
        "others_vs_session": round(float(np.mean([sp(np.delete(L, b, 0).mean(0), L[b])
                                                  for b in range(k)])), 4),
        "model_vs_session": round(float(np.mean(model_vs)), 4),
        "model_vs_truth": round(float(np.mean(model_vs)) / np.sqrt(max(rho, 1e-9)), 4),
        "model_vs_mean_common": round(sp(f, L.mean(0)), 4),
        "residual_r_between_sessions": round(float(np.mean(
            [np.corrcoef(R[i], R[j])[0, 1] for i, j in pairs])), 4),
        "round_residual_r": [round(r, 3) for r in round_r],
        "same_rounds_share": same_round,
        "round_mean_r_between_sessions": (round(float(np.mean(shared)), 3) if shared
                                          else None),
        "identical_network_pairs": len(twins),
        "identical_network_diff_r": None if twin_r is None else round(twin_r, 3),
    }


def device_row(space, device: str, archs: list[str], y: np.ndarray, seed: int = 0,
               rich: bool = True) -> dict:
    """One device: the richer models' and ``most``'s Spearman (5-fold, the same folds) and,
    for a column of several sessions, :func:`session_evidence` of the ``ens`` prediction
    (without ``rich``: of ``most``'s ``pairwise`` and ``trees`` models only, much faster)."""
    if len(archs) > MAX_ARCHS:
        idx = np.sort(np.random.default_rng(seed).permutation(len(archs))[:MAX_ARCHS])
        archs, y = [archs[i] for i in idx], y[idx]
    t0 = time.perf_counter()
    most = ceiling.most_fit(ceiling.ceiling_features(space, archs), y, seed=seed)
    preds = ceiling.rich_most_fit(space, archs, y, seed=seed,
                                  models=("gp", "trees+") if rich else ())
    row = {"device": device, "family": lofo.family(device), "architectures": len(archs),
           "most": round(most["best"], 4),
           "most_models": {k: round(v, 4) for k, v in most.items() if k != "best"},
           **{k: round(lofo.spearman(p, y), 4) for k, p in preds.items()}}
    row["best_rich"] = max(row[k] for k in preds)
    cols, rounds = session_tables(space, device)
    if len(cols) >= 2:
        row.update(session_evidence(space, archs, preds["ens"], cols, rounds))
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="nb201", choices=["nb201", "fbnet"])
    ap.add_argument("--devices", nargs="+", default=None)
    ap.add_argument("--families", nargs="+", default=None)
    ap.add_argument("--sessions-only", action="store_true",
                    help="no richer models: the session evidence of most's pairwise + trees")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    args = ap.parse_args(argv)
    space = get_space(args.space)
    devices, _ = lofo.load_devices(space)
    names = [d for d in devices if (args.devices is None or d in args.devices)
             and (args.families is None or lofo.family(d) in args.families)]
    if not names:
        raise UserError("no device of the space matches --devices / --families")
    rows = []
    for d in names:
        rows.append(device_row(space, d, *devices[d], rich=not args.sessions_only))
        r = rows[-1]
        print(f"{d}: most {r['most']:.3f} " + " ".join(
            f"{k} {r[k]:.3f}" for k in ("gp", "trees+", "ens") if k in r) + (f"  sessions {r['sessions_ceiling']:.3f} per-arch "
                                       f"{r['sessions_ceiling_per_arch']:.3f} model~truth "
                                       f"{r['model_vs_truth']:.3f} residual r "
                                       f"{r['residual_r_between_sessions']:.2f}"
                                       if "sessions" in r else "")
              + f" ({r['seconds']:.0f} s)", file=sys.stderr, flush=True)
    fams = sorted({r["family"] for r in rows})
    keys = ["most", "gp", "trees+", "ens", "best_rich", "sessions_ceiling",
            "sessions_ceiling_per_arch", "model_vs_truth", "residual_r_between_sessions",
            "round_mean_r_between_sessions"]
    summary = {f: {k: round(float(np.mean([r[k] for r in rows if r["family"] == f])), 4)
                   for k in keys if all(r.get(k) is not None for r in rows if r["family"] == f)}
               for f in fams}
    print("| family | " + " | ".join(keys) + " |")
    for f in fams:
        print(f"| {f} | " + " | ".join(f"{summary[f][k]:.3f}" if k in summary[f] else "-"
                                       for k in keys) + " |")
    write_json(args.out, {"space": args.space, "rows": rows, "families": summary,
                          "command": "OMP_NUM_THREADS=1 python benchmarks/"
                                     "latency_ceiling_models.py "
                                     + " ".join(argv if argv is not None else sys.argv[1:]),
                          "machine": describe_machine("no GPU used"),
                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        sys.exit(f"hwnas: error: {e}")
