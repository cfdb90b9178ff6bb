"""An external teacher for distillation (``hwnas train --teacher``).

A vision transformer trained on a small dataset lacks a convolution's inductive biases; DeiT
(Touvron et al., 2021) passes them on by distilling from a convolutional teacher. Here the
teacher is any network hwnas trained: a subnet of a supernet checkpoint (default its largest,
BatchNorm-recalibrated on augmented training images as every evaluation is) or a standalone
checkpoint, frozen; :func:`hwnas.supernet.train.label_loss` mixes its predictions with the labels.

Refused in one line: a teacher of other classes, one whose outputs do not fit the data, and one
that trained on images of this dataset's validation or test split (the student would learn
them through the teacher and its validation and test scores would read high). A teacher whose
checkpoint records no training images gets a warning line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hwnas.supernet.data.splits import DatasetSplits
from hwnas.supernet.evaluate import accuracy, eval_loader, recalibrated_subnet
from hwnas.supernet.fingerprint import image_hashes, read_record
from hwnas.supernet.checkpoint_io import load_network, with_training_augment
from torch import nn

from hwnas.core.errors import UserError
from hwnas.core.io import first_line

__all__ = ["check_teacher_data", "load_teacher"]


def check_teacher_data(payload: dict[str, Any], data: DatasetSplits, source: str,
                       log: Callable[[str], Any] = print) -> None:
    """:class:`UserError` unless the checkpoint ``payload`` (read from ``source``) trained on
    the classes of ``data`` and on none of its validation or test images."""
    record = read_record(payload, source)
    if record is None:
        log(f"warning: teacher {source} does not record its training images (written by an "
            f"earlier hwnas); whether it saw validation or test images of {data.name!r} cannot "
            f"be checked")
        return
    names = [c.strip().lower() for c in record.classes]
    if names != [c.strip().lower() for c in data.classes]:
        raise UserError(f"teacher {source} was trained on classes {', '.join(record.classes)}; "
                        f"dataset {data.name!r} has {', '.join(data.classes)}: pass a teacher "
                        f"trained on this dataset")
    for split in ("val", "test"):
        seen = np.isin(image_hashes(getattr(data, split).images), record.train_hashes)
        if seen.any():
            raise UserError(f"teacher {source} trained on {int(seen.sum())} of the "
                            f"{len(seen)} {split} images of {data.name!r}; the network it "
                            f"teaches would learn them through it: pass a teacher trained on "
                            f"this dataset's training split only")


def _teacher_arch(space: Any, arch: str | None) -> Any:
    if arch is None or arch == "largest":
        return space.largest()
    if arch == "smallest":
        return space.smallest()
    try:
        return space.from_string(arch)
    except UserError as exc:
        raise UserError(f"--teacher-arch {arch!r}: {exc} (or 'largest', 'smallest')") from None


def load_teacher(path: str | Path, data: DatasetSplits, *, arch: str | None = None,
                 device: str | torch.device = "cpu", calib_batches: int = 20,
                 calib_batch_size: int = 256,
                 log: Callable[[str], Any] = print) -> tuple[nn.Module, str]:
    """The teacher of checkpoint ``path`` for training on ``data``: (the frozen network on
    ``device`` in eval mode, its description ``"<file name>:<arch>"`` for
    :attr:`hwnas.supernet.recipes.TrainConfig.teacher`). ``arch``: the subnet of a supernet
    checkpoint ('largest', the default, 'smallest' or an architecture string); a standalone
    checkpoint is its own network. Logs the teacher's validation accuracy."""
    source = str(path)
    space, saved, net, payload = load_network(path, device=device)
    check_teacher_data(payload, data, source, log)
    if saved is None:
        chosen = _teacher_arch(space, arch)
        augmented = with_training_augment(data, payload.get("train_config"))
        net = recalibrated_subnet(net, chosen, augmented, calib_batches=calib_batches,
                                  calib_batch_size=calib_batch_size)
    else:
        chosen = saved
        if arch is not None and arch != space.to_string(saved):
            raise UserError(f"--teacher-arch {arch!r}: {source} holds the standalone subnet "
                            f"{space.to_string(saved)} (a subnet can be chosen from a supernet "
                            f"checkpoint only)")
    net = net.eval().requires_grad_(False)
    val = eval_loader(data, data.val, batch_size=256, device=device)
    try:
        with torch.no_grad():
            x, _ = next(iter(val))
            out = net(x[:2])
        if out.dim() != 2 or out.size(1) != data.num_classes:
            raise ValueError(f"output of shape {tuple(out.shape)}")
    except (RuntimeError, ValueError) as exc:
        raise UserError(f"teacher {source} does not fit {data.name!r} ({data.in_channels} x "
                        f"{data.image_size[0]} x {data.image_size[1]} images, "
                        f"{data.num_classes} classes): {first_line(exc)}") from None
    name = f"{Path(path).name}:{space.to_string(chosen)}"
    log(f"teacher {name}: {accuracy(net, val):.2f} % on {len(data.val)} validation images")
    return net, name
