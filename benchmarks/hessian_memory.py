"""Peak memory and time of the Hessian sensitivity (HAWQ-V2 traces) by chunk size.

What ``hwnas run`` computes for its sensitivity seeds (``search.bits.sensitivity_seeds``): the
traces of the largest subnet of a shipped CIFAR-10 supernet (BatchNorm recalibrated) on 128
training images, 4 Hutchinson vectors. Each chunk size runs in a fresh process, so its peak
resident memory (``ru_maxrss``) is its own; the traces of every chunk size are compared with
those of one chunk of all images (they should agree to float rounding).

    OMP_NUM_THREADS=1 python benchmarks/hessian_memory.py --spaces mbv3 vit --chunks 128 32 16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from hwnas.latency.machine import describe_machine

OUT_JSON = Path(__file__).with_suffix(".json")


def one(space_name: str, chunk: int, images: int) -> dict:
    """Run in this process: load, recalibrate, compute the traces; return what was measured."""
    import torch

    from hwnas.quant.sensitivity import hessian_sensitivity
    from hwnas.supernet.checkpoints import shipped_checkpoint
    from hwnas.supernet.data import load_dataset
    from hwnas.supernet.evaluate import calibration_loader, recalibrated_subnet
    from hwnas.supernet.train import load_checkpoint

    data = load_dataset("cifar10", seed=0)
    path = shipped_checkpoint(space_name, data.classes)
    space, supernet = load_checkpoint(path)[:2]
    model = recalibrated_subnet(supernet, space.largest(), data, seed=0).cpu()
    loader = calibration_loader(data, batch_size=128, seed=0)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    table = hessian_sensitivity(model, loader, [(4, 8), (8, 8)], max_images=images, n_samples=4,
                                seed=0, chunk=chunk)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"space": space_name, "chunk": chunk, "images": images, "seconds": round(seconds, 2),
            "peak_rss_mb": round(peak), "rss_before_mb": round(base),
            "traces": {k: float(v) for k, v in table.extra["traces"].items()},
            "torch_threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spaces", nargs="+", default=["mbv3", "vit"])
    ap.add_argument("--chunks", nargs="+", type=int, default=[128, 32, 16])
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    ap.add_argument("--one", nargs=2, metavar=("SPACE", "CHUNK"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.images)))
        return 0
    rows = []
    for space in args.spaces:
        for chunk in args.chunks:
            proc = subprocess.run([sys.executable, __file__, "--one", space, str(chunk),
                                   "--images", str(args.images)], capture_output=True, text=True,
                                  check=False)
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{space:5s} chunk {chunk:4d}: {r['seconds']:7.1f} s, peak RSS "
                  f"{r['peak_rss_mb']:6d} MB (peak before the traces {r['rss_before_mb']} MB)",
                  flush=True)
    for r in rows:  # agreement with one chunk of all images
        ref = next((q for q in rows
                    if q["space"] == r["space"] and q["chunk"] >= args.images), None)
        if ref is not None:
            r["max_rel_diff_vs_one_chunk"] = max(
                abs(r["traces"][k] - ref["traces"][k]) / max(abs(ref["traces"][k]), 1e-12)
                for k in ref["traces"])
    print("\n| space | chunk | seconds | peak RSS MB | max rel. trace diff vs one chunk |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['space']} | {r['chunk']} | {r['seconds']:.1f} | {r['peak_rss_mb']} | "
              f"{r.get('max_rel_diff_vs_one_chunk', float('nan')):.1e} |")
    out = {"command": "python " + " ".join([f"benchmarks/{Path(__file__).name}", *sys.argv[1:]]),
           "machine": describe_machine(
               f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "results": [{k: v for k, v in r.items() if k != "traces"} for r in rows]}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
