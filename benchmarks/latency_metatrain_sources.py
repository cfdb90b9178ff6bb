"""Should the shipped meta predictors also meta-train on this project's measured tables?

The shipped predictors meta-train on HELP's 9 meta-training devices (so HELP's split stays a
fair published comparison). This checks, on development data only, what adding the measured
tables (``results/latency_tables``: each runtime on each of our machines) would give a device
the predictor never saw: each measured family is held out in turn and scored (10 measurements,
Spearman over all its architectures, the reference ones and ``--seeds`` random draws) by the
meta predictor trained on (a) HELP's meta-training devices only and (b) those plus every other
measured family. HELP's validation and test devices are never used.

Two more views (``--view``), where what is held out is further from what stays:

* ``machine``: every table of one of our machines (all its runtimes and thread counts) at once,
  so no sibling runtime of the same processor is left in the meta-training set; the extra
  source is then the *other machines'* tables only;
* ``help-kinds``: one kind of HELP's meta-training devices (its four phones, its three GPUs,
  its two CPUs), scored on all the space's architectures, meta-trained on HELP's others alone
  or with every measured table (ours: the names with ``-``; HELP's further columns are left
  out, as some are siblings of its validation and test devices). The phones are the one ARM
  proxy these tables hold.

In those views each device is also adapted to ``--n`` random measurements (``--seeds`` draws
each), so the curve shows whether the extra tables help only the first measurements.

    python benchmarks/latency_metatrain_sources.py [--spaces nb201 fbnet] [--seeds 3]
    python benchmarks/latency_metatrain_sources.py --view machine --n 10 20 50 100 --out X.json

Prints a table and writes ``results/latency_lofo/metatrain_sources.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import latency_lofo as lofo
from hwnas.latency.machine import describe_machine
from hwnas.latency.predictors import MetaPredictor
from hwnas.latency.tables import help_protocol
from hwnas.supernet.spaces import get_space

OUT = Path(__file__).resolve().parent / "results" / "latency_lofo" / "metatrain_sources.json"


def _meta(space, devices: dict, train: list[str]) -> MetaPredictor:
    archs = list(dict.fromkeys(a for d in train for a in devices[d][0]))
    return MetaPredictor(space).meta_fit(space, archs, lofo.nan_columns(devices, train, archs),
                                         seed=0)


#: ``--view help-kinds``: HELP's meta-training devices by kind
HELP_KINDS = {"phone": "phone", "gpu": "desktop-gpu", "cpu": "server-cpu"}


def ours(device: str) -> bool:
    """Whether ``device`` is a column of this project's measured tables (``<machine>-...``)."""
    return "-" in device


def _score_fold(space, devices: dict, held: list[str], train: list[str], seeds: int,
                ns: list[int]) -> dict[str, dict[str, list[float]]]:
    """``device -> {"ref": [..], "random<n>": [..]}``: Spearman over the device's architectures
    of the predictor meta-trained on ``train``, adapted to its 10 references (redesigned on
    the held-out devices' common architectures where needed) and to ``seeds`` draws of each n."""
    common = set.intersection(*(set(devices[d][0]) for d in held))
    meta = _meta(space, devices, train)
    if not set(meta.reference_archs[:lofo.N]) <= common:
        meta.redesign(sorted(common), seed=0)
    refs = meta.reference_archs[:lofo.N]
    out = {}
    for d in held:
        archs, y = devices[d]
        idx = {x: i for i, x in enumerate(archs)}
        row = {"ref": [lofo.score_device(space, meta, archs, y, np.array([idx[a] for a in refs]),
                                         0, ("meta",))["meta"]]}
        for n in ns:
            if n >= len(archs):
                continue
            row[f"random{n}"] = [
                lofo.score_device(space, meta, archs, y,
                                  np.random.default_rng(1000 + s).choice(len(archs), n,
                                                                         replace=False),
                                  s, ("meta",))["meta"] for s in range(seeds)]
        out[d] = row
    return out


def run_view(name: str, view: str, seeds: int, ns: list[int]) -> list[dict]:
    """Rows of ``--view machine`` or ``help-kinds``: one per held-out family, source and
    measurement count (``ref`` or ``random<n>``), the family's mean over its devices and draws."""
    space, protocol = get_space(name), help_protocol(name)
    devices, _ = lofo.load_devices(space)
    measured = [d for d in devices if ours(d)]
    if view == "machine":
        folds = defaultdict(list)
        for d in measured:
            folds[d.split("-")[0]].append(d)
        plan = {m: (held, list(protocol.meta_train), [d for d in measured if d not in held])
                for m, held in sorted(folds.items())}
    else:
        plan = {}
        for kind, fam in HELP_KINDS.items():
            held = [d for d in protocol.meta_train if lofo.family(d) == fam]
            rest = [d for d in protocol.meta_train if d not in held]
            plan[kind] = (held, rest, measured)
    rows = []
    for fold, (held, base, extra) in plan.items():
        for source, train in (("help", base), ("help+measured", [*base, *extra])):
            scores = _score_fold(space, devices, held, train, seeds, ns)
            fams = defaultdict(list)
            for d in held:
                fams[lofo.family(d)].append(d)
            for fam, members in sorted(fams.items()):
                for key in scores[members[0]]:
                    vals = [v for d in members for v in scores[d].get(key, [])]
                    rows.append({"space": name, "view": view, "fold": fold, "family": fam,
                                 "devices": members, "meta_train": source, "measurements": key,
                                 "spearman": round(float(np.mean(vals)), 4)})
            print(f"{name:6s} {fold:8s} {source:14s} " + " ".join(
                f"{k} {np.mean([v for d in held for v in scores[d].get(k, [])]):.3f}"
                for k in scores[held[0]]), flush=True)
    return rows


def view_summary(rows: list[dict]) -> list[dict]:
    """Mean over held-out families per (space, view, source, measurements), and the change."""
    out = []
    keys = sorted({(r["space"], r["view"], r["measurements"]) for r in rows})
    for space, view, m in keys:
        sel = {src: {r["family"]: r["spearman"] for r in rows if (r["space"], r["view"],
               r["measurements"], r["meta_train"]) == (space, view, m, src)}
               for src in ("help", "help+measured")}
        fams = sorted(set(sel["help"]) & set(sel["help+measured"]))
        diff = [sel["help+measured"][f] - sel["help"][f] for f in fams]
        out.append({"space": space, "view": view, "measurements": m, "families": len(fams),
                    "help": round(float(np.mean([sel["help"][f] for f in fams])), 4),
                    "help+measured": round(float(np.mean([sel["help+measured"][f]
                                                          for f in fams])), 4),
                    "change": round(float(np.mean(diff)), 4),
                    "worst_family": fams[int(np.argmin(diff))],
                    "worst_change": round(float(np.min(diff)), 4)})
    return out


def run(name: str, seeds: int) -> list[dict]:
    space, protocol = get_space(name), help_protocol(name)
    devices, _ = lofo.load_devices(space)
    help_devices = {*protocol.meta_train, *protocol.validation, *protocol.test}
    measured = [d for d in devices if d not in help_devices]
    fams: dict[str, list[str]] = defaultdict(list)
    for d in measured:
        fams[lofo.family(d)].append(d)
    rows = []
    for fam, held in sorted(fams.items()):
        sources = {"help": list(protocol.meta_train),
                   "help+measured": [*protocol.meta_train, *(d for d in measured if d not in held)]}
        for source, train in sources.items():
            scores = _score_fold(space, devices, held, train, seeds, [lofo.N])
            ref = [v for d in held for v in scores[d]["ref"]]
            rnd = [v for d in held for v in scores[d][f"random{lofo.N}"]]
            rows.append({"space": name, "family": fam, "devices": held, "meta_train": source,
                         "reference": round(float(np.mean(ref)), 4),
                         "random": round(float(np.mean(rnd)), 4)})
            print(f"{name:6s} {fam:15s} {source:14s} reference {rows[-1]['reference']:.3f} "
                  f"random {rows[-1]['random']:.3f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", nargs="+", default=["nb201", "fbnet"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--view", choices=("family", "machine", "help-kinds"), default="family",
                    help="what is held out (module docstring); default each measured family")
    ap.add_argument("--n", type=int, nargs="+", default=[10, 20, 50, 100],
                    help="random measurement counts of the machine / help-kinds views")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.view != "family":
        rows = [r for s in args.spaces for r in run_view(s, args.view, args.seeds, args.n)]
        summary = view_summary(rows)
        print(f"\n{'space':6s} {'view':10s} {'measurements':12s} {'help':>7s} {'+measured':>9s} "
              f"{'change':>7s}  worst family")
        for m in summary:
            print(f"{m['space']:6s} {m['view']:10s} {m['measurements']:12s} {m['help']:7.3f} "
                  f"{m['help+measured']:9.3f} {m['change']:+7.3f}  {m['worst_family']} "
                  f"{m['worst_change']:+.3f}")
        _write(args.out, argv, t0, summary, rows)
        return 0
    rows = [r for s in args.spaces for r in run(s, args.seeds)]
    summary = []
    print(f"\n{'space':6s} {'meta-trained on':14s} {'mean ref':>9s} {'mean random':>12s} {'worst ref':>10s}")
    for s in args.spaces:
        for source in ("help", "help+measured"):
            sel = [r for r in rows if r["space"] == s and r["meta_train"] == source]
            summary.append({"space": s, "meta_train": source,
                            "mean_reference": round(float(np.mean([r["reference"] for r in sel])), 4),
                            "mean_random": round(float(np.mean([r["random"] for r in sel])), 4),
                            "worst_reference": round(float(np.min([r["reference"] for r in sel])), 4)})
            m = summary[-1]
            print(f"{s:6s} {source:14s} {m['mean_reference']:9.3f} {m['mean_random']:12.3f} "
                  f"{m['worst_reference']:10.3f}")
    _write(args.out, argv, t0, summary, rows)
    return 0


def _write(out: Path, argv: list[str] | None, t0: float, summary: list[dict],
           rows: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": "python benchmarks/latency_metatrain_sources.py " + " ".join(argv or sys.argv[1:]),
        "machine": describe_machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.time() - t0, 1), "summary": summary, "results": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
