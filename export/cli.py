"""``hwnas export RUN_DIR`` and ``hwnas finetune RUN_DIR --trial N``: the command lines of
:func:`hwnas.export.run_export.export_run` and :mod:`hwnas.export.finetune`.

Wired into ``hwnas`` by :func:`add_export_parser` and :func:`add_finetune_parser`
(``hwnas/cli.py`` calls them and dispatches to the handlers they return, :func:`run_export` and
:func:`run_finetune`). They only parse and print; whole-command errors are UserError, raised to
the ``hwnas`` main, which prints ``hwnas: error: ...`` (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from hwnas.core.cli_args import non_negative_int, positive_float, positive_int
from hwnas.core.errors import UserError

__all__ = ["EXIT_SOME_FAILED", "add_export_parser", "add_finetune_parser", "run_export",
           "run_finetune"]

EXIT_SOME_FAILED = 1


def add_export_parser(sub: Any) -> Callable[[argparse.Namespace], int]:
    """Add the ``export`` command to ``sub`` (an ``add_subparsers`` object); return its
    handler (:func:`run_export`)::

        hwnas export RUN_DIR [--front DEVICE] [--select all|3,7|top:K|fastest:K] [--out DIR]
                             [--devices cpu-ov-2t,...] [--int4] [--int8-full-range] [--batch N]
                             [--rounding adaround|nearest|adaround-all] [--max-images N]
                             [--refine N] [--no-requantize] [--with-preprocessing] [--workers N]
                             [--device cpu|cuda] [--quiet]
    """
    p = sub.add_parser("export", help="export a run's Pareto-optimal models to ONNX (FP32 and "
                                      "QDQ), verified, and the fastest file per measured device")
    p.add_argument("run_dir", help="run directory written by 'hwnas search' / 'hwnas run'")
    add_config_flag(p)
    p.add_argument("--front", metavar="DEVICE",
                   help="export this device's front (pareto_DEVICE.csv); default: every front")
    p.add_argument("--select", default="all",
                   help="'all' (default), trial numbers '3,7,12', 'top:K' (most accurate) or "
                        "'fastest:K' (fastest on --front)")
    p.add_argument("--out", help="export directory (default RUN_DIR/export; replaced atomically)")
    p.add_argument("--devices", default="",
                   help="more devices measurable here to recommend a file for, comma-separated "
                        "(e.g. cpu-ov-2t,cpu-ort-1t-b32); the run's own measured devices always")
    p.add_argument("--int4", action="store_true",
                   help="also write ONNX INT4 weights (opset 21) for layers of <= 4 bits (size)")
    p.add_argument("--int8-full-range", action="store_true",
                   help="int8 weights on the full [-127, 127] grid: exact only on CPUs with "
                        "VNNI/AMX or with onnxruntime's session.x64quantprecision=1 (default: "
                        "7 bits where AVX2/AVX-512 without VNNI could saturate, portable)")
    add_rounding_flag(p)
    p.add_argument("--batch", type=positive_int, default=1,
                   help="batch size each device's files are timed and chosen at, unless the "
                        "device's name gives one (cpu-ov-8t-b32) (default 1)")
    p.add_argument("--max-images", type=positive_int, default=1000,
                   help="test images for the parity checks (default 1000)")
    p.add_argument("--refine", type=int, default=0,
                   help="extra greedy int8/float flips per device, one whole-model timing each "
                        "(default 0)")
    p.add_argument("--no-requantize", action="store_true",
                   help="insert Q/DQ only where the fake-quant model has them (exact, but convs "
                        "followed by float ops stay float islands; the check then fails)")
    add_preprocessing_flag(p)
    p.add_argument("--workers", type=int, default=0,
                   help="models built and verified in parallel processes (timings still run "
                        "one at a time, alone); default 0: one per two cores, at most 8")
    p.add_argument("--device", default="cpu",
                   help="torch device for BatchNorm recalibration and the PyTorch reference "
                        "outputs, e.g. cuda (default cpu; onnxruntime runs on the CPU)")
    p.add_argument("--quiet", action="store_true", help="only the per-model lines")
    return run_export


def add_config_flag(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` (every command that takes settings; read by ``hwnas.cli.main``)."""
    p.add_argument("--config", metavar="FILE",
                   help="settings from a TOML file (keys: the flags' names; a table named after "
                        "the command adds to the top-level keys) or a run's config.json; flags "
                        "given here override it (--constraint adds to its constraints)")


def add_rounding_flag(p: argparse.ArgumentParser) -> None:
    """``--rounding`` (``hwnas export`` and ``hwnas run``): ``ExportSettings.rounding``."""
    from hwnas.export.records import ExportSettings

    p.add_argument("--rounding", choices=("nearest", "adaround", "adaround-all"),
                   default=ExportSettings().rounding,
                   help="how PTQ rounds the weights: adaround (default: learned rounding of the "
                        "files with weights below 6 bits, 1-5 CPU s per layer, 3-10x PTQ's "
                        "CPU time on CIFAR-10 models; keeps W4A8 files within a point of FP32 "
                        "where nearest loses 0.8-1.3; W6/W8 files "
                        "rounded to nearest), nearest (every file as the search scored it) or "
                        "adaround-all (W6/W8 files learned too: -0.11 to +0.17 point at W6A8)")


def add_preprocessing_flag(p: argparse.ArgumentParser) -> None:
    """``--with-preprocessing`` (``hwnas export`` and ``hwnas run``)."""
    p.add_argument("--with-preprocessing", action="store_true",
                   help="also write uint8/<name>.onnx (and uint8-qdq-<device>/): uint8 NHWC "
                        "images in, scaled and normalised inside the graph")


def run_export(args: argparse.Namespace) -> int:
    """Handler of ``hwnas export``. Exit status: 0 when every selected model was exported and
    verified, 1 when some failed (one line each on stderr; the others are written), 2 on a
    whole-command error (UserError, raised to the ``hwnas`` main)."""
    from hwnas.export.model_export import ExportSettings
    from hwnas.export.run_export import export_run, stage_summary
    from hwnas.latency.devices import get_device

    if args.refine < 0:
        raise UserError(f"--refine must be >= 0, got {args.refine}")
    settings = ExportSettings(requantize=not args.no_requantize, int4=args.int4,
                              policy_batch=args.batch, portable=not args.int8_full_range,
                              rounding=args.rounding,
                              refine=args.refine, uint8_input=args.with_preprocessing,
                              workers=args.workers, device=args.device)
    result = export_run(args.run_dir, front=args.front, select=args.select, out=args.out,
                        settings=settings, max_test_images=args.max_images,
                        progress=not args.quiet,
                        devices=[get_device(d.strip()) for d in args.devices.split(",")
                                 if d.strip()])  # names become Devices here, once
    n, failed = len(result.models), len(result.failed)
    print(f"exported {n - failed} of {n} models to {result.out_dir} "
          f"(manifest.json, manifest.csv) in {result.seconds:.0f} s")
    print(stage_summary(result))
    return EXIT_SOME_FAILED if failed else 0


def add_finetune_parser(sub: Any) -> Callable[[argparse.Namespace], int]:
    """Add the ``finetune`` command to ``sub``; return its handler."""
    from hwnas.export.finetune import DEFAULT_LR, FinetuneSettings

    d = FinetuneSettings()
    p = sub.add_parser("finetune", help="fine-tune one trial of a run by distillation from the "
                                        "largest subnet (QAT under its bit policy), save and "
                                        "export it")
    p.add_argument("run_dir", help="run directory written by 'hwnas search' / 'hwnas run'")
    add_config_flag(p)
    p.add_argument("--trial", type=non_negative_int,
                   help="the trial number to fine-tune (trials.csv, pareto_<device>.csv); "
                        "required here or in --config")
    p.add_argument("--epochs", type=positive_int, default=d.epochs,
                   help=f"fine-tuning epochs (default {d.epochs})")
    p.add_argument("--lr", type=positive_float, default=None,
                   help=f"peak learning rate of the cosine schedule (default: the space's; "
                        f"{DEFAULT_LR:g} where the space names none)")
    p.add_argument("--batch-size", type=positive_int, default=d.batch_size,
                   help=f"training batch size (default {d.batch_size})")
    p.add_argument("--device", default=d.device,
                   help=f"torch device to train on: cpu, cuda, cuda:N (default {d.device})")
    p.add_argument("--out", help="output directory (default RUN_DIR/finetune/trial_NNNN)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier fine-tuning of this trial in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return run_finetune


def run_finetune(args: argparse.Namespace) -> int:
    """Handler of ``hwnas finetune``: fine-tunes one trial and exports it again
    (:mod:`hwnas.export.finetune`); exit status 1 when the model was fine-tuned and saved but a
    file of its export failed verification."""
    from hwnas.export.finetune import FinetuneSettings, finetune_trial

    if args.trial is None:
        raise UserError("hwnas finetune needs --trial N, the number of the trial to fine-tune "
                        "(see the run's trials.csv or pareto_<device>.csv)")
    settings = FinetuneSettings(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                                device=args.device)
    result = finetune_trial(args.run_dir, args.trial, settings=settings, out=args.out,
                            overwrite=args.overwrite, progress=not args.quiet)
    b, a = result.before, result.after
    kind = "QAT" if result.policy else "float"
    print(f"trial {result.trial} ({kind}): validation {b['val']:.2f} -> {a['val']:.2f} %, test "
          f"{b['test']:.2f} -> {a['test']:.2f} % after {result.epochs} epoch(s) (kept epoch "
          f"{result.kept_epoch}) in {result.seconds:.0f} s on {result.device}")
    export = result.export
    for f in export.files:
        if f.status != "ok":
            print(f"{result.out_dir / f.path}: failed: {f.error}", file=sys.stderr)
    written = sum(1 for f in export.files if f.written)
    print(f"wrote {result.checkpoint.name}, summary.json and {written} ONNX file(s) to "
          f"{result.out_dir}")
    return EXIT_SOME_FAILED if export.status != "ok" else 0
