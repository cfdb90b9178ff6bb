"""Supernet checkpoints shipped with the package, found by space and dataset.

``hwnas run --space mbv3 --dataset cifar10`` (or ``--space vit``) uses the shipped CIFAR-10
supernet instead of training one (how each was trained: ``benchmarks/supernet_cifar10.md``). A
checkpoint is matched on the space name and the dataset's class names, so a CIFAR-10 loaded
from the npz file, the pickle directory or an ImageFolder with the same classes all find it.
"""

from __future__ import annotations

from pathlib import Path

from hwnas.core.resources import package_path

#: This package's folder, where the checkpoints are (package data, found through importlib).
_HERE = package_path(__name__)

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")

#: (space name, class names) -> file in this directory
SHIPPED: dict[tuple[str, tuple[str, ...]], str] = {
    ("mbv3", CIFAR10_CLASSES): "mbv3_cifar10.pt",
    ("vit", CIFAR10_CLASSES): "vit_cifar10.pt",
}


def shipped_checkpoint(space: str, classes: list[str] | tuple[str, ...], *,
                       directory: str | Path | None = None) -> Path | None:
    """The shipped checkpoint for ``space`` trained on a dataset with these classes, if any
    (looked for in ``directory``, default this package's folder)."""
    name = SHIPPED.get((space, tuple(c.lower() for c in classes)))
    path = Path(directory or _HERE) / name if name is not None else None
    if path is None or not path.is_file():
        return None
    return path
