"""What ``hwnas train`` does: train a supernet or a standalone subnet into a checkpoint file or
a resumable run directory, on CPU, one GPU or several (``torchrun``).

``--out FILE.pt`` writes the final checkpoint only. ``--out DIR`` (a name without a suffix)
is a run directory: ``run.json`` (the settings, the training configuration and the space's;
``--resume`` reads them back, so a resumed chunk needs only ``--out``), ``checkpoint.pt``
(resumable: weights, optimizer, step, RNG states), ``train_log.json`` (one record per command:
steps, seconds, images/s; the per-epoch losses) and, once training is complete,
``supernet.pt`` (the file ``hwnas search --supernet`` takes) or ``model.pt`` for
``--standalone``; with ``--eval`` also ``eval.json`` (test top-1 of the largest, smallest and
three random subnets, each BatchNorm-recalibrated on training-augmented images).
``--max-minutes`` stops training (checkpointed) that long after the command started, so a long
training is a series of commands below a per-command limit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hwnas.supernet.decoded import load_training_data
from hwnas.supernet.fingerprint import training_record
from hwnas.supernet.train_options import CHECKPOINT_EVERY_S, TrainOptions, check_augment

from hwnas.core.errors import UserError
from hwnas.core import written
from hwnas.core.io import check_writable, write_json

__all__ = ["RUN_KEYS", "eval_archs", "resolve_out", "run_train", "settings_from_args",
           "train_config"]

#: Settings that define a training run (run.json; --resume takes them from there).
RUN_KEYS = ("data", "space", "schedule", "epochs", "batch_size", "lr", "weight_decay",
            "label_smoothing", "warmup_epochs", "grad_clip", "num_random", "full_fraction", "seed",
            "standalone", "limit_train", "limit_eval", "compile", "subnet_loss", "augment",
            "optimizer", "mixup", "cutmix", "teacher", "teacher_arch", "teacher_weight",
            "teacher_mode", "decay_all", "precision", "regularise")
#: TrainConfig fields a setting overrides when given (else the space's default, else TrainConfig's).
CONFIG_KEYS = ("batch_size", "lr", "weight_decay", "label_smoothing", "warmup_epochs",
               "grad_clip", "seed", "subnet_loss", "augment", "optimizer", "mixup", "cutmix",
               "teacher_weight", "teacher_mode", "decay_all", "regularise")
#: Seed of the random subnets that --eval reports (and --standalone randomN trains).
EVAL_SEED = 2024
NUM_RANDOM_EVAL = 3
#: Files of a run directory that --overwrite removes.
RUN_FILES = ("checkpoint.pt", "train_log.json", "supernet.pt", "model.pt", "eval.json",
             "bench.json", "run.json")
#: what writes a training run directory, in its record of written files (:mod:`hwnas.core.written`)
WRITER = "train"
#: Options that only a run directory can serve.
_DIR_ONLY = ("resume", "max_minutes", "checkpoint_every_s", "eval", "eval_unfinished")


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings (:data:`RUN_KEYS`) from the command line; None = the space's default."""
    if args.full_fraction is not None and args.schedule != "deps":
        raise UserError(f"--full-fraction {args.full_fraction} applies to --schedule deps only; "
                        f"pass --schedule deps or drop it")
    if getattr(args, "regularise", None) == "largest" and getattr(args, "standalone", None):
        raise UserError("--regularise largest applies to a supernet (its sandwich steps); a "
                        "--standalone network is one network: drop it")
    if not getattr(args, "teacher", None):
        given = [k for k in ("teacher_arch", "teacher_weight", "teacher_mode")
                 if getattr(args, k, None) is not None]
        if given:
            raise UserError(f"--{given[0].replace('_', '-')} applies with --teacher only; pass "
                            f"--teacher CHECKPOINT or drop it")
    s = {k: getattr(args, k, None) for k in RUN_KEYS if k != "data"}
    s["data"] = args.dataset
    if s["compile"] == "off":
        s["compile"] = None
    return s


def train_config(settings: dict[str, Any], space):
    """The :class:`hwnas.supernet.recipes.TrainConfig` of ``settings``: the schedule preset and
    settings given, the rest the space's training defaults (validated)."""
    from hwnas.supernet.recipes import default_config, space_recipe, standalone_config

    kw = {k: settings[k] for k in CONFIG_KEYS if settings.get(k) is not None}
    epochs = settings["epochs"]
    if settings.get("standalone"):
        _, defaults = space_recipe(space, "standalone")  # the space's recipe, no schedule
        config = standalone_config(epochs, **{**defaults, **kw})
    else:
        if settings.get("num_random") is not None:
            kw["num_random"] = settings["num_random"]
        if settings.get("full_fraction") is not None:  # deps only (settings_from_args)
            kw["full_fraction"] = settings["full_fraction"]
        config = default_config(space, epochs, schedule=settings.get("schedule"), **kw)
    config.validate()
    return config


def eval_archs(space) -> list[tuple[str, Any]]:
    """The subnets --eval reports, by role: largest, smallest, random1..3 (seeded)."""
    rng = np.random.default_rng(EVAL_SEED)
    archs = [("largest", space.largest()), ("smallest", space.smallest())]
    return archs + [(f"random{i + 1}", space.sample(rng)) for i in range(NUM_RANDOM_EVAL)]


def resolve_arch(space, text: str):
    """``--standalone``'s subnet: a role of :func:`eval_archs` or an architecture string."""
    named = dict(eval_archs(space))
    if text in named:
        return named[text]
    try:
        return space.from_string(text)
    except UserError as exc:
        raise UserError(f"--standalone {text!r}: {exc} (or use one of {list(named)})") from None


def resolve_out(args: argparse.Namespace) -> tuple[str, Path | None]:
    """(``"file"``, a .pt path), (``"dir"``, a run directory) or (``"none"``, None: only
    --bench-steps may go without --out); UserError for a name that is neither or options the
    kind cannot serve."""
    if not args.out:
        if args.bench_steps is not None:
            return "none", None
        raise UserError("hwnas train needs --out: a checkpoint FILE.pt or a run directory (or "
                        "out in the [train] table of --config)")
    out = Path(args.out)
    if out.is_dir() or (not out.exists() and out.suffix == ""):
        return "dir", out
    if out.exists() and out.suffix != ".pt":
        raise UserError(f"--out {out} already exists and is neither a checkpoint file (.pt) nor "
                        f"a run directory")
    if out.suffix != ".pt":
        raise UserError(f"--out {out}: expected a checkpoint file name ending in .pt or a run "
                        f"directory (a name without a suffix)")
    given = [k for k in _DIR_ONLY if getattr(args, k, None)] + (
        ["bench_steps"] if args.bench_steps is not None else [])
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UserError(f"{flag} needs a run directory: pass --out DIR (a name without .pt) "
                        f"instead of the checkpoint file {out}")
    if out.exists() and not args.overwrite:
        raise UserError(f"{out} already exists; pass --overwrite to replace it")
    return "file", out


def _autotune(args: argparse.Namespace, scope: str, compile: str | None) -> bool:
    """cuDNN autotuning per new convolution shape: ``--cudnn-benchmark``, where ``auto`` is on
    for networks with one set of shapes (a standalone subnet, or a supernet whose random
    subnets run masked: compiled, ``compile`` being the run's mode, in scope ``subnets``), off
    where every random subnet brings new shapes."""
    masked = bool(compile) and scope == "subnets"  # the run's settings: "off" is None there
    return args.cudnn_benchmark == "on" or (
        args.cudnn_benchmark == "auto" and (_is_standalone(args) or masked))


def _compile_scope(args: argparse.Namespace, model, standalone: bool, device) -> str:
    """``--compile-scope``, where ``auto`` is ``subnets`` for a supernet with masked random
    subnets (vit, cct) on CUDA, where they halved a CCT supernet's sandwich epoch
    (``benchmarks/supernet_cifar10.md``, "Session 42"), and ``model`` otherwise: on a CPU the
    step is bound by arithmetic, and the masked graph, at the largest subnet's shapes, took 3.3x
    the sliced subnets' time there (same section)."""
    scope = getattr(args, "compile_scope", None) or "auto"
    if scope != "auto":
        return scope
    masked = device.type == "cuda" and not standalone and hasattr(model, "forward_masked")
    return "subnets" if masked else "model"


def _is_standalone(args: argparse.Namespace) -> bool:
    """Whether this command trains a standalone subnet (given, or recorded in a resumed run)."""
    if args.standalone:
        return True
    run_file = Path(args.out) / "run.json" if args.resume and args.out else None
    if run_file is not None and run_file.is_file():
        try:
            return bool(json.loads(run_file.read_text())["settings"].get("standalone"))
        except (ValueError, KeyError, TypeError, AttributeError):
            return False  # _main reports a broken run.json
    return False


def run_train(args: argparse.Namespace, *, started: float | None = None) -> int:
    """``hwnas train`` (see the module docstring); returns the exit status."""
    from hwnas.supernet.distributed import init_from_env, shutdown
    from hwnas.supernet.train import check_torch_device

    started = time.perf_counter() if started is None else started
    kind, out = resolve_out(args)
    if args.resume and kind == "dir" and not (out / "run.json").is_file():
        raise UserError(f"--resume: {out} holds no run (no run.json); start one without --resume")
    if kind == "dir" and not args.resume and not args.overwrite and args.bench_steps is None \
            and (out / "run.json").is_file():
        raise UserError(f"{out} already holds a run; pass --resume to continue it or "
                        f"--overwrite to start afresh")
    replacing = False  # --overwrite of an earlier run: the new one is built aside (staged)
    if kind == "dir" and not args.resume:  # only a directory of hwnas train's own files
        earlier = written.check_replaceable(out, overwrite=True, writers=[WRITER],
                                            what="a training run directory",
                                            instead="choose another --out")
        replacing = earlier and args.overwrite and args.bench_steps is None
    if out is not None:
        check_writable(out)
    check_torch_device(args.device)
    ctx, device = init_from_env(args.device)
    if device.type == "cuda":  # cuDNN autotuning is set with the model (_training)
        # TF32 for fp32 evaluation
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    try:
        status = _main(args, kind, out, ctx, device, started, replacing)
    except BaseException:
        shutdown(ctx, ok=False)
        raise
    shutdown(ctx)
    return status


def _read_settings(args: argparse.Namespace, run_file: Path | None) -> tuple[dict, dict]:
    """(the run's settings, its run.json: empty unless --resume reads it back)."""
    if not args.resume:
        return settings_from_args(args), {}
    try:
        recorded = json.loads(run_file.read_text())
        settings = {k: recorded["settings"].get(k) for k in RUN_KEYS}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UserError(f"--resume: {run_file} is not a run.json written by hwnas train") from None
    if args.compile is not None:  # speed only: a resumed chunk may compile or not
        settings["compile"] = None if args.compile == "off" else args.compile
    if getattr(args, "precision", None) is not None:  # a resumed chunk may change it, if asked
        settings["precision"] = args.precision
    return settings, recorded


@dataclass
class _Training:
    """What one command trains: the model (a supernet, or the standalone subnet ``arch``), its
    data, configuration, options and teacher."""

    model: Any
    space: Any
    arch: Any
    data: Any
    config: Any
    options: TrainOptions
    teacher: Any = None
    half_weights: bool = False

    def fit(self, cfg=None, **kw):
        from hwnas.supernet.train import train_standalone, train_supernet

        if self.arch is not None:
            return train_standalone(self.model, self.data, config=cfg or self.config,
                                    space=self.space, arch=self.arch, options=self.options,
                                    teacher=self.teacher, **kw)
        return train_supernet(self.model, self.space, self.data, cfg or self.config,
                              self.options, teacher=self.teacher, **kw)

    def save_final(self, path: Path, result, train_seconds: float | None = None) -> None:
        from hwnas.supernet.checkpoint_io import save_checkpoint, save_standalone

        record, data = training_record(self.data), self.data
        if self.arch is not None:
            save_standalone(path, self.model, self.space, self.arch, dataset=data.name,
                            train_config=self.config, data_record=record)
        else:
            save_checkpoint(path, self.model, self.space, dataset=data.name,
                            train_config=self.config, half=self.half_weights, data_record=record,
                            extra={"train_seconds": train_seconds, "history": result.history}
                            if train_seconds is not None else None)

    def describe(self, ctx, device) -> str:
        space, arch, data, config = self.space, self.arch, self.data, self.config
        what = f"standalone {space.to_string(arch)}" if arch is not None else f"supernet {space.name}"
        return (f"{what}: {sum(p.numel() for p in self.model.parameters()) / 1e6:.2f} M "
                f"parameters; data {data.name}: {len(data.train)} train images; device {device}"
                f"{f' x {ctx.world_size} processes' if ctx.enabled else ''}; "
                f"{len(config.stages)} stage(s) {[(s.name, s.epochs) for s in config.stages]}"
                f"{self._compile_note()}")

    def _compile_note(self) -> str:
        """``; compiled MODE, scope SCOPE`` for a compiled run (the scope ``auto`` picked)."""
        opts = self.options
        return f"; compiled {opts.compile}, scope {opts.compile_scope}" if opts.compile else ""


def _training(args: argparse.Namespace, settings: dict, recorded: dict, ctx, device,
              say) -> _Training:
    """The data, space and configuration (recorded, or from the settings), teacher and freshly
    initialised model of this run."""
    from hwnas.supernet.checkpoint_io import with_training_augment
    from hwnas.supernet.recipes import TrainConfig
    from hwnas.supernet.spaces import get_space
    from hwnas.supernet.train import reinitialize

    data = load_training_data(settings["data"], seed=0, limit_train=settings["limit_train"],
                              limit_eval=settings["limit_eval"])
    h, w = data.image_size
    if h != w:
        raise UserError(f"space {settings['space']} needs square images; the dataset's are {h}x{w}")
    # a resumed run keeps the space configuration it started with (run.json), as it keeps
    # its training configuration, so a space's changed defaults do not stop it
    space = get_space(settings["space"], in_channels=data.in_channels, image_size=h,
                      num_classes=data.num_classes, config=recorded.get("space_config"))
    if recorded.get("train_config") is not None:
        config = TrainConfig.from_dict(recorded["train_config"])
    else:
        config = train_config(settings, space)
    check_augment(config.augment or data.augment, data.in_channels)
    data = with_training_augment(data, config.to_dict())  # BN recalibration augments like training
    teacher = None
    if settings.get("teacher"):
        from hwnas.supernet.teacher import load_teacher

        teacher, name = load_teacher(settings["teacher"], data, arch=settings.get("teacher_arch"),
                                     device=device, log=say)
        if recorded.get("train_config") is not None and config.teacher != name:
            raise UserError(f"--resume: the run learns from teacher {config.teacher!r}; "
                            f"{settings['teacher']} is {name!r}")
        config = replace(config, teacher=name)
    torch.manual_seed(config.seed)
    model, arch = space.build_supernet(), None
    if settings["standalone"]:
        arch = resolve_arch(space, settings["standalone"])
        model = reinitialize(model.extract(arch).train(), seed=config.seed)
    scope = _compile_scope(args, model, bool(settings["standalone"]), device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = _autotune(args, scope, settings["compile"])
    options = TrainOptions(
        device=device, progress=not args.quiet, precision=settings.get("precision") or "auto",
        channels_last={"auto": None, "on": True, "off": False}[args.channels_last], dist=ctx,
        dataset=data.name, compile=settings["compile"] or False,
        compile_scope=scope)
    return _Training(model, space, arch, data, config, options, teacher, args.half_weights)


def _main(args: argparse.Namespace, kind: str, out: Path | None, ctx, device: torch.device,
          started: float, replacing: bool = False) -> int:
    from hwnas.supernet.distributed import shutdown

    say = print if ctx.is_main else (lambda *a, **k: None)
    settings, recorded = _read_settings(args, out / "run.json" if kind == "dir" else None)
    t = _training(args, settings, recorded, ctx, device, say)
    say(t.describe(ctx, device))
    if args.bench_steps is not None:
        return _bench(args, t.fit, out, ctx, device, t.config, settings, t.arch, say,
                      len(t.data.train))
    if kind == "file":  # the checkpoint file is written atomically: the old one stays till then
        result = t.fit()
        if ctx.is_main:
            t.save_final(out, result)
        say(f"trained {t.space.name if t.arch is None else t.space.to_string(t.arch)} on "
            f"{t.data.name}: {result.epochs} epochs, {result.seconds:.0f} s, "
            f"{result.images_per_s:.0f} images/s -> {out}")
        shutdown(ctx)  # the evaluation below needs no other rank
        if ctx.is_main:
            _print_val(t.model, t.space, t.arch, t.data, say)
        return 0
    if not (replacing and ctx.is_main):
        return _run_dir(args, t, out, out, ctx, device, settings, started, say, fresh=replacing)
    # --overwrite: the new run fills a staging sibling and replaces the old one only once this
    # command is through, so a failure, Ctrl-C or full disk meanwhile leaves the old run as it was
    written.remove_stale(out)
    with written.staged(out, WRITER) as staging:
        status = _run_dir(args, t, staging, out, ctx, device, settings, started, say, fresh=True)
    written.replace_dir(staging, out, writers=[WRITER], what="a training run directory")
    return status


def _run_dir(args: argparse.Namespace, t: _Training, work: Path, out: Path, ctx, device,
             settings: dict, started: float, say, *, fresh: bool) -> int:
    """Train into the run directory ``work`` (``out``, or the staging directory that replaces
    it; ``fresh``: a new run there, whatever ``out`` held) and evaluate with --eval."""
    from hwnas.supernet.distributed import barrier, shutdown

    ckpt, log_file, run_file = work / "checkpoint.pt", work / "train_log.json", work / "run.json"
    config, arch = t.config, t.arch
    if ctx.is_main:
        work.mkdir(parents=True, exist_ok=True)
        written.record_files(work, WRITER, RUN_FILES)
    if ctx.is_main and not args.resume:
        write_json(run_file, {"settings": settings, "train_config": config.to_dict(),
                              "space_config": t.space.config()})
    barrier(ctx)
    log = {"chunks": []}
    if not fresh and log_file.is_file():
        log = json.loads(log_file.read_text())
    done, model = bool(log.get("completed")), t.model
    if not done:
        budget = None
        if args.max_minutes is not None:
            budget = max(0.0, args.max_minutes * 60.0 - (time.perf_counter() - started))
        result = t.fit(resume_from=ckpt if args.resume and ckpt.is_file() else None,
                       checkpoint_path=ckpt, checkpoint_every_s=args.checkpoint_every_s or CHECKPOINT_EVERY_S,
                       max_seconds=budget)
        done = result.completed
        say(f"trained steps {result.step - round(result.images / config.batch_size)}.."
            f"{result.step} of {result.total_steps} in {result.seconds:.1f} s: "
            f"{result.images_per_s:.0f} images/s (total {result.total_seconds:.0f} s)")
        if ctx.is_main:
            secs = _log_chunk(log, log_file, result, ctx, device, settings, config)
            if done:
                t.save_final(work / ("model.pt" if arch is not None else "supernet.pt"), result,
                             secs)
        if not done:
            say(f"not finished: step {result.step} of {result.total_steps}; continue with "
                f"hwnas train --out {out} --resume")
    else:
        say(f"{out}: training already complete ({log.get('step')} steps)")
        if args.eval and ctx.is_main:
            model = _final_weights(work, ckpt, arch, t.space, device)
    shutdown(ctx)  # rank 0's evaluation below needs no other rank
    if args.eval and (done or args.eval_unfinished) and ctx.is_main:
        _evaluate(args, model, t.space, arch, t.data, device, settings, done, work, say)
    elif args.eval and ctx.is_main:
        say("eval skipped: training is not finished")
    return 0


def _bench(args, fit, out, ctx, device, config, settings, arch, say, train_size: int) -> int:
    """--bench-steps: training images/s over that many steps after a short warm-up, for each
    kind of stage of the schedule (a DEpS supernet's full-network step and its sandwich step
    differ about threefold), and the training time they add up to, to plan epochs."""
    from dataclasses import replace

    kinds = {}  # one stage per kind: sandwich or not, and its choices
    for stage in config.stages:
        kinds.setdefault((stage.sandwich, repr(stage.choices)), stage)
    stages, warm = list(kinds.values()), min(5, args.bench_steps)
    rows, estimate = [], 0.0
    for stage in stages:
        cfg = replace(config, stages=[replace(stage, epochs=max(1, stage.epochs))])
        fit(cfg, max_steps=warm)
        result = fit(cfg, max_steps=args.bench_steps)
        kind = "standalone" if arch is not None else stage.name
        epoch_s = train_size / max(result.images_per_s, 1e-9)
        epochs = sum(s.epochs for s in config.stages
                     if (s.sandwich, repr(s.choices)) == (stage.sandwich, repr(stage.choices)))
        estimate += epochs * epoch_s
        rows.append({"stage": kind, "steps": result.step, "seconds": result.seconds,
                     "images_per_s": result.images_per_s, "epoch_seconds": epoch_s,
                     "epochs": epochs})
        say(f"bench: {result.step} steps, {result.images} images in {result.seconds:.2f} s: "
            f"{result.images_per_s:.0f} images/s (batch {config.batch_size}, {kind} step) = "
            f"{epoch_s:.1f} s per epoch of {train_size} images x {epochs} epochs")
    say(f"bench: {config.epochs} epochs would train for about {estimate / 60:.1f} minutes at "
        f"these rates (first-use and evaluation time not included)")
    if out is not None and ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        written.record_files(out, WRITER, RUN_FILES)
        first = rows[0]
        write_json(out / "bench.json", {"steps": first["steps"], "seconds": first["seconds"],
                                        "images_per_s": first["images_per_s"],
                                        "stages": rows, "estimated_train_seconds": estimate,
                                        "batch_size": config.batch_size,
                                        "world_size": ctx.world_size, "device": str(device),
                                        "settings": settings})
    return 0


def _log_chunk(log, log_file, result, ctx, device, settings, config) -> float:
    """Add this command's record to train_log.json; returns the run's training seconds: the
    checkpoint's running total (``result.total_seconds``), which survives a run directory
    rebuilt on another machine from its checkpoint alone, where the log's earlier chunks are
    gone (session 40's shipped CCT supernet recorded 148 of its 2,220 s)."""
    log["chunks"].append({
        "argv": sys.argv, "end_step": result.step, "images": result.images,
        "seconds": result.seconds, "images_per_s": result.images_per_s,
        "world_size": ctx.world_size, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "rollbacks": result.rollbacks,
    })
    images = sum(c["images"] for c in log["chunks"])
    logged = sum(c["seconds"] for c in log["chunks"])
    secs = max(result.total_seconds, logged)
    log.update(settings=settings, epochs=config.epochs, completed=result.completed,
               step=result.step, total_steps=result.total_steps, train_seconds=secs,
               images_per_s=images / max(logged, 1e-9), history=result.history)
    write_json(log_file, log)
    return secs


def _final_weights(out: Path, ckpt: Path, arch, space, device):
    """A finished run's model: its final weights, else its last checkpoint."""
    from hwnas.supernet.checkpoint_io import load_checkpoint, load_standalone

    final = out / ("model.pt" if arch is not None else "supernet.pt")
    weights = final if final.is_file() else ckpt
    if arch is not None:
        return load_standalone(weights, device=device)[2]
    return load_checkpoint(weights, device=device, space=space)[1]


def _print_val(model, space, arch, data, say) -> None:
    """Validation top-1 after a file-mode training: the largest and smallest subnet (or the
    standalone model)."""
    from hwnas.supernet.evaluate import accuracy, eval_loader, evaluate_subnet

    if arch is not None:
        device = next(model.parameters()).device
        acc = accuracy(model.eval(), eval_loader(data, data.val, device=device))
        say(f"  val acc {acc:5.1f}%  {space.to_string(arch)}")
        return
    for role, a in (("largest", space.largest()), ("smallest", space.smallest())):
        acc, _ = evaluate_subnet(model, a, data, split="val")
        say(f"  {role:8s} val acc {acc:5.1f}%  {space.to_string(a)}")


def _evaluate(args, model, space, arch, data, device, settings, done, out, say) -> None:
    """--eval: test top-1 of the standalone model, or of the supernet's eval_archs subnets
    (BatchNorm recalibrated) -> eval.json."""
    from hwnas.supernet.evaluate import accuracy, eval_loader, evaluate_subnet

    t0 = time.perf_counter()
    model = model.float().to(memory_format=torch.contiguous_format)
    rows = []
    if arch is not None:
        model.eval()
        acc = accuracy(model, eval_loader(data, data.test, batch_size=500, device=device))
        rows.append({"role": settings["standalone"], "arch": space.to_string(arch), "top1": acc,
                     "flops": space.flops(arch), "params": space.params(arch)})
    else:
        for role, a in eval_archs(space):
            acc, _ = evaluate_subnet(model, a, data, split="test", batch_size=500,
                                     calib_batches=args.calib_batches,
                                     calib_batch_size=args.calib_batch_size)
            rows.append({"role": role, "arch": space.to_string(a), "top1": acc,
                         "flops": space.flops(a), "params": space.params(a)})
    for r in rows:
        say(f"  {r['role']:9s} test top-1 {r['top1']:6.2f}%  {r['flops'] / 1e6:7.1f} MFLOPs  "
            f"{r['params'] / 1e6:5.2f} M params  {r['arch']}")
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    recal = ({"batches": args.calib_batches, "batch_size": args.calib_batch_size,
              "augmented": True} if arch is None and has_bn else False)
    write_json(out / "eval.json", {"split": "test", "images": len(data.test),
                                   "bn_recalibration": recal, "training_completed": done,
                                   "subnets": rows, "seconds": time.perf_counter() - t0,
                                   "settings": settings})
