"""Checkpoint files: save and load supernets and standalone subnets (with their space, training
configuration and the record of their training images), checked on the way in.

A checkpoint is a ``torch.save`` payload tagged with its format (:data:`SUPERNET_FORMAT` or
:data:`STANDALONE_FORMAT`), written atomically, and read with ``weights_only=True`` (a file
holding anything but tensors and plain data is refused: it could run code). Every way a file
can be wrong -- missing, another kind, foreign, corrupt, another space, non-finite weights --
is one :class:`UserError` line naming it. :func:`load_for_resume` adds the checks of a
training that continues one.
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hwnas.supernet.data import AUGMENT_KINDS, DatasetSplits
from hwnas.supernet.recipes import TrainConfig
from hwnas.supernet.space import SearchSpace
from torch import nn

from hwnas.core.errors import UserError
from hwnas.core.io import first_line, write_atomic

__all__ = ["STANDALONE_FORMAT", "SUPERNET_FORMAT", "load_checkpoint", "load_for_resume",
           "load_network", "load_standalone", "save_checkpoint", "save_standalone",
           "with_training_augment"]

#: Format tags of the two checkpoint kinds.
SUPERNET_FORMAT = "hwnas-supernet-1"
STANDALONE_FORMAT = "hwnas-standalone-1"


def _state_dict(module: nn.Module, half: bool) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in module.state_dict().items():
        v = v.detach().cpu()
        out[k] = v.half() if half and v.is_floating_point() else v.contiguous()
    return out


def _write(path: str | Path, fmt: str, space: SearchSpace, state_dict: dict[str, torch.Tensor], *,
           dataset: str, train_config: TrainConfig | None, extra: dict[str, Any] | None,
           train_state: dict[str, Any] | None, data_record: dict[str, Any] | None,
           arch: str | None = None) -> Path:
    """Write a checkpoint of format ``fmt`` atomically (the keys in the order files have)."""
    payload: dict[str, Any] = {"format": fmt, "space": space.name, "space_config": space.config()}
    if arch is not None:
        payload["arch"] = arch
    payload.update(dataset=dataset, train_config=train_config.to_dict() if train_config else None,
                   extra=extra or {}, state_dict=state_dict)
    if train_state is not None:
        payload["train_state"] = train_state
    if data_record is not None:
        payload["data_record"] = data_record
    return write_atomic(path, lambda tmp: torch.save(payload, tmp))


def save_checkpoint(path: str | Path, supernet: nn.Module, space: SearchSpace, *,
                    dataset: str, train_config: TrainConfig | None = None,
                    extra: dict[str, Any] | None = None,
                    train_state: dict[str, Any] | None = None, half: bool = False,
                    data_record: dict[str, Any] | None = None) -> Path:
    """Save the supernet's weights with everything needed to rebuild it (written atomically).

    ``train_state`` (from the training loop) makes it resumable. ``half``: store floating
    tensors as float16 (half the size, for shipping; loading converts back to float32).
    ``data_record`` (:func:`hwnas.supernet.fingerprint.training_record`) says which images it
    trained on, so that a search can keep them out of validation."""
    return _write(path, SUPERNET_FORMAT, space, _state_dict(supernet, half), dataset=dataset,
                  train_config=train_config, extra=extra, train_state=train_state,
                  data_record=data_record)


def save_standalone(path: str | Path, model: nn.Module, space: SearchSpace, arch: Any, *,
                    dataset: str, train_config: TrainConfig | None = None,
                    extra: dict[str, Any] | None = None,
                    train_state: dict[str, Any] | None = None,
                    data_record: dict[str, Any] | None = None) -> Path:
    """Save a standalone subnet: its space, architecture string, weights and (``data_record``)
    the images it trained on."""
    return _write(path, STANDALONE_FORMAT, space, _state_dict(model, False), dataset=dataset,
                  train_config=train_config, extra=extra, train_state=train_state,
                  data_record=data_record, arch=space.to_string(space.parse(arch)))


def _read_payload(path: str | Path, fmt: str | None) -> dict[str, Any]:
    """The checked payload of a checkpoint of format ``fmt`` (None: either kind)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; expected a file written by "
                        f"'hwnas train' or 'hwnas run'")
    what = {SUPERNET_FORMAT: "supernet", STANDALONE_FORMAT: "standalone subnet"}.get(fmt, "hwnas")
    link = f" (a symbolic link to {path.resolve()})" if path.is_symlink() else ""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise UserError(f"cannot read {what} checkpoint {path}{link}: "
                        f"{exc.strerror or first_line(exc)}") from None
    # torch.save writes a zip archive (PK..), its legacy format a pickle (0x80); nothing else is one
    if head and not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise UserError(f"cannot read {what} checkpoint {path}{link}: not a checkpoint (a file "
                        f"of another kind, starting {head!r}); expected a file written by "
                        f"'hwnas train' or 'hwnas run'")
    try:
        with warnings.catch_warnings():  # e.g. about the pickle protocol of a foreign file
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's weights-only loader refused an object
        raise UserError(f"cannot read {what} checkpoint {path}: it holds objects other than "
                        f"tensors and plain data, which hwnas never loads (they could run "
                        f"code)") from None
    except Exception as exc:  # torch raises many types for a corrupt or foreign file
        raise UserError(f"cannot read {what} checkpoint {path}{link}: {first_line(exc)}") from None
    if not isinstance(payload, dict) or payload.get("format") not in (SUPERNET_FORMAT, STANDALONE_FORMAT):
        tag = repr(fmt) if fmt else f"{SUPERNET_FORMAT!r} or {STANDALONE_FORMAT!r}"
        raise UserError(f"{path} is not an hwnas {what} checkpoint (no {tag} format tag)")
    if fmt is not None and payload["format"] != fmt:
        kinds = {SUPERNET_FORMAT: "a supernet", STANDALONE_FORMAT: "a standalone subnet"}
        raise UserError(f"{path} holds {kinds[payload['format']]} checkpoint, not "
                        f"{kinds[fmt]} checkpoint")
    return payload


def _space_of(payload: dict[str, Any], path: str | Path) -> SearchSpace:
    from hwnas.supernet.spaces import get_space

    try:
        return get_space(payload["space"], config=payload["space_config"])
    except KeyError:
        raise UserError(f"checkpoint {path} records no space") from None
    except UserError as exc:
        raise UserError(f"checkpoint {path}: {exc}") from None
    except (TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise UserError(f"checkpoint {path} records a space that cannot be built: "
                        f"{first_line(exc)}") from None


def with_training_augment(data: DatasetSplits, train_config: dict[str, Any] | None) -> DatasetSplits:
    """``data`` with the augmentation that a checkpoint's weights were trained with, where its
    ``train_config`` (the checkpoint's dict, as saved) records one.

    BatchNorm recalibration (:func:`hwnas.supernet.evaluate.bn_calibration_loader`) augments like
    ``data.augment``, and it must augment like training did: run 5's CIFAR-10 supernet, trained
    with cutout, scored 93.7 % (largest subnet) and 91.6 % (smallest) on 2,000 test images when
    recalibrated without cutout, 94.5 % and 93.2 % with it; run 7's (the shipped one, trained
    with TrivialAugment before cutout) 95.65 % and 92.50 % without TrivialAugment, 95.70 % and
    93.15 % with it."""
    if train_config is not None and not isinstance(train_config, dict):
        raise UserError(f"a checkpoint's train_config is a {type(train_config).__name__}, not a "
                        f"training configuration")
    augment = (train_config or {}).get("augment")
    if not augment or augment == data.augment:
        return data
    if augment not in AUGMENT_KINDS:
        raise UserError(f"the checkpoint was trained with augmentation {augment!r}, which this "
                        f"version does not know; expected one of {list(AUGMENT_KINDS)}")
    return replace(data, augment=augment)


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu",
                    space: SearchSpace | None = None):
    """Load a supernet checkpoint; returns (space, supernet, payload).

    With ``space``, the checkpoint must hold that space (same name and configuration), else
    :class:`UserError`."""
    payload = _read_payload(path, SUPERNET_FORMAT)
    if space is not None:
        _check_same_space(payload, space, path)
    ckpt_space, _, supernet = _network_of(payload, path)
    return ckpt_space, supernet.to(device), payload


def load_standalone(path: str | Path, *, device: str | torch.device = "cpu"):
    """Load a standalone subnet checkpoint; returns (space, arch, model in eval mode, payload)."""
    payload = _read_payload(path, STANDALONE_FORMAT)
    space, arch, model = _network_of(payload, path)
    return space, arch, model.to(device).eval(), payload


def load_network(path: str | Path, *, device: str | torch.device = "cpu"):
    """Load a checkpoint of either kind; returns (space, arch, network, payload): the supernet
    and ``arch`` None for a supernet checkpoint, the subnet (eval mode) and its architecture
    for a standalone one."""
    payload = _read_payload(path, None)
    space, arch, model = _network_of(payload, path)
    model = model.to(device)
    return space, arch, (model if arch is None else model.eval()), payload


def _network_of(payload: dict[str, Any], path: str | Path) -> tuple[SearchSpace, Any, nn.Module]:
    """(space, arch, network with the payload's weights) of a checked payload; arch is None
    for a supernet."""
    space = _space_of(payload, path)
    if payload["format"] == SUPERNET_FORMAT:
        arch, model = None, _build(space, path)
    else:
        arch = space.parse(payload["arch"])
        model = _build(space, path).extract(arch)
    _load_state(model, payload, path, space)
    return space, arch, model


def _build(space: SearchSpace, path: str | Path) -> nn.Module:
    """The supernet of a checkpoint's space; UserError when its recorded configuration cannot
    make one (a crafted file: negative class count, channels ...)."""
    try:
        return space.build_supernet()
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise UserError(f"checkpoint {path} records a space configuration that builds no "
                        f"network: {first_line(exc)}") from None


def _load_state(module: nn.Module, payload: dict[str, Any], path: str | Path,
                space: SearchSpace) -> None:
    state = payload.get("state_dict")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"checkpoint {path} holds no weights (its state_dict is not a mapping "
                        f"of tensors)")
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise UserError(f"checkpoint {path} holds non-finite weights (NaN or infinity) in "
                        f"{len(bad)} tensor(s), e.g. {bad[0]}; train it again")
    try:
        module.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError) as exc:
        raise UserError(f"checkpoint {path} does not match space {space.name}: "
                        f"{first_line(exc)}") from None


def _check_same_space(payload: dict[str, Any], space: SearchSpace, path: str | Path) -> None:
    if payload.get("space") != space.name:
        raise UserError(f"checkpoint {path} holds space {payload.get('space')!r}, not "
                        f"{space.name!r}; train a new one or pass the matching --space")
    if payload.get("space_config") != space.config():
        diff = sorted(k for k in set(space.config()) | set(payload.get("space_config") or {})
                      if (payload.get("space_config") or {}).get(k) != space.config().get(k))
        raise UserError(f"checkpoint {path} holds space {space.name!r} with another "
                        f"configuration (differs in {', '.join(diff)})")


def load_for_resume(path: str | Path, kind: str, model: nn.Module, space: SearchSpace,
                    arch: str | None, config: TrainConfig, steps_per_epoch: int,
                    train_size: int) -> dict[str, Any]:
    """The payload of the resumable checkpoint ``path`` of ``kind`` (a format tag), its weights
    loaded into ``model``; UserError unless it continues this training: same space, subnet
    ``arch`` (standalone), configuration and dataset size, and a training state."""
    payload = _read_payload(path, kind)
    _check_same_space(payload, space, path)
    if kind == STANDALONE_FORMAT and payload.get("arch") != arch:
        raise UserError(f"checkpoint {path} holds subnet {payload.get('arch')!r}, not {arch!r}")
    ts = payload.get("train_state")
    if not ts:
        raise UserError(f"checkpoint {path} holds final weights only (no training state); "
                        f"it cannot be resumed")
    if payload.get("train_config") is None or TrainConfig.from_dict(payload["train_config"]) != config:
        raise UserError(f"checkpoint {path} was trained with another training configuration; "
                        f"resume with the configuration it records (train_config)")
    if ts["train_size"] != train_size or ts["steps_per_epoch"] != steps_per_epoch:
        raise UserError(f"checkpoint {path} was trained on {ts['train_size']} images "
                        f"({ts['steps_per_epoch']} steps/epoch); this dataset has {train_size} "
                        f"({steps_per_epoch} steps/epoch)")
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        raise UserError(f"checkpoint {path} does not match space {space.name}: "
                        f"{first_line(exc)}") from None
    return payload


def rng_state(device: torch.device, rng: np.random.Generator | None = None) -> dict[str, Any]:
    """The random state a resumable checkpoint holds: torch's CPU generator, ``device``'s
    CUDA generator, and ``rng``'s (a NumPy generator) where given."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if rng is not None:
        state["numpy"] = rng.bit_generator.state
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device,
                  rng: np.random.Generator | None = None) -> None:
    """Restore what :func:`rng_state` saved (the parts this call has generators for)."""
    torch.set_rng_state(state["torch"])
    if rng is not None and "numpy" in state:
        rng.bit_generator.state = state["numpy"]
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
