"""Seconds an export spends before its first model, with and without the run's data set in
memory (benchmarks/export_speed.md, Session 31)::

    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=... python benchmarks/export_prepare_time.py RUN_DIR \\
        [--rounds 3] [--json out.json]

Per round, interleaved: ``load``: the export's preparation reading and decoding the data set
itself (what ``hwnas run``'s export and, before Session 31, every parallel worker did);
``given``: the same preparation handed the data set ``hwnas run``'s search already loaded;
``worker``: what a parallel worker does now (receive the pickled batches, load the supernet).
Prints the medians and writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch
    from hwnas.export.model_export import ExportSettings
    from hwnas.export.run_export import _for_worker, _load_run, _prepare
    from hwnas.search.replay import load_run_supernet
    from hwnas.search.rundir import RunDir
    from hwnas.supernet.data.sources import load_dataset

    torch.set_num_threads(1)
    cfg = _load_run(args.run_dir)
    settings = ExportSettings()
    dataset = load_dataset(cfg.dataset, seed=cfg.data_seed)  # the search's, in hwnas run
    times: dict[str, list[float]] = {"load": [], "given": [], "worker": []}
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        _prepare(args.run_dir, cfg, settings, [], {}, 1000)
        times["load"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ctx = _prepare(args.run_dir, cfg, settings, [], {}, 1000, dataset=dataset)
        times["given"].append(time.perf_counter() - t0)
        blob = pickle.dumps(_for_worker(ctx))
        t0 = time.perf_counter()
        shipped = pickle.loads(blob)
        load_run_supernet(RunDir(args.run_dir), shipped.cfg, device=settings.device)
        times["worker"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'':>8} {'median s':>9}  rounds")
    for k, v in times.items():
        print(f"{k:>8} {med[k]:9.2f}  " + " ".join(f"{t:.2f}" for t in v))
    print(f"shipped to each worker: {len(blob) / 1e6:.1f} MB")
    if args.json:
        from export_speed import machine  # this folder's: CPU, cores, GPU, versions, load

        doc = {"command": " ".join(sys.argv), "run_dir": str(args.run_dir), "dataset": cfg.dataset,
               "median_s": med, "rounds_s": times, "shipped_mb": len(blob) / 1e6,
               "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
