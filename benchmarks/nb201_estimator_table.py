"""The latency of every NAS-Bench-201 cell under each of hwnas's analytical estimators, as a
table in the shared data's CSV layout, so ``search_nb201.py --latency-csv`` can search on it.

The estimators (FPGA dataflow, Edge TPU, rooflines of Jetson, phone and Raspberry Pi CPUs)
are models of our own, not HELP's devices, so a search on them is development data. Their
latency depends on which operations a cell holds, not on the cell's weights, so they have
few distinct levels (141-195 among 15,625 cells) and a wide range (up to 190x), unlike the
desktop GPUs (issue 47, session 56).

    python benchmarks/nb201_estimator_table.py --out /tmp/nb201_est.csv    # about 90 s
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from hwnas.latency.estimators import available_estimators, get_estimator
from hwnas.latency.tables import load_shared_table
from hwnas.supernet.spaces import get_space


def estimator_columns(archs: list[str], names: list[str]) -> dict[str, np.ndarray]:
    """``name -> latency (ms) of each of archs`` under each named estimator."""
    space = get_space("nb201")
    nets = [space.layers(space.from_string(a)) for a in archs]
    return {n: get_estimator(n).estimate_many(nets) for n in names}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--estimators", nargs="+", default=None,
                    help="default: every registered estimator")
    args = ap.parse_args(argv)
    names = args.estimators or available_estimators()
    shared = load_shared_table("nb201", space=get_space("nb201"))
    archs = list(shared.archs)
    cols = estimator_columns(archs, names)
    tmp = args.out.with_suffix(args.out.suffix + ".part")
    with open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arch_idx", "arch", *names])
        for i, a in enumerate(archs):
            w.writerow([i, a, *(f"{cols[n][i]:.6g}" for n in names)])
    tmp.replace(args.out)
    for n in names:
        print(f"{n:22s} {len(np.unique(cols[n].round(9))):4d} levels, "
              f"{cols[n].min():.4g}-{cols[n].max():.4g} ms")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
