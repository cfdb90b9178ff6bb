"""Seconds per stage of one model's export (FP32 + QDQ + per-device file, every check), with
its wall and CPU seconds: the subnet ``smallest``, ``largest``, ``sample:SEED`` or an arch string
of a run's space, under a uniform int8 policy, exported as ``hwnas export`` exports a row::

    HWNAS_SHARED_DATA=... python benchmarks/export_one_model.py RUN_DIR sample:3 [--profile F]

``RUN_DIR``: a search run directory (its config.json and supernet.pt; no trial needed).
``--profile F``: also write a cProfile of the export to ``F``. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def parse_arch(space, text: str):  # noqa: ANN001, ANN201
    """``smallest``, ``largest``, ``sample:SEED`` or an arch string of ``space``."""
    import numpy as np

    if text in ("smallest", "largest"):
        return getattr(space, text)()
    if text.startswith("sample:"):
        return space.sample(np.random.default_rng(int(text.split(":", 1)[1])))
    return space.from_string(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("arch", help="smallest | largest | sample:SEED | an arch string")
    ap.add_argument("--device", default="cpu", help="ExportSettings.device (default cpu)")
    ap.add_argument("--profile", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch
    import hwnas.export.device_policy  # noqa: F401 - everything the export runs, loaded now
    import hwnas.export.qdq.build  # noqa: F401
    import hwnas.export.recommend  # noqa: F401
    from hwnas.export.model_export import ExportSettings
    from hwnas.export.run_export import ModelRow, _export_row, _load_run, _prepare
    from hwnas.quant.policy import uniform
    from hwnas.supernet.evaluate import recalibrated_subnet

    from hwnas.core.errors import UserError

    torch.set_num_threads(1)  # as one export worker
    try:
        settings = ExportSettings(workers=1, device=args.device)
        ctx = _prepare(args.run_dir, _load_run(args.run_dir), settings, [], {}, 1000,
                       torch_device=args.device)
        space = ctx.space
        arch = parse_arch(space, args.arch)
        net = recalibrated_subnet(ctx.supernet, arch, ctx.data, calib_batches=ctx.calib_batches,
                                  seed=ctx.seed, batches=ctx.bn_batches)
        policy = json.dumps(uniform(net, 8, 8).to_dict())
        row = ModelRow(trial=0, arch=space.to_string(arch), policy=policy, accuracy=None,
                       predicted={})
        with tempfile.TemporaryDirectory() as out:
            c0, t0 = cpu_seconds(), time.perf_counter()
            prof = cProfile.Profile() if args.profile else None
            if prof:
                prof.enable()
            result = _export_row(ctx, row, Path(out), 0, 1, False)
            if prof:
                prof.disable()
                prof.dump_stats(str(args.profile))
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    except UserError as exc:
        print(f"export_one_model: error: {exc}", file=sys.stderr)
        return 2
    files = {f.path.split("/")[0] if "/" in f.path else "fp32":
             {"status": f.status, "agreement": f.top1_agreement,
              "test_accuracy": f.test_accuracy, "max_abs_diff": f.max_abs_diff}
             for f in result.files}
    print(json.dumps({"arch": row.arch, "status": result.status, "wall_s": round(wall, 2),
                      "cpu_s": round(cpu, 2),
                      "stage_seconds": {k: round(v, 2)
                                        for k, v in result.info["stage_seconds"].items()},
                      "files": files}))
    return 0 if result.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
