"""CPU seconds of a search's stages: ``hwnas <args>`` run under cProfile with the process's
CPU clock, then the cumulative CPU seconds of the functions that make up each stage (data,
sensitivity seeds, trials and their parts, test scores and outputs). CPU seconds, not wall
seconds: the machine is shared. Figures: benchmarks/gpu_matrix_timing.md.

    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=/work/shared/data python benchmarks/search_stage_cpu.py \
        --profile base.prof -- search --space mbv3 --dataset cifar10 --trials 8 \
        --eval-images 2000 --out /tmp/runs --name base --quiet
    python benchmarks/search_stage_cpu.py --profile base.prof   # the table of a saved profile
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

#: (label, file name, function): cumulative CPU seconds of each
STAGES = [
    ("dataset loaded (decoded)", "sources.py", "load_dataset"),
    ("supernet and splits", "runner.py", "_supernet_and_data"),
    ("study start (seeds included)", "runner.py", "_start_study"),
    ("  sensitivity seeds", "bits.py", "sensitivity_seeds"),
    ("    Hessian traces", "sensitivity.py", "hessian_sensitivity"),
    ("trials", "runner.py", "_run_all_trials"),
    ("  evaluator", "evaluator.py", "__call__"),
    ("  sampler (ask)", "study.py", "ask"),
    ("  measured latency", "measured.py", "latency_with_std"),
    ("test scores and outputs", "runner.py", "write_outputs"),
    ("  test scores", "runner.py", "score_models"),
    ("all: BN recalibrations", "evaluate.py", "recalibrated_subnet"),
    ("all: PTQ", "ptq.py", "ptq"),
    ("all: accuracy passes", "evaluate.py", "accuracy"),
    ("search", "runner.py", "run_search"),
]


def stage_table(profile: str) -> str:
    stats = pstats.Stats(profile).stats
    found = {}
    for (path, _line, name), (_cc, calls, _tt, cum, _callers) in stats.items():
        for label, file, func in STAGES:
            if name == func and path.endswith(file):
                found[label] = (cum, calls)
    lines = ["| stage | CPU s | calls |", "|---|---:|---:|"]
    lines += [f"| {label} | {found[label][0]:.1f} | {found[label][1]} |"
              for label, _, _ in STAGES if label in found]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="profile file to write (or read)")
    parser.add_argument("hwnas_args", nargs="*", help="arguments of `hwnas` (after --)")
    args = parser.parse_args()
    if args.hwnas_args:
        from hwnas.cli import main as hwnas_main

        sys.argv = ["hwnas", *args.hwnas_args]
        profiler = cProfile.Profile(time.process_time)
        start = time.process_time()
        try:
            profiler.runcall(hwnas_main)
        except SystemExit:
            pass
        finally:
            profiler.dump_stats(args.profile)
        print(f"total CPU s: {time.process_time() - start:.1f}")
    print(stage_table(args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
