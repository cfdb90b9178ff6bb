"""Supernet checkpoints shipped with the package, found by space and dataset.

``hwnas run --space mbv3 --dataset cifar10`` (or ``--space vit``) uses the shipped CIFAR-10
supernet instead of training one (how each was trained: ``benchmarks/supernet_cifar10.md``). A
checkpoint is matched on the space name and the dataset's class names, so a CIFAR-10 loaded
from the npz file, the pickle directory or an ImageFolder with the same classes all find it.
A space names candidate files in order, the first present wins: ``vit`` takes ``cct``'s
supernet (``cct_cifar10.pt``, a variant of the vit family,
:attr:`hwnas.supernet.space.SearchSpace.family`) before its own, and
the run then goes on in space ``cct``; ``vit_cifar10.pt`` stays shipped for ``--supernet``.
"""

from __future__ import annotations

from pathlib import Path

from hwnas.core.resources import package_path

#: This package's folder, where the checkpoints are (package data, found through importlib).
_HERE = package_path(__name__)

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")

#: (space name, class names) -> files in this directory, in order of preference: the first
#: present is used. A file may hold a variant of the space (same family): ``cct_cifar10.pt``
#: for ``vit``; the search refuses any other space's.
SHIPPED: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {
    ("mbv3", CIFAR10_CLASSES): ("mbv3_cifar10.pt",),
    ("vit", CIFAR10_CLASSES): ("cct_cifar10.pt", "vit_cifar10.pt"),
    ("cct", CIFAR10_CLASSES): ("cct_cifar10.pt",),
}


def shipped_candidates(space: str, classes: list[str] | tuple[str, ...], *,
                       directory: str | Path | None = None) -> list[Path]:
    """The files that may hold a shipped checkpoint for ``space`` on a dataset with these
    classes, preferred first, present or not (in ``directory``, default this package's
    folder)."""
    names = SHIPPED.get((space, tuple(c.lower() for c in classes)), ())
    return [Path(directory or _HERE) / name for name in names]


def shipped_checkpoint(space: str, classes: list[str] | tuple[str, ...], *,
                       directory: str | Path | None = None) -> Path | None:
    """The shipped checkpoint for ``space`` trained on a dataset with these classes, if any:
    the first of its candidates present (:data:`SHIPPED`)."""
    return next((p for p in shipped_candidates(space, classes, directory=directory)
                 if p.is_file()), None)
