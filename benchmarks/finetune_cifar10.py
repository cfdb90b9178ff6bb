"""Fine-tuning three models of a CIFAR-10 front: test accuracy before and after, and GPU time.

For a finished run directory (``hwnas run`` / ``hwnas search`` on CIFAR-10) it picks three
models of one device's Pareto front - the slowest (largest), the middle and the fastest
(smallest) by that device's latency - and fine-tunes each with ``Run.finetune``
(:mod:`hwnas.export.finetune`: distillation from the supernet's largest subnet, LSQ QAT when the
model has a bit policy, the best validation epoch kept, saved to ``RUN/finetune/trial_NNNN``
and exported again, verified). It prints a table - model, arch, policy, test accuracy before
(as the search scored it) and after, training seconds, GPU minutes (the whole call: rebuild,
evaluation, training, export) - and writes ``benchmarks/finetune_cifar10.json`` (keys command,
machine, date, results). The exported files are verified but not timed (``--devices`` to time
them on CPU devices of this machine)::

    python benchmarks/finetune_cifar10.py RUN_DIR --front cpu-ort-1t --epochs 5 --device cuda
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from hwnas.export.finetune import FinetuneSettings
from hwnas.latency.machine import describe_machine

import hwnas
from hwnas.core.errors import UserError
from hwnas.core.io import write_json

OUT_JSON = Path(__file__).with_suffix(".json")
ROLES = ("largest", "middle", "smallest")


def pick_models(front: Any, device: str) -> list[tuple[str, int]]:
    """``[(role, trial)]``: the slowest, the middle and the fastest model of ``front`` (a
    Pareto front DataFrame) by ``latency_ms:<device>``; a front of fewer than three models
    gives each of them once (two: largest and smallest)."""
    column = f"latency_ms:{device}"
    if column not in front or front.empty:
        raise UserError(f"the front has no models with a {column} column")
    ordered = front.sort_values([column, "trial"], ascending=[False, True])["trial"].tolist()
    picks = {"largest": ordered[0], "middle": ordered[len(ordered) // 2],
             "smallest": ordered[-1]}
    chosen: dict[str, int] = {}
    for role in ("largest", "smallest", "middle"):  # a short front loses its middle first
        if picks[role] not in chosen.values():
            chosen[role] = int(picks[role])
    return [(role, chosen[role]) for role in ROLES if role in chosen]


def policy_label(policy: dict | None) -> str:
    """``float``, ``w8a8`` for a uniform policy, else ``mixed w<lo>-<hi> a<lo>-<hi>``."""
    if not policy:
        return "float"
    layers = policy.get("layers", {}).values()
    w = sorted({int(v["w_bits"]) for v in layers})
    a = sorted({int(v["a_bits"]) for v in layers})
    if len(w) == 1 and len(a) == 1:
        return f"w{w[0]}a{a[0]}"
    return f"mixed w{w[0]}-{w[-1]} a{a[0]}-{a[-1]}"


def finetune_models(run: Any, picks: list[tuple[str, int]], settings: FinetuneSettings, *,
                    devices: list[str], progress: bool,
                    on_row: Any = None) -> list[dict[str, Any]]:
    """Fine-tune each picked trial; one result row per model (printed as it finishes, and
    handed to ``on_row(rows)`` so a run cut off later keeps what it measured)."""
    rows = []
    for role, trial in picks:
        start = time.perf_counter()
        result = run.finetune(trial, settings=settings, overwrite=True, progress=progress,
                              devices=devices)
        wall = time.perf_counter() - start
        export = result.export
        rows.append({
            "model": role, "trial": trial, "arch": result.arch,
            "policy": policy_label(result.policy),
            "test_before": round(result.before["test"], 2),
            "test_after": round(result.after["test"], 2),
            "val_before": round(result.before["val"], 2), "val_after": round(result.after["val"], 2),
            "epochs": result.epochs, "kept_epoch": result.kept_epoch,
            "train_seconds": round(result.seconds, 1), "seconds": round(wall, 1),
            "gpu_minutes": round(wall / 60.0, 2) if result.device.startswith("cuda") else None,
            "device": result.device, "export": export.status,
            "files": [f.path for f in export.files if f.written],
            "export_errors": export.errors,
            "qdq_agreement": next((f.top1_agreement for f in export.files
                                   if f.path.startswith("qdq/")), None),
            "out_dir": str(result.out_dir)})
        print(table(rows[-1:], header=len(rows) == 1), flush=True)
        if on_row is not None:
            on_row(rows)
    return rows


def table(rows: list[dict[str, Any]], *, header: bool = True) -> str:
    """The rows as a Markdown table."""
    lines = []
    if header:
        lines += [("| model | trial | arch | policy | test before % | test after % | train s | "
                   "GPU min | export |"), "|---|---:|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        gpu = "-" if r["gpu_minutes"] is None else f"{r['gpu_minutes']:.2f}"
        lines.append(f"| {r['model']} | {r['trial']} | `{r['arch']}` | {r['policy']} | "
                     f"{r['test_before']:.2f} | {r['test_after']:.2f} | {r['train_seconds']:.1f} "
                     f"| {gpu} | {r['export']} |")
    return "\n".join(lines)


def machine(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        gpu = f"{torch.cuda.get_device_name(index)}, torch {torch.__version__}"
    else:
        gpu = f"no GPU used, torch {torch.__version__}"
    return describe_machine(f"{gpu}, Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="a finished CIFAR-10 run directory")
    p.add_argument("--front", help="device whose front to pick from (default: the run's first)")
    p.add_argument("--models", default=",".join(ROLES),
                   help="which of largest,middle,smallest (default all three)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=FinetuneSettings.lr)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device", default="cuda")
    p.add_argument("--devices", default="",
                   help="CPU devices measurable here to time the exported files on (default none)")
    p.add_argument("--out", type=Path, default=OUT_JSON)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    words = [sys.argv[0], *sys.argv[1:]] if argv is None else ["benchmarks/finetune_cifar10.py", *argv]
    command = "python " + " ".join(shlex.quote(a) for a in words)
    roles = [r.strip() for r in args.models.split(",") if r.strip()]
    try:
        if not roles or any(r not in ROLES for r in roles):
            raise UserError(f"--models: expected some of {','.join(ROLES)}, got {args.models!r}")
        settings = FinetuneSettings(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                                    device=args.device)
        settings.validate()
        run = hwnas.load_run(args.run_dir)
        front = args.front or next(iter(run.fronts), None)
        if front not in run.fronts:
            raise UserError(f"{args.run_dir} has no front for device {front!r}; fronts: "
                            f"{', '.join(run.fronts) or 'none'}")
        if args.device.startswith("cuda"):
            torch.backends.cudnn.benchmark = True
        picks = [(role, t) for role, t in pick_models(run.fronts[front], front) if role in roles]
        doc = {"command": command, "machine": machine(args.device),
               "date": datetime.now(UTC).isoformat(timespec="seconds"),
               "run_dir": str(args.run_dir), "dataset": run.settings.get("dataset"),
               "front": front,
               "settings": {"epochs": args.epochs, "lr": args.lr,
                            "batch_size": args.batch_size, "device": args.device}}

        def write(rows: list[dict[str, Any]]) -> None:
            gpu = (round(sum(r["seconds"] for r in rows) / 60.0, 2)
                   if args.device.startswith("cuda") else None)
            write_json(args.out, {**doc, "total_gpu_minutes": gpu, "results": rows})

        rows = finetune_models(run, picks, settings, progress=not args.quiet,
                               devices=[d.strip() for d in args.devices.split(",") if d.strip()],
                               on_row=write)
    except UserError as exc:
        print(f"finetune_cifar10: error: {exc}", file=sys.stderr)
        return 2
    print(f"\n{table(rows)}\n\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
