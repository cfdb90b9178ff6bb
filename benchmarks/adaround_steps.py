"""AdaRound's Adam steps per layer, chosen on the validation split (never the test images).

Issue 49. For CIFAR-10 mbv3 subnets of a supernet checkpoint (BatchNorm recalibrated as the
search does), the W4A8 file of ``benchmarks/quant_peers.py`` (``hwnas_w4a8``: first and last
layer W8A8, MSE observers, bias correction, portable) is written with nearest rounding and with
AdaRound at each step count of ``--steps``, on the same 512 calibration images (training split),
and each file is run with onnxruntime on the validation split (5,000 images held out of the
training split, stratified; ``--val N`` takes a stratified subset). The rule, fixed before
running: the step count with the highest validation top-1, except that a smaller one within
``--tolerance`` points of it (0.1: 5 of 5,000 images) is preferred, being cheaper; over several
subnets, by mean validation top-1. Records each file's PTQ CPU seconds::

    python benchmarks/adaround_steps.py [--subnets smallest,middle] [--steps 50,100,200,500]
        [--recipe w4a8|int8] [--resume-dir DIR [--budget 360]] [--merge]
        [--out benchmarks/adaround_steps.json]

``--recipe int8`` writes ``hwnas_int8`` instead (the exported int8 file: min-max, bias
correction, portable), to see whether AdaRound helps at 8 bits (forced:
``rounding="adaround-all"``); its rows are never candidates of the rule, which chooses the W4A8
step count. ``--resume-dir``: AdaRound in parts
(:mod:`adaround_resume`): learned layers are kept there and the PTQ pauses after ``--budget``
wall seconds (exit status 3, the rows finished before it written); the same command again goes
on where it stopped. Its PTQ CPU seconds are then those of all parts.

``--merge`` keeps the rows of ``--out`` that are not run now (one subnet or step count per
command, under the 10-minute limit of a command).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import adaround_resume as resume
    import quant_peers as peers
    import quant_recipes as recipes
except ModuleNotFoundError:
    from benchmarks import adaround_resume as resume
    from benchmarks import quant_peers as peers
    from benchmarks import quant_recipes as recipes

from hwnas.core.errors import UserError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECIPES = ("w4a8", "int8")


def recipe_of(row: dict) -> str:
    """A row's recipe; rows written before ``--recipe`` existed are W4A8 ones."""
    return row.get("recipe") or ("int8" if row.get("method", "").startswith("hwnas_int8")
                                 else "w4a8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=str(ROOT / "supernet/checkpoints/mbv3_cifar10.pt"))
    p.add_argument("--data", default="cifar10")
    p.add_argument("--subnets", default="smallest", help="comma list of smallest,middle,largest")
    p.add_argument("--steps", default="50,100,200,500",
                   help="AdaRound Adam steps per layer to try; 0 = nearest rounding")
    p.add_argument("--recipe", choices=RECIPES, default="w4a8",
                   help="W4A8 (first and last layer W8A8) or int8 file of quant_peers.py")
    p.add_argument("--calib", type=int, default=512)
    p.add_argument("--val", type=int, default=0, help="stratified validation images (0: all)")
    p.add_argument("--tolerance", type=float, default=0.1,
                   help="points within which fewer steps are preferred")
    p.add_argument("--resume-dir", default="",
                   help="keep AdaRound's learned layers here and pause after --budget seconds")
    p.add_argument("--budget", type=float, default=360.0,
                   help="wall seconds of AdaRound per command with --resume-dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(HERE / "adaround_steps.json"))
    p.add_argument("--merge", action="store_true")
    return p.parse_args(argv)


def choose(rows: list[dict], tolerance: float) -> int | None:
    """The step count (>0) by the rule of the module docstring, from rows of
    ``{"subnet", "steps", "val_top1"}``; only W4A8 rows, and only step counts run on every
    subnet, count."""
    rows = [r for r in rows if recipe_of(r) == "w4a8"]
    subnets = {r["subnet"] for r in rows}
    by_steps: dict[int, list[float]] = {}
    for r in rows:
        if r["steps"] > 0:
            by_steps.setdefault(r["steps"], []).append(r["val_top1"])
    means = {k: float(np.mean(v)) for k, v in by_steps.items() if len(v) == len(subnets)}
    if not means:
        return None
    best = max(means.values())
    return min(k for k, v in means.items() if v >= best - tolerance)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from hwnas.export.qdq import float_proto
    from hwnas.latency.machine import describe_machine
    from hwnas.supernet.data import load_dataset
    from hwnas.supernet.data.splits import _rng, _stratified_take
    from hwnas.supernet.train import load_checkpoint, with_training_augment

    torch.set_num_threads(1)
    roles = [r for r in args.subnets.split(",") if r]
    steps = [int(s) for s in args.steps.split(",") if s]
    unknown = [r for r in roles if r not in recipes.ROLES]
    if unknown or any(s < 0 for s in steps):
        raise UserError(f"--subnets takes {', '.join(recipes.ROLES)} and --steps counts >= 0")
    space, supernet, payload = load_checkpoint(args.checkpoint, device="cpu")
    data = with_training_augment(load_dataset(args.data, seed=args.seed),
                                 payload.get("train_config"))
    val_y = data.val.labels.numpy()
    idx = np.arange(len(val_y))
    if 0 < args.val < len(val_y):
        idx = _stratified_take(val_y, args.val, _rng(args.seed, 97))[1]
    val_y = val_y[idx]
    rows, paused = [], None
    for role in roles:
        if paused:
            break
        arch, net, calib, normalise = peers.float_subnet(role, supernet, space, data, args.seed,
                                                         args.calib)
        val_x = normalise(data.val.images[idx]).numpy()
        with tempfile.TemporaryDirectory() as work:
            fp32_path = Path(work) / "fp32.onnx"
            onnx.save(float_proto(net, calib[:1]), fp32_path)
            fp32 = 100 * float((peers.ort_top1(fp32_path, val_x) == val_y).mean())
            for n in steps:
                cpu = time.process_time()
                method = f"hwnas_{args.recipe}" + ("_adaround" if n else "")
                folder = (resume.folder_of(args.resume_dir, role, method, n)
                          if args.resume_dir and n else None)
                try:
                    with resume.resumable(folder, args.budget) as part:
                        proto = peers.hwnas_file(net, calib, method, max(1, n))
                except resume.Paused as exc:
                    paused = f"{role}, {n} steps paused: {exc}; run the same command again"
                    break
                cpu = part.earlier_cpu + time.process_time() - cpu
                path = Path(work) / f"{method}_{n}.onnx"
                onnx.save(proto, path)
                top1 = 100 * float((peers.ort_top1(path, val_x) == val_y).mean())
                row = {"subnet": role, "arch": space.to_string(arch), "method": method,
                       "recipe": args.recipe, "steps": n,
                       "rounding": peers.rounding_of(method), "val_images": int(len(val_y)),
                       "calib_images": int(len(calib)), "fp32_val_top1": round(fp32, 2),
                       "val_top1": round(top1, 2), "drop": round(top1 - fp32, 2),
                       "ptq_cpu_seconds": round(cpu, 1)}
                rows.append(row)
                print("  " + "  ".join(f"{k}={v}" for k, v in row.items() if k != "arch"),
                      flush=True)
    out = Path(args.out)
    commands = [recipes.command_line(argv)]
    if args.merge and out.is_file():
        old = json.loads(out.read_text())
        now = {(r["subnet"], recipe_of(r), r["steps"]) for r in rows}
        rows = [r for r in old["results"]
                if (r["subnet"], recipe_of(r), r["steps"]) not in now] + rows
        commands = old.get("commands", []) + commands
    rows.sort(key=lambda r: (r["subnet"], RECIPES.index(recipe_of(r)), r["steps"]))
    chosen = choose(rows, args.tolerance)
    doc = {"command": " && ".join(commands), "commands": commands,
           "machine": describe_machine(), "date": recipes.now_iso(),
           "rule": f"W4A8 rows: highest mean validation top-1 over subnets; fewer steps within "
                   f"{args.tolerance} point preferred", "chosen_steps": chosen, "results": rows}
    recipes.write_json(out, doc)
    lines = ["| subnet | recipe | steps | validation top-1 (drop vs FP32) | PTQ CPU s |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['subnet']} | {recipe_of(r)} | {r['steps'] or 'nearest'} | "
                     f"{r['val_top1']:.2f} "
                     f"({r['drop']:+.2f}) | {r['ptq_cpu_seconds']:.0f} |")
    print("\n".join(lines))
    print(f"chosen steps: {chosen}; wrote {out}")
    if paused:
        print(paused)
        return 3
    return 0


if __name__ == "__main__":
    recipes.run_script(main, "adaround_steps")
