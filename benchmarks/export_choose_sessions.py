"""Seconds of the int8/float choice (``choose``, the part of an export that holds the machine
alone) with one onnxruntime session per model for all its timings, against a new session per
timing as before Session 31 (benchmarks/export_speed.md)::

    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=... python benchmarks/export_choose_sessions.py RUN_DIR \\
        [--arch largest] [--rounds 3]

The subnet (``smallest``, ``largest``, ``sample:SEED`` or an arch string) under a uniform int8
policy is quantized once; then the choice for ``cpu-ort-1t`` runs ``--rounds`` times each way,
interleaved ("after" is given the FP32 session, as the export gives it the FP32 file's
verification session). Prints the seconds and the timing sessions each way made.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--arch", default="largest")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    import torch
    import hwnas.export.device_policy as dp
    import hwnas.latency.onnx_measure as om
    from hwnas.export.model_export import ExportSettings, _choose
    from hwnas.export.qdq import build_qdq, float_proto
    from hwnas.export.run_export import _load_run, _prepare
    from hwnas.latency.devices import MeasuredDevice
    from hwnas.quant.policy import uniform
    from hwnas.supernet.evaluate import recalibrated_subnet

    torch.set_num_threads(1)
    s = ExportSettings()
    ctx = _prepare(args.run_dir, _load_run(args.run_dir), s, [], {}, 1000)
    from export_one_model import parse_arch  # this folder's

    arch = parse_arch(ctx.space, args.arch)
    net = recalibrated_subnet(ctx.supernet, arch, ctx.data, calib_batches=ctx.calib_batches,
                              seed=ctx.seed, batches=ctx.bn_batches).eval()
    build = build_qdq(net, uniform(net, 8, 8), ctx.ptq_batches, config=ctx.ptq_config,
                      example=ctx.test_images[:1], opset=s.opset)
    fp32 = float_proto(net, ctx.test_images[:1], opset=s.opset)
    device = MeasuredDevice("cpu-ort-1t", threads=1)

    made = [0]
    real_make, real_rounds = om.make_runner, dp.time_rounds

    def counting(*a, **k):  # noqa: ANN002, ANN003, ANN202
        made[0] += 1
        return real_make(*a, **k)

    def fresh_each_time(models, **kw):  # noqa: ANN001, ANN003, ANN202 - before: no reuse
        kw.pop("runners", None)
        return real_rounds(models, **kw)
    om.make_runner = counting
    times: dict[str, list[float]] = {"before": [], "after": []}
    sessions: dict[str, int] = {}
    for i in range(args.rounds):
        for which in (("before", "after") if i % 2 == 0 else ("after", "before")):
            dp.time_rounds = fresh_each_time if which == "before" else real_rounds
            # after: the FP32 file's verification session exists before the choice (the export
            # passes it); before, the choice made its own
            preset = ({"fp32": real_make(fp32.SerializeToString(), threads=1)}
                      if which == "after" else None)
            made[0] = 0
            t0 = time.perf_counter()
            _choose(build, fp32, device, s, False, preset)
            times[which].append(time.perf_counter() - t0)
            sessions[which] = made[0]
    for which, t in times.items():
        print(f"{which:>6}: median {statistics.median(t):.2f} s ({' '.join(f'{x:.2f}' for x in t)}), "
              f"{sessions[which]} timing sessions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
