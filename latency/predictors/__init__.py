"""Latency predictors: a few measurements on a new device -> the latency of any architecture.

Six families behind one interface (:class:`LatencyPredictor`), each detailed in its own module:
``flops`` (a power law of FLOPs: rank = FLOPs rank), ``lut`` (a layer-wise lookup table whose
per-layer-kind costs are fitted by NNLS), ``mlp`` (a small MLP ensemble, no prior), ``opcount``
(a non-negative cost per operation: the baseline of issue 23), ``lowrank`` (per-operation costs
under a low-rank prior from other devices: fast and robust to which architectures were
measured) and ``meta``, the default (a GP prior meta-learned from other devices' tables,
HELP-style, with reference architectures chosen by optimal design).

``load_pretrained("nb201")`` / ``load_pretrained("fbnet")`` return the meta predictor trained on
HELP's meta-training devices, shipped in ``latency/data/`` so that adaptation works offline.
Importing this package imports numpy only (scipy and scikit-learn are imported when fitting).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hwnas.core.resources import package_path
from hwnas.latency.predictors.base import (
    PREDICTORS,
    LatencyPredictor,
    predictor_classes,
    register_predictor_class,
)
from hwnas.latency.predictors.flops import FlopsPredictor
from hwnas.latency.predictors.lowrank import LowRankPredictor
from hwnas.latency.predictors.lut import LayerTablePredictor
from hwnas.latency.predictors.meta import MetaPredictor
from hwnas.latency.predictors.mlp import MLPPredictor
from hwnas.latency.predictors.opcount import OpCountPredictor

from hwnas.core.errors import UserError

__all__ = [
    "DEFAULT_PREDICTOR",
    "PREDICTORS",
    "FlopsPredictor",
    "LatencyPredictor",
    "LayerTablePredictor",
    "LowRankPredictor",
    "MLPPredictor",
    "MetaPredictor",
    "OpCountPredictor",
    "available_predictors",
    "available_pretrained",
    "default_predictor",
    "get_predictor",
    "load_pretrained",
    "pretrained_path",
    "register_predictor",
    "register_predictor_class",
    "predictor_classes",
]

#: The predictor hwnas adapts by default (where a pretrained one exists for the space).
DEFAULT_PREDICTOR = "meta"

#: Where the shipped meta-trained predictors live: ``<package>/latency/data/<space>_meta.npz``.
PRETRAINED_DIR = package_path("hwnas.latency", "data")

for _cls in (FlopsPredictor, LayerTablePredictor, MLPPredictor, MetaPredictor, OpCountPredictor,
             LowRankPredictor):
    PREDICTORS.register(_cls.name, _cls, builtin=True)
del _cls


def register_predictor(name: str, cls: type[LatencyPredictor]) -> None:
    """Make a predictor class available by name (``cls(space)`` must construct it; its files
    load with :meth:`LatencyPredictor.load`). ``tests/test_latency_predictor_contract.py``
    checks every registered predictor."""
    PREDICTORS.register(name, cls)


def available_predictors() -> list[str]:
    """The names of the registered predictors, sorted."""
    return PREDICTORS.names()


def get_predictor(name: str, space: Any, **options: Any) -> LatencyPredictor:
    """A fresh predictor ``name`` for ``space``.

    ``meta`` returns the shipped meta-trained predictor of the space when there is one (and the
    space has the configuration it was trained for), else an untrained one that must be
    :meth:`~LatencyPredictor.meta_fit` before it can adapt. ``lowrank`` likewise returns
    ``latency/data/<space>_lowrank.npz`` where it is shipped.

    Examples:
        >>> import numpy as np
        >>> from hwnas.latency import get_predictor
        >>> from hwnas.supernet import get_space
        >>> space = get_space("nb201")
        >>> rng = np.random.default_rng(0)
        >>> archs = [space.sample(rng) for _ in range(10)]
        >>> predictor = get_predictor("flops", space)
        >>> ms = [0.1 + 1e-8 * space.flops(a) for a in archs]   # ten measurements of a device
        >>> predictor = predictor.adapt(archs, ms, seed=0)
        >>> predictor.predict(archs[:2]).shape
        (2,)
    """
    cls = PREDICTORS.get(name)
    if name == "meta" and not options and getattr(space, "name", None) in available_pretrained():
        pre = load_pretrained(space.name)
        if pre.space.config() == space.config():
            return pre
    if name == "lowrank" and not options and pretrained_path(
            getattr(space, "name", ""), "lowrank").is_file():
        pre = LatencyPredictor.load(pretrained_path(space.name, "lowrank"))
        if pre.space.config() == space.config():
            return pre
    return cls(space, **options)


def pretrained_path(space_name: str, kind: str = "meta") -> Path:
    """The file of the shipped meta-trained predictor ``kind`` (``meta`` or ``lowrank``) of
    ``space_name`` (may not exist)."""
    if kind not in ("meta", "lowrank"):
        raise UserError(f"no pretrained predictors of kind {kind!r}; expected meta or lowrank")
    return PRETRAINED_DIR / f"{space_name}_{kind}.npz"


def available_pretrained() -> list[str]:
    """Spaces with a shipped meta-trained predictor."""
    if not PRETRAINED_DIR.is_dir():
        return []
    return sorted(p.name[: -len("_meta.npz")] for p in PRETRAINED_DIR.glob("*_meta.npz"))


def load_pretrained(space_name: str) -> LatencyPredictor:
    """The shipped meta-trained predictor of ``space_name`` (not adapted to any device yet).

    Examples:
        >>> from hwnas.latency import load_pretrained
        >>> from hwnas.supernet import get_space
        >>> space = get_space("nb201")
        >>> predictor = load_pretrained("nb201")      # meta-trained, shipped with hwnas
        >>> predictor.name, len(predictor.reference_archs) >= 10
        ('meta', True)
    """
    path = pretrained_path(space_name)
    if not path.is_file():
        raise UserError(f"no pretrained latency predictor for space {space_name!r}; pretrained "
                        f"predictors exist for {available_pretrained()}")
    return LatencyPredictor.load(path)


def default_predictor(space: Any, name: str | None = None) -> LatencyPredictor:
    """The predictor to adapt for ``space``: the one named ``name``, else the space's
    pretrained predictor (:func:`load_pretrained`), else the FLOPs one."""
    if name is not None:
        return get_predictor(name, space)
    try:
        pretrained = load_pretrained(space.name)
    except UserError:  # none shipped for this space
        return get_predictor("flops", space)
    if pretrained.space.config() != space.config():  # trained for another configuration
        return get_predictor("flops", space)
    return pretrained
