"""``hwnas latency ...``: devices, on-device measurement, adaptation and prediction.

Wired into the ``hwnas`` command line by :func:`add_latency_parser` (``hwnas/cli.py`` calls it);
``devices``, ``reference``, ``measure``, ``adapt`` and ``predict`` only parse and print, over
:mod:`hwnas.latency.adapt`, :mod:`hwnas.latency.devices`, :mod:`hwnas.latency.onnx_measure` and
the predictors. Bad input raises :class:`hwnas.core.errors.UserError` (one ``hwnas: error: ...``
line, exit 2) and writes nothing.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from hwnas.latency.onnx_measure import PRECISIONS, RUNTIMES, busy_machine

from hwnas.core.errors import UserError
from hwnas.core.resources import package_path

__all__ = ["add_latency_parser", "run_latency"]

from hwnas.core.cli_args import (  # noqa: E402
    non_negative_int,
    positive_float,
    positive_int,
    seed_int,
)

EXIT_SOME_UNSTABLE = 1




def _add_measure(lsub: Any) -> None:
    """The ``latency measure`` subcommand's arguments."""
    m = lsub.add_parser("measure", help="measure every .onnx model of a directory with onnxruntime "
                                        "or OpenVINO")
    m.add_argument("dir", help="directory of .onnx models (e.g. a run's models/)")
    m.add_argument("--runtime", choices=RUNTIMES, default="onnxruntime",
                   help="runtime to time the models with (default onnxruntime; openvino needs "
                        "pip install 'hwnas[openvino]')")
    m.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="OpenVINO's inference precision hint (default f32)")
    m.add_argument("--threads", type=positive_int, default=1, help="runtime threads (default 1)")
    m.add_argument("--repeats", type=positive_int, default=50, help="timed runs per model (default 50)")
    m.add_argument("--warmup", type=non_negative_int, default=10, help="untimed runs first (default 10)")
    m.add_argument("--max-cv", type=positive_float, default=0.1,
                   help="leave out models whose coefficient of variation exceeds this (default 0.1)")
    m.add_argument("--out", help="CSV to write (arch,latency_ms,p95_ms,cv,file); default: print it")
    m.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    m.add_argument("--quiet", action="store_true", help="no per-model lines")


def _add_adapt(lsub: Any) -> None:
    """The ``latency adapt`` subcommand's arguments."""
    a = lsub.add_parser("adapt", help="adapt a predictor to your measurements; save a device profile")
    a.add_argument("--device", required=True, help="name of the new device profile")
    a.add_argument("--space", required=True, help="search space of the measured architectures")
    a.add_argument("--measurements", required=True, help="CSV with columns arch,latency_ms")
    a.add_argument("--predictor", help="predictor to adapt: meta, lowrank (a low-rank prior over "
                                       "the meta-training devices' per-operation costs), "
                                       "opcount, flops, ... (default: the space's pretrained "
                                       "meta predictor, else the FLOPs predictor)")
    a.add_argument("--seed", type=seed_int, default=0, help="seed of the adaptation (default 0)")
    a.add_argument("--overwrite", action="store_true", help="replace an existing profile")
    a.add_argument("--export-settling", metavar="DIR",
                   help="when the measurements leave open which network the device runs, write "
                        "the models of the architectures that would settle it to DIR (new or "
                        "empty; as 'reference --export' does), to measure and add")
    a.add_argument("--execution", default="auto", metavar="auto|RUNTIME|raw|pruned",
                   help="which network the device ran, where a space has variants (NB-201): raw "
                        "(every operation), pruned (without operations whose output is unused), "
                        "or the runtime that ran it (onnxruntime, openvino, tensorrt, tflite, "
                        "litert, torchscript, pytorch-mobile, executorch, torch.compile: pruned; "
                        "pytorch, eager, cudagraph: raw); auto (default): pruned when every "
                        "measured model was an ONNX file (the measurements' file column: hwnas "
                        "exports hold no dead operations), else weighed by the measurements")


def add_latency_parser(sub: Any) -> Callable[[argparse.Namespace], int]:
    """Add the ``latency`` command group to ``sub`` (an ``add_subparsers`` object whose
    ``parser_class`` is used for the nested parsers too); return its handler::

        hwnas latency devices [--space S]
        hwnas latency reference --space S [--n 10] --export DIR [--seed N] [--overwrite]
        hwnas latency measure DIR [--runtime onnxruntime|openvino] [--precision f32|bf16|f16]
                                  [--threads N] [--repeats N] [--warmup N] [--max-cv 0.1]
                                  [--out CSV] [--overwrite]
        hwnas latency adapt   --device NAME --space SPACE --measurements CSV [--predictor NAME]
                                  [--seed N] [--overwrite] [--export-settling DIR]
                                  [--execution auto|RUNTIME|raw|pruned]
        hwnas latency predict --device NAME --space SPACE --archs CSV --out CSV [--overwrite]
    """
    lat = sub.add_parser("latency", help="latency devices: list, reference models, measure on-device, adapt, predict")
    lsub = lat.add_subparsers(dest="latency_command", required=True, parser_class=type(lat),
                              metavar="{devices,reference,measure,adapt,predict}")

    d = lsub.add_parser("devices", help="list the latency devices and their kind")
    d.add_argument("--space", help="only devices that cover this space")

    r = lsub.add_parser("reference", help="export the models a new device should measure first "
                                          "(ONNX, for python -m hwnas.latency.ondevice)")
    r.add_argument("--space", required=True, help="search space of the models")
    r.add_argument("--n", type=positive_int, default=10,
                   help="number of models (default 10): the predictor's first N reference "
                        "architectures")
    r.add_argument("--export", required=True, metavar="DIR",
                   help="directory to write ref_NN.onnx and archs.csv into (new or empty)")
    r.add_argument("--seed", type=seed_int, default=0,
                   help="seed of the random models beyond the predictor's references (default 0)")
    r.add_argument("--overwrite", action="store_true",
                   help="replace an earlier reference export in --export DIR")

    _add_measure(lsub)
    _add_adapt(lsub)

    p = lsub.add_parser("predict", help="latency of a list of architectures on a device")
    p.add_argument("--device", required=True, help="any device of 'hwnas latency devices'")
    p.add_argument("--space", required=True, help="search space of the architectures")
    p.add_argument("--archs", required=True, help="CSV with an 'arch' column")
    p.add_argument("--out", required=True, help="CSV to write (arch,latency_ms[,latency_std_ms])")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    return run_latency


def run_latency(args: argparse.Namespace) -> int:
    """Dispatch ``hwnas latency <command>``."""
    handler = {"devices": _cmd_devices, "reference": _cmd_reference, "measure": _cmd_measure,
               "adapt": _cmd_adapt, "predict": _cmd_predict}[args.latency_command]
    return handler(args)


# --------------------------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------------------------


def _cmd_devices(args: argparse.Namespace) -> int:
    from hwnas.latency.devices import available_devices

    if args.space is not None:
        from hwnas.supernet.spaces import available_spaces

        if args.space not in available_spaces():
            raise UserError(f"unknown space {args.space!r}; expected one of {available_spaces()}")
    infos = available_devices(args.space)
    width = max(len(i.name) for i in infos)
    spaces = max(11, *(len(i.spaces_text) for i in infos))
    print(f"{'device':{width}s}  {'kind':9s}  {'spaces':{spaces}s}  description")
    for i in infos:
        print(f"{i.name:{width}s}  {i.kind:9s}  {i.spaces_text:{spaces}s}  {i.description}")
    return 0


# --------------------------------------------------------------------------------------------
# reference
# --------------------------------------------------------------------------------------------


def _cmd_reference(args: argparse.Namespace) -> int:
    """``hwnas latency reference``: write the models a new device should measure first (ONNX,
    with their architectures, for the standalone on-device script ``python -m
    hwnas.latency.ondevice``, whose one file ``ondevice.py`` is copied to the device)."""
    from hwnas.latency.predictors import default_predictor
    from hwnas.latency.reference import ARCHS_FILE, choose_reference, export_reference
    from hwnas.supernet.spaces import get_space

    space = get_space(args.space)
    reference = choose_reference(space, args.n, predictor=default_predictor(space),
                                 seed=args.seed)
    paths = export_reference(space, reference, args.export, overwrite=args.overwrite)
    out = Path(args.export)
    print(f"wrote {len(paths)} ONNX models of {space.name} and {ARCHS_FILE} to {out}")
    n_ref = reference.n_reference
    if n_ref < len(paths):
        print(f"note: the {reference.predictor} predictor has {n_ref} reference architecture(s) "
              f"for {space.name}; the other {len(paths) - n_ref} span the space (its smallest, "
              f"largest and seeded random architectures)")
    script = package_path("hwnas.latency", "ondevice.py")
    print(f"measure them on the device: copy {script} (one file, needs only numpy and "
          f"onnxruntime) and {out} there, then python ondevice.py {out.name} --out "
          f"measurements.csv (on this machine: python -m hwnas.latency.ondevice {out} --out "
          f"measurements.csv)")
    print(f"then: hwnas latency adapt --device MY_DEVICE --space {space.name} --measurements "
          f"measurements.csv")
    return 0


# --------------------------------------------------------------------------------------------
# measure
# --------------------------------------------------------------------------------------------


def _cmd_measure(args: argparse.Namespace) -> int:
    """``hwnas latency measure``: leaves out models whose timing varies too much (cv above
    ``--max-cv``, after one re-measurement) and says so; exits 1 when some were left out and 2
    when all were (nothing written then)."""
    from hwnas.latency.adapt import check_csv_out
    from hwnas.latency.onnx_measure import measure_dir
    from hwnas.latency.ondevice import CSV_COLUMNS, write_csv_atomic

    out = check_csv_out(args.out, args.overwrite)
    say = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    if args.precision not in (None, "f32") and args.runtime != "openvino":
        raise UserError(f"--precision {args.precision} needs --runtime openvino; onnxruntime's "
                        f"CPU provider runs the files as written")
    stable, unstable = measure_dir(args.dir, threads=args.threads, repeats=args.repeats,
                                   warmup=args.warmup, max_cv=args.max_cv, progress=say,
                                   runtime=args.runtime, precision=args.precision)
    busy = busy_machine(args.threads)  # slower, and unequally, than the device on its own
    if busy:
        print(f"hwnas: warning: {busy}", file=sys.stderr)
    if not stable:
        raise UserError(
            f"all {len(unstable)} models were unstable (cv > {args.max_cv} twice); nothing "
            f"written - measure on a quieter machine, raise --repeats, or raise --max-cv"
        )
    for row in unstable:
        print(f"hwnas: unstable: {row['file']} (arch {row['arch']}) cv {row['cv']:.3f} > "
              f"--max-cv {args.max_cv} twice; not reported", file=sys.stderr)
    if out is not None:
        write_csv_atomic(stable, out)
        print(f"wrote {len(stable)} measurements to {out}"
              + (f"; {len(unstable)} unstable models left out" if unstable else ""))
    else:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for row in stable:
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
        print(buffer.getvalue(), end="")
    return EXIT_SOME_UNSTABLE if unstable else 0


# --------------------------------------------------------------------------------------------
# adapt
# --------------------------------------------------------------------------------------------


def _settling(predictor: Any, space: Any, measured: list[str], args: argparse.Namespace) -> None:
    """Name (and with ``--export-settling`` export) the architectures that would settle an
    open execution variant."""
    from hwnas.latency.fewshot import settling_suggestions
    from hwnas.latency.reference import ReferenceSet, export_reference

    archs = settling_suggestions(predictor, space, measured, seed=args.seed)
    if not archs:
        return
    print(f"measuring these {len(archs)} would settle it (add them to "
          f"{args.measurements} and adapt again):")
    for a in archs:
        print(f"  {a}")
    if args.export_settling:
        paths = export_reference(space, ReferenceSet(archs, 0, predictor.name),
                                 args.export_settling, flag="--export-settling")
        print(f"wrote their {len(paths)} ONNX models to {args.export_settling} (measure them "
              f"with python -m hwnas.latency.ondevice)")
    else:
        print("(--export-settling DIR writes their ONNX models)")


def _cmd_adapt(args: argparse.Namespace) -> int:
    """``hwnas latency adapt``: takes the measurements of any architectures and prints its
    leave-one-out error on them, whether more measurements would likely help and its learning
    curve with what 20 more would likely bring (:func:`hwnas.latency.fewshot.leave_one_out`),
    and, when they leave open which network the device runs, which architectures would settle
    it (``--export-settling`` writes them). Measurements of ONNX files (the ``file`` column of
    ``ondevice.py``) settle it without more: hwnas exports hold no dead operations, so
    ``adapt`` assumes the ``pruned`` network (``--execution``)."""
    from hwnas.latency.adapt import adapt_device, pin_execution
    from hwnas.latency.fewshot import LOO_MAX_MEASUREMENTS, execution_note, leave_one_out
    from hwnas.latency.predictors import default_predictor
    from hwnas.latency.profiles import (
        check_profile_name,
        check_profile_target,
        profiles_dir,
        read_measurements,
    )
    from hwnas.supernet.spaces import get_space

    check_profile_name(args.device)
    check_profile_target(profiles_dir() / args.device, args.device, args.overwrite)
    space = get_space(args.space)
    if args.export_settling:
        from hwnas.latency.reference import check_export_target

        check_export_target(Path(args.export_settling), False, "--export-settling")
    data = read_measurements(args.measurements, space)  # bad rows fail before loading a predictor
    predictor = default_predictor(space, args.predictor)
    pinned = pin_execution(args.execution, predictor, space, data)
    if pinned:
        print(pinned)
    min_loo = max(3, int(getattr(predictor, "min_samples", 1)) + 1)
    loo = None
    if min_loo <= len(data) <= LOO_MAX_MEASUREMENTS:  # before adapting: it adapts copies
        loo = leave_one_out(predictor, data.archs, data.latency_ms, seed=args.seed)
    start = time.perf_counter()
    profile, predictor, rho = adapt_device(args.device, space, args.measurements,
                                           predictor=predictor, seed=args.seed,
                                           overwrite=args.overwrite)
    seconds = time.perf_counter() - start
    print(f"adapted {profile.predictor} to {profile.n_measurements} measurements of "
          f"{args.device!r} on {space.name} in {seconds:.2f} s (Spearman on the measurements "
          f"{rho:.3f})")
    cap = getattr(predictor, "max_adapt_measurements", None)
    if cap is not None and len(data) > cap:
        print(f"adapted on {cap} of the {len(data)} measurements (a subsample seeded by --seed): "
              f"the fit grows with the cube of their number, and a few hundred settle it")
    if loo is not None:
        print(loo.summary())
        print(loo.reason)
        gain = loo.gain_line()
        if gain:
            print(gain)
    elif len(data) > LOO_MAX_MEASUREMENTS:
        print(f"held-out check skipped: {len(data)} measurements are more than "
              f"{LOO_MAX_MEASUREMENTS} (each check re-adapts the predictor); more would rarely "
              f"help")
    else:
        print(f"more measurements would likely help: {len(data)} are too few to check the "
              f"predictor (leave-one-out needs {min_loo}; hwnas latency reference --n 10 "
              f"exports 10 models)")
    note = execution_note(predictor, space.name)
    if note:
        print(note)
        _settling(predictor, space, data.archs, args)
    refs = getattr(predictor, "reference_archs", None)
    if refs:
        want = set(refs[: profile.n_measurements])
        have = set(data.archs)
        if not want <= have:
            print(f"note: {len(want - have)} of the measured architectures are not the "
                  f"predictor's reference architectures; it ranks best when its first "
                  f"{len(want)} are the ones measured (hwnas latency reference --space "
                  f"{space.name} --n {len(want)} --export DIR writes them)")
    print(f"device profile: {profile.path}")
    print(f"use it as: hwnas latency predict --device {args.device} --space {space.name} "
          f"--archs ARCHS.csv --out OUT.csv")
    return 0


# --------------------------------------------------------------------------------------------
# predict
# --------------------------------------------------------------------------------------------


def _cmd_predict(args: argparse.Namespace) -> int:
    from hwnas.latency.adapt import predict_csv
    from hwnas.supernet.spaces import get_space

    space = get_space(args.space)
    values = predict_csv(args.device, space, args.archs, args.out, overwrite=args.overwrite)
    print(f"predicted {len(values)} architectures on {args.device!r}: median "
          f"{float(np.median(values)):.4g} ms, range {values.min():.4g}-{values.max():.4g} ms "
          f"-> {args.out}")
    return 0
