"""Adaptation time of the shipped meta predictors at 10, 20, 50 and 100 random measurements.

Each shipped predictor (``latency/data/{nb201,fbnet}_meta.npz``: residual learner and member
screening on) and the same file with both off (what files written before them do) is adapted
to 10/20/50/100 random architectures of HELP's first test device (5 draws, the two interleaved),
and the CPU seconds of ``adapt()`` (``time.process_time``, one thread: wall time on a shared
machine says more about the other jobs) are reported as medians. Prints a table, writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/latency_adapt_time.py
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import numpy as np
from hwnas.latency.machine import describe_machine
from hwnas.latency.predictors import load_pretrained
from hwnas.latency.tables import help_protocol, load_shared_table
from hwnas.supernet.spaces import get_space

from hwnas.core.io import write_json

OUT = Path(__file__).resolve().parent / "results" / "latency_lofo" / "curve" / "adapt_cpu_seconds.json"


def main(argv: list[str] | None = None) -> int:
    out = {}
    print(f"{'space':<7}{'device':<16}{'n':>5}{'new (s)':>10}{'before (s)':>12}")
    for name in ("nb201", "fbnet"):
        new = load_pretrained(name)
        old = copy.deepcopy(new)
        old.residual, old.screen_margin = "off", 0.0
        space = get_space(name)
        table = load_shared_table(name, space=space)
        device = help_protocol(name).test[0]
        y = table.column(device)
        for n in (10, 20, 50, 100):
            times: dict[str, list[float]] = {"new": [], "before": []}
            for draw in range(5):
                rows = np.random.default_rng(draw).permutation(len(table))[:n]
                archs = [table.archs[i] for i in rows]
                for key, pred in (("new", new), ("before", old)):
                    trial = copy.deepcopy(pred)
                    t0 = time.process_time()
                    trial.adapt(archs, y[rows], seed=0)
                    times[key].append(time.process_time() - t0)
            med = {k: round(float(np.median(v)), 3) for k, v in times.items()}
            out[f"{name}@{n}"] = {"device": device, **med}
            print(f"{name:<7}{device:<16}{n:>5}{med['new']:>10.3f}{med['before']:>12.3f}")
    write_json(OUT, {"command": "OMP_NUM_THREADS=1 python benchmarks/latency_adapt_time.py",
                     "machine": describe_machine("no GPU used"),
                     "unit": "CPU seconds of adapt(), median of 5 random draws",
                     "results": out})
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
