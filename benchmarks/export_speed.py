"""Seconds per exported model: ``hwnas run`` (search, then the export of every front) timed end
to end and per stage.

It runs what ``hwnas run`` runs, through the API: the search (:func:`hwnas.search.run`, from
the same flags) and :func:`hwnas.export.run_export.export_run` on its run directory (FP32 +
QDQ + per-device policy files, every check), and reports the search's and the export's wall
and CPU seconds, the export's seconds per model and, over the models, the median seconds of
each export stage (``recalibrate``, ``fp32``, ``ptq``, ``qdq``, ``choose``, ``device_files``,
``recommend`` ...; ``qdq`` and ``device_files`` include their ``ptq``). A row is added to
``benchmarks/export_speed.json`` (rows of the same dataset, space, device, trials and
machine are replaced) and a table printed::

    python benchmarks/export_speed.py                                   # digits default, here
    python benchmarks/export_speed.py --supernet runs/digits-mbv3-tiny/supernet.pt
    python benchmarks/export_speed.py --space mbv3 --dataset /data/C10.npz --trials 20 \\
        --device cuda                                                   # the GPU machine

Needs what ``hwnas run`` needs (torch, onnx, onnxruntime, Optuna); no network. ``--dataset``
takes what ``hwnas run --dataset`` takes (``digits``, ``cifar10``, a cifar10-jpeg ``.npz``...).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT_JSON = HERE / "export_speed.json"
KEY = ("dataset", "space", "device", "trials", "cpu")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (export workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def machine() -> dict:
    import onnxruntime
    import torch
    from hwnas.latency.machine import cpu_model

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu,
            "python": platform.python_version(), "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def stage_medians(models: list) -> dict[str, float]:
    """Median seconds per stage over the exported models (a stage a model skipped counts 0)."""
    stages = sorted({k for m in models for k in m.info.get("stage_seconds", {})})
    return {k: round(statistics.median(m.info.get("stage_seconds", {}).get(k, 0.0)
                                       for m in models), 3) for k in stages}


def run(args: argparse.Namespace, out_dir: Path) -> dict:
    """The search and the export of one configuration: the result row (wall seconds, and the
    CPU seconds beside them: on a shared machine the wall clock also counts the others)."""
    from hwnas.export.model_export import ExportSettings
    from hwnas.export.run_export import export_run

    from hwnas import search
    from hwnas.cli import build_parser, config_from_args

    argv = ["search", "--space", args.space, "--dataset", args.dataset, "--trials",
            str(args.trials), "--device", args.device, "--out", str(out_dir), "--name", "bench",
            "--quiet"]
    if args.supernet:
        argv += ["--supernet", args.supernet]
    config = config_from_args(build_parser().parse_args(argv))
    here = machine()  # the load average before the run
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = search.run(config, overwrite=True, progress=False, log=lambda *a, **k: None)
    search_s, search_cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    print(f"search: {search_s:.1f} s ({result.run_dir})", flush=True)
    settings = ExportSettings(device=args.device, workers=args.workers)
    wall, cpu = time.perf_counter(), cpu_seconds()
    exported = export_run(result.run_dir, settings=settings, progress=False,
                          report=lambda line: print(line, flush=True),
                          dataset=result.data)  # as hwnas run: the search's data set
    export_s, export_cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    manifest = json.loads((exported.out_dir / "manifest.json").read_text())
    n = len(exported.models)
    per_model = [round(sum(m.info.get("stage_seconds", {}).get(k, 0.0) for k in
                           ("recalibrate", "fp32", "qdq", "int4", "choose", "device_files",
                            "uint8", "recommend")), 3) for m in exported.models]
    return {"dataset": args.dataset, "space": args.space, "device": args.device,
            "trials": args.trials, "supernet": args.supernet or "(the run's: trained or shipped)",
            "cpu": here["cpu"], "machine": here, "models": n, "failed": len(exported.failed),
            "workers": manifest.get("workers"),
            "search_s": round(search_s, 1), "search_cpu_s": round(search_cpu, 1),
            "export_s": round(export_s, 1), "export_cpu_s": round(export_cpu, 1),
            "export_s_per_model": round(export_s / max(n, 1), 2),
            "total_s": round(search_s + export_s, 1),
            "shared_s": {k: round(v, 2) for k, v in manifest.get("shared_seconds", {}).items()},
            # where the export's wall seconds went (prepare, workers_ready, models,
            # timings_alone within models, finish) and the search's (hwnas run prints both)
            "export_stages_s": {k: round(v, 2) for k, v in exported.stages.items()},
            "search_stages_s": {k: round(v, 2) for k, v in result.timings.items()},
            "model_s": per_model, "stage_median_s": stage_medians(exported.models),
            "recommend_rounds": sorted(d.rounds_timed for m in exported.models
                                       for d in m.devices if d.rounds_timed),
            "rounds_asked": settings.rounds}


def table(rows: list[dict]) -> str:
    head = (f"{'dataset':<22} {'device':<6} {'trials':>6} {'models':>6} {'search s':>9} "
            f"{'export s':>9} {'s/model':>8} {'total s':>8}  stage medians (s)")
    lines = [head, "-" * len(head)]
    for r in rows:
        stages = " ".join(f"{k}={v:g}" for k, v in r["stage_median_s"].items())
        lines.append(f"{Path(r['dataset']).name[:22]:<22} {r['device']:<6} {r['trials']:>6} "
                     f"{r['models']:>6} {r['search_s']:>9.1f} {r['export_s']:>9.1f} "
                     f"{r['export_s_per_model']:>8.2f} {r['total_s']:>8.1f}  {stages}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--space", default="mbv3-tiny")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--trials", type=int, default=60)
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--supernet", help="a supernet checkpoint (default: what hwnas run uses)")
    p.add_argument("--workers", type=int, default=0,
                   help="export processes (default 0: one per two cores, at most 8)")
    p.add_argument("--work-dir", help="where the run directory goes (default: a temporary one)")
    p.add_argument("--json", default=str(OUT_JSON), help=f"results file (default {OUT_JSON})")
    args = p.parse_args(argv)
    from hwnas.core.errors import UserError

    try:
        if args.work_dir:
            Path(args.work_dir).mkdir(parents=True, exist_ok=True)
            row = run(args, Path(args.work_dir))
        else:
            with tempfile.TemporaryDirectory(prefix="export_speed-") as tmp:
                row = run(args, Path(tmp))
    except UserError as exc:
        print(f"export_speed: error: {exc}", file=sys.stderr)
        return 2
    path = Path(args.json)
    doc = json.loads(path.read_text()) if path.exists() else {"results": []}
    doc["results"] = [r for r in doc.get("results", [])
                      if tuple(r.get(k) for k in KEY) != tuple(row.get(k) for k in KEY)] + [row]
    doc.update(command="python benchmarks/export_speed.py " + shlex.join(sys.argv[1:] if argv is None else argv),
               machine=row["machine"],
               date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    from hwnas.core.io import write_json

    write_json(path, doc)
    print(table(doc["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
