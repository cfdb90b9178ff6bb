"""Where onnxruntime's time goes, per op type, in the FP32 and the all-int8 export of the mbv3
CIFAR-10 subnets: the evidence behind the per-layer int8/float choice of export/device_policy.py.

For each subnet (largest, middle, smallest of the shipped supernet), batch and thread count it
profiles with onnxruntime's profiler (:func:`hwnas.export.ort_profile.profile_model`) the FP32 graph and
the QDQ graph with every layer int8, and sums the kernel time per op type of the graph
onnxruntime runs (after its fusions): how much the integer convs gain over the float ones, and
how much the Quantize/Dequantize, layout and float-activation nodes that int8 brings cost back.
Calibration uses random images: only the timings matter here.

Needs only torch, onnx, onnxruntime and numpy, so it runs on a GPU machine's host CPU too::

    python benchmarks/export_ort_ops.py --batches 32 --threads 1,8
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent

import torch  # noqa: E402
from export_ort import (  # noqa: E402
    ROLES,
    check_models,
    command_line,
    integer_dot_product,
    load_mbv3,
    parse_list,
    run_script,
    subnet_archs,
)
from hwnas.export.ort_profile import profile_model  # noqa: E402
from hwnas.export.qdq import build_qdq, float_proto  # noqa: E402
from hwnas.latency.machine import cpu_model  # noqa: E402
from hwnas.quant.policy import uniform  # noqa: E402
from hwnas.quant.ptq import PTQConfig  # noqa: E402

from hwnas.core.io import write_atomic  # noqa: E402


def op_times(model: bytes, *, batch: int, threads: int, runs: int) -> dict:
    """Profiled wall time and per-op-type kernel time (ms) and node count of one model."""
    prof = profile_model(model, batch=batch, threads=threads, runs=runs)
    op_of = {n.name: n.op_type for n in prof.optimized.graph.node}
    ms: Counter = Counter()
    count: Counter = Counter()
    for name, t in prof.node_ms.items():
        ms[op_of.get(name, "other")] += t
        count[op_of.get(name, "other")] += 1
    return {"wall_ms": prof.wall_ms, "kernel_ms": prof.total_ms,
            "ops": {op: {"ms": round(ms[op], 4), "nodes": count[op]} for op, _ in ms.most_common()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ROLES))
    p.add_argument("--batches", default="32")
    p.add_argument("--threads", default="1")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--checkpoint")
    p.add_argument("--out", default=str(HERE / "export_ort_ops.json"))
    args = p.parse_args(argv)
    import onnxruntime as ort

    roles = check_models([r for r in args.models.split(",") if r])
    batches = parse_list("--batches", args.batches)
    threads = parse_list("--threads", args.threads)
    vnni, flags = integer_dot_product()
    machine = (f"{cpu_model()}, {os.cpu_count()} logical CPUs, onnxruntime {ort.__version__}, "
               f"integer dot product: {'yes' if vnni else 'no'} ({' '.join(flags) or 'none'})")
    print(f"# {machine}", flush=True)
    _, space, supernet, _ = load_mbv3(args.checkpoint)
    calib = [torch.randn(128, 3, 32, 32, generator=torch.Generator().manual_seed(0))]
    rows = []
    for role in roles:
        model = supernet.extract(subnet_archs(space)[role]).eval()
        example = calib[0][:1]
        build = build_qdq(model, uniform(model, 8, 8), calib,
                          config=PTQConfig(max_images=128), example=example)
        graphs = {"fp32": float_proto(model, example).SerializeToString(),
                  "int8": build.proto().SerializeToString()}
        for batch in batches:
            for t in threads:
                row = {"model": role, "batch": batch, "threads": t,
                       **{kind: op_times(g, batch=batch, threads=t, runs=args.runs)
                          for kind, g in graphs.items()}}
                rows.append(row)
                print(f"\n{role} batch {batch} threads {t}: wall fp32 {row['fp32']['wall_ms']:.2f}"
                      f" ms, int8 {row['int8']['wall_ms']:.2f} ms")
                for kind in graphs:
                    ops = row[kind]["ops"]
                    print(f"  {kind:5s} " + "  ".join(f"{op} {v['ms']:.2f} ({v['nodes']})"
                                                      for op, v in ops.items()))
    doc = {"command": command_line(argv),
           "machine": machine, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "results": rows}
    write_atomic(args.out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_script(main, "export_ort_ops")
