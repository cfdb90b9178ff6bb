"""Meta-training set and shipped meta predictors of the MobileNetV3 spaces (no public latency).

``mbv3-tiny`` (the digits default, input 1x8x8) and ``mbv3`` (CIFAR, 3x32x32) have no published
latency tables, so this script builds one here and meta-trains :class:`MetaPredictor` on it:

1. Sample ``N`` architectures per space (seeded; the smallest and the largest included).
2. Latency of each on every device we have:

   * measured: each subnet extracted from a freshly initialised supernet (eval mode; weights do
     not change latency), exported to ONNX once and timed with onnxruntime on this CPU with 1
     thread (``cpu-ort-1t``) and with 2 threads (``cpu-ort-2t``), interleaved per architecture
     so that drift of the shared machine hits both alike (median of ``repeats`` after
     ``warmup``);
   * estimated: every registered estimator of :mod:`hwnas.latency.estimators` on the layer list;
   * synthetic: the same estimators with varied parameters (clock, DSP count, bandwidth,
     efficiency, overheads, on-chip cache) - further plausible devices that widen the set of
     "hardware" the prior learns from (:func:`synthetic_estimators`).

   The table is written to ``benchmarks/results/latency_mbv3/<space>.csv`` (arch + one column
   per device); ``--from-csv`` reuses it instead of measuring again.
   * GPU (``--measure-gpu``, run on a machine with a CUDA GPU; needs only torch): the same
     architectures timed with PyTorch (fp32, CUDA events, median of ``repeats``) at batch 1 and
     64, eager (``<gpu>-torch-b1``/``-b64``, e.g. ``h200-torch-b1``: launch-bound, host noise
     included) and as a replayed CUDA graph (``<gpu>-graph-b1``/``-b64``: the GPU's own time),
     written to ``<space>_gpu.csv``. A later ``--from-csv`` run adds those columns to
     ``<space>.csv``.
     onnxruntime's CUDA provider is measured too where the installed onnxruntime has it
     (``<gpu>-ort-b1``/``-b64``).
3. Held-out check (HELP's few-shot protocol, scored with ``benchmarks/latency_fewshot.py``'s own
   functions): meta-train on every device except ``cpu-ort-2t``, adapt on 2/5/10/20
   measurements of ``cpu-ort-2t``, Spearman over all sampled architectures, 5 seeds, every
   predictor (FLOPs, layer table, MLP, meta on its reference architectures, meta on random
   ones). A harder variant also holds out every measured device (meta-training on estimators
   only); with GPU columns, a third holds out the GPU at batch 64.
4. Meta-train on every device (the held-out one included) and save the shipped predictor to
   :func:`hwnas.latency.predictors.pretrained_path` (``latency/data/<space>_meta.npz``).

Writes ``benchmarks/latency_metatrain_mbv3.json``. About 1.5 minutes on 2 CPU cores.

Any space from measured tables (``--tables``, the ``vit`` transformer above all): instead of
step 2's measurements here, the architectures measured on every device of the given tables of
``benchmarks/measure_latency_tables.py`` (``<space>_<tag>.csv.gz``, e.g. ``vit_xeon`` and
``vit_h200``) with all their device columns, plus the estimators and synthetic devices; steps
3 and 4 as above, the held-out device given by ``--held-out`` (default: the first onnxruntime
column); ``--held-out-tables`` adds the check on every device of another machine's tables,
meta-trained on none of them. Eager PyTorch on a GPU (``-torch-b<batch>``) is kept in the
table but not meta-trained on (:func:`untrained`).

    python benchmarks/latency_metatrain_mbv3.py            # measure, score, ship
    python benchmarks/latency_metatrain_mbv3.py --from-csv # reuse the measured tables
    python benchmarks/latency_metatrain_mbv3.py --measure-gpu   # on the GPU machine
    python benchmarks/latency_metatrain_mbv3.py --spaces vit \
        --tables latency/data/tables/vit_vm.csv.gz \
        latency/data/tables/vit_h200.csv.gz        # a vit predictor from tables
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import os
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import latency_fewshot as shared
    import latency_lofo as lofo
except ModuleNotFoundError:
    from benchmarks import latency_fewshot as shared
    from benchmarks import latency_lofo as lofo
(Task, evaluate, machine, print_tables, to_rows, write_json) = (
    shared.Task, shared.evaluate, shared.machine, shared.print_tables, shared.to_rows,
    shared.write_json)
REPO = Path(__file__).resolve().parent.parent

from hwnas.latency.estimators import available_estimators, get_estimator  # noqa: E402
from hwnas.latency.estimators.edgetpu import (  # noqa: E402
    PCIE_ACCELERATOR,
    USB_ACCELERATOR,
    EdgeTPUEstimator,
)
from hwnas.latency.estimators.fpga import PYNQ_Z2, ZC706, ZCU102, FPGAEstimator  # noqa: E402
from hwnas.latency.estimators.roofline import (  # noqa: E402
    JETSON_ORIN_NANO,
    PIXEL3_CPU,
    RASPI4,
    RooflineEstimator,
)
from hwnas.latency.predictors import MetaPredictor, load_pretrained, pretrained_path  # noqa: E402
from hwnas.latency.tables import LatencyTable, load_latency_table  # noqa: E402
from hwnas.supernet.spaces import get_space  # noqa: E402

OUT_JSON = Path(__file__).with_suffix(".json")
RESULTS_DIR = REPO / "benchmarks" / "results" / "latency_mbv3"
MEASURED = ("cpu-ort-1t", "cpu-ort-2t")
HELD_OUT = "cpu-ort-2t"
PREDICTORS = ["flops", "lut", "mlp", "meta", "meta[random]"]
#: space -> (architectures, onnxruntime repeats)
DEFAULTS = {"mbv3-tiny": (300, 30), "mbv3": (150, 20)}
#: spaces meta-trained only from measured tables (``--tables``)
TABLE_SPACES = ("vit",)
#: few-shot sample sizes of the held-out check
FEW_SHOT_NS = [2, 5, 10, 20]


def synthetic_estimators() -> list[Any]:
    """Estimators with varied parameters: plausible devices no preset describes (what is varied
    is in the name). They only widen meta-training; none claims to be a real board."""
    return [
        FPGAEstimator(replace(ZCU102, name="syn-fpga-dsp600", dsp=600, clock_mhz=250.0),
                      "syn-fpga-dsp600-250mhz"),
        FPGAEstimator(replace(ZC706, name="syn-fpga-seq", mode="sequential", ddr_gbs=2.0),
                      "syn-fpga-seq-ddr2"),
        FPGAEstimator(replace(PYNQ_Z2, name="syn-fpga-tiny", dsp=90, clock_mhz=150.0,
                              bram36=60), "syn-fpga-dsp90-bram60"),
        EdgeTPUEstimator(replace(USB_ACCELERATOR, name="syn-tpu-small", rows=32, cols=32,
                                 param_cache_mib=2.0, link_gbs=0.1), "syn-tpu-32x32-2mib"),
        EdgeTPUEstimator(replace(PCIE_ACCELERATOR, name="syn-tpu-fast", clock_mhz=960.0,
                                 layer_overhead_us=0.5, invoke_overhead_ms=0.02),
                         "syn-tpu-960mhz-lowoverhead"),
        RooflineEstimator(replace(JETSON_ORIN_NANO, name="syn-gpu-launch", layer_overhead_us=40.0,
                                  mem_gbs=25.0), "syn-gpu-launchbound"),
        RooflineEstimator(replace(PIXEL3_CPU, name="syn-cpu-dwslow",
                                  efficiency={**PIXEL3_CPU.efficiency, "depthwise": 0.05,
                                              "pointwise": 0.8}, mem_gbs=3.0),
                          "syn-cpu-dwslow-mem3"),
        RooflineEstimator(replace(RASPI4, name="syn-mcu", peak_gops={32: 2.0, 16: 4.0, 8: 8.0},
                                  mem_gbs=0.5, layer_overhead_us=50.0, saturation_outputs=8),
                          "syn-mcu-2gflops"),
    ]


def sample_archs(space: Any, n: int, seed: int) -> list[str]:
    """``n`` distinct canonical strings: the smallest, the largest, then seeded samples."""
    rng = np.random.default_rng(seed)
    out = [space.to_string(space.smallest()), space.to_string(space.largest())]
    seen = set(out)
    tries = 0
    while len(out) < n and tries < 100 * n:
        tries += 1
        s = space.to_string(space.sample(rng))
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def measure(space: Any, archs: list[str], repeats: int, warmup: int) -> dict[str, np.ndarray]:
    """onnxruntime CPU latency (median ms) with 1 and 2 threads, interleaved per architecture."""
    import torch
    from hwnas.export.onnx_export import onnx_bytes
    from hwnas.latency.onnx_measure import measure_onnx
    from tqdm import tqdm

    torch.manual_seed(0)
    supernet = space.build_supernet().eval()
    example = torch.zeros(1, *space.input_shape)
    out = {d: np.empty(len(archs)) for d in MEASURED}
    for i, a in enumerate(tqdm(archs, desc=f"measure {space.name}", leave=False)):
        model = supernet.extract(space.from_string(a)).eval()
        blob = onnx_bytes(model, example)
        for d, threads in zip(MEASURED, (1, 2)):
            out[d][i] = measure_onnx(blob, threads=threads, warmup=warmup,
                                     repeats=repeats).median_ms
    return out


def estimate(space: Any, archs: list[str]) -> dict[str, np.ndarray]:
    """Every registered estimator and every synthetic one on the layer lists."""
    nets = [space.layers(space.from_string(a)) for a in archs]
    ests = [get_estimator(n) for n in available_estimators()] + synthetic_estimators()
    return {e.name: np.asarray(e.estimate_many(nets), dtype=np.float64) for e in ests}


def write_csv(path: Path, archs: list[str], table: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arch", *table])
        for i, a in enumerate(archs):
            w.writerow([a, *(f"{table[d][i]:.6g}" for d in table)])
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def metas_for(space: Any, table: LatencyTable, devices: list[str], seeds: int) -> list:
    return [MetaPredictor(space).meta_fit(space, table.archs, table.columns(devices), seed=s)
            for s in range(seeds)]


def gpu_columns(space: Any, archs: list[str], repeats: int, warmup: int
                ) -> dict[str, np.ndarray]:
    """PyTorch CUDA latency (median ms) of ``archs`` at batch 1 and 64 on this machine's GPU
    (and onnxruntime CUDA where available), interleaved per architecture."""
    import torch
    from hwnas.latency.devices.measured import MeasuredDevice, _ort_cuda_available
    from tqdm import tqdm

    if not torch.cuda.is_available():
        raise SystemExit("--measure-gpu: torch sees no CUDA GPU here")
    gpu = torch.cuda.get_device_name(0).split()[-1].lower()
    torch.manual_seed(0)
    supernet = space.build_supernet().eval()  # one for all devices (weights do not matter)
    common = dict(threads=1, repeats=repeats, warmup=warmup,
                  model_fn=lambda arch: supernet.extract(arch).eval())
    devices = [MeasuredDevice(f"{gpu}-{kind}-b{b}", provider="cuda-torch", batch=b,
                              cuda_graph=kind == "graph", **common)
               for kind in ("torch", "graph") for b in (1, 64)]
    if _ort_cuda_available():
        devices += [MeasuredDevice(f"{gpu}-ort-b{b}", provider="cuda-ort", batch=b, **common)
                    for b in (1, 64)]
    out = {d.name: np.empty(len(archs)) for d in devices}
    for i, a in enumerate(tqdm(archs, desc=f"gpu {space.name}", leave=False)):
        for d in devices:
            out[d.name][i] = d.latency(space, [a])[0]
    return out


def untrained(gpu: list[str]) -> list[str]:
    """GPU columns kept in the table but not meta-trained on: eager PyTorch (``-torch-b<n>``; a
    CPU's eager PyTorch, ``-torch-<n>t``, is trained on). Its
    times are the host's kernel-launch path, not the GPU: on the H200 batch 1 and batch 64 take
    the same time (mbv3 medians 4.47 and 4.49 ms, ~9x the CUDA-graph time), yet rank the
    architectures alike only to Spearman 0.80 - two noisy readings of one quantity. With them
    in the prior the held-out CPU at n = 2 ranked backwards (-0.84)."""
    return [d for d in gpu if re.search(r"-torch-b\d+$", d)]


def merge_gpu_csv(space: Any, path: Path) -> list[str]:
    """Add the columns of ``<space>_gpu.csv`` (if any) that ``<space>.csv`` lacks; returns the
    GPU columns of the table."""
    gpu_path = path.with_name(f"{path.stem}_gpu.csv")
    if not gpu_path.exists():
        return []
    base, gpu = load_latency_table(path, space=space), load_latency_table(gpu_path, space=space)
    if sorted(base.archs) != sorted(gpu.archs):
        raise SystemExit(f"{_shown(gpu_path)} does not hold the architectures of "
                         f"{_shown(path)}; measure it again with --measure-gpu")
    new = [d for d in gpu.devices if d not in base.devices]
    if new:
        cols = {d: base.column(d) for d in base.devices}
        rows = gpu.rows(base.archs)
        cols.update({d: gpu.column(d)[rows] for d in new})
        write_csv(path, list(base.archs), cols)
    return list(gpu.devices)


def measured_tables(space: Any, paths: list[Path]) -> tuple[list[str], dict[str, np.ndarray]]:
    """The architectures measured on every device of ``paths`` (``.csv.gz`` tables of
    measure_latency_tables.py, or plain CSV: arch + one column per device, ms), in the first
    table's order, and every device's column on them."""
    cells: dict[str, dict[str, float]] = {}
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"--tables: {path} does not exist")
        if path.name.endswith(".gz"):
            table = lofo.read_gz_table(path, space)
        else:
            lt = load_latency_table(path, space=space)
            table = {d: dict(zip(lt.archs, lt.column(d))) for d in lt.devices}
        for d, col in table.items():
            if d in cells:
                raise SystemExit(f"--tables: device {d!r} appears in two tables")
            cells[d] = col
    if not cells:
        raise SystemExit("--tables: the tables hold no device column")
    first = next(iter(cells.values()))
    archs = [a for a in first if all(a in col for col in cells.values())]
    if len(archs) <= max(FEW_SHOT_NS):
        raise SystemExit(f"--tables: only {len(archs)} architectures are measured on every "
                         f"device; the few-shot check needs more than {max(FEW_SHOT_NS)}")
    return archs, {d: np.array([col[a] for a in archs]) for d, col in cells.items()}


def pick_held_out(held_out: str | None, measured: list[str], name: str) -> str:
    """The measured device of the held-out check: ``held_out`` if given, else cpu-ort-2t, else
    the first onnxruntime column, else the first measured one."""
    held = held_out or (HELD_OUT if HELD_OUT in measured else
                        next((d for d in measured if "-ort-" in d), measured[0]))
    if held not in measured:
        raise SystemExit(f"--held-out {held!r} is not a measured device of {name}; expected one "
                         f"of {', '.join(measured)}")
    return held


def run_space(name: str, n: int, repeats: int, warmup: int, seed: int, seeds: int,
              from_csv: bool, tables: list[Path] | None = None, held_out: str | None = None,
              ship_dir: Path | None = None, results_dir: Path = RESULTS_DIR,
              predictors: list[str] | None = None,
              held_out_tables: list[Path] | None = None) -> dict:
    space = get_space(name)
    path = results_dir / f"{name}.csv"
    t0 = time.perf_counter()
    gpu = merge_gpu_csv(space, path) if from_csv else []
    measured = list(MEASURED)
    if tables:
        archs, cols = measured_tables(space, tables)
        measured = list(cols)
        held_out = pick_held_out(held_out, measured, name)  # refused before anything is written
        gpu = [d for d in measured if re.search(r"-b\d+$", d)]
        cols.update(estimate(space, archs))
        write_csv(path, archs, cols)
        table = load_latency_table(path, space=space)
        measure_s = None
        repeats = warmup = None
    elif from_csv:
        table = load_latency_table(path, space=space)
        measure_s = None
    else:
        archs = sample_archs(space, n, seed)
        cols = measure(space, archs, repeats, warmup)
        measure_s = time.perf_counter() - t0
        cols.update(estimate(space, archs))
        write_csv(path, archs, cols)
        table = load_latency_table(path, space=space)
    print(f"{name}: {len(table)} architectures x {len(table.devices)} devices "
          f"({_shown(path)})")
    if not tables:
        measured = [*MEASURED, *gpu]
    held = pick_held_out(held_out, measured, name)
    task = Task(table, held, None, np.arange(len(table)))
    rows, ns = [], list(FEW_SHOT_NS)
    usable = [d for d in table.devices if d not in untrained(gpu)]
    variants = [(f"holdout-{held}", [task], [d for d in usable if d != held]),
                ("estimators-only", [task], [d for d in usable if d not in measured])]
    gpu_b64 = [d for d in gpu if d.endswith("-graph-b64")]
    if gpu_b64:
        variants.append((f"holdout-{gpu_b64[0]}",
                         [Task(table, gpu_b64[0], None, np.arange(len(table)))],
                         [d for d in usable if d != gpu_b64[0]]))
    if held_out_tables:  # a machine none of the meta-training devices ran on: the shipped set
        h_archs, h_cols = measured_tables(space, held_out_tables)
        h_path = results_dir / f"{name}_held_out_machine.csv"
        write_csv(h_path, h_archs, h_cols)
        h_table = load_latency_table(h_path, space=space)
        variants.append(("held-out-machine",
                         [Task(h_table, d, None, np.arange(len(h_table))) for d in h_cols],
                         usable))
    for variant, vtasks, train in variants:
        acc = evaluate(space, vtasks, metas_for(space, table, train, seeds), None,
                       predictors or PREDICTORS, ns, seeds)
        vrows = to_rows(name, acc, variant)
        for r in vrows:
            r["meta_train_devices"] = len(train)
        print(f"\n== {name}, meta-training variant {variant} ({len(train)} devices; "
              f"{len(vtasks[0].table)} architectures scored)")
        print_tables(name, vrows, [t.device for t in vtasks], None, ns)
        rows += vrows
    shipped = MetaPredictor(space).meta_fit(space, table.archs, table.columns(usable), seed=0)
    target = pretrained_path(name) if ship_dir is None else ship_dir / pretrained_path(name).name
    out = shipped.save(target)
    check = load_pretrained(name) if ship_dir is None else MetaPredictor.load(out)
    assert check.reference_archs == shipped.reference_archs
    print(f"shipped {_shown(out)} ({out.stat().st_size} bytes, "
          f"{len(usable)} of the {len(table.devices)} devices)")
    ms = table.columns(measured)
    return {"space": name, "architectures": len(table), "devices": table.devices,
            "tables": [str(p) for p in tables or []], "held_out_device": held,
            "held_out_tables": [str(p) for p in held_out_tables or []],
            "repeats": repeats, "warmup": warmup, "measure_seconds": measure_s,
            "measured_median_ms": {d: round(float(np.median(v)), 5) for d, v in ms.items()},
            "measured_range_ms": {d: [round(float(v.min()), 5), round(float(v.max()), 5)]
                                  for d, v in ms.items()},
            "shipped": _shown(out), "shipped_bytes": out.stat().st_size,
            "meta_trained_devices": usable,
            "results": rows}


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spaces", nargs="+", default=list(DEFAULTS),
                    choices=[*DEFAULTS, *TABLE_SPACES],
                    help=f"default: {' '.join(DEFAULTS)}; {' '.join(TABLE_SPACES)} needs --tables")
    ap.add_argument("--n", type=int, default=None, help="architectures per space (default: "
                    + ", ".join(f"{k} {v[0]}" for k, v in DEFAULTS.items()) + ")")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="seed of the architecture sample")
    ap.add_argument("--seeds", type=int, default=5, help="seeds of the few-shot protocol")
    ap.add_argument("--from-csv", action="store_true",
                    help=f"reuse {RESULTS_DIR.relative_to(REPO)}/<space>.csv, do not measure")
    ap.add_argument("--measure-gpu", action="store_true",
                    help="only time the architectures of <space>.csv on this machine's CUDA GPU "
                         "(PyTorch, batch 1 and 64) and write <space>_gpu.csv")
    ap.add_argument("--tables", nargs="+", type=Path, default=None,
                    help="meta-train on these measured tables of measure_latency_tables.py "
                         "(<space>_<tag>.csv.gz; one space) instead of measuring here")
    ap.add_argument("--held-out", default=None,
                    help="measured device of the held-out check (default: cpu-ort-2t, or the "
                         "first onnxruntime column of --tables)")
    ap.add_argument("--held-out-tables", nargs="+", type=Path, default=None,
                    help="measured tables of another machine (same space as --tables, or as "
                         "the shipped set with --from-csv), none of whose devices is meta-trained "
                         "on: each of their devices is scored few-shot on the architectures they "
                         "hold")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                    help="where <space>.csv is written and read")
    ap.add_argument("--predictors", nargs="+", default=PREDICTORS, choices=PREDICTORS,
                    help="predictors scored in the held-out check (default: all)")
    ap.add_argument("--ship-dir", type=Path, default=None,
                    help="write <space>_meta.npz here instead of latency/data/")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    args = ap.parse_args(argv)
    results = args.results_dir
    if args.tables and len(args.spaces) != 1:
        ap.error("--tables: name exactly one space with --spaces")
    needs_tables = [s for s in args.spaces if s in TABLE_SPACES]
    if needs_tables and not args.tables:
        ap.error(f"{needs_tables[0]} has no measurement here: give its tables with --tables")
    if args.held_out_tables and not (args.tables or args.from_csv):
        ap.error("--held-out-tables needs the meta-training set: --tables, or --from-csv (the "
                 "shipped set)")
    if args.tables and args.measure_gpu:
        ap.error("--tables and --measure-gpu exclude each other")
    t0 = time.perf_counter()
    if args.measure_gpu:
        for name in args.spaces:
            space = get_space(name)
            archs = list(load_latency_table(results / f"{name}.csv", space=space).archs)
            cols = gpu_columns(space, archs, max(DEFAULTS[name][1], 30), max(args.warmup, 10))
            write_csv(results / f"{name}_gpu.csv", archs, cols)
            print(f"{name}: {len(archs)} architectures on the GPU: "
                  + ", ".join(f"{d} {np.median(v):.3f} ms (median)" for d, v in cols.items()))
        return 0
    spaces = []
    for name in args.spaces:
        n, repeats = DEFAULTS.get(name, (0, 0))
        spaces.append(run_space(name, args.n or n, repeats, args.warmup, args.seed, args.seeds,
                                args.from_csv, args.tables, args.held_out, args.ship_dir,
                                results, args.predictors, args.held_out_tables))
    total = time.perf_counter() - t0
    write_json(args.out, {
        "command": "python benchmarks/latency_metatrain_mbv3.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "held_out_device": args.held_out or HELD_OUT,
        "total_seconds": round(total, 1),
        "spaces": spaces,
    })
    print(f"wrote {args.out} in {total:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
