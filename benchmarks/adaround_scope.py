"""What ``--rounding adaround`` costs an export's file before and after Session 34 (AdaRound of
the weights below 8 bits only): PTQ CPU seconds paired in fresh processes, each file's
validation top-1, learned layers and hash (benchmarks/adaround_steps.md, Session 34)::

    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=... python benchmarks/adaround_scope.py \\
        [--subnet smallest] [--recipe int8|w4a8] [--arms adaround-all,adaround,nearest]
        [--pairs 1] [--steps 200] [--merge] [--out benchmarks/adaround_scope.json]

The file is that of ``quant_peers.hwnas_build`` for the recipe (``int8``: the exported int8
file, min-max, bias correction, portable; ``w4a8``: first and last layer W8A8, MSE observers),
on the CIFAR-10 mbv3 subnet with BatchNorm recalibrated and 512 calibration images, once per
arm (its ``PTQConfig.rounding``): ``adaround-all`` is what ``--rounding adaround`` did before
(every quantized weight of every file learned), ``adaround`` what it does now (the same for a
file with weights below 8 bits, nothing for an int8 one; below 6 bits since Session 37 of
quant_peers.md, the same for these two recipes), ``nearest`` the reference.
Each round runs every arm in its own fresh process, the order rotated round by round (also
across ``--merge`` commands) so that a loaded machine slows them alike; user and system CPU
seconds come from the child's ``getrusage`` around the PTQ and the writing of its QDQ graph
(data loading and the validation pass excluded). Each file then runs with onnxruntime on the
5,000 validation images (never the test split). Prints medians per arm, writes JSON;
``--merge`` adds this command's rounds to those of ``--out`` (one or two rounds per command,
under the 10-minute limit of a command).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import quant_recipes as recipes
except ModuleNotFoundError:
    from benchmarks import quant_recipes as recipes

from hwnas.core.errors import UserError

HERE = Path(__file__).resolve().parent
ARMS = ("adaround-all", "adaround", "nearest")

_CHILD = """
import hashlib, json, resource, sys, tempfile, time
import numpy as np, onnx, torch
sys.path.insert(0, {here!r})
import quant_peers as peers
from hwnas.quant.adaround import learned_layers
from hwnas.quant.fake_quant import quant_layers
torch.set_num_threads(1)
data, arch, net, calib, normalise = peers.cifar10_subnet({checkpoint!r}, {subnet!r})
r0 = resource.getrusage(resource.RUSAGE_SELF); w = time.time()
build = peers.hwnas_build(net, calib, {method!r}, {steps}, rounding={arm!r})
proto = build.proto()
r1 = resource.getrusage(resource.RUSAGE_SELF); wall = time.time() - w
with tempfile.TemporaryDirectory() as work:
    path = f"{{work}}/file.onnx"
    onnx.save(proto, path)
    y = data.val.labels.numpy()
    top1 = 100 * float((peers.ort_top1(path, normalise(data.val.images).numpy()) == y).mean())
print(json.dumps({{"user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
                  "wall_s": wall, "val_images": int(len(y)), "val_top1": round(top1, 2),
                  "learned_layers": len(learned_layers(build.qmodel)),
                  "quant_layers": len(quant_layers(build.qmodel)),
                  "sha256": hashlib.sha256(proto.SerializeToString()).hexdigest()}}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=str(HERE.parent / "supernet/checkpoints/mbv3_cifar10.pt"))
    p.add_argument("--subnet", default="smallest", choices=recipes.ROLES)
    p.add_argument("--recipe", default="int8", choices=("int8", "w4a8"))
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--steps", type=int, default=200, help="AdaRound steps per layer")
    p.add_argument("--pairs", type=int, default=1, help="rounds, each running every arm once")
    p.add_argument("--out", default=str(HERE / "adaround_scope.json"))
    p.add_argument("--merge", action="store_true")
    return p.parse_args(argv)


def run_arm(args: argparse.Namespace, arm: str) -> dict:
    code = _CHILD.format(here=str(HERE), checkpoint=args.checkpoint, subnet=args.subnet,
                         method=f"hwnas_{args.recipe}", steps=args.steps, arm=arm)
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ),
                          capture_output=True, text=True)
    if done.returncode:
        raise UserError(f"the {arm} child failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(rows: list[dict], arms: list[str]) -> dict[str, dict]:
    """Per arm: median CPU/user/system/wall seconds over its rounds, its top-1 and hashes."""
    out = {}
    for arm in arms:
        sel = [r for r in rows if r["arm"] == arm]
        if not sel:
            continue
        out[arm] = {"rounds": len(sel),
                    "cpu_s": round(statistics.median(r["user_s"] + r["sys_s"] for r in sel), 1),
                    **{k: round(statistics.median(r[k] for r in sel), 1)
                       for k in ("user_s", "sys_s", "wall_s")},
                    "val_top1": sorted({r["val_top1"] for r in sel}),
                    "learned_layers": sorted({r["learned_layers"] for r in sel}),
                    "quant_layers": sel[0]["quant_layers"],
                    "sha256": sorted({r["sha256"] for r in sel})}
    return out


def main(argv: list[str] | None = None) -> int:
    from hwnas.latency.machine import describe_machine

    args = parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if not arms or any(a not in ARMS for a in arms) or args.pairs < 1 or args.steps < 1:
        raise UserError(f"--arms takes {', '.join(ARMS)}; --pairs and --steps must be positive")
    out = Path(args.out)
    key = {"subnet": args.subnet, "recipe": args.recipe, "steps": args.steps}
    old = json.loads(out.read_text()) if args.merge and out.is_file() else {}
    rows = [r for r in old.get("results", []) if {k: r[k] for k in key} == key]
    others = [r for r in old.get("results", []) if {k: r[k] for k in key} != key]
    start = 1 + max((r["round"] for r in rows), default=-1)
    for rnd in range(start, start + args.pairs):
        shift = rnd % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            row = {**key, "round": rnd, "arm": arm, **run_arm(args, arm)}
            rows.append(row)
            print(f"round {rnd} {arm:>12}: user {row['user_s']:.1f} s, sys {row['sys_s']:.1f} s, "
                  f"wall {row['wall_s']:.1f} s, val top-1 {row['val_top1']:.2f}, learned "
                  f"{row['learned_layers']}/{row['quant_layers']}", flush=True)
    medians = summary(rows, list(ARMS) + sorted({r["arm"] for r in rows} - set(ARMS)))
    print(f"\n{args.subnet} {args.recipe}, {args.steps} steps: medians over rounds")
    print(f"{'arm':<13} {'rounds':>6} {'CPU s':>7} {'user s':>7} {'sys s':>6} {'wall s':>7} "
          f"{'val top-1':>10} {'learned':>8}  file")
    for arm, m in medians.items():
        print(f"{arm:<13} {m['rounds']:>6} {m['cpu_s']:>7.1f} {m['user_s']:>7.1f} "
              f"{m['sys_s']:>6.1f} {m['wall_s']:>7.1f} {'/'.join(map(str, m['val_top1'])):>10} "
              f"{'/'.join(map(str, m['learned_layers'])):>8}  "
              f"{'/'.join(h[:12] for h in m['sha256'])}")
    commands = old.get("commands", []) + [recipes.command_line(argv)]
    doc = {"command": " && ".join(commands), "commands": commands,
           "machine": describe_machine(), "date": recipes.now_iso(),
           "medians": {f"{args.subnet}/{args.recipe}/{args.steps}": medians,
                       **{k: v for k, v in old.get("medians", {}).items()
                          if k != f"{args.subnet}/{args.recipe}/{args.steps}"}},
           "results": others + rows}
    recipes.write_json(out, doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    recipes.run_script(main, "adaround_scope")
