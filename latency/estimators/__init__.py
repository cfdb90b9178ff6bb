"""Analytical latency estimators: latency of a network on a device we cannot measure, from its
layer list alone (no torch, no model file). An estimate is a model, not a measurement: it ranks
architectures by what the modelled hardware would do; its absolute numbers carry the
assumptions documented (with parameters and sources) in each family's module:

* :mod:`~hwnas.latency.estimators.fpga` - a pipelined (dataflow) FPGA accelerator (FINN, hls4ml);
* :mod:`~hwnas.latency.estimators.edgetpu` - the Coral Edge TPU (int8 systolic array, 8 MB
  parameter cache, unsupported ops on the host CPU);
* :mod:`~hwnas.latency.estimators.roofline` - a per-layer roofline for GPU/CPU-class devices.

Devices built on them have kind ``"estimated"`` until a user adapts them with measurements. The
shared pieces (:class:`Estimator`, :class:`LayerCost`, layer helpers) live in
:mod:`~hwnas.latency.estimators.base`; this package face re-exports them and holds the registry
(:func:`register_estimator`, :func:`get_estimator`, :func:`available_estimators`).
"""

from __future__ import annotations

from collections.abc import Callable

from hwnas.latency.estimators.base import (
    ELEMENTWISE_OPS,
    Breakdown,
    Estimator,
    LayerCost,
    in_elems,
    layer_kind,
    out_elems,
    vector_ops,
)

from hwnas.core.registry import Registry

__all__ = [
    "Breakdown",
    "Estimator",
    "LayerCost",
    "available_estimators",
    "get_estimator",
    "layer_kind",
    "in_elems",
    "out_elems",
    "vector_ops",
    "ELEMENTWISE_OPS",
    "register_estimator",
    "ESTIMATORS",
]


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

#: name -> factory() returning a new :class:`Estimator`
ESTIMATORS: Registry[Callable[[], Estimator]] = Registry("estimator")


def register_estimator(name: str, factory: Callable[[], Estimator]) -> None:
    """Make an estimator available by name (``factory()`` returns a new instance);
    ``tests/test_latency_estimator_contract.py`` checks every registered estimator."""
    ESTIMATORS.register(name, factory)


def available_estimators() -> list[str]:
    """Names of the registered estimators, sorted.

    Examples:
        >>> from hwnas.latency import available_estimators
        >>> "edgetpu-est" in available_estimators()
        True
    """
    return ESTIMATORS.names()


def get_estimator(name: str) -> Estimator:
    """A new instance of the estimator ``name``; :class:`UserError` (with close names) if unknown.

    Examples:
        >>> from hwnas.latency import get_estimator
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> estimator = get_estimator("fpga-zcu102-est")
        >>> ms = estimator.estimate_many([space.layers(space.smallest())])
        >>> ms.shape, bool(ms[0] > 0)
        ((1,), True)
    """
    return ESTIMATORS.get(name)()


def _register_presets() -> None:
    """The built-in estimators: each family module's ``PRESETS``."""
    from hwnas.latency.estimators import edgetpu, fpga, roofline

    for module in (fpga, edgetpu, roofline):
        for name, factory in module.PRESETS.items():
            ESTIMATORS.register(name, factory, builtin=True)


_register_presets()
