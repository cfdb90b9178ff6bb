"""Wall and CPU seconds of each trial of a search, split into its parts: ``hwnas <args>`` run
with timers around the evaluator's call and its pieces (BN recalibration, PTQ, accuracy
passes, measured latency) and the sampler's choice, counted per trial, and the seconds between
two evaluator calls (Optuna's ask and tell, the storage). Written to a JSON file, one row per
trial; a table is printed. Figures: benchmarks/gpu_matrix_timing.md.

    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=/work/shared/data python benchmarks/search_trial_times.py \
        --json T.json -- search --space mbv3 --dataset cifar10 --trials 20 --eval-images 500 \
        --out /tmp/runs --name NAME --quiet
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import time

#: (label, module, qualified name) of the functions timed per trial
PARTS = [
    ("evaluator", "hwnas.search.evaluator", "TrialEvaluator.__call__"),
    ("bn_recal", "hwnas.supernet.evaluate", "recalibrated_subnet"),
    ("ptq", "hwnas.quant.ptq", "ptq"),
    ("accuracy", "hwnas.supernet.evaluate", "accuracy"),
    ("latency", "hwnas.latency.devices.measured", "MeasuredDevice.latency_with_std"),
    ("sampler_choose", "hwnas.search.screening", "ScreeningSampler.choose"),
    ("sampler_fit", "hwnas.search.screening", "ScreeningSampler._fit"),
]

ROWS: list[dict] = []  # one per evaluator call
STATE = {"trial": -1, "depth": {}, "last_end": None}


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _wrap(label: str, fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if label == "evaluator":
            start = _clocks()
            row = {"trial": len(ROWS), "parts": {}}
            if STATE["last_end"] is not None:
                row["between_wall"] = start[0] - STATE["last_end"][0]
                row["between_cpu"] = start[1] - STATE["last_end"][1]
            ROWS.append(row)
        depth = STATE["depth"].get(label, 0)
        STATE["depth"][label] = depth + 1
        start = _clocks()
        try:
            return fn(*args, **kwargs)
        finally:
            end = _clocks()
            STATE["depth"][label] = depth
            if depth == 0 and ROWS:
                # sampler work before an evaluator call belongs to the next trial
                row = ROWS[-1] if label != "sampler_choose" and label != "sampler_fit" else None
                key = label
                if row is None:
                    STATE.setdefault("pending", {}).setdefault(key, [0.0, 0.0])
                    STATE["pending"][key][0] += end[0] - start[0]
                    STATE["pending"][key][1] += end[1] - start[1]
                else:
                    part = row["parts"].setdefault(key, [0.0, 0.0, 0])
                    part[0] += end[0] - start[0]
                    part[1] += end[1] - start[1]
                    part[2] += 1
            if label == "evaluator":
                STATE["last_end"] = end
                ROWS[-1]["wall"] = end[0] - start[0]
                ROWS[-1]["cpu"] = end[1] - start[1]
                ROWS[-1]["sampler"] = STATE.pop("pending", {})
    return timed


def install() -> None:
    for label, module, qualname in PARTS:
        mod = importlib.import_module(module)
        owner, _, name = qualname.rpartition(".")
        target = getattr(mod, owner) if owner else mod
        setattr(target, name, _wrap(label, getattr(target, name)))
        if not owner:  # modules that imported the function by name
            for other in list(sys.modules.values()):
                if other is not None and other is not mod and \
                        getattr(other, name, None) is getattr(mod, name).__wrapped__:
                    setattr(other, name, getattr(mod, name))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, help="file to write the per-trial rows to")
    parser.add_argument("hwnas_args", nargs="+", help="arguments of `hwnas` (after --)")
    args = parser.parse_args()
    importlib.import_module("hwnas.search.runner")  # the modules whose names are patched
    from hwnas.cli import main as hwnas_main

    install()
    sys.argv = ["hwnas", *args.hwnas_args]
    start = _clocks()
    try:
        hwnas_main()
    except SystemExit:
        pass
    end = _clocks()
    with open(args.json, "w") as f:
        json.dump({"args": args.hwnas_args, "wall": end[0] - start[0], "cpu": end[1] - start[1],
                   "rows": ROWS}, f, indent=1)
    print("trial wall cpu between_wall " + " ".join(p[0] for p in PARTS[1:]))
    for r in ROWS:
        parts = " ".join(f"{r['parts'].get(p[0], [0, 0])[1]:.2f}" for p in PARTS[1:5])
        samp = " ".join(f"{r.get('sampler', {}).get(p[0], [0, 0])[1]:.2f}" for p in PARTS[5:])
        print(f"{r['trial']} {r.get('wall', 0):.2f} {r.get('cpu', 0):.2f} "
              f"{r.get('between_wall', 0):.2f} {parts} {samp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
