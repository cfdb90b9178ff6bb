"""Host-side cost of one supernet training step on the CPU, where compute is made small
(digits' 8x8 images, batch 2) so that per-step host work shows: milliseconds per sandwich step,
host reads per step (``.item()`` and friends: each a synchronisation on CUDA) and aten operator
calls per step (each a kernel launch or more on a GPU). Findings: ``train_step_overhead.md``.

    OMP_NUM_THREADS=1 python benchmarks/train_step_overhead.py [--spaces mbv3 fbnet vit cct]
        [--batch 2] [--steps 12] [--json benchmarks/train_step_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

import torch
from torch.profiler import ProfilerActivity, profile

import hwnas.supernet.train as train_mod
from hwnas.supernet import TrainOptions, get_space, load_dataset, sandwich_config, train_supernet
from hwnas.supernet.host_sync import count_host_syncs


def measure(space_name: str, batch: int, steps: int, warmup: int = 2) -> dict:
    """Train ``steps`` sandwich steps on digits; time each ``_Loop._step`` and count the host
    reads of the steps after ``warmup`` and the aten calls of one profiled step."""
    data = load_dataset("digits", seed=0)
    space = get_space(space_name, in_channels=data.in_channels, image_size=data.image_size[0],
                      num_classes=data.num_classes)
    torch.manual_seed(0)
    supernet = space.build_supernet()
    times: list[float] = []
    syncs: list[int] = []
    ops: list[int] = []
    original = train_mod._Loop._step

    def timed(self, *args):
        i = len(times)
        if i == warmup:  # one profiled step (not timed)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                original(self, *args)
            ops.append(sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")))
        with count_host_syncs() as counts:
            start = time.perf_counter()
            lr = original(self, *args)
            times.append(time.perf_counter() - start)
        syncs.append(sum(counts.values()))
        return lr

    train_mod._Loop._step = timed
    try:
        train_supernet(supernet, space, data, sandwich_config(epochs=1, batch_size=batch),
                       TrainOptions(progress=False, max_steps=steps + 1))
    finally:
        train_mod._Loop._step = original
    kept = times[warmup:]
    return {"space": space_name, "batch": batch, "steps": len(kept),
            "params_m": round(sum(p.numel() for p in supernet.parameters()) / 1e6, 2),
            "step_ms_median": round(1000 * statistics.median(kept), 1),
            "step_ms_min": round(1000 * min(kept), 1),
            "host_syncs_per_step_max": max(syncs[warmup:]),
            "aten_calls_per_step": ops[0] if ops else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", nargs="+", default=["mbv3", "fbnet", "vit", "cct"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--json", default="benchmarks/train_step_overhead.json")
    args = ap.parse_args(argv)
    rows = [measure(s, args.batch, args.steps) for s in args.spaces]
    cols = ["space", "batch", "params_m", "step_ms_median", "step_ms_min",
            "host_syncs_per_step_max", "aten_calls_per_step"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    out = {"command": "python " + " ".join(sys.argv),
           "machine": f"{platform.processor() or platform.machine()}, "
                      f"{torch.get_num_threads()} torch threads, CPU only",
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
           "torch": torch.__version__, "results": rows}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
