"""Paired timing of a W4A8 AdaRound PTQ with and without the retained heap
(``hwnas.core.heap``; ``HWNAS_RETAIN_HEAP=0`` turns it off), the files compared by hash
(benchmarks/adaround_steps.md, Session 32)::

    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=... python benchmarks/ptq_heap_ab.py \\
        [--subnet middle] [--steps 50] [--pairs 2] [--out benchmarks/results/ptq_heap_ab.json]

Each pair quantizes the same float subnet (``quant_peers.float_subnet``, 512 calibration
images) once with the heap retained and once without, in alternating order, each in a fresh
process; user and system CPU seconds and minor page faults of the quantization (PTQ and the
QDQ graph it is written to: :func:`quant_peers.hwnas_file`, data loading excluded) come from
the child's ``getrusage`` around that call; peak memory is the whole child's. Prints medians,
writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_CHILD = """
import hashlib, json, resource, sys, time
import torch
sys.path.insert(0, {here!r})
import quant_peers as peers
torch.set_num_threads(1)
data, arch, net, calib, normalise = peers.cifar10_subnet({checkpoint!r}, {subnet!r})
r0 = resource.getrusage(resource.RUSAGE_SELF); w = time.time()
proto = peers.hwnas_file(net, calib, "hwnas_w4a8_adaround", {steps})
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
                  "minor_faults": r1.ru_minflt - r0.ru_minflt, "wall_s": time.time() - w,
                  "peak_rss_mb": r1.ru_maxrss / 1024,
                  "sha256": hashlib.sha256(proto.SerializeToString()).hexdigest()}}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=str(HERE.parent / "supernet/checkpoints/mbv3_cifar10.pt"))
    p.add_argument("--subnet", default="middle", choices=("smallest", "middle", "largest"))
    p.add_argument("--steps", type=int, default=50, help="AdaRound steps per layer")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--out", default=str(HERE / "results" / "ptq_heap_ab.json"))
    return p.parse_args(argv)


def run_one(args: argparse.Namespace, retain: bool) -> dict:
    code = _CHILD.format(here=str(HERE), checkpoint=args.checkpoint, subnet=args.subnet,
                         steps=args.steps)
    env = dict(os.environ, HWNAS_RETAIN_HEAP="1" if retain else "0")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                         text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    row["retained_heap"] = retain
    return row


def main(argv: list[str] | None = None) -> int:
    from hwnas.latency.machine import describe_machine
    import datetime as _dt

    args = parse_args(argv)
    rows = []
    for pair in range(args.pairs):
        for retain in ((False, True) if pair % 2 == 0 else (True, False)):
            row = run_one(args, retain) | {"pair": pair}
            rows.append(row)
            print(f"pair {pair} retained={retain}: user {row['user_s']:.1f} s, sys "
                  f"{row['sys_s']:.1f} s, faults {row['minor_faults']:,}", flush=True)
    summary = {}
    print(f"\n{'retained heap':<14} {'user s':>8} {'sys s':>8} {'CPU s':>8} {'faults':>12} "
          f"{'peak MB':>8}")
    for retain in (False, True):
        sel = [r for r in rows if r["retained_heap"] == retain]
        med = {k: statistics.median(r[k] for r in sel)
               for k in ("user_s", "sys_s", "minor_faults", "peak_rss_mb", "wall_s")}
        med["cpu_s"] = statistics.median(r["user_s"] + r["sys_s"] for r in sel)
        summary["on" if retain else "off"] = med
        print(f"{'on' if retain else 'off':<14} {med['user_s']:>8.1f} {med['sys_s']:>8.1f} "
              f"{med['cpu_s']:>8.1f} {med['minor_faults']:>12,.0f} {med['peak_rss_mb']:>8.0f}")
    same = len({r["sha256"] for r in rows}) == 1
    print(f"files identical in every run: {same}")
    result = {"command": "python benchmarks/ptq_heap_ab.py " + " ".join(sys.argv[1:] if argv is None
                                                                       else argv),
              "machine": describe_machine(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
              "subnet": args.subnet, "adaround_steps": args.steps, "pairs": args.pairs,
              "medians": summary, "files_identical": same, "results": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
