"""Train, resume, evaluate and benchmark supernets (and standalone subnets) on CIFAR-sized data.

The entry point for the GPU machine; it needs only torch and numpy (tqdm is optional; Pillow
only to decode JPEG datasets, which a pre-decoded ``.npz`` avoids)::

    python -m hwnas.supernet.train_cifar prepare --out data/cifar10-decoded.npz   # decode once (Pillow)
    python -m hwnas.supernet.train_cifar --data data/cifar10-decoded.npz --space mbv3 \\
        --schedule deps --epochs 60 --batch-size 512 --out runs/mbv3 --max-minutes 9
    python -m hwnas.supernet.train_cifar --out runs/mbv3 --resume --max-minutes 9 --eval
    python -m hwnas.supernet.train_cifar --data ... --standalone largest --epochs 60 --out runs/sa-largest
    python -m hwnas.supernet.train_cifar rank --out runs/nb201 --truth nb201_cifar100_accuracy.csv
    torchrun --nproc_per_node=2 -m hwnas.supernet.train_cifar --data ... --out runs/mbv3-ddp ...

A run directory (``--out``) holds ``run.json`` (the settings; ``--resume`` reads them back, so
a resumed chunk needs only ``--out``), ``checkpoint.pt`` (resumable: weights, optimizer, step,
RNG states), ``train_log.json`` (one record per invocation: steps, seconds, images/s; the
per-epoch losses), and once training is complete ``supernet.pt`` (or ``model.pt`` for
``--standalone``: final weights only, ``--half-weights`` for float16) and with ``--eval``
``eval.json`` (top-1 of the largest, smallest and three random subnets on the test split,
each extracted and BatchNorm-recalibrated on augmented training images).

``--max-minutes`` ends training (with a checkpoint) once that much time has passed since the
command started, so a long training is a series of commands below a per-command limit; each
prints ``not finished`` and the next one continues with ``--resume``.

``rank`` evaluates random subnets of a trained run's supernet (BatchNorm recalibrated) and
writes ``rank.json`` with the Kendall tau between their accuracies and ground-truth ones from
a CSV (an ``arch`` column of canonical strings and an accuracy column), e.g. NAS-Bench-201's.

Bad input raises :class:`hwnas.core.errors.UserError`: one ``train_cifar: error: ...`` line and
exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hwnas.supernet.data import AUGMENT_KINDS, DatasetSplits, ImageSplit, load_dataset
from hwnas.supernet.fingerprint import training_record

from hwnas.core.cli_args import OneLineParser, positive_float, positive_int
from hwnas.core.errors import UserError
from hwnas.core.io import write_atomic, write_json

PROG = "train_cifar"
from hwnas.core.cli_args import EXIT_USER_ERROR  # noqa: E402  (re-exported)

#: Keys of a pre-decoded dataset file written by ``prepare``.
DECODED_KEYS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test", "classes", "mean", "std")
#: Seed of the random subnets that ``--eval`` reports (and ``--standalone randomN`` trains).
EVAL_SEED = 2024
NUM_RANDOM_EVAL = 3


# -- pre-decoded datasets --------------------------------------------------------------------------

def save_decoded(data: DatasetSplits, path: str | Path) -> Path:
    """Write a dataset's splits as raw uint8 arrays (NCHW) with labels, class names and the
    train statistics, so that a machine without Pillow can load it (:func:`load_decoded`)."""
    def save(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(
                fh,
                x_train=data.train.images.numpy(), y_train=data.train.labels.numpy(),
                x_val=data.val.images.numpy(), y_val=data.val.labels.numpy(),
                x_test=data.test.images.numpy(), y_test=data.test.labels.numpy(),
                classes=np.asarray(data.classes), mean=np.asarray(data.mean, dtype=np.float64),
                std=np.asarray(data.std, dtype=np.float64), name=np.asarray(data.name),
                augment=np.asarray(data.augment),
            )

    return write_atomic(path, save)


def is_decoded(path: str | Path) -> bool:
    """Whether ``path`` is a ``.npz`` written by :func:`save_decoded`."""
    path = Path(path)
    if not (path.is_file() and path.suffix.lower() == ".npz"):
        return False
    try:
        with np.load(path, allow_pickle=False) as npz:
            return "x_train" in npz.files
    except Exception:
        return False


def load_decoded(path: str | Path) -> DatasetSplits:
    """Load a file written by :func:`save_decoded` (numpy only, no image decoding)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in DECODED_KEYS if k not in npz.files]
            if missing:
                raise UserError(f"{path} is not a decoded dataset: missing key(s) {', '.join(missing)}")
            a = {k: npz[k] for k in npz.files}
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"cannot read decoded dataset {path}: {exc}") from None

    def split(x: str, y: str) -> ImageSplit:
        images, labels = a[x], a[y]
        if images.dtype != np.uint8 or images.ndim != 4 or labels.shape != (images.shape[0],):
            raise UserError(f"{path}: {x} must be uint8 (N, C, H, W) with {y} of length N, got "
                            f"{images.dtype} {images.shape} and {labels.shape}")
        return ImageSplit(torch.from_numpy(np.ascontiguousarray(images)),
                          torch.from_numpy(labels.astype(np.int64)))

    return DatasetSplits(
        name=str(a["name"]) if "name" in a else path.stem,
        train=split("x_train", "y_train"), val=split("x_val", "y_val"),
        test=split("x_test", "y_test"),
        classes=[str(c) for c in a["classes"].tolist()],
        mean=tuple(float(v) for v in a["mean"]), std=tuple(float(v) for v in a["std"]),
        augment=str(a["augment"]) if "augment" in a else "crop_flip",
    )


def load_data(spec: str, *, seed: int = 0, limit_train: int | None = None,
              limit_eval: int | None = None) -> DatasetSplits:
    """A decoded ``.npz`` (fast, numpy only) or anything :func:`hwnas.supernet.data.load_dataset`
    reads; optionally only ``limit_train`` training and ``limit_eval`` val/test images, a
    random subset drawn with ``seed`` (smoke runs)."""
    data = load_decoded(spec) if is_decoded(spec) else load_dataset(spec, seed=seed)

    def head(s: ImageSplit, n: int | None) -> ImageSplit:
        # a seeded random subset (files may be sorted by class, so the first n would not do)
        if n is None or n >= len(s):
            return s
        idx = torch.from_numpy(np.sort(np.random.default_rng(seed).permutation(len(s))[:n]))
        return ImageSplit(s.images[idx].contiguous(), s.labels[idx].contiguous())

    if limit_train is not None or limit_eval is not None:
        data = DatasetSplits(data.name, head(data.train, limit_train), head(data.val, limit_eval),
                             head(data.test, limit_eval), data.classes, data.mean, data.std,
                             data.augment)
    return data


# -- command line ------------------------------------------------------------------------------------



#: Settings that define a training run (stored in run.json; --resume takes them from there).
RUN_KEYS = ("data", "space", "schedule", "epochs", "batch_size", "lr", "weight_decay",
            "label_smoothing", "warmup_epochs", "grad_clip", "num_random", "full_fraction", "seed",
            "standalone", "limit_train", "limit_eval", "compile", "subnet_loss", "augment")
#: torch.compile modes that --compile accepts ("off": none; on --resume it overrides the run's).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "off")


def build_parser() -> argparse.ArgumentParser:
    from hwnas.supernet.train import SCHEDULES, SUBNET_LOSSES

    p = OneLineParser(prog=f"python -m hwnas.supernet.{PROG}",
                description="Train an hwnas supernet (or a standalone subnet) on CIFAR-sized "
                            "images, resumably, on CPU, one GPU or several (torchrun). "
                            "'prepare --out FILE' decodes a dataset into a numpy-only .npz.")
    p.add_argument("--data", default="cifar10",
                   help="a decoded .npz from 'prepare', or any dataset hwnas reads ('cifar10', a "
                        "cifar10-jpeg .npz, 'digits', ...) (default: cifar10)")
    p.add_argument("--space", default="mbv3", help="search space (default: mbv3)")
    p.add_argument("--schedule", choices=SCHEDULES, default="sandwich",
                   help="supernet schedule preset (default: sandwich)")
    p.add_argument("--epochs", type=positive_int, default=30, help="training epochs (default 30)")
    p.add_argument("--batch-size", type=positive_int, default=256,
                   help="global batch size over all processes (default 256)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help="peak learning rate (default 0.1 × batch size / 128)")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="(default 5e-4)")
    p.add_argument("--label-smoothing", type=float, default=0.1, help="(default 0.1)")
    p.add_argument("--warmup-epochs", type=float, default=2.0, help="(default 2)")
    p.add_argument("--grad-clip", type=float, default=5.0,
                   help="clip the step's gradient norm (summed over the sandwich's subnets) to "
                        "this; 0 = off (default 5)")
    p.add_argument("--num-random", type=int, default=2,
                   help="random subnets per sandwich step (default 2)")
    p.add_argument("--subnet-loss", choices=SUBNET_LOSSES, default="mean",
                   help="combine the losses of a sandwich step's subnets by their mean (the "
                        "step then has one network's scale, so the standalone learning rate "
                        "applies), their sum (BigNAS), or the largest's plus the mean of the "
                        "others' (largest+mean) (default: mean)")
    p.add_argument("--full-fraction", type=float, default=0.5,
                   help="deps schedule: share of the epochs that train only the full network "
                        "(default 0.5)")
    p.add_argument("--augment", choices=AUGMENT_KINDS, default=None,
                   help="training augmentation (default: the dataset's, crop_flip for CIFAR-style "
                        "images); crop_flip_cutout adds a 16x16 cutout, trivial_crop_flip_cutout "
                        "one TrivialAugment operation per image before that. BatchNorm "
                        "recalibration for --eval uses the same")
    p.add_argument("--seed", type=int, default=0, help="seed of data order, augmentation, subnets")
    p.add_argument("--out", help="run directory (checkpoint, logs, final weights, eval)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue the run in --out with its recorded settings")
    g.add_argument("--overwrite", action="store_true", help="start the run in --out afresh")
    p.add_argument("--max-minutes", type=positive_float, default=None,
                   help="stop training (checkpointed) this many minutes after the command started")
    p.add_argument("--checkpoint-every-s", type=positive_float, default=120.0,
                   help="seconds between checkpoints while training (default 120)")
    p.add_argument("--eval", action="store_true",
                   help="once training is complete: test top-1 of largest, smallest and 3 random "
                        "subnets (BN recalibrated) -> eval.json")
    p.add_argument("--eval-unfinished", action="store_true",
                   help="with --eval: evaluate also when this command ends before training is "
                        "complete (eval.json then says training_completed: false)")
    p.add_argument("--calib-batches", type=positive_int, default=40,
                   help="with --eval: BatchNorm recalibration batches per supernet subnet, "
                        "augmented like training (default 40)")
    p.add_argument("--calib-batch-size", type=positive_int, default=256,
                   help="with --eval: images per recalibration batch (default 256)")
    p.add_argument("--standalone", metavar="ARCH",
                   help="train this subnet from scratch instead of the supernet: an arch string, "
                        "'largest', 'smallest' or 'random1'..'random3' (the random subnets --eval reports)")
    p.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES,
                   metavar="MODE", help="torch.compile the standalone model, or the supernet's "
                   "largest and smallest subnets (random subnets run eagerly); optional mode: "
                   "default, reduce-overhead, max-autotune, or off. It changes speed only, so on "
                   "--resume it overrides the run's setting")
    p.add_argument("--cudnn-benchmark", choices=("auto", "on", "off"), default="auto",
                   help="let cuDNN time its algorithms for every new convolution shape (CUDA "
                        "only). Each random subnet of a sandwich step brings new shapes, so this "
                        "tuning stalls a supernet's GPU for minutes; a standalone network has "
                        "one set of shapes and gains. auto = on for --standalone, off for "
                        "supernets (default: auto)")
    p.add_argument("--bench-steps", type=positive_int, default=None,
                   help="only measure training images/s over this many steps (after warm-up)")
    p.add_argument("--limit-train", type=positive_int, default=None,
                   help="use only N training images, a seeded random subset (smoke runs)")
    p.add_argument("--limit-eval", type=positive_int, default=None,
                   help="use only N validation and N test images (smoke runs)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="auto = bf16 autocast on CUDA, fp32 on CPU")
    p.add_argument("--channels-last", choices=("auto", "on", "off"), default="auto",
                   help="auto = on for CUDA")
    p.add_argument("--half-weights", action="store_true",
                   help="write the final supernet.pt in float16 (half the size, for shipping)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def build_prepare_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=f"python -m hwnas.supernet.{PROG} prepare",
                description="Decode a dataset once (needs Pillow for JPEGs) into a numpy-only .npz "
                            "that --data reads without Pillow.")
    p.add_argument("--source", default="cifar10",
                   help="dataset to decode (default: cifar10, the shared cifar10-jpeg.npz)")
    p.add_argument("--out", required=True, help="the .npz to write")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/validation split")
    return p


def cmd_prepare(argv: list[str]) -> int:
    args = build_prepare_parser().parse_args(argv)
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


# -- rank: supernet accuracies against ground truth -------------------------------------------------

def kendall_tau(a: Any, b: Any) -> float:
    """Kendall's tau-b between two equally long sequences (ties handled as scipy's default
    ``kendalltau``; O(n^2), meant for the tens to hundreds of architectures ranked here).
    NaN when either sequence is constant."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"kendall_tau needs two 1-D sequences of one length, got {x.shape} and {y.shape}")
    i, j = np.triu_indices(len(x), 1)
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    n_x, n_y = int(np.count_nonzero(dx)), int(np.count_nonzero(dy))
    if n_x == 0 or n_y == 0:
        return float("nan")
    return float((dx * dy).sum() / np.sqrt(float(n_x) * float(n_y)))


def read_truth(path: str | Path, column: str | None = None) -> tuple[str, dict[str, float]]:
    """The ground-truth CSV: (accuracy column name, {arch string: accuracy}). Without
    ``column`` the file must have exactly one numeric column besides ``arch`` and ``arch_idx``."""
    import csv

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


def build_rank_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=f"python -m hwnas.supernet.{PROG} rank",
                      description="Evaluate random subnets of a trained run's supernet (BN "
                                  "recalibrated) and rank them against ground-truth accuracies "
                                  "(Kendall tau) -> rank.json in the run directory.")
    p.add_argument("--out", required=True, help="run directory (its supernet.pt, else checkpoint.pt)")
    p.add_argument("--truth", required=True,
                   help="CSV with an 'arch' column (the space's canonical strings) and an accuracy column")
    p.add_argument("--column", default=None, help="the accuracy column (default: the only numeric one)")
    p.add_argument("--num", type=positive_int, default=50, help="random subnets (default 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled subnets")
    p.add_argument("--split", choices=("val", "test"), default="val",
                   help="split the supernet accuracies are measured on (default val)")
    p.add_argument("--calib-batches", type=positive_int, default=20,
                   help="BatchNorm recalibration batches per subnet (default 20)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    return p


def cmd_rank(argv: list[str]) -> int:
    from hwnas.supernet.evaluate import evaluate_subnet
    from hwnas.supernet.train import load_checkpoint, with_training_augment

    args = build_rank_parser().parse_args(argv)
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
    data = load_data(settings["data"], seed=0, limit_train=settings["limit_train"],
                     limit_eval=settings["limit_eval"])
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


# -- helpers ---------------------------------------------------------------------------------------

def _settings(args: argparse.Namespace) -> dict[str, Any]:
    s = {k: getattr(args, k) for k in RUN_KEYS}
    if s["lr"] is None:
        s["lr"] = 0.1 * s["batch_size"] / 128
    if s["compile"] == "off":
        s["compile"] = None
    return s


def _eval_archs(space) -> list[tuple[str, Any]]:
    rng = np.random.default_rng(EVAL_SEED)
    archs = [("largest", space.largest()), ("smallest", space.smallest())]
    archs += [(f"random{i + 1}", space.sample(rng)) for i in range(NUM_RANDOM_EVAL)]
    return archs


def _is_standalone(args: argparse.Namespace) -> bool:
    """Whether this command trains a standalone subnet (given, or recorded in a resumed run)."""
    if args.standalone:
        return True
    run_file = Path(args.out) / "run.json" if args.resume and args.out else None
    if run_file is not None and run_file.is_file():
        try:
            return bool(json.loads(run_file.read_text())["settings"].get("standalone"))
        except (ValueError, KeyError, TypeError):
            return False  # _main reports a broken run.json
    return False


def _resolve_arch(space, text: str):
    named = dict(_eval_archs(space))
    if text in named:
        return named[text]
    try:
        return space.from_string(text)
    except UserError as exc:
        raise UserError(f"--standalone {text!r}: {exc} (or use one of {list(named)})") from None


def _train_config(s: dict[str, Any], space):
    from hwnas.supernet.train import schedule_config, standalone_config

    common = dict(batch_size=s["batch_size"], lr=s["lr"], weight_decay=s["weight_decay"],
                  label_smoothing=s["label_smoothing"], warmup_epochs=s["warmup_epochs"],
                  grad_clip=s.get("grad_clip", 5.0), seed=s["seed"],
                  subnet_loss=s.get("subnet_loss", "sum"), augment=s.get("augment"))
    if s["standalone"]:
        return standalone_config(s["epochs"], **common)
    if s["schedule"] == "sandwich":
        from hwnas.supernet.train import TrainConfig, TrainStage

        return TrainConfig(stages=[TrainStage("sandwich", s["epochs"], num_random=s["num_random"])],
                           **common)
    if s["schedule"] == "deps":
        return schedule_config("deps", space, s["epochs"], num_random=s["num_random"],
                               full_fraction=s.get("full_fraction", 0.5), **common)
    return schedule_config(s["schedule"], space, s["epochs"], num_random=s["num_random"], **common)


def _describe(model: torch.nn.Module) -> str:
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters"


# -- main ------------------------------------------------------------------------------------------

def run(argv: list[str] | None = None, *, started: float | None = None) -> int:
    """The command (see the module docstring); returns the exit status."""
    started = time.perf_counter() if started is None else started
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["prepare"]:
        return cmd_prepare(argv[1:])
    if argv[:1] == ["rank"]:
        return cmd_rank(argv[1:])
    args = build_parser().parse_args(argv)

    from hwnas.supernet.distributed import init_from_env, shutdown

    ctx, device = init_from_env(args.device)
    if device.type == "cuda":
        # --cudnn-benchmark: autotune convolution algorithms per new shape; let fp32 work
        # (evaluation) use TF32 tensor cores
        torch.backends.cudnn.benchmark = (args.cudnn_benchmark == "on" or (
            args.cudnn_benchmark == "auto" and _is_standalone(args)))
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    try:
        return _main(args, ctx, device, started)
    finally:
        shutdown(ctx)


def _main(args: argparse.Namespace, ctx, device: torch.device, started: float) -> int:
    from hwnas.supernet.evaluate import accuracy, eval_loader, evaluate_subnet
    from hwnas.supernet.spaces import get_space
    from hwnas.supernet.train import (
        load_standalone,
        reinitialize,
        save_checkpoint,
        save_standalone,
        train_standalone,
        train_supernet,
        with_training_augment,
    )

    say = print if ctx.is_main else (lambda *a, **k: None)
    bench = args.bench_steps is not None
    out = Path(args.out) if args.out else None
    if out is None and not bench:
        raise UserError("--out DIR is required (except with --bench-steps)")
    run_file = out / "run.json" if out else None
    if args.resume:
        if not (run_file and run_file.is_file()):
            raise UserError(f"--resume: {out} holds no run (no run.json); start one without --resume")
        settings = json.loads(run_file.read_text())["settings"]
        if args.compile is not None:  # speed only: a resumed chunk may compile or not
            settings["compile"] = None if args.compile == "off" else args.compile
    else:
        if run_file and run_file.is_file() and not args.overwrite and not bench:
            raise UserError(f"{out} already holds a run; pass --resume to continue it or "
                            f"--overwrite to start afresh")
        settings = _settings(args)
    data = load_data(settings["data"], seed=0, limit_train=settings["limit_train"],
                     limit_eval=settings["limit_eval"])
    h, w = data.image_size
    if h != w:
        raise UserError(f"space {settings['space']} needs square images; the dataset's are {h}x{w}")
    space = get_space(settings["space"], in_channels=data.in_channels, image_size=h,
                      num_classes=data.num_classes)
    config = _train_config(settings, space)
    data = with_training_augment(data, config.to_dict())  # BN recalibration augments like training
    torch.manual_seed(settings["seed"])
    supernet = space.build_supernet()
    arch = None
    if settings["standalone"]:
        arch = _resolve_arch(space, settings["standalone"])
        model = reinitialize(supernet.extract(arch).train(), seed=settings["seed"])
        del supernet
        target = model
    else:
        model = target = supernet
    say(f"{'standalone ' + space.to_string(arch) if arch is not None else 'supernet ' + space.name}: "
        f"{_describe(target)}; data {data.name}: {len(data.train)} train images; device {device}"
        f"{f' x {ctx.world_size} processes' if ctx.enabled else ''}; "
        f"{len(config.stages)} stage(s) {[(s.name, s.epochs) for s in config.stages]}")

    common = dict(device=device, progress=not args.quiet, precision=args.precision,
                  channels_last={"auto": None, "on": True, "off": False}[args.channels_last],
                  dist=ctx, dataset=data.name)

    def fit(**kw):
        if arch is not None:
            return train_standalone(model, data, config=config, space=space, arch=arch,
                                    compile=settings["compile"] or False, **common, **kw)
        return train_supernet(model, space, data, config, compile=settings["compile"] or False,
                              **common, **kw)

    if bench:
        warm = min(5, args.bench_steps)
        fit(max_steps=warm)
        result = fit(max_steps=args.bench_steps)
        say(f"bench: {result.step} steps, {result.images} images in {result.seconds:.2f} s: "
            f"{result.images_per_s:.0f} images/s (batch {config.batch_size}, "
            f"{'standalone' if arch is not None else config.stages[0].name} step)")
        if out is not None and ctx.is_main:
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / "bench.json", {"steps": result.step, "seconds": result.seconds,
                                            "images_per_s": result.images_per_s,
                                            "batch_size": config.batch_size,
                                            "world_size": ctx.world_size, "device": str(device),
                                            "settings": settings})
        return 0

    assert out is not None and run_file is not None
    ckpt = out / "checkpoint.pt"
    log_file = out / "train_log.json"
    if ctx.is_main:
        if not args.resume:
            if args.overwrite:
                for name in ("checkpoint.pt", "train_log.json", "supernet.pt", "model.pt",
                             "eval.json", "run.json"):
                    (out / name).unlink(missing_ok=True)
            out.mkdir(parents=True, exist_ok=True)
            write_json(run_file, {"settings": settings, "train_config": config.to_dict(),
                                   "space_config": space.config()})
    from hwnas.supernet.distributed import barrier

    barrier(ctx)
    resume_from = ckpt if args.resume and ckpt.is_file() else None
    log = json.loads(log_file.read_text()) if log_file.is_file() else {"chunks": []}
    done = bool(log.get("completed"))
    if not done:
        budget = None
        if args.max_minutes is not None:
            budget = max(0.0, args.max_minutes * 60.0 - (time.perf_counter() - started))
        result = fit(resume_from=resume_from, checkpoint_path=ckpt,
                     checkpoint_every_s=args.checkpoint_every_s, max_seconds=budget)
        done = result.completed
        say(f"trained steps {result.step - round(result.images / config.batch_size)}..{result.step} "
            f"of {result.total_steps} in {result.seconds:.1f} s: {result.images_per_s:.0f} images/s"
            f" (total {result.total_seconds:.0f} s)")
        if ctx.is_main:
            log["chunks"].append({
                "argv": sys.argv, "end_step": result.step, "images": result.images,
                "seconds": result.seconds, "images_per_s": result.images_per_s,
                "world_size": ctx.world_size, "device": str(device),
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "torch": torch.__version__,
            })
            images = sum(c["images"] for c in log["chunks"])
            secs = sum(c["seconds"] for c in log["chunks"])
            log.update(settings=settings, epochs=config.epochs, completed=done,
                       step=result.step, total_steps=result.total_steps,
                       train_seconds=secs, images_per_s=images / max(secs, 1e-9),
                       history=result.history)
            write_json(log_file, log)
            if done:
                record = training_record(data)
                if arch is not None:
                    save_standalone(out / "model.pt", model, space, arch, dataset=data.name,
                                    train_config=config, data_record=record)
                else:
                    save_checkpoint(out / "supernet.pt", model, space, dataset=data.name,
                                    train_config=config, half=args.half_weights,
                                    extra={"train_seconds": secs, "history": result.history},
                                    data_record=record)
        if not done:
            say(f"not finished: step {result.step} of {result.total_steps}; continue with "
                f"--out {out} --resume")
    else:
        say(f"{out}: training already complete ({log.get('step')} steps)")
        if args.eval and ctx.is_main:  # the final weights, else the last checkpoint
            from hwnas.supernet.train import load_checkpoint

            final = out / ("model.pt" if arch is not None else "supernet.pt")
            weights = final if final.is_file() else ckpt
            if arch is not None:
                _, _, loaded, _ = load_standalone(weights, device=device)
                model = loaded
            else:
                _, model, _ = load_checkpoint(weights, device=device, space=space)

    if args.eval and (done or args.eval_unfinished) and ctx.is_main:
        t0 = time.perf_counter()
        model = model.float().to(memory_format=torch.contiguous_format)
        rows = []
        if arch is not None:
            model.eval()
            acc = accuracy(model, eval_loader(data, data.test, batch_size=500, device=device))
            rows.append({"role": settings["standalone"], "arch": space.to_string(arch), "top1": acc,
                         "flops": space.flops(arch), "params": space.params(arch)})
        else:
            for role, a in _eval_archs(space):
                acc, _ = evaluate_subnet(model, a, data, split="test", batch_size=500,
                                         calib_batches=args.calib_batches,
                                         calib_batch_size=args.calib_batch_size)
                rows.append({"role": role, "arch": space.to_string(a), "top1": acc,
                             "flops": space.flops(a), "params": space.params(a)})
        for r in rows:
            say(f"  {r['role']:9s} test top-1 {r['top1']:6.2f}%  {r['flops'] / 1e6:7.1f} MFLOPs  "
                f"{r['params'] / 1e6:5.2f} M params  {r['arch']}")
        recal = ({"batches": args.calib_batches, "batch_size": args.calib_batch_size,
                  "augmented": True} if arch is None else False)
        write_json(out / "eval.json", {"split": "test", "images": len(data.test),
                                        "bn_recalibration": recal,
                                        "training_completed": done, "subnets": rows,
                                        "seconds": time.perf_counter() - t0,
                                        "settings": settings})
    elif args.eval and ctx.is_main:
        say("eval skipped: training is not finished")
    return 0


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    try:
        return run(argv, started=started)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; continue with --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
