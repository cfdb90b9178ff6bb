"""The ``hwnas`` command line: a thin layer over the Python API.

Bad input ends with one ``hwnas: error: ...`` line and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from hwnas.core.cli_args import (
    EXIT_USER_ERROR,
    OneLineParser,
    bounded_int,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    seed_int,
)
from hwnas.core.config_file import read_config_file
from hwnas.core.errors import UserError
from hwnas.export.cli import (
    EXIT_SOME_FAILED,
    add_config_flag,
    add_export_parser,
    add_finetune_parser,
    add_preprocessing_flag,
    add_rounding_flag,
    run_export,
    run_finetune,
)
from hwnas.latency.cli import add_latency_parser, run_latency
from hwnas.supernet.train_options import (
    AUGMENT_KINDS,
    CHECKPOINT_EVERY_S,
    COMPILE_MODES,
    COMPILE_SCOPES,
    MAX_EPOCHS,
    OPTIMIZERS,
    PRECISIONS,
    REGULARISE,
    SCHEDULES,
    SUBNET_LOSSES,
    TEACHER_MODES,
)

if TYPE_CHECKING:  # the search (and torch) load only when a command needs them
    from hwnas.search.runner import SearchResult


def _common(p: argparse.ArgumentParser, d) -> None:
    add_config_flag(p)
    p.add_argument("--dataset", default=d.dataset,
                   help="'digits' (built in, default), 'cifar10' (from the shared data), or a path: "
                        "a cifar10-jpeg .npz, a cifar-10-batches-py directory or an ImageFolder directory")
    p.add_argument("--space", default=d.space, help=f"search space (default: {d.space})")
    p.add_argument("--seed", type=seed_int, default=d.seed, help=f"seed of training and search (default {d.seed})")
    p.add_argument("--device", default=d.torch_device,
                   help=f"torch device for training/evaluation (default {d.torch_device})")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--augment", choices=AUGMENT_KINDS, default=d.augment,
                   help="training augmentation when a supernet is trained (default: the "
                        "dataset's: shifts for digits, crop and flip for images); a checkpoint "
                        "trained with another is refused")


def _csv_list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _bit_list(text: str) -> list[int]:
    try:
        return [int(s) for s in _csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated bit-widths, got {text!r}") from None


def _search_options(p: argparse.ArgumentParser, d) -> None:
    from hwnas.search.config import MAX_TRIALS
    from hwnas.search.samplers import SAMPLERS

    _common(p, d)
    p.add_argument("--supernet", help="supernet checkpoint to use (default: the run's own, the one "
                                      "shipped for the space and dataset, or train one; vit "
                                      "takes cct's shipped one first, the run then in space cct)")
    p.add_argument("--epochs", type=bounded_int(MAX_EPOCHS), default=d.epochs,
                   help=f"supernet training epochs when one is trained (default {d.epochs})")
    p.add_argument("--objectives", default=d.objectives,
                   help="comma-separated: accuracy, latency:DEVICE, size, bops, flops, params "
                        f"(default {d.objectives})")
    p.add_argument("--constraint", action="append", default=[], metavar="METRIC<=VALUE",
                   help="e.g. latency:edgetpu-est<=5ms, size<=200KiB, accuracy>=95 (repeatable)")
    p.add_argument("--devices", type=_csv_list, default=list(d.devices),
                   help="comma-separated devices to report a Pareto front for, besides those of "
                        f"the objectives (default {','.join(d.devices)}; see `hwnas latency devices`)")
    p.add_argument("--no-bits", dest="bits", action="store_false",
                   help="search architectures only (float models); default: bit-widths too")
    p.add_argument("--bit-choices", type=_bit_list, default=list(d.bit_choices),
                   help=f"weight bit-widths per layer group, 32 = float (default "
                        f"{','.join(map(str, d.bit_choices))})")
    p.add_argument("--sampler", choices=SAMPLERS, default=d.sampler,
                   help=f"Optuna sampler, seeded by --seed: tpe (multivariate TPE), nsga2, random, "
                        f"gp, screening (a GP surrogate of accuracy picks each trial from a "
                        f"pool of candidates whose size and estimated/predicted latency are "
                        f"computed for free; cheap constraints screen the pool), or auto "
                        f"(screening when an objective needs an evaluation, else tpe) (default "
                        f"{d.sampler})")
    p.add_argument("--mlflow", metavar="URI", default=d.mlflow,
                   help="log every completed trial to MLflow at this tracking URI (file:./mlruns, "
                        "http://host:5000), one run per trial in an experiment named after the "
                        "study (Optuna's MLflowCallback; pip install 'hwnas[mlflow]')")
    p.add_argument("--accuracy", choices=("supernet", "predictor"), default=d.accuracy,
                   help="accuracy objective: evaluate every trial on the supernet (default), or "
                        "a predictor fitted on --predictor-samples supernet evaluations")
    p.add_argument("--predictor-samples", type=positive_int, default=d.predictor_samples,
                   help=f"supernet evaluations the accuracy predictor is fitted on "
                        f"(default {d.predictor_samples})")
    p.add_argument("--calib-batches", type=positive_int, default=d.calib_batches,
                   help=f"BatchNorm recalibration batches (64 augmented training images each) per "
                        f"candidate (default {d.calib_batches}, sized for a CPU: about 8 %% of a "
                        f"candidate's scoring. On CIFAR-10's 5,000 validation images it reads "
                        f"0.02-0.25 points below 40 batches of 256, with 0.02-0.28 points of "
                        f"seed-to-seed noise (std), and ranks 12 subnets against it with Kendall "
                        f"tau 0.88-0.97 (40 x 256 against itself: 0.90): "
                        f"benchmarks/bn_recalibration.md)")
    p.add_argument("--eval-images", type=non_negative_int, default=d.eval_images,
                   help="validation images scoring each candidate and test images scoring each "
                        "front model, at most (a stratified seeded subset; default 0: every "
                        "image; e.g. 2000 on a CPU with CIFAR-10)")
    p.add_argument("--trials", type=bounded_int(MAX_TRIALS), default=d.trials,
                   help=f"completed trials in total over all workers (default {d.trials})")
    p.add_argument("--storage", help="Optuna storage URL (default: SQLite in the run directory); "
                                     "postgresql://USER@HOST/DB for several workers or machines")
    p.add_argument("--study-name", help="study name in the storage (default: the run name)")
    p.add_argument("--workers", type=positive_int, default=d.workers,
                   help="worker processes sharing the study (needs a server --storage)")
    p.add_argument("--name", help="run name (default: <dataset>-<space>)")
    p.add_argument("--out", default=d.out, help=f"directory of runs (default: {d.out})")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run of the same name (default: continue it)")


def _train_options(p: argparse.ArgumentParser, d) -> None:
    """``hwnas train``'s own flags; a training setting left out takes the space's default."""
    p.add_argument("--epochs", type=bounded_int(MAX_EPOCHS), default=d.epochs,
                   help=f"training epochs (default {d.epochs})")
    p.add_argument("--out", help="a checkpoint FILE.pt (final weights only), or a run directory "
                                 "(a name without a suffix: run.json, resumable checkpoint.pt, "
                                 "train_log.json, supernet.pt or model.pt, eval.json)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue the run directory --out with its recorded settings")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an existing checkpoint or run (the old one stays until the new "
                        "one is written)")
    _train_recipe_options(p.add_argument_group("schedule and recipe (default: the space's)"))
    _train_run_dir_options(p.add_argument_group("run directory"))
    _train_speed_options(p.add_argument_group("speed (never changes what is computed)"))


def _train_recipe_options(h) -> None:
    """The training recipe's flags; the defaults they name are TrainConfig's and TrainStage's
    (what applies where a space sets none of its own)."""
    from hwnas.supernet.recipes import DEPS_FULL_FRACTION, TrainConfig, TrainStage

    c, num_random = TrainConfig(), TrainStage("", 0).num_random
    h.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="supernet schedule preset (default: the space's, sandwich for most)")
    h.add_argument("--standalone", metavar="ARCH",
                   help="train this subnet from scratch instead of the supernet: an arch string, "
                        "'largest', 'smallest' or 'random1'..'random3' (the ones --eval reports)")
    h.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help=f"sgd (Nesterov momentum {c.momentum:g}) or adamw (betas 0.9, 0.999; for "
                        f"vision transformers); neither decays norms, biases, position "
                        f"embeddings (default {c.optimizer})")
    h.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"global batch size over all processes (default {c.batch_size})")
    h.add_argument("--lr", type=positive_float, default=None,
                   help=f"peak learning rate (default {c.lr:g})")
    h.add_argument("--weight-decay", type=non_negative_float, default=None,
                   help=f"(default {c.weight_decay:g})")
    h.add_argument("--decay-all", action="store_true", default=None,
                   help="weight decay on every parameter, norms, biases and position embeddings "
                        "too (CCT's original script); default: weights only")
    h.add_argument("--label-smoothing", type=non_negative_float, default=None,
                   help=f"(default {c.label_smoothing:g})")
    h.add_argument("--mixup", type=non_negative_float, default=None, metavar="ALPHA",
                   help=f"MixUp's Beta alpha; 0 = off (default {c.mixup:g})")
    h.add_argument("--cutmix", type=non_negative_float, default=None, metavar="ALPHA",
                   help=f"CutMix's Beta alpha; 0 = off (default {c.cutmix:g}). "
                        f"With both on, each batch is one or the other")
    h.add_argument("--teacher", metavar="CHECKPOINT",
                   help="also learn from this trained network (DeiT-style distillation): the "
                        "largest subnet, or the --standalone network, mixes the labels' loss "
                        "with the teacher's; a supernet checkpoint (its --teacher-arch subnet) or "
                        "a standalone one, trained on this dataset's training images only")
    h.add_argument("--teacher-arch", metavar="ARCH",
                   help="with a supernet --teacher: its subnet, 'largest' (default), 'smallest' "
                        "or an arch string")
    h.add_argument("--teacher-weight", type=positive_float, default=None,
                   help=f"with --teacher: share of the teacher's loss, in (0, 1] "
                        f"(default {c.teacher_weight:g})")
    h.add_argument("--teacher-mode", choices=TEACHER_MODES, default=None,
                   help=f"with --teacher: its probabilities (soft) or its top class (hard) as "
                        f"targets (default {c.teacher_mode})")
    h.add_argument("--warmup-epochs", type=non_negative_float, default=None,
                   help=f"linear warm-up before the cosine decay (default {c.warmup_epochs:g})")
    h.add_argument("--grad-clip", type=non_negative_float, default=None,
                   help=f"clip the step's gradient norm to this; 0 = off (default {c.grad_clip:g})")
    h.add_argument("--num-random", type=non_negative_int, default=None,
                   help=f"random subnets per sandwich step (default {num_random})")
    h.add_argument("--subnet-loss", choices=SUBNET_LOSSES, default=None,
                   help=f"combine a sandwich step's losses by their sum (BigNAS), mean, or the "
                        f"largest's plus the mean of the others' (default {c.subnet_loss})")
    h.add_argument("--regularise", choices=REGULARISE, default=None,
                   help=f"which subnets of a sandwich step the space's dropout and stochastic "
                        f"depth act on: all, or the largest only (BigNAS) (default {c.regularise})")
    h.add_argument("--full-fraction", type=non_negative_float, default=None,
                   help=f"--schedule deps: share of the epochs that train only the full network "
                        f"(default {DEPS_FULL_FRACTION:g})")
    h.add_argument("--limit-train", type=positive_int, default=None,
                   help="use only N training images, a seeded random subset (smoke runs)")
    h.add_argument("--limit-eval", type=positive_int, default=None,
                   help="use only N validation and N test images (smoke runs)")


def _train_run_dir_options(r) -> None:
    r.add_argument("--max-minutes", type=positive_float, default=None,
                   help="stop training (checkpointed) this many minutes after the command started")
    r.add_argument("--checkpoint-every-s", type=positive_float, default=None,
                   help=f"seconds between checkpoints while training "
                        f"(default {CHECKPOINT_EVERY_S:g})")
    r.add_argument("--eval", action="store_true",
                   help="once training is complete: test top-1 of largest, smallest and 3 random "
                        "subnets (BatchNorm recalibrated) -> eval.json")
    r.add_argument("--eval-unfinished", action="store_true",
                   help="with --eval: evaluate also when this command ends before training is done")
    r.add_argument("--calib-batches", type=positive_int, default=40,
                   help="with --eval: recalibration batches per subnet, augmented (default 40)")
    r.add_argument("--calib-batch-size", type=positive_int, default=256,
                   help="with --eval: images per recalibration batch (default 256)")
    r.add_argument("--half-weights", action="store_true",
                   help="write the final supernet checkpoint in float16 (half the size)")


def _train_speed_options(s) -> None:
    s.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES,
                   metavar="MODE", help="torch.compile the standalone model, or the supernet's "
                   "largest and smallest subnets (and its random subnets: --compile-scope); mode "
                   "default, reduce-overhead (CUDA graphs, fastest on a GPU), max-autotune or off "
                   "(on --resume it overrides the run's)")
    s.add_argument("--compile-scope", choices=("auto",) + COMPILE_SCOPES, default="auto",
                   help="with --compile: auto = subnets for a vit or cct supernet on CUDA, model "
                        "otherwise (default); model = the network only; step = also a "
                        "standalone network's loss, the batches' normalisation and, on the CPU, "
                        "their augmentation (fewer kernel launches per step on a GPU); subnets = "
                        "also a supernet's random subnets, as one masked graph (vit, cct)")
    s.add_argument("--cudnn-benchmark", choices=("auto", "on", "off"), default="auto",
                   help="cuDNN autotuning per new convolution shape (CUDA): auto = on for "
                        "--standalone and for compile scope subnets, off for other supernets, "
                        "whose random subnets bring new shapes")
    s.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="auto = bf16 autocast on CUDA, fp32 on CPU (default auto; on --resume "
                        "the run's)")
    s.add_argument("--channels-last", choices=("auto", "on", "off"), default="auto",
                   help="auto = on for CUDA")
    s.add_argument("--bench-steps", type=positive_int, default=None,
                   help="only measure training images/s over this many steps (after warm-up)")


def build_parser() -> argparse.ArgumentParser:
    from hwnas.search.config import SearchConfig

    d = SearchConfig()  # one source of defaults for the API and the CLI

    from hwnas.core.version import __version__

    parser = OneLineParser(prog="hwnas", description="Hardware-aware NAS: supernets, "
                                     "latency, quantization, multi-objective search, ONNX export.")
    parser.add_argument("--version", action="version", version=f"hwnas {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    r = sub.add_parser("run", help="the whole job on defaults: supernet, joint architecture + "
                                   "bit-width search for several devices, Pareto fronts, ONNX export")
    _search_options(r, d)
    add_preprocessing_flag(r)
    add_rounding_flag(r)
    s = sub.add_parser("search", help="multi-objective search of architectures and bit-widths "
                                      "(resumable; several workers on a server database)")
    _search_options(s, d)

    t = sub.add_parser("train", help="train a supernet (or a standalone subnet) into a checkpoint "
                                     "file or a resumable run directory; several GPUs via torchrun")
    _common(t, d)
    _train_options(t, d)

    sub.add_parser("spaces", help="list the available search spaces")
    add_latency_parser(sub)
    add_export_parser(sub)
    add_finetune_parser(sub)
    return parser


def config_from_args(args: argparse.Namespace):
    from hwnas.search.config import SearchConfig

    return SearchConfig(
        space=args.space, dataset=args.dataset, supernet=args.supernet, epochs=args.epochs,
        objectives=args.objectives, constraints=list(args.constraint), devices=list(args.devices),
        bits=args.bits, bit_choices=list(args.bit_choices), sampler=args.sampler,
        trials=args.trials, seed=args.seed, storage=args.storage, study_name=args.study_name,
        workers=args.workers, name=args.name, out=args.out, torch_device=args.device,
        accuracy=args.accuracy, predictor_samples=args.predictor_samples, mlflow=args.mlflow,
        calib_batches=args.calib_batches, eval_images=args.eval_images, augment=args.augment,
        # settings without a flag, from --config only
        **{k: getattr(args, k) for k in _FILE_ONLY if hasattr(args, k)})


#: SearchConfig fields that only a --config file sets; flags whose name differs from the field
_FILE_ONLY = ("data_seed", "ptq_images", "sensitivity_seeds")
_FIELD_FLAGS = {"torch_device": "device", "constraints": "constraint"}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _flag_value(where: str, action: argparse.Action, value):
    """``value`` of a settings file as the flag of ``action`` would give it; UserError when
    it is not one the flag accepts."""
    key = action.dest
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise UserError(f"{where}: {key} = {value!r}: expected true or false")
        return value  # the value of the dest itself (--no-bits: bits = false)
    if isinstance(action, argparse._AppendAction):
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise UserError(f"{where}: {key} = {value!r}: expected a list of strings")
        return list(value)
    if isinstance(value, (dict, bool)) or (value is None and action.default is not None):
        raise UserError(f"{where}: {key} = {value!r}: not a value --{key.replace('_', '-')} takes")
    if value is not None and action.type is not None:
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        try:
            value = action.type(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise UserError(f"{where}: {key} = {value!r}: {exc}") from None
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = ",".join(value)  # a comma-separated flag (export --devices)
    elif value is not None and not isinstance(value, str):
        raise UserError(f"{where}: {key} = {value!r}: expected a string")
    if action.choices is not None and value is not None and value not in action.choices:
        raise UserError(f"{where}: {key} = {value!r}: expected one of {list(action.choices)}")
    return value


def config_defaults(parser: argparse.ArgumentParser, command: str, path: str) -> dict:
    """The settings of ``--config FILE`` for ``command`` as parser defaults (so flags given on
    the command line override them): keys are the flags' names (``-`` or ``_``), for
    run/search/train also the SearchConfig field names; a run's config.json is accepted. A
    top-level key that is a setting of another command only is skipped (one file serves
    ``run`` and ``export``); one of no command, or of another command in this command's
    table, is refused."""
    from hwnas.search.config import RUN_ONLY_KEYS, SearchConfig

    subs = {name: p for name, p in _subparsers(parser).items()
            if any(a.dest == "config" for a in p._actions)}
    shared, own = read_config_file(path, command, commands=tuple(_subparsers(parser)))
    where = f"--config {path}"
    field_names = set(SearchConfig.__dataclass_fields__) | set(RUN_ONLY_KEYS)

    def dests(name: str) -> dict[str, argparse.Action]:
        return {a.dest: a for a in subs[name]._actions if a.option_strings
                and a.dest not in ("help", "config")}

    def keys_of(name: str) -> set[str]:
        keys = set(dests(name)) | {k for k, v in _FIELD_FLAGS.items() if v in dests(name)}
        return keys | field_names if name in ("run", "search") else keys

    anywhere = set().union(*(keys_of(n) for n in subs))
    unknown = sorted(set(shared) - anywhere)
    if unknown:
        raise UserError(f"{where}: unknown setting(s) {', '.join(unknown)}; expected the flags' "
                        f"names of a command (see 'hwnas {command} --help')")
    mine = keys_of(command)
    values = {**{k: v for k, v in shared.items() if k in mine}, **own}
    actions = dests(command)
    out: dict = {}
    if command in ("run", "search"):
        fields = {k: v for k, v in values.items() if k in field_names}
        cfg = SearchConfig.from_dict(fields, source=where)
        keys = set(fields) - set(RUN_ONLY_KEYS) | ({"devices"} if "reported_devices" in fields else set())
        for key in keys:
            dest = _FIELD_FLAGS.get(key, key)
            out[dest] = getattr(cfg, key)
            if dest in actions and out[dest] is not None:
                _flag_value(where, actions[dest], out[dest])
        values = {k: v for k, v in values.items() if k not in field_names}
    values = {_FIELD_FLAGS.get(k, k): v for k, v in values.items()}
    for key, value in values.items():
        if key not in actions:
            raise UserError(f"{where}: {key!r} is not a setting of 'hwnas {command}'; expected "
                            f"some of {', '.join(sorted(actions))}")
        out[key] = _flag_value(where, actions[key], value)
    return out


def _search(args: argparse.Namespace):
    from hwnas import search
    from hwnas.search.runner import summary

    result = search.run(config_from_args(args), overwrite=args.overwrite, progress=not args.quiet)
    print()
    print(summary(result))
    print(f"run directory: {result.run_dir}  (trials.csv, pareto_<device>.csv, fronts.png, "
          f"devices.png, hypervolume.csv, study.db)")
    return result


def cmd_search(args: argparse.Namespace) -> int:
    result = _search(args)
    print(f"wall time: {result.seconds:.0f} s")
    return 0


def search_stages(result: SearchResult) -> str:
    """Where the search's wall seconds went, on one line (``hwnas run``): its ``timings`` and
    the rest (data, run directory, the study's start with the sensitivity seeds)."""
    t = result.timings
    known = {"supernet": t.get("supernet_s", 0.0), "trials": t.get("search_s", 0.0),
             "test scores and outputs": t.get("outputs_s", 0.0)}
    rest = max(result.seconds - sum(known.values()), 0.0)
    return (f"search stages (s): data, run directory and study start (sensitivity seeds "
            f"included) {rest:.1f}, " + ", ".join(f"{k} {v:.1f}" for k, v in known.items()))


def cmd_run(args: argparse.Namespace) -> int:
    """The search, then the models of every front exported (FP32 and QDQ ONNX, verified and
    timed; ``hwnas export`` does the same for any run directory)."""
    import time

    from hwnas.export.model_export import ExportSettings
    from hwnas.export.run_export import export_run, stage_summary

    start = time.perf_counter()
    result = _search(args)
    searched = time.perf_counter()
    exported = export_run(result.run_dir, progress=not args.quiet,
                          settings=ExportSettings(uint8_input=args.with_preprocessing,
                                                  rounding=args.rounding, device=args.device,
                                                  workers=0),
                          dataset=result.data)  # the search's, not decoded again
    n, failed = len(exported.models), len(exported.failed)
    end = time.perf_counter()
    print(f"exported {n - failed} of {n} Pareto-optimal models to {exported.out_dir} "
          f"(FP32 and QDQ ONNX, manifest.json, manifest.csv) in {end - searched:.0f} s")
    print(f"wall time: {end - start:.0f} s (search {searched - start:.0f} s, "
          f"export {end - searched:.0f} s)")
    print(search_stages(result))
    print(stage_summary(exported))
    return EXIT_SOME_FAILED if failed else 0


def cmd_train(args: argparse.Namespace) -> int:
    """A supernet or standalone subnet (:mod:`hwnas.supernet.train_run`); several processes
    under ``torchrun -m hwnas train``."""
    from hwnas.supernet.train_run import run_train

    return run_train(args, started=args.started)


def cmd_spaces(args: argparse.Namespace) -> int:
    from hwnas.supernet.spaces import available_spaces, get_space

    for name in available_spaces():
        print(get_space(name).describe())
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the settings of ``--config FILE`` under it: flags given override
    the file, the file overrides the defaults. UserError for a bad settings file."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "config", None):
        _subparsers(parser)[args.command].set_defaults(
            **config_defaults(parser, args.command, args.config))
        args = parser.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    import time

    args = argparse.Namespace(command=None)
    started = time.perf_counter()  # --max-minutes counts from here
    try:
        args = parse_args(argv)
        args.started = started
        if args.command in ("run", "search", "train", "export", "finetune") \
                and "torch" not in sys.modules:  # read when torch starts; a user's setting wins
            from hwnas.core.affinity import torch_thread_defaults

            torch_thread_defaults()
        handler = {"run": cmd_run, "search": cmd_search, "export": run_export, "train": cmd_train,
                   "spaces": cmd_spaces, "latency": run_latency,
                   "finetune": run_finetune}[args.command]
        return handler(args)
    except UserError as exc:
        print(f"hwnas: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # output piped into e.g. `head`, which closed early
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"hwnas: interrupted; {_resume_hint(args.command)}", file=sys.stderr)
        return 130


def _resume_hint(command: str | None) -> str:
    """What to do after Ctrl-C: a search continues where it stopped when its command runs again
    (completed trials are kept, the interrupted one is enqueued again); an export leaves the
    previous one in place."""
    if command in ("run", "search"):
        return ("run the same command again to continue (completed trials are kept; "
                "--overwrite starts afresh)")
    if command == "export":
        return "the previous export is unchanged; run the same command again to export"
    if command == "train":
        return ("a run directory continues from its last checkpoint with --resume (one that "
                "--overwrite was replacing is unchanged); a checkpoint file was not written")
    if command == "finetune":
        return ("the previous fine-tuning output is unchanged; run the same command again "
                "(with --overwrite to replace an earlier one)")
    return "nothing was written"


if __name__ == "__main__":
    sys.exit(main())
