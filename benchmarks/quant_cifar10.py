"""Quantization table on CIFAR-10 for a trained supernet checkpoint of any space (mbv3, vit).

FP32, int8 PTQ (min-max, percentile, MSE), W4A8 PTQ and QAT, and a mixed policy at about 5
average weight bits, for the largest, middle and smallest subnets.

    python benchmarks/quant_cifar10.py --checkpoint CKPT.pt --data cifar10 --device cuda
    python benchmarks/quant_cifar10.py --checkpoint supernet/checkpoints/vit_cifar10.pt \
        --device cpu --subnets smallest --out benchmarks/quant_cifar10_vit.json --merge

Prints a table and writes --out (default benchmarks/quant_cifar10.json, the mbv3 table; keys of
/work/shared/BENCHMARKS.md). Targets (issue 5): int8 PTQ within 0.5 points of FP32, W4A8 QAT
within 1.5, mixed within 1. The recipes are in benchmarks/quant_recipes.py. Imports only torch,
numpy and hwnas packages.
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
from hwnas.supernet.train import load_checkpoint, with_training_augment

from hwnas.core.errors import UserError

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="CIFAR-10 supernet checkpoint of any space (e.g. supernet/checkpoints/"
                        "mbv3_cifar10.pt or vit_cifar10.pt)")
    p.add_argument("--data", default="cifar10",
                   help="'cifar10' (shared npz via $HWNAS_SHARED_DATA) or a dataset path")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--qat-epochs", type=int, default=3)
    p.add_argument("--qat-max-steps", type=int, default=None)
    p.add_argument("--qat-batch-size", type=int, default=256)
    p.add_argument("--qat-lr", type=float, default=3e-3)
    p.add_argument("--qat-scale-lr", type=float, default=None,
                   help="LSQ step-size learning rate (default: --qat-lr, one rate as LSQ prescribes)")
    p.add_argument("--calib-images", type=int, default=512)
    p.add_argument("--hessian-samples", type=int, default=8)
    p.add_argument("--hessian-images", type=int, default=256)
    p.add_argument("--amp", action="store_true",
                   help="bf16 autocast in QAT (slower on an H200 for these small nets; see quant/qat.py)")
    p.add_argument("--subnets", default=",".join(ROLES))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(HERE / "quant_cifar10.json"),
                   help="JSON to write (keep one file per space, e.g. quant_cifar10_vit.json)")
    p.add_argument("--merge", action="store_true",
                   help="keep the rows of other subnets/methods already in --out (run one subnet per "
                        "command and build up one file)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def bench_config(args: argparse.Namespace) -> QuantBenchConfig:
    """The table's settings from the parsed command line (the step sizes learn at --qat-lr
    unless --qat-scale-lr is given)."""
    return QuantBenchConfig(
        subnets=tuple(s for s in args.subnets.split(",") if s),
        methods=tuple(m for m in args.methods.split(",") if m),
        calib_images=args.calib_images, qat_epochs=args.qat_epochs,
        qat_max_steps=args.qat_max_steps, qat_batch_size=args.qat_batch_size, qat_lr=args.qat_lr,
        qat_scale_lr=args.qat_lr if args.qat_scale_lr is None else args.qat_scale_lr,
        hessian_samples=args.hessian_samples, hessian_images=args.hessian_images, qat_amp=args.amp,
        seed=args.seed, progress=not args.quiet)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {args.device} requested but CUDA is not available")
    torch.manual_seed(args.seed)
    if args.device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True
    start = time.perf_counter()
    space, supernet, payload = load_checkpoint(args.checkpoint, device=args.device)
    data = with_training_augment(load_dataset(args.data, seed=args.seed),
                                 payload.get("train_config"))
    if tuple(space.input_shape) != (data.in_channels, *data.image_size) or space.num_classes != data.num_classes:
        raise UserError(f"checkpoint space {space.name} expects inputs {space.input_shape} and "
                        f"{space.num_classes} classes; dataset {args.data} has "
                        f"{(data.in_channels, *data.image_size)} and {data.num_classes}")
    config = bench_config(args)
    rows = run_quant_benchmark(supernet, space, data, config)
    commands = []
    if args.merge and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        rows = merge_rows(old.get("results", []), rows)
        commands = old.get("commands") or ([old["command"]] if "command" in old else [])
    print(format_table(rows))
    command = recipes.command_line(argv)
    result = {
        "command": " && ".join([*commands, command]),
        "commands": [*commands, command],
        "machine": machine_description(args.device),
        "date": now_iso(),
        "dataset": args.data,
        "space": space.name,
        "checkpoint": args.checkpoint,
        "checkpoint_dataset": payload.get("dataset"),
        "total_seconds": round(time.perf_counter() - start, 1),
        "results": rows,
    }
    path = write_json(args.out, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    recipes.run_script(main, "quant_cifar10")
