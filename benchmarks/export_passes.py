"""The export's verification passes, one after the other against side by side
(:meth:`hwnas.export.passes.ImagePasses.together`), on the models of a run directory
(benchmarks/export_speed.md, Session 34)::

    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=... python benchmarks/export_passes.py RUN_DIR \\
        --select 3,5 --rounds 3 [--json out.json]

For each selected model it builds what the export verifies (the recalibrated float network and
its FP32 file; for a quantized row also PTQ and the ``qdq/`` file with its exact reference,
the fake-quant model with int32 biases) and times, in alternating order per round, the pairs
of passes the export makes over the test images (1000 by default): the file with onnxruntime
(one thread) and the PyTorch model it is compared with, one after the other
(``ImagePasses.onnx`` then ``.torch``, as before) against side by side (``together``); then
the file's pass alone over one session against N (``onnx_sessions``, ``--sessions N``, default
2: what a worker with N cores does when its PyTorch passes run on a GPU); then in chunks of 256 images against 64 (the longest
gap between two yield points is what a timing of another worker waits at most). Every round
checks that both ways give the same logits bit for bit. Prints a table of medians (wall and
this process's CPU seconds; for the passes one after the other, the CPU seconds of each: on
a free second core, side by side takes the larger of the two) and writes JSON (``--json``).
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


def pairs_of(run_dir: Path, select: str, max_images: int) -> tuple[list, object, object]:
    """``[(model name, [(label, file bytes, key, context), ...])]``, the test images and labels: the
    (file, reference) pairs the export verifies for each selected model; ``context()`` gives
    the model to run (the exact reference of a QDQ file exists only inside its context)."""
    import contextlib
    import copy
    import json as _json

    import torch
    from hwnas.export.model_export import ExportSettings
    from hwnas.export.qdq.build import build_qdq, float_proto
    from hwnas.export.run_export import _load_run, _prepare, _selected_rows
    from hwnas.quant.policy import QuantPolicy
    from hwnas.supernet.evaluate import recalibrated_subnet

    cfg = _load_run(run_dir)
    rows = _selected_rows(run_dir, None, select)
    s = ExportSettings()
    ctx = _prepare(run_dir, cfg, s, rows, {}, max_images)
    out = []
    for row in rows:
        arch = ctx.space.from_string(row.arch)
        torch.manual_seed(ctx.seed)
        net = recalibrated_subnet(ctx.supernet, arch, ctx.data, calib_batches=ctx.calib_batches,
                                  seed=ctx.seed, batches=ctx.bn_batches).cpu().eval()
        fp32 = float_proto(net, ctx.test_images[:1], opset=s.opset).SerializeToString()
        pairs = [("fp32 file + float model", fp32, "float",
                  lambda net=net: contextlib.nullcontext(net))]
        if row.policy:
            policy = QuantPolicy.from_dict(_json.loads(row.policy))
            build = build_qdq(copy.deepcopy(net), policy, ctx.ptq_batches, config=ctx.ptq_config,
                              example=ctx.test_images[:1], opset=s.opset, portable=s.portable)
            qdq = build.proto(requantize=False).SerializeToString()
            pairs.append(("qdq file + exact reference", qdq, "deployed",
                          lambda build=build: build.reference(requantize=False)))
        out.append((row.name, pairs))
    return out, ctx.test_images, ctx.test_labels


#: what each mode runs: ImagePasses settings, and whether the PyTorch pass runs too
MODES = {
    "alone": ({"side_by_side": False, "onnx_batch_size": 256}, True),  # as before
    "together": ({"side_by_side": True, "onnx_batch_size": 256}, True),
    "onnx x1": ({"onnx_sessions": 1}, False),
    "onnx x2": ({"onnx_sessions": 2}, False),
    "chunks 256": ({"onnx_batch_size": 256}, False),
    "chunks 64": ({"onnx_batch_size": 64}, False),
}
PAIRS = (("alone", "together"), ("onnx x1", "onnx x2"), ("chunks 256", "chunks 64"))


def add_sessions_mode(n: int) -> tuple[str, str]:
    """The pair "one session against ``n``" (``--sessions N``: what a worker with ``n`` cores
    does, Session 36)."""
    MODES[f"onnx x{n}"] = ({"onnx_sessions": n}, False)
    return ("onnx x1", f"onnx x{n}")


def time_pair(images, labels, data: bytes, key: str, context, mode: str  # noqa: ANN001
              ) -> dict:
    """One mode (:data:`MODES`) on fresh ImagePasses: wall and CPU seconds, the CPU seconds of
    the onnxruntime pass, the longest gap between two yield points (what a timing of another
    worker waits at most) and the logits."""
    from hwnas.core import cooperate
    from hwnas.export.passes import ImagePasses

    kwargs, with_torch = MODES[mode]
    passes = ImagePasses(images, labels, **kwargs)
    marks: list[float] = []
    with context() as model, cooperate.installed(lambda: marks.append(time.perf_counter())):
        wall, cpu = time.perf_counter(), _cpu()
        ort_cpu = float("nan")
        if mode == "together":
            got, want = passes.together("f.onnx", data, key, model)
        else:
            got = passes.onnx("f.onnx", data)
            ort_cpu = _cpu() - cpu
            want = passes.torch(key, model) if with_torch else got
        end = time.perf_counter()
    gaps = np.diff([*marks, end])  # from the first yield point: the sessions are made before
    return {"wall": end - wall, "cpu": _cpu() - cpu, "ort_cpu": ort_cpu,
            "max_gap": float(gaps.max()), "logits": (got, want)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--select", default="all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-images", type=int, default=1000)
    ap.add_argument("--compare", default="all",
                    help="which comparisons: all, or some of together,sessions,chunks")
    ap.add_argument("--sessions", type=int, default=2,
                    help="sessions of the 'sessions' comparison (one against N; default 2)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    names = dict(zip(("together", "sessions", "chunks"), PAIRS))
    names["sessions"] = add_sessions_mode(max(2, args.sessions))
    wanted = list(names) if args.compare == "all" else args.compare.split(",")
    if not set(wanted) <= set(names):
        ap.error(f"--compare {args.compare}: expected all or some of {', '.join(names)}")
    chosen = [names[w] for w in wanted]
    models, images, labels = pairs_of(args.run_dir, args.select, args.max_images)
    rows = []
    for name, pairs in models:
        for label, data, key, context in pairs:
            for modes in chosen:
                runs: dict[str, list] = {m: [] for m in modes}
                for r in range(args.rounds):
                    logits = {}
                    for mode in modes if r % 2 == 0 else modes[::-1]:
                        got = time_pair(images, labels, data, key, context, mode)
                        logits[mode] = got.pop("logits")
                        runs[mode].append(got)
                    a, b = modes
                    if not all(np.array_equal(x, y) for x, y in zip(logits[a], logits[b])):
                        print(f"{name} {label}: logits differ ({a} / {b})", file=sys.stderr)
                        return 1
                    print(f"{name} {label} round {r + 1}: {a} {runs[a][-1]['wall']:.2f} s, "
                          f"{b} {runs[b][-1]['wall']:.2f} s", flush=True)
                row = {"model": name, "pair": label, "modes": list(modes), "images": len(images),
                       "bit_identical": True}
                for mode, got in runs.items():
                    med = {k: round(statistics.median(g[k] for g in got), 3)
                           for k in ("wall", "cpu", "max_gap")}
                    row[mode] = {"wall_s": [round(g["wall"], 3) for g in got],
                                 "cpu_s": [round(g["cpu"], 3) for g in got],
                                 "max_yield_gap_s": [round(g["max_gap"], 3) for g in got],
                                 "wall_median_s": med["wall"], "cpu_median_s": med["cpu"],
                                 "max_yield_gap_median_s": med["max_gap"]}
                    if mode == "alone":  # the two passes' CPU seconds: what a free core overlaps
                        ort = statistics.median(g["ort_cpu"] for g in got)
                        row[mode]["onnx_cpu_median_s"] = round(ort, 3)
                        row[mode]["torch_cpu_median_s"] = round(med["cpu"] - ort, 3)
                rows.append(row)
    head = (f"{'model':<11} {'pair':<28} {'mode a / b':<24} {'a s':>7} {'b s':>7} {'change':>7}"
            f"  longest gap a / b s   CPU s a / b")
    print(head + "\n" + "-" * len(head))
    for r in rows:
        a, b = (r[m] for m in r["modes"])
        wa, wb = a["wall_median_s"], b["wall_median_s"]
        print(f"{r['model']:<11} {r['pair']:<28} {' / '.join(r['modes']):<24} {wa:>7.2f} "
              f"{wb:>7.2f} {100 * (wb / wa - 1):>6.0f}%  {a['max_yield_gap_median_s']:>8.2f} / "
              f"{b['max_yield_gap_median_s']:<8.2f}   {a['cpu_median_s']:.2f} / "
              f"{b['cpu_median_s']:.2f}"
              + (f" (onnxruntime {a['onnx_cpu_median_s']:.2f}, PyTorch "
                 f"{a['torch_cpu_median_s']:.2f})" if "onnx_cpu_median_s" in a else ""))
    if args.json:
        doc = {"command": "python benchmarks/export_passes.py " + " ".join(argv or sys.argv[1:]),
               "torch_threads": torch.get_num_threads(), "cores": os.cpu_count(),
               "load_average": [round(x, 2) for x in os.getloadavg()],
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
