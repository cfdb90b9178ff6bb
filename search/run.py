"""The main job (``hwnas run``): supernet → multi-objective search → Pareto front → ONNX.

1. Train the space's supernet on the dataset (or load a checkpoint).
2. Run a seeded Optuna study over the architectures with three objectives: validation accuracy
   from the supernet (max), FLOPs (min) and latency measured with onnxruntime on this CPU (min).
3. Write the run directory::

       runs/<name>/config.json        settings of the run (checked on --resume)
       runs/<name>/supernet.pt        the supernet checkpoint used
       runs/<name>/study.db           the Optuna study (SQLite; resumable, optuna-dashboard)
       runs/<name>/trials.csv         every completed trial: arch string and all metrics
       runs/<name>/pareto.csv         the non-dominated set (study.best_trials) + test accuracy
       runs/<name>/pareto.png         the fronts over all trials
       runs/<name>/models/            each Pareto-optimal subnet as ONNX + manifest.json

Nothing is created before the inputs are validated and the supernet is ready; every file is
written atomically, so an interrupted run leaves either the previous version or the new one.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from export.onnx_export import check_parity, export_onnx
from search.evaluator import EvalSettings, SubnetEvaluator
from search.plots import plot_pareto
from search.samplers import DEFAULT_SAMPLER, SAMPLERS
from search.study import (
    enqueue_seeds,
    open_study,
    pareto_trials,
    run_trials,
    sqlite_url,
    trials_frame,
)
from supernet.data import DatasetSplits, load_dataset
from supernet.errors import UserError
from supernet.checkpoints import shipped_checkpoint
from supernet.evaluate import accuracy, eval_loader
from supernet.space import SearchSpace
from supernet.spaces import available_spaces, get_space
from supernet.train import TrainResult, load_checkpoint, sandwich_config, save_checkpoint, train_supernet

RUN_MARKER = "config.json"
#: settings that must match when a run is resumed (the trial budget may grow)
_RESUME_KEYS = ("dataset", "space", "sampler", "seed", "epochs", "supernet", "data_seed")


@dataclass
class RunConfig:
    """Everything ``hwnas run`` needs; the CLI maps its flags one to one onto these fields."""

    dataset: str = "digits"
    space: str = "mbv3-tiny"
    supernet: str | None = None
    epochs: int = 30
    trials: int = 60
    sampler: str = DEFAULT_SAMPLER
    seed: int = 0
    data_seed: int = 0
    name: str | None = None
    out: str = "runs"
    latency_threads: int = 1
    device: str = "cpu"

    def validate(self) -> None:
        if self.trials <= 0:
            raise UserError(f"--trials must be a positive number of trials, got {self.trials}")
        if self.supernet is None and self.epochs <= 0:
            raise UserError(f"--epochs must be positive, got {self.epochs}")
        if self.latency_threads <= 0:
            raise UserError(f"--threads must be positive, got {self.latency_threads}")
        if self.sampler not in SAMPLERS:
            raise UserError(f"unknown sampler {self.sampler!r}; expected one of {list(SAMPLERS)}")
        if self.space not in available_spaces():
            raise UserError(f"unknown space {self.space!r}; expected one of {available_spaces()}")
        if self.name is not None and (not self.name or "/" in self.name or self.name.startswith(".")):
            raise UserError(f"--name {self.name!r} must be a plain directory name")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"--device {self.device}: no CUDA device is available here; use cpu")


@dataclass
class RunResult:
    run_dir: Path
    trials: pd.DataFrame
    pareto: pd.DataFrame
    seconds: float
    train: TrainResult | None = None
    timings: dict[str, float] = field(default_factory=dict)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def _write_csv(path: Path, frame: pd.DataFrame) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(path)


def _prepare_run_dir(cfg: RunConfig, data: DatasetSplits, resume: bool, overwrite: bool) -> Path:
    """Decide what to do with the run directory; raises before anything is written."""
    name = cfg.name or f"{data.name}-{cfg.space}"
    run_dir = Path(cfg.out) / name
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} exists and is not a directory")
    if run_dir.exists() and any(run_dir.iterdir()):
        marker = run_dir / RUN_MARKER
        if resume and overwrite:
            raise UserError("--resume and --overwrite exclude each other; choose one")
        if not marker.is_file():
            raise UserError(f"{run_dir} exists and is not an hwnas run directory (no {RUN_MARKER}); "
                            f"choose another --name or --out")
        if overwrite:
            shutil.rmtree(run_dir)
        elif resume:
            saved = json.loads(marker.read_text())
            current = _settings(cfg, data)
            diff = [k for k in _RESUME_KEYS if saved.get(k) != current.get(k)]
            if diff:
                raise UserError(f"cannot resume {run_dir}: settings differ from the saved run in "
                                + ", ".join(f"{k} ({saved.get(k)!r} there, {current.get(k)!r} now)" for k in diff))
        else:
            raise UserError(f"{run_dir} already holds a run; pass --resume to continue it, "
                            f"--overwrite to replace it, or choose another --name")
    return run_dir


def _settings(cfg: RunConfig, data: DatasetSplits) -> dict[str, Any]:
    s = asdict(cfg)
    s["dataset_name"] = data.name
    s["supernet"] = str(Path(cfg.supernet).resolve()) if cfg.supernet else None
    return s


def _check_compatible(space: SearchSpace, data: DatasetSplits, source: str) -> None:
    want = (data.in_channels, *data.image_size)
    if tuple(space.input_shape) != want or space.num_classes != data.num_classes:
        raise UserError(f"{source} was built for input {tuple(space.input_shape)} with "
                        f"{space.num_classes} classes; the dataset has input {want} with "
                        f"{data.num_classes} classes")


def _obtain_supernet(cfg: RunConfig, data: DatasetSplits, run_dir: Path, progress: bool):
    """(space, supernet, train result or None); loads the run's own checkpoint on resume."""
    own = run_dir / "supernet.pt"
    if own.is_file():
        space, supernet, _ = load_checkpoint(own, device=cfg.device)
        return space, supernet, None
    checkpoint = cfg.supernet or shipped_checkpoint(cfg.space, data.classes)
    if checkpoint:
        space, supernet, _ = load_checkpoint(checkpoint, device=cfg.device)
        if space.name != cfg.space:
            raise UserError(f"checkpoint {checkpoint} holds space {space.name!r}, not {cfg.space!r}")
        _check_compatible(space, data, f"checkpoint {checkpoint}")
        return space, supernet, None
    h, w = data.image_size
    if h != w:
        raise UserError(f"space {cfg.space} needs square images; the dataset's are {h}x{w}")
    space = get_space(cfg.space, in_channels=data.in_channels, image_size=h,
                      num_classes=data.num_classes)
    supernet = space.build_supernet()
    result = train_supernet(supernet, space, data, sandwich_config(cfg.epochs, seed=cfg.seed),
                            device=cfg.device, progress=progress)
    return space, supernet, result


def run(cfg: RunConfig, *, resume: bool = False, overwrite: bool = False,
        progress: bool = True, log=print) -> RunResult:
    """The main job; see the module docstring. ``log`` receives progress lines."""
    start = time.perf_counter()
    cfg.validate()
    data = load_dataset(cfg.dataset, seed=cfg.data_seed)
    run_dir = _prepare_run_dir(cfg, data, resume, overwrite)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    space, supernet, train_result = _obtain_supernet(cfg, data, run_dir, progress)
    timings["supernet_s"] = time.perf_counter() - t0
    if train_result:
        log(f"trained supernet {space.name} on {data.name}: {train_result.epochs} epochs in "
            f"{train_result.seconds:.0f} s ({train_result.images_per_s:.0f} images/s)")

    if not (run_dir / RUN_MARKER).is_file():
        # first write of this run: stage everything, then move it into place in one rename
        staging = run_dir.with_name(f".{run_dir.name}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_checkpoint(staging / "supernet.pt", supernet, space, dataset=data.name,
                        train_config=sandwich_config(cfg.epochs, seed=cfg.seed) if train_result else None)
        if train_result:
            _write_json(staging / "train_history.json", asdict(train_result))
        _write_json(staging / RUN_MARKER, _settings(cfg, data))
        if run_dir.exists():  # an empty directory
            run_dir.rmdir()
        staging.rename(run_dir)
    else:
        settings = _settings(cfg, data)
        _write_json(run_dir / RUN_MARKER, settings)  # the budget may have grown

    settings = EvalSettings(latency_threads=cfg.latency_threads, seed=cfg.seed)
    evaluator = SubnetEvaluator(space, supernet, data, settings)
    study = open_study(sqlite_url(run_dir / "study.db"), run_dir.name, cfg.sampler, cfg.seed)
    enqueue_seeds(study, space)
    t0 = time.perf_counter()
    ran = run_trials(study, space, evaluator, cfg.trials, progress=progress)
    timings["search_s"] = time.perf_counter() - t0
    log(f"search: {ran} new trials ({cfg.sampler}, seed {cfg.seed}) in {timings['search_s']:.0f} s")

    trials = trials_frame(study)
    _write_csv(run_dir / "trials.csv", trials)
    t0 = time.perf_counter()
    pareto = export_front(study, space, evaluator, data, run_dir)
    timings["export_s"] = time.perf_counter() - t0
    _write_csv(run_dir / "pareto.csv", pareto)
    plot_pareto(trials, run_dir / "pareto.png",
                title=f"{space.name} on {data.name}: {len(trials)} trials, "
                      f"{int(trials['pareto'].sum())} Pareto-optimal ({cfg.sampler})")
    return RunResult(run_dir, trials, pareto, time.perf_counter() - start, train_result, timings)


def export_front(study, space: SearchSpace, evaluator: SubnetEvaluator, data: DatasetSplits,
                 run_dir: Path) -> pd.DataFrame:
    """Export every Pareto-optimal subnet to ONNX, check it against PyTorch and score it on the
    test split; returns pareto.csv's rows. A model that fails the parity check is deleted and
    marked as failed rather than shipped."""
    models_tmp = run_dir / ".models.tmp"
    shutil.rmtree(models_tmp, ignore_errors=True)
    models_tmp.mkdir()
    test_x = torch.cat([x for x, _ in eval_loader(data, data.test)]).cpu()
    rows, manifest = [], []
    for t in sorted(pareto_trials(study), key=lambda t: t.user_attrs["latency_ms"]):
        arch_str = t.user_attrs["arch"]
        _, model = evaluator.build(space.from_string(arch_str))
        model = model.cpu()
        test_acc = accuracy(model, eval_loader(data, data.test))
        filename = f"trial_{t.number:04d}.onnx"
        metadata = {"arch": arch_str, "space": space.name, "dataset": data.name,
                    "trial": t.number, "val_accuracy": t.user_attrs["accuracy"],
                    "test_accuracy": test_acc, "flops": t.user_attrs["flops"],
                    "latency_ms_cpu": t.user_attrs["latency_ms"]}
        path = export_onnx(model, torch.zeros(1, *space.input_shape), models_tmp / filename,
                           metadata=metadata)
        parity = check_parity(path, model, test_x)
        if not parity.passed:
            path.unlink()
        rows.append({"trial": t.number, "arch": arch_str, **{k: t.user_attrs[k] for k in (
            "accuracy", "flops", "params", "size_bytes", "latency_ms", "latency_p95_ms")},
            "test_accuracy": test_acc, "onnx": f"models/{filename}" if parity.passed else "",
            "onnx_max_abs_diff": parity.max_abs_diff, "onnx_parity": parity.passed})
        manifest.append({"file": filename if parity.passed else None, **metadata,
                         "parity": parity.as_dict()})
    _write_json(models_tmp / "manifest.json", manifest)
    final = run_dir / "models"
    shutil.rmtree(final, ignore_errors=True)
    models_tmp.rename(final)
    return pd.DataFrame(rows)


def summary_table(result: RunResult) -> str:
    """The Pareto set as a readable table, fastest first."""
    p = result.pareto
    if p.empty:
        return "no Pareto-optimal trials"
    table = pd.DataFrame({
        "trial": p["trial"],
        "val acc %": p["accuracy"].map("{:.1f}".format),
        "test acc %": p["test_accuracy"].map("{:.1f}".format),
        "MFLOPs": (p["flops"] / 1e6).map("{:.2f}".format),
        "latency ms": p["latency_ms"].map("{:.3f}".format),
        "size KiB": (p["size_bytes"] / 1024).map("{:.0f}".format),
        "ONNX |diff|": p["onnx_max_abs_diff"].map("{:.1e}".format),
        "arch": p["arch"],
    })
    return table.to_string(index=False)
