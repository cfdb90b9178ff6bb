"""Where a search's supernet comes from: the run directory's own checkpoint when a run goes on,
``--supernet``, the shipped one for the space and dataset (or a variant's of the same family:
:attr:`hwnas.supernet.space.SearchSpace.family`), else one trained for the dataset. Every check
(space, input shape, devices, cheap bounds, augmentation) happens before training starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hwnas.search.config import SearchConfig
from hwnas.search.evaluator import check_cheap_bounds, check_devices
from hwnas.search.rundir import RunDir
from hwnas.supernet.checkpoints import shipped_candidates, shipped_checkpoint
from hwnas.supernet.data.splits import DatasetSplits
from hwnas.supernet.fingerprint import training_record
from hwnas.supernet.space import SearchSpace
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import (
    TrainConfig,
    TrainResult,
    default_config,
    load_checkpoint,
    train_supernet,
    with_training_augment,
)

from hwnas.core.errors import UserError


def _check_compatible(space: SearchSpace, data: DatasetSplits, source: str) -> None:
    want = (data.in_channels, *data.image_size)
    if tuple(space.input_shape) != want or space.num_classes != data.num_classes:
        raise UserError(f"{source} was built for input {tuple(space.input_shape)} with "
                        f"{space.num_classes} classes; the dataset has input {want} with "
                        f"{data.num_classes} classes")


def _checkpoint(cfg: SearchConfig, data: DatasetSplits, run_dir: Path,
                continuing: bool = True) -> tuple[str | Path | None, str]:
    """(the checkpoint the search scores on, where it comes from): a continued run's own
    (``"run"``; never one that ``--overwrite`` replaces: its settings, e.g. the epochs, may
    differ), ``--supernet`` (``"supernet"``), the shipped one (``"shipped"``); None, ``"train"``:
    train one."""
    own = RunDir(run_dir).supernet
    if continuing and own.is_file():
        return str(own), "run"
    if cfg.supernet:
        return cfg.supernet, "supernet"
    shipped = shipped_checkpoint(cfg.space, data.classes)
    return (shipped, "shipped") if shipped is not None else (None, "train")


def checkpoint_source(cfg: SearchConfig, data: DatasetSplits, run_dir: Path,
                       continuing: bool = True) -> str | Path | None:
    """The checkpoint the search scores on (:func:`_checkpoint`); None: train one."""
    return _checkpoint(cfg, data, run_dir, continuing)[0]


def variant_note(cfg: SearchConfig, data: DatasetSplits, space: SearchSpace,
                 source: str | Path) -> str:
    """The line that says a search of ``cfg.space`` runs on the shipped supernet of a variant,
    ``space``, and how to run on another."""
    others = [str(p) for p in shipped_candidates(cfg.space, data.classes)
              if p.is_file() and p != Path(source)]
    instead = (f"--supernet {others[0]} for the shipped {cfg.space} one" if others
               else f"--supernet FILE for another ('hwnas train --space {cfg.space}' trains one)")
    return (f"--space {cfg.space} on {data.name}: using the shipped {space.name} supernet "
            f"{Path(source).name} (space {space.name}, the {cfg.space} family's network for "
            f"these classes; the run records space {space.name}); {instead}")


def resolve_supernet(cfg: SearchConfig, data: DatasetSplits, run_dir: Path, progress: bool,
                     continuing: bool = True) -> tuple[SearchSpace, Any, TrainResult | None, TrainConfig | None,
                                dict[str, Any] | None]:
    """(space, supernet, training result or None, the training configuration its checkpoint
    records or None, the record of its training images or None) — from the checkpoint that
    applies, else trained for the dataset. Checks happen before training starts. The space is
    ``cfg.space``, or for the shipped checkpoint only a variant of it (its
    :attr:`~hwnas.supernet.space.SearchSpace.family`; the caller goes on in it,
    :func:`_in_space`)."""
    source, origin = _checkpoint(cfg, data, run_dir, continuing)
    if source:
        space, supernet, payload = load_checkpoint(source, device=cfg.torch_device)
        if space.name != cfg.space and not (origin == "shipped" and space.family == cfg.space):
            raise UserError(f"checkpoint {source} holds space {space.name!r}, not {cfg.space!r}")
        _check_compatible(space, data, f"checkpoint {source}")
        check_devices(space, cfg.all_devices)
        check_cheap_bounds(space, cfg.constraint_list, bits=cfg.bits, bit_choices=cfg.bit_choices)
        recorded = payload.get("train_config")
        if recorded is not None and not isinstance(recorded, dict):
            raise UserError(f"checkpoint {source}: its train_config is a "
                            f"{type(recorded).__name__}, not a training configuration")
        try:
            recorded_config = TrainConfig.from_dict(recorded) if recorded else None
        except UserError as exc:
            raise UserError(f"checkpoint {source}: its train_config: {exc}") from None
        trained_with = with_training_augment(data, recorded).augment
        if cfg.augment is not None and cfg.augment != trained_with:
            raise UserError(f"--augment {cfg.augment}: checkpoint {source} was trained with "
                            f"{trained_with}; pass --augment {trained_with}, leave it out, or "
                            f"train a new supernet (--supernet, --name)")
        return space, supernet, None, recorded_config, payload.get("data_record")
    h, w = data.image_size
    if h != w:
        raise UserError(f"space {cfg.space} needs square images; the dataset's are {h}x{w}")
    space = get_space(cfg.space, in_channels=data.in_channels, image_size=h,
                      num_classes=data.num_classes)
    check_devices(space, cfg.all_devices)
    check_cheap_bounds(space, cfg.constraint_list, bits=cfg.bits, bit_choices=cfg.bit_choices)
    torch.manual_seed(cfg.seed)  # the initial weights, as `hwnas train --seed` draws them
    supernet = space.build_supernet()
    config = default_config(space, cfg.epochs, seed=cfg.seed, augment=cfg.augment)
    result = train_supernet(supernet, space, data, config, device=cfg.torch_device,
                            progress=progress)
    return space, supernet, result, config, training_record(data)
