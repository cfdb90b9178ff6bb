"""Paired, interleaved timing of ``hwnas export`` under two source trees, with the exported
files and verdicts compared (benchmarks/export_speed.md, Session 31)::

    git archive BASE | tar -x -C /tmp/base          # the code to compare against
    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=... python benchmarks/export_ab.py RUN_DIR \\
        --before /tmp/base [--after /tmp/new] --pairs 3 [--select 2,3] [--json out.json] \\
        [--devices cpu-ort-1t-b2] [--keep-dw-float 2]

Each pair runs the export once with the ``--before`` tree and once with the ``--after`` tree
(default: this checkout), in alternating order (A B, B A, ...), each in a fresh process whose
wall, user and system seconds, minor page faults and peak memory come from ``wait4``. Other
trees run through the editable install's module map (the same interpreter and packages; only
hwnas's source differs).
Each export's manifest gives its stage seconds; its files are hashed, and every file's status,
top-1 agreement, test accuracy and max |diff| compared between the two trees (the
``qdq-<device>`` files follow a timing-driven int8/float choice, so they may differ between any
two runs; ``--keep-dw-float N`` replaces every device's choice, after its timings, by the first
N depthwise layers, so that those files can be compared too), and the rest of the manifest
but its timings. Each stage's CPU seconds come from the export's process as it runs. Prints a
table of medians and writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

_RUNNER = """
import sys
import importlib
for name in list(sys.modules):
    if name.startswith("__editable__") and name.endswith("_finder"):
        finder = sys.modules[name]
        for key, path in list(finder.MAPPING.items()):
            finder.MAPPING[key] = path.replace(sys.argv[1], sys.argv[2], 1)
exec(sys.argv[3])
from hwnas.cli import main
sys.exit(main(sys.argv[4:]))
"""

#: run inside the export's process before it starts (argv: the JSON file of CPU seconds per
#: stage, the number of depthwise layers every device keeps float, or -1 for its own choice):
#: each stage's CPU seconds of the process (``time.process_time``; stages nest as in the
#: manifest) and, with ``--keep-dw-float``, every device's choice made after its timings as
#: usual but replaced by the first N depthwise layers, so that two runs write the same files
_PATCH = """
import atexit, contextlib, dataclasses, json, time
import hwnas.export.model_export as _me
import hwnas.export.passes as _passes
_cpu, _cpu_path, _keep = {{}}, {path!r}, {keep}
_wall_call = _passes.StageClock.__call__

@contextlib.contextmanager
def _call(self, stage):
    start = time.process_time()
    try:
        with _wall_call(self, stage):
            yield
    finally:
        _cpu[stage] = _cpu.get(stage, 0.0) + time.process_time() - start
_passes.StageClock.__call__ = _call
atexit.register(lambda: open(_cpu_path, "w").write(json.dumps(_cpu)))
if _keep >= 0:
    _choose = _me.choose_float_layers

    def _fixed(build_model, fp32, quantized, kinds, **kw):
        chosen = _choose(build_model, fp32, quantized, kinds, **kw)
        dw = [n for n in quantized if kinds.get(n) == "depthwise"][:_keep]
        return dataclasses.replace(chosen, float_layers=dw, chosen_label=f"first {{_keep}} dw")
    _me.choose_float_layers = _fixed
"""


def run_once(tree: Path | None, run_dir: Path, out: Path, extra: list[str],
             keep_dw_float: int = -1) -> dict:
    """One ``hwnas export`` in a fresh process (``tree``: another source tree, else this one);
    its resource figures, the stage seconds of its manifest and each stage's CPU seconds."""
    args = ["export", str(run_dir), "--out", str(out), "--quiet", *extra]
    cpu_path = Path(str(out) + ".cpu_stages.json")
    patch = _PATCH.format(path=str(cpu_path), keep=int(keep_dw_float))
    cmd = [sys.executable, "-c", _RUNNER, str(HERE), str(tree or HERE), patch, *args]
    start = time.perf_counter()
    # started in the output's folder: from the checkout, ``import hwnas`` would find its
    # ``hwnas/`` folder on the current directory before the remapped editable finder
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=out.parent)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    text = proc.stdout.read().decode(errors="replace")
    proc.stdout.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"export failed ({tree or 'this checkout'}):\n{text}")
    manifest = json.loads((out / "manifest.json").read_text())
    stages: dict[str, float] = {}
    for m in manifest["models"]:
        for k, v in (m.get("info", {}).get("stage_seconds") or {}).items():
            stages[k] = stages.get(k, 0.0) + v
    for k, v in (manifest.get("shared_seconds") or {}).items():
        stages[f"shared_{k}"] = v
    return {"wall_s": wall, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
            "cpu_s": usage.ru_utime + usage.ru_stime, "minor_faults": usage.ru_minflt,
            "max_rss_mb": usage.ru_maxrss / 1024, "stages_s": stages,
            "stages_cpu_s": json.loads(cpu_path.read_text()),
            "files": {**file_facts(out, manifest), **manifest_facts(manifest)}}


#: manifest fields that hold timings (or follow from them), left out of the comparison
_TIMED = {"latency_ms", "stage_seconds", "device_choice", "candidates", "created",
          "shared_seconds", "export_stages_s", "machine", "run_dir"}


def manifest_facts(manifest: dict) -> dict[str, dict]:
    """Every model's file records and info in the manifest, timings left out (``_TIMED``; a
    device's entry is a timing's verdict and is left out too): what must not change."""
    facts = {}
    for m in manifest["models"]:
        for f in m.get("files", []):
            facts[f"manifest:{f['path']}"] = {k: v for k, v in f.items() if k not in _TIMED}
        facts[f"manifest:{m['name']}:info"] = {k: v for k, v in m.get("info", {}).items()
                                               if k not in _TIMED}
    return facts


def file_facts(out: Path, manifest: dict) -> dict[str, dict]:
    """Per written file (and verification sample): its hash and verdict figures."""
    facts = {}
    for m in manifest["models"]:
        for f in m.get("files", []):
            path = out / f["path"]
            facts[f["path"]] = {
                "status": f.get("status"), "sha256": _sha(path) if path.is_file() else None,
                **{k: f.get(k) for k in ("top1_agreement", "test_accuracy", "max_abs_diff",
                                         "searched_agreement", "searched_max_abs_diff")}}
        sample = m.get("info", {}).get("verify_sample")
        if sample:
            facts[sample] = {"sha256": _sha(out / sample)}
        for d in m.get("devices", []):
            if d.get("measured"):
                facts[f"{m['name']}:{d['device']}"] = {"recommended": d.get("recommended")}
    return facts


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def compare(a: dict[str, dict], b: dict[str, dict]) -> list[str]:
    """What differs between two exports' file facts (empty: identical)."""
    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)} != {b.get(key)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--before", type=Path, required=True, help="source tree to compare against")
    ap.add_argument("--after", type=Path, default=None,
                    help="source tree measured against it (default: this checkout)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--select", default="all")
    ap.add_argument("--devices", default="", help="more devices to tune for (export's flag)")
    ap.add_argument("--keep-dw-float", type=int, default=-1,
                    help="every device keeps the first N depthwise layers float, whatever its "
                         "timings chose (the same files in every run; default: its own choice)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    extra = ["--select", args.select] + (["--devices", args.devices] if args.devices else [])
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="hwnas-ab-") as tmp:
        for i in range(args.pairs):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for which in order:
                tree = args.before if which == "before" else args.after
                r = run_once(tree, args.run_dir, Path(tmp) / f"{which}{i}", extra,
                             args.keep_dw_float)
                runs[which].append(r)
                print(f"pair {i + 1} {which}: wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s "
                      f"(sys {r['sys_s']:.1f}), faults {r['minor_faults'] / 1e6:.2f} M",
                      flush=True)
    diffs = [compare(b["files"], a["files"]) for b, a in zip(runs["before"], runs["after"])]
    keys = ["wall_s", "cpu_s", "user_s", "sys_s", "minor_faults", "max_rss_mb"]
    med = {w: {k: statistics.median(r[k] for r in runs[w]) for k in keys} for w in runs}
    stage_keys = sorted({k for w in runs for r in runs[w] for k in r["stages_s"]})
    stages = {w: {k: statistics.median(r["stages_s"].get(k, 0.0) for r in runs[w])
                  for k in stage_keys} for w in runs}
    cpu_keys = sorted({k for w in runs for r in runs[w] for k in r["stages_cpu_s"]})
    stages_cpu = {w: {k: statistics.median(r["stages_cpu_s"].get(k, 0.0) for r in runs[w])
                      for k in cpu_keys} for w in runs}
    print(f"\n{'median of ' + str(args.pairs):>22} {'before':>10} {'after':>10} {'change':>8}")
    for k in keys:
        b, a = med["before"][k], med["after"][k]
        print(f"{k:>22} {b:10.1f} {a:10.1f} {100 * (a - b) / b if b else 0:7.0f}%")
    for k in stage_keys:
        b, a = stages["before"][k], stages["after"][k]
        print(f"{'stage ' + k:>22} {b:10.1f} {a:10.1f}")
    for k in cpu_keys:
        b, a = stages_cpu["before"][k], stages_cpu["after"][k]
        print(f"{'CPU s ' + k:>22} {b:10.1f} {a:10.1f}")
    for i, d in enumerate(diffs):
        print(f"pair {i + 1}: " + ("files and verdicts identical" if not d else
                                    f"{len(d)} difference(s): " + "; ".join(d[:4])))
    if args.json:
        from export_speed import machine  # this folder's: CPU, cores, GPU, versions, load

        doc = {"command": " ".join(sys.argv), "run_dir": str(args.run_dir),
               "select": args.select, "pairs": args.pairs, "median": med,
               "stage_median_s": stages, "stage_cpu_median_s": stages_cpu,
               "differences": diffs,
               "runs": {w: [{k: v for k, v in r.items() if k != "files"} for r in runs[w]]
                        for w in runs},
               "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
