"""Estimated devices: an analytical estimator of :mod:`hwnas.latency.estimators`
(``fpga-zcu102-est``, ``edgetpu-est``, ``jetson-orin-nano-est`` ...) applied to any space's layer
list."""

from __future__ import annotations

from typing import Any

from hwnas.latency.devices.base import Device, parse_archs, resolve_space


class EstimatedDevice(Device):
    """An analytical estimator (:mod:`hwnas.latency.estimators`) applied to the space's layer list."""

    kind = "estimated"

    def __init__(self, estimator: Any, name: str | None = None) -> None:
        self.estimator = estimator
        self.name = name or estimator.name
        self.description = estimator.description
        self.quant_rules = getattr(estimator, "quant_rules", Device.quant_rules)

    def latency(self, space, archs):
        space = resolve_space(space)
        return self.estimator.estimate_many([space.layers(a) for a in parse_archs(space, archs)])
