"""The code trace of a QDQ file (:func:`hwnas.export.code_trace.trace_codes`, what the export's
quantized check runs when the top-1 agreement is low and every image moved a little), this
checkout's against another source tree's, interleaved, on a run's model
(benchmarks/export_speed.md, Session 36)::

    git archive BASE | tar -x -C /tmp/base
    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=... python benchmarks/export_trace.py RUN_DIR \\
        --before /tmp/base --select 1 --rounds 2 --max-images 1000

Each round traces the model's ``qdq/`` file (its exact reference: the fake-quant model with
int32 biases) once with ``--before``'s ``export/code_trace.py`` and once with this checkout's,
the order alternating, and checks that both give the same trace
(every layer's figures, the first and unexplained layers and their distances); prints the
process CPU seconds of each trace and of its tally (medians).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _module_of(tree: Path):  # noqa: ANN202
    """``export/code_trace.py`` of another source tree (``git archive BASE``), as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("code_trace_before",
                                                  tree / "export" / "code_trace.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--select", default="all")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-images", type=int, default=1000)
    ap.add_argument("--before", type=Path, required=True,
                    help="source tree to compare against (git archive BASE | tar -x -C DIR)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from export_passes import pairs_of
    from hwnas.export import code_trace

    models, images, _ = pairs_of(args.run_dir, args.select, args.max_images)
    modules = {"before": _module_of(args.before), "after": code_trace}
    for name, pairs in models:
        for label, data, _key, context in pairs:
            if not label.startswith("qdq"):
                continue
            runs: dict[str, list] = {k: [] for k in modules}
            for r in range(args.rounds):
                traces = {}
                for way in list(modules) if r % 2 == 0 else list(modules)[::-1]:
                    module, spent = modules[way], [0.0]
                    add = module._Tally.add

                    def timed(self, *a, _add=add, **k):  # noqa: ANN001, ANN202
                        t = _cpu()
                        try:
                            return _add(self, *a, **k)
                        finally:
                            spent[0] += _cpu() - t
                    module._Tally.add = timed
                    try:
                        with context() as deployed:
                            wall, cpu = time.perf_counter(), _cpu()
                            trace = module.trace_codes(data, deployed, images)
                            runs[way].append((time.perf_counter() - wall, _cpu() - cpu, spent[0]))
                    finally:
                        module._Tally.add = add
                    traces[way] = (trace.layers, trace.first_layer, trace.first_distance_to_half,
                                   trace.unexplained, trace.unexplained_distance_to_half)
                    print(f"{name} {label} round {r + 1} {way}: wall {runs[way][-1][0]:.1f} s, "
                          f"CPU {runs[way][-1][1]:.1f} s (tally {spent[0]:.1f})", flush=True)
                if traces["before"] != traces["after"]:
                    print(f"{name}: the traces differ", file=sys.stderr)
                    return 1
            med = {w: [statistics.median(x[i] for x in runs[w]) for i in range(3)] for w in runs}
            print(f"{name} {label} ({len(images)} images, traces identical): CPU s before "
                  f"{med['before'][1]:.1f} (tally {med['before'][2]:.1f}), after "
                  f"{med['after'][1]:.1f} (tally {med['after'][2]:.1f}); wall {med['before'][0]:.1f}"
                  f" / {med['after'][0]:.1f}; first layer {traces['after'][1]}, starts as flips: "
                  f"{traces['after'][3] is None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
