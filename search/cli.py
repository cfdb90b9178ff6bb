"""The ``hwnas`` command line: a thin layer over the Python API.

Bad input ends with one ``hwnas: error: ...`` line and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from latency.cli import add_latency_parser, run_latency
from supernet.cli_args import EXIT_USER_ERROR, OneLineParser, positive_int
from supernet.errors import UserError





def _common(p: argparse.ArgumentParser, d) -> None:
    p.add_argument("--dataset", default=d.dataset,
                   help="'digits' (built in, default), 'cifar10' (from the shared data), or a path: "
                        "a cifar10-jpeg .npz, a cifar-10-batches-py directory or an ImageFolder directory")
    p.add_argument("--space", default=d.space, help=f"search space (default: {d.space})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of training and search (default {d.seed})")
    p.add_argument("--device", default=d.device, help=f"torch device for training/evaluation (default {d.device})")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    from search.run import RunConfig
    from search.samplers import SAMPLERS

    d = RunConfig()  # one source of defaults for the API and the CLI

    parser = OneLineParser(prog="hwnas", description="Hardware-aware NAS: supernets, "
                                     "latency, quantization, multi-objective search, ONNX export.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    r = sub.add_parser("run", help="train a supernet (or load one), search it, export the Pareto front")
    _common(r, d)
    r.add_argument("--supernet", help="use this supernet checkpoint instead of training one")
    r.add_argument("--epochs", type=positive_int, default=d.epochs,
                   help=f"supernet training epochs (default {d.epochs})")
    r.add_argument("--trials", type=positive_int, default=d.trials,
                   help=f"search trials in total (default {d.trials})")
    r.add_argument("--sampler", choices=SAMPLERS, default=d.sampler,
                   help=f"Optuna sampler (default {d.sampler})")
    r.add_argument("--threads", type=positive_int, default=d.latency_threads,
                   help=f"onnxruntime threads for latency measurement (default {d.latency_threads})")
    r.add_argument("--name", help="run name (default: <dataset>-<space>)")
    r.add_argument("--out", default=d.out, help=f"directory of runs (default: {d.out})")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true", help="continue the run of the same name")
    g.add_argument("--overwrite", action="store_true", help="replace the run of the same name")

    t = sub.add_parser("train", help="train a supernet and save its checkpoint")
    _common(t, d)
    t.add_argument("--epochs", type=positive_int, default=d.epochs, help=f"training epochs (default {d.epochs})")
    t.add_argument("--out", required=True, help="checkpoint file to write (.pt)")
    t.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")

    sub.add_parser("spaces", help="list the available search spaces")
    add_latency_parser(sub)
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    from search.run import RunConfig, run, summary_table

    cfg = RunConfig(dataset=args.dataset, space=args.space, supernet=args.supernet,
                    epochs=args.epochs, trials=args.trials, sampler=args.sampler, seed=args.seed,
                    name=args.name, out=args.out, latency_threads=args.threads, device=args.device)
    result = run(cfg, resume=args.resume, overwrite=args.overwrite, progress=not args.quiet)
    print()
    print(f"Pareto-optimal models ({len(result.pareto)} of {len(result.trials)} trials):")
    print(summary_table(result))
    print()
    print(f"run directory: {result.run_dir}  (trials.csv, pareto.csv, pareto.png, models/)")
    print(f"wall time: {result.seconds:.0f} s")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from supernet.data import load_dataset
    from supernet.evaluate import evaluate_subnet
    from supernet.spaces import get_space
    from supernet.train import sandwich_config, save_checkpoint, train_supernet

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise UserError(f"{out} already exists; pass --overwrite to replace it")
    if out.suffix != ".pt":
        raise UserError(f"--out {out}: expected a checkpoint file name ending in .pt")
    data = load_dataset(args.dataset, seed=0)
    h, w = data.image_size
    space = get_space(args.space, in_channels=data.in_channels, image_size=h,
                      num_classes=data.num_classes)
    supernet = space.build_supernet()
    config = sandwich_config(args.epochs, seed=args.seed)
    result = train_supernet(supernet, space, data, config, device=args.device,
                            progress=not args.quiet)
    save_checkpoint(out, supernet, space, dataset=data.name, train_config=config)
    print(f"trained {space.name} on {data.name}: {result.epochs} epochs, {result.seconds:.0f} s, "
          f"{result.images_per_s:.0f} images/s -> {out}")
    for role, arch in (("largest", space.largest()), ("smallest", space.smallest())):
        acc, _ = evaluate_subnet(supernet, arch, data, split="val")
        print(f"  {role:8s} val acc {acc:5.1f}%  {space.to_string(arch)}")
    return 0


def cmd_spaces(args: argparse.Namespace) -> int:
    from supernet.spaces import available_spaces, get_space

    for name in available_spaces():
        print(get_space(name).describe())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {"run": cmd_run, "train": cmd_train, "spaces": cmd_spaces,
               "latency": run_latency}[args.command]
    try:
        return handler(args)
    except UserError as exc:
        print(f"hwnas: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # output piped into e.g. `head`, which closed early
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("hwnas: interrupted; rerun with --resume to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
