"""Time of the Hessian sensitivity seeds: one Hessian-vector product per Rademacher vector
(``probe_batch=1``, the loop ``hwnas run`` used) against the vectors batched into one
double-backward pass (``probe_batch=4``: all four, as the default off the CPU does), on the same
model and images, interleaved.

What ``hwnas run`` computes for its sensitivity seeds (``search.bits.sensitivity_seeds``): the
traces of the largest subnet of a shipped CIFAR-10 supernet (BatchNorm recalibrated) on 128
training images, 4 vectors, chunks of 32 images. The rounds alternate the two settings and the
medians are reported; the traces of both are compared (same vectors: they agree to float
rounding) with their Spearman correlation and the largest relative difference.

    OMP_NUM_THREADS=1 python benchmarks/hessian_batched.py --spaces mbv3 vit --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from hwnas.core.maths import spearman
from hwnas.latency.machine import describe_machine

OUT_JSON = Path(__file__).with_suffix(".json")


def measure(space_name: str, rounds: int, images: int, batches: list[int]) -> list[dict]:
    import torch

    from hwnas.quant.sensitivity import hessian_sensitivity
    from hwnas.supernet.checkpoints import shipped_checkpoint
    from hwnas.supernet.data import load_dataset
    from hwnas.supernet.evaluate import calibration_loader, recalibrated_subnet
    from hwnas.supernet.train import load_checkpoint

    data = load_dataset("cifar10", seed=0)
    space, supernet = load_checkpoint(shipped_checkpoint(space_name, data.classes))[:2]
    model = recalibrated_subnet(supernet, space.largest(), data, seed=0)
    # drawn once: a BatchLoader reshuffles on every pass, and both settings must see the same
    # images for their traces to be comparable
    loader = calibration_loader(data, batch_size=128, seed=0)
    fixed = [next(iter(loader))]
    seconds: dict[int, list[float]] = {b: [] for b in batches}
    traces: dict[int, dict[str, float]] = {}
    for r in range(rounds):
        for b in (batches if r % 2 == 0 else batches[::-1]):
            t0 = time.perf_counter()
            table = hessian_sensitivity(model, fixed, [(4, 8), (8, 8)], max_images=images,
                                        n_samples=4, seed=0, probe_batch=b)
            seconds[b].append(time.perf_counter() - t0)
            traces[b] = table.extra["traces"]
            print(f"{space_name} probe_batch {b}: {seconds[b][-1]:.1f} s", flush=True)
    base = traces[batches[0]]
    names = list(base)
    rows = []
    for b in batches:
        rows.append({"space": space_name, "probe_batch": b, "images": images, "n_samples": 4,
                     "seconds_median": round(statistics.median(seconds[b]), 2),
                     "seconds": [round(s, 2) for s in seconds[b]],
                     "trace_spearman_vs_unbatched": spearman([base[n] for n in names],
                                                             [traces[b][n] for n in names]),
                     "max_rel_trace_diff_vs_unbatched": max(
                         abs(traces[b][n] - base[n]) / max(abs(base[n]), 1e-12) for n in names),
                     "torch_threads": torch.get_num_threads()})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spaces", nargs="+", default=["mbv3", "vit"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    args = ap.parse_args(argv)
    rows = [row for space in args.spaces
            for row in measure(space, args.rounds, args.images, args.batches)]
    print("\n| space | probe batch | median s | rounds s | Spearman vs 1 | max rel. diff vs 1 |")
    print("|---|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['space']} | {r['probe_batch']} | {r['seconds_median']:.1f} | "
              f"{', '.join(f'{s:.1f}' for s in r['seconds'])} | "
              f"{r['trace_spearman_vs_unbatched']:.4f} | {r['max_rel_trace_diff_vs_unbatched']:.1e} |")
    out = {"command": "python " + " ".join([f"benchmarks/{Path(__file__).name}", *sys.argv[1:]]),
           "machine": describe_machine(
               f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "results": rows}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
