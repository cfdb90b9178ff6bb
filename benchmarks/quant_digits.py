"""Quantization table on the digits default: FP32, int8 PTQ (min-max, percentile, MSE), W4A8
PTQ and QAT, and a mixed policy at about 5 average weight bits, for the largest, middle and
smallest subnets of the mbv3-tiny supernet. Runs on the CPU in minutes.

    python benchmarks/quant_digits.py                      # trains the supernet first
    python benchmarks/quant_digits.py --checkpoint runs/digits-mbv3-tiny/supernet.pt

Prints a table and writes benchmarks/quant_digits.json (keys of /work/shared/BENCHMARKS.md,
quant_cifar10.json). The recipes are in benchmarks/quant_recipes.py.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import quant_recipes as recipes
except ModuleNotFoundError:
    from benchmarks import quant_recipes as recipes
(METHODS, ROLES, QuantBenchConfig, format_table, machine_description, merge_rows, now_iso, run_quant_benchmark, write_json) = (
    recipes.METHODS, recipes.ROLES, recipes.QuantBenchConfig, recipes.format_table, recipes.machine_description, recipes.merge_rows, recipes.now_iso, recipes.run_quant_benchmark, recipes.write_json)
from hwnas.supernet.data import load_dataset
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import (
    load_checkpoint,
    sandwich_config,
    save_checkpoint,
    train_supernet,
    with_training_augment,
)

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="supernet checkpoint (hwnas train); trained here if absent")
    p.add_argument("--save-checkpoint", help="where to save the supernet trained here")
    p.add_argument("--epochs", type=int, default=15, help="supernet training epochs (default 15)")
    p.add_argument("--qat-epochs", type=int, default=3)
    p.add_argument("--calib-images", type=int, default=512)
    p.add_argument("--subnets", default=",".join(ROLES))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: robust on a shared, oversubscribed CPU)")
    p.add_argument("--out", default=str(HERE / "quant_digits.json"))
    p.add_argument("--merge", action="store_true",
                   help="keep the rows of other subnets/methods already in --out (run one subnet per "
                        "command and build up one file)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = load_dataset("digits", seed=args.seed)
    start = time.perf_counter()
    if args.checkpoint:
        space, supernet, payload = load_checkpoint(args.checkpoint)
        data = with_training_augment(data, payload.get("train_config"))
        train_info = {"checkpoint": args.checkpoint, "epochs": (payload.get("train_config") or {}).get("stages")}
    else:
        space = get_space("mbv3-tiny", in_channels=data.in_channels, image_size=data.image_size[0],
                          num_classes=data.num_classes)
        supernet = space.build_supernet()
        cfg = sandwich_config(args.epochs, seed=args.seed)
        result = train_supernet(supernet, space, data, cfg, progress=not args.quiet)
        train_info = {"epochs": args.epochs, "train_seconds": round(result.seconds, 1)}
        if args.save_checkpoint:
            save_checkpoint(args.save_checkpoint, supernet, space, dataset="digits", train_config=cfg)
    config = QuantBenchConfig(
        subnets=tuple(s for s in args.subnets.split(",") if s),
        methods=tuple(m for m in args.methods.split(",") if m),
        calib_images=args.calib_images, qat_epochs=args.qat_epochs, seed=args.seed,
        progress=not args.quiet)
    rows = run_quant_benchmark(supernet, space, data, config)
    commands = []
    if args.merge and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        rows = merge_rows(old.get("results", []), rows)
        commands = old.get("commands") or ([old["command"]] if "command" in old else [])
    print(format_table(rows))
    command = recipes.command_line(argv)
    payload = {
        "command": " && ".join([*commands, command]),
        "commands": [*commands, command],
        "machine": machine_description("cpu"),
        "date": now_iso(),
        "dataset": "digits",
        "space": space.name,
        "supernet": train_info,
        "total_seconds": round(time.perf_counter() - start, 1),
        "results": rows,
    }
    path = write_json(args.out, payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    recipes.run_script(main, "quant_digits")
