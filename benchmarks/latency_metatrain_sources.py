"""Should the shipped meta predictors also meta-train on this project's measured tables?

The shipped predictors meta-train on HELP's 9 meta-training devices (so HELP's split stays a
fair published comparison). This checks, on development data only, what adding the measured
tables (``results/latency_tables``: each runtime on each of our machines) would give a device
the predictor never saw: each measured family is held out in turn and scored (10 measurements,
Spearman over all its architectures, the reference ones and ``--seeds`` random draws) by the
meta predictor trained on (a) HELP's meta-training devices only and (b) those plus every other
measured family. HELP's validation and test devices are never used.

    python benchmarks/latency_metatrain_sources.py [--spaces nb201 fbnet] [--seeds 3]

Prints a table and writes ``results/latency_lofo/metatrain_sources.json``.
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
        common = set.intersection(*(set(devices[d][0]) for d in held))
        sources = {"help": list(protocol.meta_train),
                   "help+measured": [*protocol.meta_train, *(d for d in measured if d not in held)]}
        for source, train in sources.items():
            meta = _meta(space, devices, train)
            if not set(meta.reference_archs[:lofo.N]) <= common:
                meta.redesign(sorted(common), seed=0)
            refs = meta.reference_archs[:lofo.N]
            ref, rnd = [], []
            for d in held:
                archs, y = devices[d]
                idx = {x: i for i, x in enumerate(archs)}
                ref.append(lofo.score_device(space, meta, archs, y, np.array([idx[a] for a in refs]),
                                             0, ("meta",))["meta"])
                for s in range(seeds):
                    pick = np.random.default_rng(1000 + s).choice(len(archs), lofo.N, replace=False)
                    rnd.append(lofo.score_device(space, meta, archs, y, pick, s, ("meta",))["meta"])
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
    args = ap.parse_args(argv)
    t0 = time.time()
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
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "command": "python benchmarks/latency_metatrain_sources.py " + " ".join(argv or sys.argv[1:]),
        "machine": describe_machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.time() - t0, 1), "summary": summary, "results": rows}, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
