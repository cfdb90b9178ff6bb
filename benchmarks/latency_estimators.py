"""How well do the analytical latency estimators rank architectures on real (or simulated) devices?

For the NAS-Bench-201 and FBNet spaces, every architecture of the shared latency tables
(15,625 and 5,000) is turned into its layer list and estimated by each estimator of
:mod:`hwnas.latency.estimators` (plus three FPGA accelerator variants and FLOPs/params baselines).
The score is the Spearman rank correlation between estimate and the table column, over all
architectures. Targets: the ``fpga`` and ``eyeriss`` columns (accelerator simulators, from
HW-NAS-Bench); the others (``raspi4``, ``pixel3``, ``gold_6240``, ``1080ti_1``) for context.

Writes ``benchmarks/latency_estimators.json`` (keys: command, machine, date, results rows
``{space, estimator, device_column, spearman}``) and ``benchmarks/latency_estimators.md``.

Usage::

    python benchmarks/latency_estimators.py [--spaces nb201 fbnet] [--limit N]

``--limit`` scores a random subset per space (quick checks); the committed results use all.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent

from hwnas.latency.devices import latency_tables  # noqa: E402
from hwnas.latency.estimators import available_estimators, get_estimator  # noqa: E402
from hwnas.latency.estimators.fpga import ZCU102, FPGAEstimator  # noqa: E402
from hwnas.latency.machine import describe_machine  # noqa: E402
from hwnas.supernet.layers import total_macs, total_params  # noqa: E402
from hwnas.supernet.spaces import get_space  # noqa: E402

TARGETS = ("fpga", "eyeriss")
CONTEXT = ("raspi4", "pixel3", "gold_6240", "1080ti_1")
OUT_JSON = Path(__file__).with_suffix(".json")
OUT_MD = Path(__file__).with_suffix(".md")


def machine() -> str:
    return describe_machine("no GPU used")


def estimators() -> dict[str, object]:
    """Every registered estimator plus the ZCU102 FPGA in its other two modes."""
    out = {name: get_estimator(name) for name in available_estimators()}
    for mode in ("throughput", "sequential"):
        name = f"fpga-zcu102-est[{mode}]"
        out[name] = FPGAEstimator(dataclasses.replace(ZCU102, mode=mode), name)
    return out


def score_space(space_name: str, path: Path, limit: int | None, seed: int) -> list[dict]:
    space = get_space(space_name)
    frame = pd.read_csv(path)
    if limit is not None and limit < len(frame):
        frame = frame.sample(limit, random_state=seed)
    layer_lists = [space.layers(space.from_string(a))
                   for a in tqdm(frame["arch"], desc=f"{space_name} layer lists", leave=False)]
    columns = [c for c in TARGETS + CONTEXT if c in frame.columns]
    predictions: dict[str, np.ndarray] = {
        "flops (baseline)": np.array([total_macs(la) for la in layer_lists], dtype=float),
        "params (baseline)": np.array([total_params(la) for la in layer_lists], dtype=float),
    }
    seconds: dict[str, float] = {}
    for name, est in tqdm(estimators().items(), desc=f"{space_name} estimators", leave=False):
        start = time.perf_counter()
        predictions[name] = est.estimate_many(layer_lists)
        seconds[name] = time.perf_counter() - start
    rows = []
    for name, pred in predictions.items():
        for column in columns:
            rho = float(spearmanr(pred, frame[column].to_numpy())[0])
            rows.append({"space": space_name, "estimator": name, "device_column": column,
                         "spearman": round(rho, 4), "n_archs": len(frame),
                         "estimate_ms_per_arch": round(seconds.get(name, 0.0) / len(frame) * 1e3, 4)})
    return rows


def table(rows: list[dict], space: str) -> str:
    sub = [r for r in rows if r["space"] == space]
    columns = list(dict.fromkeys(r["device_column"] for r in sub))
    names = list(dict.fromkeys(r["estimator"] for r in sub))
    value = {(r["estimator"], r["device_column"]): r["spearman"] for r in sub}
    lines = ["| estimator | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{value[(name, c)]:.3f}" for c in columns) + " |")
    return "\n".join(lines)


def summary(rows: list[dict], space: str) -> list[str]:
    """Plain statements computed from the numbers (no hand-tuned prose)."""
    out = []
    value = {(r["estimator"], r["device_column"]): r["spearman"] for r in rows if r["space"] == space}
    names = [n for n in dict.fromkeys(r["estimator"] for r in rows if r["space"] == space)
             if "baseline" not in n]
    for column in TARGETS:
        if ("flops (baseline)", column) not in value:
            continue
        flops = value[("flops (baseline)", column)]
        best = max(names, key=lambda n: value[(n, column)])
        fpga = value.get(("fpga-zcu102-est", column))
        out.append(
            f"- {space} `{column}`: best estimator {best} ({value[(best, column)]:.3f}); FLOPs "
            f"alone {flops:.3f}; our default FPGA estimate fpga-zcu102-est {fpga:.3f} "
            f"({'better' if fpga > flops else 'worse'} than FLOPs)."
        )
    return out


def write_md(rows: list[dict], command: str, spaces: list[str]) -> None:
    parts = [
        "# Analytical latency estimators vs measured/simulated tables",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Date: {dt.date.today().isoformat()}",
        "",
        "Spearman rank correlation between each estimate (computed from the layer list only) and",
        "the table column, over every architecture of the table. `fpga` and `eyeriss` are the",
        "HW-NAS-Bench accelerator-simulator columns; the others are measured devices, shown for",
        "context. The estimators model *other* hardware (a ZCU102/ZC706/PYNQ-Z2 dataflow FPGA",
        "design, a Coral Edge TPU, Jetson/phone/Pi rooflines) than the devices of the tables, so",
        "these numbers say how well each model's notion of cost ranks architectures the way those",
        "devices do, not whether the model is right about its own device. An estimate that ranks",
        "no better than FLOPs adds no ranking information for that column; its use is a",
        "plausible prior for a device nobody has measured yet, to be replaced by an adapted",
        "profile (`hwnas latency adapt`) after about ten real measurements.",
        "",
    ]
    for space in spaces:
        if not any(r["space"] == space for r in rows):
            continue
        n = next(r["n_archs"] for r in rows if r["space"] == space)
        parts += [f"## {space} ({n} architectures)", "", table(rows, space), ""]
        parts += summary(rows, space) + [""]
    parts += [
        "## Caveats",
        "",
        "- The FPGA variants differ only in what the design optimises: `latency` (default,",
        "  streaming pipeline: bottleneck interval + per-layer fill), `throughput` (bottleneck",
        "  interval only) and `sequential` (sum of per-layer intervals, no overlap).",
        "- Parameters (DSPs, clock, bandwidths, peaks) come from vendor data sheets; per-op",
        "  efficiencies and overheads are assumptions documented in `latency/estimators/`.",
        "  They were not fitted to these tables.",
        "",
    ]
    tmp = OUT_MD.with_suffix(".md.tmp")
    tmp.write_text("\n".join(parts))
    os.replace(tmp, OUT_MD)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spaces", nargs="+", default=["nb201", "fbnet"])
    parser.add_argument("--limit", type=int, help="score a random subset of this many per space")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    command = "python benchmarks/latency_estimators.py" + (
        " " + " ".join(argv if argv is not None else sys.argv[1:]) if (argv or sys.argv[1:]) else "")

    tables = latency_tables()
    rows: list[dict] = []
    for space in args.spaces:
        if space not in tables:
            print(f"skipping {space}: its latency table is absent (set HWNAS_SHARED_DATA)")
            continue
        rows += score_space(space, tables[space], args.limit, args.seed)
        print(f"\n{space}\n" + table(rows, space))
        print("\n".join(summary(rows, space)))
    if not rows:
        print("no latency tables found; nothing written")
        return 1
    payload = {"command": command, "machine": machine(), "date": dt.datetime.now().isoformat(timespec="seconds"),
               "targets": list(TARGETS), "context": list(CONTEXT), "results": rows}
    tmp = OUT_JSON.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, OUT_JSON)
    write_md(rows, command, args.spaces)
    print(f"\nwrote {OUT_JSON.relative_to(ROOT)} and {OUT_MD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
