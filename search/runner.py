"""A search from start to finish: supernet, joint architecture + bit-width study, outputs.

:func:`run_search` validates everything before writing, obtains the supernet, runs (or
continues) the Optuna study and writes the outputs (:mod:`hwnas.search.outputs`); rerunning
the same command continues the run.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import hwnas.search.outputs as outputs
from hwnas.search.bits import (
    ArchBitsSpace,
    bit_groups,
    group_params,
    policy_for,
    sensitivity_seeds,
    uniform_groups,
)
from hwnas.search.config import RESUME_KEYS, SearchConfig
from hwnas.search.evaluator import (
    TrialEvaluator,
    metric_columns,
    policy_from_text,
    policy_text,
)
from hwnas.search.plots import plot_across_devices, plot_fronts, plot_hypervolume
from hwnas.search.replay import eval_settings, load_run_supernet, replay_splits
from hwnas.search.rundir import RUN_FORMAT, RunDir
from hwnas.search.samplers import make_sampler, resolve_sampler, screening_problem
from hwnas.search.supernet_source import checkpoint_source, variant_note, resolve_supernet
from hwnas.search.study import (
    check_storage,
    completed,
    describe_study,
    enqueue_once,
    is_sqlite,
    lock_sqlite,
    open_study,
    recover_interrupted,
    run_trials,
    sampler_seed,
    sqlite_url,
)
from hwnas.supernet.data.sources import load_dataset
from hwnas.supernet.data.splits import DatasetSplits
from hwnas.supernet.space import SearchSpace
from hwnas.supernet.train import (
    TrainConfig,
    TrainResult,
    check_torch_device,
    save_checkpoint,
)

from hwnas.core.errors import UserError
from hwnas.core.heap import retain_freed_memory, retained_heap
from hwnas.core.io import LockFile, check_writable, first_line, write_json
from hwnas.core.written import (
    RECORD,
    check_replaceable,
    foreign,
    read_record,
    record_files,
    remove_stale,
    replace_dir,
    staged,
)

CONFIG_FILE = RunDir.CONFIG


class InfeasibleError(UserError):
    """No completed trial meets the constraints (raised after the outputs are written)."""


@dataclass
class SearchResult:
    run_dir: Path
    trials: pd.DataFrame
    fronts: dict[str, pd.DataFrame]
    hypervolume: pd.DataFrame
    seconds: float
    new_trials: int = 0
    train: TrainResult | None = None
    timings: dict[str, float] = field(default_factory=dict)
    #: the dataset as loaded, before any split was replayed: ``export_run(dataset=)`` reuses it
    data: DatasetSplits | None = field(default=None, repr=False)


# -- the run directory -----------------------------------------------------------------------

def settings_of(cfg: SearchConfig, data: DatasetSplits, run_name: str,
                requested: str | None = None) -> dict[str, Any]:
    """config.json of a run: the settings and what the run resolved; ``requested_space``: the
    ``--space`` asked for where the run went on in a variant's (:func:`_in_space`)."""
    s = cfg.to_dict()
    s.update(format=RUN_FORMAT, devices=cfg.all_devices, reported_devices=list(cfg.devices),
             dataset_name=data.name, study_name=cfg.study_name or run_name,
             supernet=str(Path(cfg.supernet).resolve()) if cfg.supernet else None)
    if requested is not None and requested != cfg.space:
        s["requested_space"] = requested
    return s


def _in_space(cfg: SearchConfig, space: str, run_dir: Path) -> SearchConfig:
    """``cfg`` going on in ``space``, a variant of ``cfg.space`` whose shipped supernet the run
    uses (:func:`resolve_supernet`), named after its run directory: what the run records
    (config.json, hence export, fine-tuning, :func:`hwnas.load_run`, a repeat of the run with
    its config) names the space used, and still finds this directory."""
    return replace(cfg, space=space, name=cfg.name or run_dir.name)


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run hwnas wrote (:meth:`RunDir.is_run`)."""
    return RunDir(path).is_run()


def check_out_dir(out: str | Path) -> None:
    """UserError unless ``--out`` is, or can be created as, a writable directory."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; expected the directory that holds runs")
    check_writable(out)


def run_dir_of(cfg: SearchConfig, data: DatasetSplits) -> Path:
    return Path(cfg.out) / (cfg.name or f"{data.name}-{cfg.space}")


def prepare_run_dir(cfg: SearchConfig, data: DatasetSplits,
                    overwrite: bool) -> tuple[Path, bool, SearchConfig]:
    """(run directory, continuing?, the settings it goes on with) — raises before anything is
    written. A run that went on in a variant's space when started with ``cfg.space`` (its
    config.json's ``requested_space``) continues in that space. Nothing is deleted here: with
    ``overwrite`` an existing run is replaced only once the new one is staged, and only when
    everything in it is what hwnas wrote (:mod:`hwnas.core.written`)."""
    run_dir = run_dir_of(cfg, data)
    if run_dir.is_symlink():
        raise UserError(f"{run_dir} is a symbolic link; hwnas writes a run only into a real "
                        f"directory: choose another --name or --out")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} exists and is not a directory; choose another --name or --out")
    if not (run_dir.exists() and any(run_dir.iterdir())):
        return run_dir, False, cfg
    if not is_run_dir(run_dir):
        names = foreign(run_dir) if read_record(run_dir) is None else [CONFIG_FILE]
        raise UserError(f"{run_dir} exists and is not an hwnas run directory (no record of a "
                        f"search's files, {RECORD}; it holds {', '.join(names[:4])}"
                        f"{' ...' if len(names) > 4 else ''}); hwnas never replaces it, choose "
                        f"another --name or --out")
    if overwrite:
        check_replaceable(run_dir, overwrite=True, writers=[RunDir.WRITER],
                          what="an hwnas run directory", flag="run directory",
                          instead="choose another --name or --out")
        return run_dir, False, cfg
    RunDir(run_dir).read_config(need_supernet=False)  # one line for a broken config.json
    check_writable(run_dir, "run directory")  # continuing writes there: fail before any work
    if RunDir(run_dir).supernet.is_symlink():
        raise UserError(f"{RunDir(run_dir).supernet} is a symbolic link (to "
                        f"{RunDir(run_dir).supernet.resolve()}), not the supernet checkpoint the "
                        f"search wrote; restore the run's own file, or pass --overwrite")
    saved = json.loads((run_dir / CONFIG_FILE).read_text())
    if saved.get("requested_space") == cfg.space and isinstance(saved.get("space"), str):
        cfg = _in_space(cfg, saved["space"], run_dir)
    current = settings_of(cfg, data, run_dir.name)
    # a run written before a setting existed ran at its default (every image: eval_images 0)
    saved.setdefault("eval_images", 0)
    diff = [k for k in RESUME_KEYS if saved.get(k) != current.get(k)]
    if diff:
        raise UserError(f"{run_dir} holds a run with other settings: " + ", ".join(
            f"{k} ({saved.get(k)!r} there, {current.get(k)!r} now)" for k in diff)
            + "; pass --overwrite to replace it or choose another --name")
    return run_dir, True, cfg


def _lock_run_dir(run_dir: Path) -> LockFile:
    """An exclusive lock on the run directory (a lock file beside it), so two processes cannot
    write one run — extra workers of the same run share the study through the storage, not the
    directory. Taken before the directory is checked."""
    try:
        lock = LockFile(run_dir.with_name(f".{run_dir.name}.lock"))
    except OSError as exc:
        raise UserError(f"--out {run_dir.parent}: cannot write there ({first_line(exc)})") from None
    if not lock.held:
        raise UserError(f"another hwnas process is writing {run_dir}; wait for it, or choose "
                        f"another --name (several workers: --storage postgresql://... --workers N)")
    return lock


# -- the study -------------------------------------------------------------------------------

def make_objective(space: SearchSpace, evaluator: TrialEvaluator, cfg: SearchConfig):
    """The Optuna objective: suggest an architecture (and bit-widths), score it, record every
    metric as a user attribute and every constraint with ``trial.set_constraint``."""
    objectives, constraints = cfg.objective_metrics, cfg.constraint_list
    joint = ArchBitsSpace(space, cfg.bit_choices) if cfg.bits else None

    def objective(trial) -> tuple[float, ...]:
        if joint is not None:
            cand = joint.suggest(trial)
            arch, policy = cand.arch, joint.policy(cand)
        else:
            arch, policy = space.suggest(trial), None
        trial.set_user_attr("arch", space.to_string(arch))
        trial.set_user_attr("policy", policy_text(policy))
        metrics = evaluator(arch, policy)
        for name, value in metrics.items():
            trial.set_user_attr(name, value)
        for c in constraints:
            trial.set_constraint(c.text, c.violation(metrics[c.metric.column]))
        return tuple(metrics[m.column] for m in objectives)

    return objective


def seed_trials(space: SearchSpace, supernet, data: DatasetSplits, cfg: SearchConfig,
                log=print) -> list[tuple[dict[str, Any], str]]:
    """(params, label) of the seed trials: largest and smallest architectures (float and, when
    bits are searched, int8), plus sensitivity-based policies of the largest - only when the
    budget reaches them (a 4-trial search spent its Hessian seconds, 33 s on an H100, on
    policies no trial ran: benchmarks/export_speed.md, Session 36)."""
    seeds: list[tuple[dict[str, Any], str]] = []
    groups = bit_groups(space)
    archs = [("largest", space.largest()), ("smallest", space.smallest())]
    for label, arch in archs:
        params = space.to_params(arch)
        if not cfg.bits:
            seeds.append((params, label))
            continue
        quantized = [b for b in cfg.bit_choices if b < 32]
        if 32 in cfg.bit_choices:
            seeds.append(({**params, **group_params(uniform_groups(groups, 32))}, f"{label}-float"))
        if 8 in quantized:
            seeds.append(({**params, **group_params(uniform_groups(groups, 8))}, f"{label}-int8"))
    if not (cfg.bits and cfg.sensitivity_seeds):
        return seeds
    if cfg.trials <= len(seeds):
        log(f"sensitivity seeds: skipped ({cfg.trials} trials run only the {len(seeds)} plain seeds)")
    else:
        t0 = time.perf_counter()
        found = sensitivity_seeds(space, supernet, data, cfg.bit_choices, seed=cfg.seed)
        for i, group_bits in enumerate(found):
            seeds.append(({**space.to_params(space.largest()), **group_params(group_bits)},
                          f"largest-hessian-{i + 1}"))
        log(f"sensitivity seeds: {len(found)} bit policies in {time.perf_counter() - t0:.1f} s")
    return seeds


def build_sampler(cfg: SearchConfig, space: SearchSpace, evaluator: TrialEvaluator,
                  n_seeds: int, seed: int | None = None):
    """The search's sampler, seeded by ``seed`` (default ``cfg.seed``); ``screening`` gets the
    search's problem (candidates with their bit policies, cheap objectives and constraints on
    the evaluator's devices)."""
    if not isinstance(cfg.sampler, str):
        return cfg.sampler  # the user's Optuna sampler object, as given
    problem = None
    name = resolve_sampler(cfg.sampler, cfg.objective_metrics)
    if name == "screening":
        problem = screening_problem(space, cfg.objective_metrics, cfg.constraint_list,
                                    evaluator.devices, bits=cfg.bits, bit_choices=cfg.bit_choices)
    return make_sampler(name, cfg.seed if seed is None else seed, n_seeds=n_seeds,
                        problem=problem)


def tracking_callbacks(cfg: SearchConfig) -> list:
    """Optuna callbacks that log each completed trial to an experiment tracker: with
    ``cfg.mlflow``, optuna-integration's ``MLflowCallback`` (one MLflow run per trial, in the
    experiment named after the study; metrics named after the objectives, ``:`` as ``_``)."""
    if cfg.mlflow is None:
        return []
    import warnings

    from optuna_integration.mlflow import MLflowCallback

    names = [m.key.replace(":", "_") for m in cfg.objective_metrics]
    with warnings.catch_warnings():  # deprecated in optuna-integration 4.9, kept until 6.0 (the
        warnings.simplefilter("ignore", FutureWarning)  # extra pins below 6)
        return [MLflowCallback(tracking_uri=cfg.mlflow, metric_name=names,
                               create_experiment=True, tag_study_user_attrs=True)]


def _sampler_label(cfg: SearchConfig) -> str:
    """``auto (screening)``: the sampler as set, and what it stands for where they differ (a
    sampler object: its class name)."""
    if not isinstance(cfg.sampler, str):
        return cfg.sampler_name
    name = resolve_sampler(cfg.sampler, cfg.objective_metrics)
    return cfg.sampler if name == cfg.sampler else f"{cfg.sampler} ({name})"


def _open(cfg: SearchConfig, run_dir: Path, sampler):
    storage = cfg.storage or sqlite_url(RunDir(run_dir).study_db)
    study = open_study(storage, cfg.study_name or run_dir.name, sampler, cfg.seed,
                       cfg.objective_metrics)
    return storage, study


def study_attrs(cfg: SearchConfig, data: DatasetSplits, supernet_source: str | None,
                trained: bool) -> dict[str, Any]:
    """What the study's objectives are about (its user attributes, e.g. for optuna-dashboard)."""
    from hwnas.core.version import __version__

    if trained or supernet_source is None:
        supernet = f"trained for this run ({cfg.epochs} epochs)"
    else:
        supernet = str(Path(supernet_source).resolve())
    return {"space": cfg.space, "dataset": data.name, "dataset_spec": cfg.dataset,
            "data_seed": cfg.data_seed, "supernet": supernet, "hwnas_version": __version__,
            "objectives": cfg.objectives, "constraints": list(cfg.constraints),
            "devices": cfg.all_devices, "bits": cfg.bits, "sampler": cfg.sampler_name,
            "seed": cfg.seed}


def _evaluator(cfg: SearchConfig, space, supernet, data, accuracy_fn=None,
               run_dir: Path | str | None = None, log=None) -> TrialEvaluator:
    """The trial evaluator; with ``run_dir``, the int8 speed-up tables of the run's last export
    replace the devices' default int8 gain (said once through ``log``)."""
    settings = eval_settings(cfg)
    speedups = RunDir(run_dir).int8_speedups(cfg.all_devices) if run_dir is not None else {}
    for device, table in speedups.items():
        if log is not None:
            log(f"{device}: int8 speed-ups of {len(table)} layer shape(s) from "
                f"{RunDir(run_dir).int8_speedup(device)}")
    return TrialEvaluator(space, supernet, data, cfg.all_devices, settings, accuracy_fn,
                          int8_speedups=speedups)


PREDICTOR_FILE = RunDir.PREDICTOR


def accuracy_predictor(cfg: SearchConfig, space: SearchSpace, evaluator: TrialEvaluator,
                       run_dir: Path, *, progress: bool = False, log=print):
    """``accuracy_fn`` for ``--accuracy predictor``: fitted on ``predictor_samples`` random
    candidates evaluated on the supernet (saved in accuracy_predictor.json with the held-out
    Spearman, and refitted from there when the run continues or another worker joins)."""
    from hwnas.search.accuracy_predictor import (
        candidate_features,
        fit_and_report,
        sample_candidates,
    )
    from tqdm.auto import tqdm

    groups = bit_groups(space) if cfg.bits else []
    path = RunDir(run_dir).predictor
    if path.is_file():
        saved = json.loads(path.read_text())
        samples = [(space.from_string(r["arch"]), policy_from_text(r["policy"]), r["accuracy"])
                   for r in saved["samples"]]
    else:
        samples = []
        todo = sample_candidates(space, groups, cfg.bit_choices, cfg.predictor_samples, cfg.seed + 1)
        for arch, bits in tqdm(todo, desc="accuracy samples", disable=not progress, leave=False):
            policy = policy_for(space, arch, bits) if cfg.bits else None
            samples.append((arch, policy, evaluator(arch, policy)["accuracy"]))
    x = np.stack([candidate_features(space, a, p, groups) for a, p, _ in samples])
    y = np.array([acc for _, _, acc in samples])
    predictor, report = fit_and_report(x, y, seed=cfg.seed)
    if not path.is_file():
        write_json(path, {"report": report.as_dict(), "samples": [
            {"arch": space.to_string(a), "policy": policy_text(p), "accuracy": acc}
            for a, p, acc in samples]})
        log(f"accuracy predictor: {len(samples)} supernet evaluations; Spearman on "
            f"{report.n_test} held-out candidates {report.spearman:.3f}, mean abs error "
            f"{report.mae:.2f} points")

    def accuracy_fn(arch, policy) -> float:
        return float(predictor.predict(candidate_features(space, arch, policy, groups)[None])[0])

    return accuracy_fn


def worker_main(cfg_dict: dict[str, Any], run_dir: str, n_seeds: int, worker: int = 1) -> int:
    """One extra worker process: load the run's supernet, join the study, run trials (its
    sampler seeded apart from the other workers')."""
    cfg = SearchConfig(**cfg_dict)
    torch.set_num_threads(1)
    retain_freed_memory()  # the worker only searches: freed memory is reused
    rd = RunDir(run_dir)
    space, supernet, payload = load_run_supernet(rd, cfg, device=cfg.torch_device)
    data = replay_splits(cfg, payload, str(rd.supernet), scoring=True)  # as the main process
    evaluator = _evaluator(cfg, space, supernet, data, run_dir=run_dir)
    if cfg.accuracy == "predictor":
        fn = accuracy_predictor(cfg, space, evaluator, Path(run_dir), log=lambda *a: None)
        evaluator = _evaluator(cfg, space, supernet, data, fn, run_dir=run_dir)
    _, study = _open(cfg, Path(run_dir), build_sampler(cfg, space, evaluator, n_seeds))
    study.sampler = build_sampler(cfg, space, evaluator, n_seeds,
                                  seed=sampler_seed(cfg.seed, len(study.trials), worker))
    return run_trials(study, make_objective(space, evaluator, cfg), cfg.trials, progress=False,
                      callbacks=tracking_callbacks(cfg))


@dataclass
class _RunSupernet:
    """The supernet a search scores on, and what its run directory records of it."""

    space: SearchSpace
    supernet: Any
    source: str | None  # the checkpoint it was loaded from; None: trained for this run
    train: TrainResult | None
    train_config: TrainConfig | None
    record: dict[str, Any] | None  # its training images (hwnas.supernet.fingerprint)


def _check_continuable(cfg: SearchConfig, run_dir: Path, continuing: bool) -> None:
    """UserError for a continued run whose outputs outlived its SQLite study."""
    rd = RunDir(run_dir)
    if continuing and cfg.storage is None and rd.trials_csv.is_file() and not rd.study_db.is_file():
        raise UserError(f"{run_dir} holds a run whose study.db is missing; its outputs "
                        f"cannot be continued: restore study.db, pass --overwrite to "
                        f"start afresh, or choose another --name")


def _supernet_and_data(cfg: SearchConfig, data: DatasetSplits, run_dir: Path, continuing: bool,
                       progress: bool, log) -> tuple[_RunSupernet, DatasetSplits]:
    """The supernet (loaded, or trained first) and the splits replayed for it
    (:func:`hwnas.search.replay.replay_splits`: a checkpoint's training images stay out of
    validation; the scoring budget)."""
    source = checkpoint_source(cfg, data, run_dir, continuing)
    if source is None:
        log(f"no supernet checkpoint for space {cfg.space} on {data.name} (none shipped, no "
            f"--supernet): training one first, {cfg.epochs} epoch{'s' * (cfg.epochs != 1)} on "
            f"{cfg.torch_device} "
            f"(the progress bar estimates the time; --supernet FILE uses a trained one)")
    space, supernet, train, train_config, record = resolve_supernet(
        cfg, data, run_dir, progress, continuing)
    if space.name != cfg.space:
        log(variant_note(cfg, data, space, source))
    data = replay_splits(cfg, {"data_record": record, "train_config": train_config.to_dict()
                               if train_config else None}, str(source), data=data,
                         disjoint=train is None, scoring=True, log=log)
    if cfg.eval_images:
        log(f"scoring on {len(data.val)} validation and {len(data.test)} test images "
            f"(eval_images {cfg.eval_images})")
    return _RunSupernet(space, supernet, source, train, train_config, record), data


def _write_run_files(cfg: SearchConfig, run_dir: Path, continuing: bool, sn: _RunSupernet,
                     data: DatasetSplits, requested: str) -> None:
    """A new run directory appears whole (settings, supernet, training history) in one rename;
    a continued one gets its settings and record of written files updated (the ``--space``
    its first command asked for kept)."""
    if continuing:
        requested = RunDir(run_dir).read_config(need_supernet=False).get("requested_space",
                                                                          requested)
    settings = settings_of(cfg, data, run_dir.name, requested)
    owned = RunDir(run_dir).written_files(cfg.all_devices)
    if continuing:
        record_files(run_dir, RunDir.WRITER, owned, dirs=RunDir.OWNED_ELSEWHERE)
        write_json(RunDir(run_dir).config, settings)  # trials/workers may have changed
        return
    remove_stale(run_dir)  # what a killed search left beside it
    with staged(run_dir, RunDir.WRITER, flag="run directory",
                dirs=RunDir.OWNED_ELSEWHERE) as staging:
        stage = RunDir(staging)
        save_checkpoint(stage.supernet, sn.supernet, sn.space, dataset=data.name,
                        train_config=sn.train_config, data_record=sn.record)
        if sn.train:
            write_json(stage.train_history, sn.train.__dict__)
        write_json(stage.config, settings)
    record_files(staging, RunDir.WRITER, owned)
    replace_dir(staging, run_dir, writers=[RunDir.WRITER], what="an hwnas run directory",
                flag="run directory")


def _start_study(cfg: SearchConfig, sn: _RunSupernet, data: DatasetSplits, run_dir: Path,
                 continuing: bool, progress: bool, log):
    """(study, evaluator of the outputs, evaluator of the trials, seeds enqueued): the study
    opened or continued, described, seeded once, its sampler drawing on, interrupted trials
    recovered."""
    space, supernet = sn.space, sn.supernet
    evaluator = _evaluator(cfg, space, supernet, data, run_dir=run_dir, log=log)
    search_evaluator = evaluator
    if cfg.accuracy == "predictor":
        fn = accuracy_predictor(cfg, space, evaluator, run_dir, progress=progress, log=log)
        search_evaluator = _evaluator(cfg, space, supernet, data, fn, run_dir=run_dir)
    storage, study = _open(cfg, run_dir, build_sampler(cfg, space, evaluator, 0))
    attrs = study_attrs(cfg, data, sn.source, sn.train is not None)
    if continuing and "supernet" in study.user_attrs:
        attrs.pop("supernet")  # the run's own copy now; the study keeps where it came from
    describe_study(study, attrs)
    n_before = len(study.get_trials(deepcopy=False))
    seeds = [] if n_before else seed_trials(space, supernet, data, cfg, log)
    n_seeds = enqueue_once(study, seeds)
    # start-up counts seeds; a continued study draws on from a seed of its own
    study.sampler = build_sampler(cfg, space, evaluator, n_seeds,
                                  seed=sampler_seed(cfg.seed, n_before))
    if is_sqlite(storage):
        recovered = recover_interrupted(study)
        if recovered:
            log(f"recovered {recovered} trial(s) interrupted in an earlier run; they run again")
    return study, evaluator, search_evaluator, n_seeds


def _run_all_trials(cfg: SearchConfig, study, space: SearchSpace, evaluator: TrialEvaluator,
                    run_dir: Path, n_seeds: int, progress: bool) -> int:
    """Run trials until the budget has completed, with ``cfg.workers - 1`` extra worker
    processes (:func:`worker_main`) beside this one; the number this process ran."""
    procs = []
    if cfg.workers > 1:
        ctx = multiprocessing.get_context("spawn")
        for w in range(1, cfg.workers):
            p = ctx.Process(target=worker_main, args=(cfg.to_dict(), str(run_dir), n_seeds, w))
            p.start()
            procs.append(p)
    try:
        new = run_trials(study, make_objective(space, evaluator, cfg), cfg.trials,
                         progress=progress, callbacks=tracking_callbacks(cfg))
    finally:
        for p in procs:
            p.join()
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        raise UserError(f"{len(failed)} of {cfg.workers - 1} extra worker(s) failed "
                        f"(exit codes {failed}); rerun the command to complete the budget")
    return new


def _check_feasible(cfg: SearchConfig, trials: pd.DataFrame) -> None:
    """InfeasibleError (after the outputs are written) when no trial meets the constraints,
    naming the closest ones."""
    constraints = cfg.constraint_list
    if constraints and not trials["feasible"].any():
        closest = outputs.closest_infeasible(trials, constraints)
        detail = "; ".join(
            f"trial {int(r.trial)}: " + ", ".join(f"{c.metric.key}={r[c.metric.column]:.4g}"
                                                   for c in constraints)
            for _, r in closest.iterrows())
        raise InfeasibleError(f"no trial meets {' and '.join(c.text for c in constraints)} "
                              f"after {len(trials)} trials; closest: {detail}")


def run_search(cfg: SearchConfig, *, overwrite: bool = False, progress: bool = True,
               log=print) -> SearchResult:
    """Run the search ``cfg`` from start to finish:

    1. Validate the settings, load the dataset, build the space and check every device has a
       latency model for it — all before anything is written.
    2. Obtain the supernet: the run directory's own checkpoint when continuing, ``--supernet``,
       the checkpoint shipped for the space and dataset, or train one. A shipped checkpoint
       may hold a variant of the space (``cct`` for ``vit``): the run then goes on, and
       records itself, in the variant's space (:func:`_in_space`).
    3. Open (or continue) the Optuna study, enqueue the seeds once (largest and smallest
       architectures, float and int8, plus Hessian-sensitivity bit policies of the largest), and
       run trials until the budget has completed — with ``--workers N`` on a server database,
       N processes share the study (more machines: run the same command there).
    4. Write the outputs (:mod:`hwnas.search.outputs`): trials.csv/.parquet, pareto_<device>.csv
       with test-split accuracy, hypervolume.csv, fronts.png, devices.png, hypervolume.png.

    Rerunning the same command continues the run (settings must match; the budget may grow);
    ``overwrite=True`` starts afresh. Files are written atomically; the run directory appears
    with its first complete files (config.json, supernet.pt) in one rename.
    """
    start = time.perf_counter()
    cfg.validate()
    check_torch_device(cfg.torch_device)
    check_out_dir(cfg.out)
    if cfg.storage:
        check_storage(cfg.storage)
    loaded = data = load_dataset(cfg.dataset, seed=cfg.data_seed)
    lock = _lock_run_dir(run_dir_of(cfg, data))  # before the directory is checked; held to the end
    written, sqlite_lock, requested = False, None, cfg.space
    try:
        run_dir, continuing, cfg = prepare_run_dir(cfg, data, overwrite)
        if cfg.space != requested:
            log(f"--space {requested}: continuing {run_dir} in space {cfg.space}, the "
                f"{requested} variant whose shipped supernet it runs on ({RunDir.CONFIG})")
        _check_continuable(cfg, run_dir, continuing)
        sqlite_lock = lock_sqlite(cfg.storage) if cfg.storage else None
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        sn, data = _supernet_and_data(cfg, data, run_dir, continuing, progress, log)
        if sn.space.name != cfg.space:  # a variant's shipped supernet: the run is in its space
            cfg = _in_space(cfg, sn.space.name, run_dir)
        timings["supernet_s"] = time.perf_counter() - t0
        if sn.train:
            log(f"trained supernet {sn.space.name} on {data.name}: {sn.train.epochs} epochs in "
                f"{sn.train.seconds:.0f} s ({sn.train.images_per_s:.0f} images/s)")
        written = True
        _write_run_files(cfg, run_dir, continuing, sn, data, requested)
        with retained_heap():  # seeds, trials and scoring reuse freed memory (hwnas.core.heap)
            study, evaluator, search_evaluator, n_seeds = _start_study(
                cfg, sn, data, run_dir, continuing, progress, log)
            t0 = time.perf_counter()
            new = _run_all_trials(cfg, study, sn.space, search_evaluator, run_dir, n_seeds,
                                  progress)
            timings["search_s"] = time.perf_counter() - t0
            log(f"search: {_sampler_label(cfg)} (seed {cfg.seed}), {len(completed(study))} trials "
                f"in the study, {new} new by this process in {timings['search_s']:.0f} s")
            t0 = time.perf_counter()
            result = write_outputs(study, cfg, sn.space, evaluator, data, run_dir)
            timings["outputs_s"] = time.perf_counter() - t0
        result.seconds, result.new_trials, result.train, result.timings = (
            time.perf_counter() - start, new, sn.train, timings)
        result.data = loaded
        _check_feasible(cfg, result.trials)
        return result
    finally:
        if sqlite_lock is not None:
            sqlite_lock.release(clean=not written)
        lock.release(clean=not written)


def score_models(rows: pd.DataFrame, evaluator: TrialEvaluator) -> dict:
    """(arch, policy) -> (validation, test) accuracy measured on the supernet for each
    distinct model in ``rows`` (:meth:`TrialEvaluator.front_scores`, on its data's splits)."""
    return evaluator.front_scores(list(rows[["arch", "policy"]].itertuples(index=False)))


def write_outputs(study, cfg: SearchConfig, space: SearchSpace, evaluator: TrialEvaluator,
                  data: DatasetSplits, run_dir: Path) -> SearchResult:
    devices = cfg.all_devices
    objectives = cfg.objective_metrics
    rd = RunDir(run_dir)
    trials = outputs.trials_frame(study, devices, objectives, cfg.constraint_list,
                                  metric_columns(devices))
    trials["policy"] = trials["policy"].fillna("")
    fronts = {d: outputs.device_front(trials, d, objectives) for d in devices}
    union = pd.concat(list(fronts.values())) if fronts else trials.head(0)
    scores = score_models(union, evaluator) if len(union) else {}
    for d, f in fronts.items():
        keys = list(zip(f["arch"], f["policy"]))
        at = f.columns.get_loc("accuracy") + 1
        f.insert(at, "test_accuracy", [scores[k][1] for k in keys])
        if cfg.accuracy == "predictor":  # the objective was predicted; show the measured value
            f.insert(at, "accuracy_supernet", [scores[k][0] for k in keys])
        outputs.write_frame(rd.pareto(d), f)
    outputs.write_frame(rd.trials_csv, trials)
    if importlib.util.find_spec("pyarrow") is not None:  # the optional `parquet` extra
        outputs.write_frame(rd.trials_parquet, trials)
    history = outputs.hypervolume_history(trials, devices)
    outputs.write_frame(rd.hypervolume, history)
    title = (f"{space.name} on {data.name}: {len(trials)} trials ({_sampler_label(cfg)}), "
             f"objectives {cfg.objectives}")
    plot_fronts(trials, fronts, rd.plot(rd.FRONTS_PNG), title=title)
    if len(devices) > 1:
        plot_across_devices(trials, fronts, rd.plot(rd.DEVICES_PNG))
    if len(history):
        plot_hypervolume(history, rd.plot(rd.HYPERVOLUME_PNG))
    return SearchResult(run_dir, trials, fronts, history, 0.0)


def summary(result: SearchResult) -> str:
    """The fronts as readable tables, one per device."""
    parts = []
    for device, front in result.fronts.items():
        parts.append(f"Pareto front on {device} ({len(front)} models):")
        parts.append(outputs.summary_table(front, device))
        parts.append("")
    return "\n".join(parts)
