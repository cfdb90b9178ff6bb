"""Training speed of ``hwnas train`` beside CPU-bound processes (issue 50, item 5).

Starts ``--busy`` processes that spin on the CPU, then times ``hwnas train --bench-steps N``
(digits, mbv3-tiny supernet: the supernet training ``hwnas run`` does first) in each of
``--modes``, interleaved, ``--repeats`` times each: ``spin`` (torch's default thread count,
one per core, OpenMP threads spinning while they wait: what hwnas did before issue 50),
``passive`` (the same threads, ``OMP_WAIT_POLICY=PASSIVE``), ``one`` (one thread) and ``hwnas``
(no setting: what the hwnas command chooses itself). Prints a table of seconds per training
step and writes JSON.

    python benchmarks/contention.py --busy 0,2,6 --steps 10 --repeats 2

Keep it short on a shared machine: every busy process takes a core from the people beside you.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _spin(stop: float) -> None:
    x = 0
    while time.time() < stop:
        x += 1


#: the environment of each mode (None: unset, so that the command chooses)
MODES = {"spin": {"OMP_NUM_THREADS": str(os.cpu_count()), "OMP_WAIT_POLICY": "ACTIVE"},
         "passive": {"OMP_NUM_THREADS": str(os.cpu_count()), "OMP_WAIT_POLICY": "PASSIVE"},
         "one": {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": None},
         "hwnas": {"OMP_NUM_THREADS": None, "OMP_WAIT_POLICY": None},
         # libgomp: spin this many times at a barrier, then sleep (the policy left unset)
         "spin10k": {"OMP_NUM_THREADS": str(os.cpu_count()), "OMP_WAIT_POLICY": None,
                     "GOMP_SPINCOUNT": "10000"},
         "spin100k": {"OMP_NUM_THREADS": str(os.cpu_count()), "OMP_WAIT_POLICY": None,
                      "GOMP_SPINCOUNT": "100000"},
         "passive10k": {"OMP_NUM_THREADS": str(os.cpu_count()), "OMP_WAIT_POLICY": "PASSIVE",
                        "GOMP_SPINCOUNT": "10000"}}


def _bench(steps: int, mode: str) -> float:
    """Seconds per training step of one ``hwnas train --bench-steps`` command."""
    env = dict(os.environ)
    for key, value in MODES[mode].items():
        env.pop(key, None)
        if value is not None:
            env[key] = value
    out = subprocess.run([sys.executable, "-m", "hwnas", "train", "--epochs", "1",
                          "--bench-steps", str(steps), "--quiet"], env=env, capture_output=True,
                         text=True, timeout=1800, check=True).stdout
    m = re.search(r"bench: (\d+) steps, \d+ images in ([0-9.]+) s", out)
    if not m:
        raise RuntimeError(f"no bench line in: {out}")
    return float(m.group(2)) / int(m.group(1))


def _cpu_model() -> str:
    from hwnas.latency.machine import cpu_model

    return cpu_model()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", default="0,2,6", help="busy process counts to try")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="spin,one,hwnas", help=f"some of {', '.join(MODES)}")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    args = ap.parse_args()
    rows = []
    modes = args.modes.split(",")
    for busy in [int(b) for b in args.busy.split(",")]:
        times: dict[str, list[float]] = {m: [] for m in modes}
        procs = [multiprocessing.Process(target=_spin, args=(time.time() + 3600,), daemon=True)
                 for _ in range(busy)]
        for p in procs:
            p.start()
        try:
            for _ in range(args.repeats):  # interleaved: the machine's load drifts
                for mode in modes:
                    load = os.getloadavg()[0]
                    times[mode].append(_bench(args.steps, mode))
                    print(f"busy {busy} {mode}: {times[mode][-1]:.3f} s/step "
                          f"(1-minute load before {load:.1f})", flush=True)
        finally:
            for p in procs:
                p.terminate()
                p.join()
        rows.append({"busy": busy, **{f"s_per_step_{m}": statistics.median(times[m])
                                      for m in modes}, "runs": times})
    print("\n busy " + "".join(f"{m + ' s/step':>16}" for m in modes))
    for r in rows:
        print(f"{r['busy']:>5} " + "".join(f"{r[f's_per_step_{m}']:>16.3f}" for m in modes))
    Path(args.out).write_text(json.dumps({
        "benchmark": "contention", "command": " ".join(sys.argv),
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "load_average_at_end": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "note": "shared machine (other engineers' jobs ran beside): medians of interleaved runs",
        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
