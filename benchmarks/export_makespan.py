"""The wall time of a parallel export's models part under two submission orders, by list
scheduling of measured per-model seconds: the fronts' order (the old ``_export_parallel``) and
costliest first (:func:`hwnas.export.run_export.submission_order`)::

    python benchmarks/export_makespan.py EXPORT_DIR [--supernet CKPT] [--workers 2,4,8] [--json OUT]
    python benchmarks/export_makespan.py --seconds 26,30,...,85 [--costs ...]   # figures by hand

``EXPORT_DIR``: an export (its ``manifest.json``; best a sequential one, ``--workers 1``, so that
each model's seconds are its own). A model's seconds: its stages summed (``ptq`` left out, it is
counted inside ``qdq`` and ``device_files``). Each order is list-scheduled on k workers: a model
starts on the first worker free, in submission order. The model assumes that a model takes
as long beside others as alone (no contention, no timing gate): a lower bound of what the order
changes, not a prediction of the wall time. Prints a table; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path


def makespan(seconds: list[float], order: list[int], workers: int) -> float:
    """Finish time of the last model when ``order`` is submitted to ``workers`` workers, each
    model starting on the first one free (what a process pool does)."""
    free = [0.0] * workers
    end = 0.0
    for i in order:
        start = heapq.heappop(free)
        heapq.heappush(free, start + seconds[i])
        end = max(end, start + seconds[i])
    return end


def model_seconds(model: dict) -> float:
    return sum(v for k, v in (model.get("info", {}).get("stage_seconds") or {}).items()
               if k != "ptq")


def from_export(export_dir: Path, supernet: Path | None = None
                ) -> tuple[list[str], list[float], list[int], dict]:
    """(names, measured seconds, the costliest-first order the export now submits, per model
    stage seconds) of an export directory. The space comes from ``supernet`` (a checkpoint)
    when given, else from the run directory its manifest names (gone when the export ran on
    another machine, e.g. the device's ``/tmp``)."""
    from hwnas.export.run_export import ModelRow, submission_order

    doc = json.loads((export_dir / "manifest.json").read_text())
    if supernet is not None:
        from hwnas.supernet.checkpoint_io import load_checkpoint
        space = load_checkpoint(supernet)[0]
    else:
        from hwnas.search.replay import load_run_supernet
        from hwnas.search.rundir import RunDir
        rd = RunDir(Path(doc["run_dir"]))
        space, _, _ = load_run_supernet(rd, rd.read_search_config())
    rows = [ModelRow(int(m["name"].rsplit("_", 1)[1]), m["arch"] or "",
                     json.dumps(m["policy"]) if m.get("policy") else "", m.get("accuracy"), {})
            for m in doc["models"]]
    order = submission_order(rows, space, doc["settings"]["rounding"])
    stages = {m["name"]: m["info"].get("stage_seconds", {}) for m in doc["models"]}
    return ([m["name"] for m in doc["models"]], [model_seconds(m) for m in doc["models"]],
            order, stages)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export_dir", nargs="?", type=Path)
    ap.add_argument("--seconds", help="per-model seconds in the fronts' order, comma-separated "
                                      "(instead of EXPORT_DIR)")
    ap.add_argument("--costs", help="with --seconds: the estimated costs that order the "
                                    "submission (default: the seconds themselves)")
    ap.add_argument("--supernet", type=Path,
                    help="with EXPORT_DIR: the checkpoint whose space the run used, when the "
                         "manifest's run directory is not on this machine")
    ap.add_argument("--workers", default="2,4,8")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    stages: dict = {}
    if a.seconds:
        seconds = [float(t) for t in a.seconds.split(",")]
        names = [f"model_{i + 1}" for i in range(len(seconds))]
        costs = [float(t) for t in a.costs.split(",")] if a.costs else seconds
        order = sorted(range(len(seconds)), key=lambda i: -costs[i])
    elif a.export_dir:
        names, seconds, order, stages = from_export(a.export_dir, a.supernet)
    else:
        ap.error("give EXPORT_DIR or --seconds")
    fronts = list(range(len(seconds)))
    best = sorted(fronts, key=lambda i: -seconds[i])  # LPT on the measured seconds
    print("model seconds (fronts' order): "
          + ", ".join(f"{n} {s:.1f}" for n, s in zip(names, seconds)))
    print("submitted costliest first: " + ", ".join(names[i] for i in order))
    print(f"{'k':>3} {'fronts order':>13} {'costliest first':>16} {'LPT on measured':>16} "
          f"{'lower bound':>12}")
    table = []
    for k in (int(t) for t in a.workers.split(",")):
        row = {"workers": k, "fronts": makespan(seconds, fronts, k),
               "costliest_first": makespan(seconds, order, k),
               "lpt_measured": makespan(seconds, best, k),
               "lower_bound": max(max(seconds), sum(seconds) / k)}
        table.append(row)
        print(f"{k:>3} {row['fronts']:>13.1f} {row['costliest_first']:>16.1f} "
              f"{row['lpt_measured']:>16.1f} {row['lower_bound']:>12.1f}")
    if a.json:
        a.json.write_text(json.dumps({"source": str(a.export_dir or "--seconds"),
                                      "models": names, "seconds": seconds,
                                      "submitted": [names[i] for i in order],
                                      "stage_seconds": stages, "makespan": table},
                                     indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
