"""Harness pieces of the CIFAR-10 supernet benchmark (benchmarks/supernet_cifar10.md) around
``hwnas train``:

    python benchmarks/cifar_tools.py prepare --source cifar10 --out data/cifar10-decoded.npz
    python benchmarks/cifar_tools.py rank --out runs/nb --truth data/nb201_cifar100_accuracy.csv
    python benchmarks/cifar_tools.py subset --source data/cifar10-jpeg.npz --per-class 500 \
        --out data/c10_probe.npz

``prepare`` decodes a dataset once (Pillow for JPEGs) into a numpy-only ``.npz`` that
``hwnas train --dataset FILE`` reads on a machine without Pillow. ``rank`` evaluates random
subnets of a trained run directory's supernet (BatchNorm recalibrated) and writes
``rank.json`` with the Kendall tau between their accuracies and ground-truth ones from a CSV
(an ``arch`` column of canonical strings and an accuracy column), e.g. NAS-Bench-201's.
``subset`` writes a cifar10-jpeg ``.npz`` of the first ``--per-class`` training images of each
class (and a tenth as many test images), a few MiB that can travel where the whole file cannot
(h200_vit.sh's speed probe).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hwnas.core.cli_args import EXIT_USER_ERROR, OneLineParser, positive_int
from hwnas.core.errors import UserError
from hwnas.core.io import write_json

PROG = "cifar_tools"


def kendall_tau(a: Any, b: Any) -> float:
    """Kendall's tau-b of two equally long sequences (scipy's); NaN when either is constant."""
    from scipy.stats import kendalltau

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise UserError(f"kendall_tau needs two 1-D sequences of one length, got {x.shape} "
                        f"and {y.shape}")
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(kendalltau(x, y)[0])


def read_truth(path: str | Path, column: str | None = None) -> tuple[str, dict[str, float]]:
    """The ground-truth CSV: (accuracy column name, {arch string: accuracy}). Without
    ``column`` the file must have exactly one numeric column besides ``arch`` and ``arch_idx``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--truth {path} does not exist; expected a CSV with an 'arch' column")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "arch" not in rows[0]:
        raise UserError(f"--truth {path}: expected a CSV with a header holding 'arch' and an "
                        f"accuracy column")
    if column is None:
        def numeric(k: str) -> bool:
            try:
                float(rows[0][k])
            except (TypeError, ValueError):
                return False
            return True
        candidates = [k for k in rows[0] if k not in ("arch", "arch_idx") and numeric(k)]
        if len(candidates) != 1:
            raise UserError(f"--truth {path}: cannot tell the accuracy column among {candidates}; "
                            f"pass --column")
        column = candidates[0]
    if column not in rows[0]:
        raise UserError(f"--truth {path} has no column {column!r}; columns: {list(rows[0])}")
    try:
        return column, {r["arch"]: float(r[column]) for r in rows}
    except ValueError as exc:
        raise UserError(f"--truth {path}: column {column!r} is not numeric ({exc})") from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Decode a dataset into a numpy-only .npz (prepare); "
                                             "rank a run's subnets against ground truth (rank).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    q = sub.add_parser("prepare", help="decode a dataset once into a .npz hwnas train reads "
                                       "without Pillow")
    q.add_argument("--source", default="cifar10",
                   help="dataset to decode (default: cifar10, the shared cifar10-jpeg.npz)")
    q.add_argument("--out", required=True, help="the .npz to write")
    q.add_argument("--seed", type=int, default=0, help="seed of the train/validation split")
    t = sub.add_parser("subset", help="a small class-balanced cifar10-jpeg .npz (speed probes)")
    t.add_argument("--source", required=True, help="a cifar10-jpeg .npz")
    t.add_argument("--per-class", type=positive_int, default=500,
                   help="training images per class (default 500; test: a tenth, at least 1)")
    t.add_argument("--out", required=True, help="the .npz to write")
    r = sub.add_parser("rank", help="Kendall tau of a run's supernet accuracies against a CSV")
    r.add_argument("--out", required=True,
                   help="run directory of hwnas train (its supernet.pt, else checkpoint.pt)")
    r.add_argument("--truth", required=True,
                   help="CSV with an 'arch' column (the space's canonical strings) and an accuracy column")
    r.add_argument("--column", default=None, help="the accuracy column (default: the only numeric one)")
    r.add_argument("--num", type=positive_int, default=50, help="random subnets (default 50)")
    r.add_argument("--seed", type=int, default=0, help="seed of the sampled subnets")
    r.add_argument("--split", choices=("val", "test"), default="val",
                   help="split the supernet accuracies are measured on (default val)")
    r.add_argument("--calib-batches", type=positive_int, default=20,
                   help="BatchNorm recalibration batches per subnet (default 20)")
    r.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    return p


def cmd_prepare(args: argparse.Namespace) -> int:
    from hwnas.supernet.data import load_dataset
    from hwnas.supernet.decoded import save_decoded

    out = Path(args.out)
    if out.suffix.lower() != ".npz":
        raise UserError(f"--out {out}: expected a file name ending in .npz")
    t0 = time.perf_counter()
    data = load_dataset(args.source, seed=args.seed)
    save_decoded(data, out)
    print(f"decoded {data.name}: {len(data.train)} train, {len(data.val)} val, {len(data.test)} "
          f"test images {tuple(data.train.images.shape[1:])} in {time.perf_counter() - t0:.1f} s "
          f"-> {out} ({out.stat().st_size / 2**20:.0f} MiB)")
    return 0


def cmd_subset(args: argparse.Namespace) -> int:
    from hwnas.core.io import write_atomic

    out = Path(args.out)
    if out.suffix.lower() != ".npz":
        raise UserError(f"--out {out}: expected a file name ending in .npz")
    keys = [f"{s}_{k}" for s in ("train", "test") for k in ("jpeg", "offsets", "labels")]
    try:
        with np.load(args.source, allow_pickle=False) as z:
            src = {k: z[k] for k in [*keys, "classes"]}
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"--source {args.source}: not a cifar10-jpeg .npz with {', '.join(keys)} "
                        f"and classes ({str(exc).splitlines()[0]})") from None
    arrays: dict[str, np.ndarray] = {"classes": src["classes"]}
    for split, n in (("train", args.per_class), ("test", max(1, args.per_class // 10))):
        labels, off, jpeg = src[f"{split}_labels"], src[f"{split}_offsets"], src[f"{split}_jpeg"]
        picked = []
        for c in range(len(src["classes"])):
            idx = np.flatnonzero(labels == c)[:n]
            if len(idx) < n:
                raise UserError(f"--per-class {n}: the {split} split has {len(idx)} images of "
                                f"class {c}")
            picked.append(idx)
        order = np.sort(np.concatenate(picked))  # the source's order, classes interleaved
        parts = [jpeg[off[i]:off[i + 1]] for i in order]
        arrays[f"{split}_jpeg"] = np.concatenate(parts)
        arrays[f"{split}_offsets"] = np.concatenate(
            [[0], np.cumsum([len(b) for b in parts])]).astype(np.int64)
        arrays[f"{split}_labels"] = labels[order]

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    write_atomic(out, save)
    print(f"{len(arrays['train_labels'])} train and {len(arrays['test_labels'])} test images -> "
          f"{out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0


def cmd_rank(args: argparse.Namespace) -> int:
    import torch
    from hwnas.supernet.decoded import load_training_data
    from hwnas.supernet.evaluate import evaluate_subnet
    from hwnas.supernet.train import load_checkpoint, with_training_augment

    out = Path(args.out)
    run_file = out / "run.json"
    if not run_file.is_file():
        raise UserError(f"--out {out} holds no run (no run.json)")
    settings = json.loads(run_file.read_text())["settings"]
    if settings.get("standalone"):
        raise UserError(f"--out {out} is a standalone run; rank needs a supernet run")
    ckpt = next((c for c in (out / "supernet.pt", out / "checkpoint.pt") if c.is_file()), None)
    if ckpt is None:
        raise UserError(f"--out {out} holds no supernet.pt or checkpoint.pt")
    column, truth = read_truth(args.truth, args.column)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    data = load_training_data(settings["data"], seed=0, limit_train=settings.get("limit_train"),
                              limit_eval=settings.get("limit_eval"))
    space, supernet, payload = load_checkpoint(ckpt, device=device)
    data = with_training_augment(data, payload.get("train_config"))
    rng = np.random.default_rng(args.seed)
    archs: dict[str, Any] = {}
    for _ in range(1000 * args.num):  # distinct architectures
        if len(archs) == args.num:
            break
        a = space.sample(rng)
        archs.setdefault(space.to_string(a), a)
    missing = [t for t in archs if t not in truth]
    if missing:
        raise UserError(f"--truth {args.truth} lacks {len(missing)} of the sampled architectures, "
                        f"e.g. {missing[0]!r}; is it a table of space {space.name}?")
    t0 = time.perf_counter()
    rows = []
    for text, a in archs.items():
        acc, _ = evaluate_subnet(supernet, a, data, split=args.split,
                                 calib_batches=args.calib_batches, batch_size=500)
        rows.append({"arch": text, "supernet_top1": acc, "truth": truth[text]})
    tau = kendall_tau([r["supernet_top1"] for r in rows], [r["truth"] for r in rows])
    report = {"checkpoint": str(ckpt), "space": space.name, "split": args.split,
              "truth": str(args.truth), "truth_column": column, "num": len(rows),
              "seed": args.seed, "kendall_tau": tau, "seconds": time.perf_counter() - t0,
              "subnets": rows}
    write_json(out / "rank.json", report)
    print(f"rank: {len(rows)} subnets of {space.name} ({args.split} split) vs {column}: "
          f"Kendall tau {tau:.3f} -> {out / 'rank.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"prepare": cmd_prepare, "rank": cmd_rank,
                "subset": cmd_subset}[args.command](args)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
