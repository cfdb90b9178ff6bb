"""The export's onnxruntime verification pass of written files over one session against N
(:class:`hwnas.export.passes.ImagePasses` ``onnx_sessions``), interleaved, on the run's test
images (benchmarks/export_speed.md, Session 36)::

    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=... python benchmarks/export_sessions.py RUN_DIR \\
        EXPORT_DIR --files qdq/trial_0001.onnx,trial_0001.onnx --sessions 2 --rounds 2

Each round runs every file's pass once per session count, the order alternating per round,
each on fresh ImagePasses (the sessions are made inside the timed span), and checks that the
logits are the same bit for bit. Prints wall and process CPU seconds per pass (medians) and
the seconds to make the sessions; writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("export_dir", type=Path)
    ap.add_argument("--files", required=True, help="comma-separated paths inside EXPORT_DIR")
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-images", type=int, default=1000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from hwnas.export.model_export import ExportSettings
    from hwnas.export.passes import ImagePasses
    from hwnas.export.run_export import _load_run, _prepare, _selected_rows
    from hwnas.latency.onnx_measure import make_runner

    cfg = _load_run(args.run_dir)
    ctx = _prepare(args.run_dir, cfg, ExportSettings(), _selected_rows(args.run_dir, None, "all"),
                   {}, args.max_images)
    counts = (1, max(2, args.sessions))
    rows = []
    for rel in args.files.split(","):
        data = (args.export_dir / rel).read_bytes()
        t0 = time.perf_counter()
        make_runner(data, runtime="onnxruntime", threads=1)
        make_s = time.perf_counter() - t0
        runs: dict[int, list] = {n: [] for n in counts}
        for r in range(args.rounds):
            logits = {}
            for n in counts if r % 2 == 0 else counts[::-1]:
                passes = ImagePasses(ctx.test_images, ctx.test_labels, onnx_sessions=n)
                wall, cpu = time.perf_counter(), _cpu()
                logits[n] = passes.onnx(rel, data)
                runs[n].append((time.perf_counter() - wall, _cpu() - cpu))
                print(f"{rel} round {r + 1}: {n} session(s) {runs[n][-1][0]:.2f} s wall, "
                      f"{runs[n][-1][1]:.2f} s CPU", flush=True)
            if not np.array_equal(logits[counts[0]], logits[counts[1]]):
                print(f"{rel}: logits differ between 1 and {counts[1]} sessions", file=sys.stderr)
                return 1
        rows.append({"file": rel, "images": len(ctx.test_images), "bit_identical": True,
                     "make_session_s": round(make_s, 3),
                     **{f"sessions_{n}": {"wall_s": [round(w, 3) for w, _ in runs[n]],
                                          "cpu_s": [round(c, 3) for _, c in runs[n]],
                                          "wall_median_s": round(statistics.median(
                                              w for w, _ in runs[n]), 3),
                                          "cpu_median_s": round(statistics.median(
                                              c for _, c in runs[n]), 3)} for n in counts}})
    for row in rows:
        a, b = (row[f"sessions_{n}"] for n in counts)
        print(f"{row['file']}: 1 session {a['wall_median_s']:.2f} s wall / {a['cpu_median_s']:.2f}"
              f" s CPU; {counts[1]} sessions {b['wall_median_s']:.2f} / {b['cpu_median_s']:.2f};"
              f" one session made in {row['make_session_s']:.2f} s; logits identical")
    if args.json:
        doc = {"command": "python benchmarks/export_sessions.py " + " ".join(argv or sys.argv[1:]),
               "cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
