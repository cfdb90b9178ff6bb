"""Devices: a name, a kind, and a way to give the latency of architectures of a search space.

One module per kind (:data:`KINDS`): ``measured`` (timed here: ``cpu-ort-1t``, ``cpu-ov-8t-b32``,
``cuda-graph``), ``table`` (a column of a latency table: ``pixel3``, ``xeon-ort-1t``),
``estimated`` (an analytical estimator: ``edgetpu-est``) and ``adapted`` (a device profile:
a predictor adapted to a user's measurements); the interface in ``base``, the one registry of
built-in and user devices in ``registry``. :func:`get_device` finds a device by name (optionally
checking that it covers a space), :func:`available_devices` lists them. Importing this package
does not import torch (only measuring with the default supernet does) nor pandas.
"""

from __future__ import annotations

import difflib
from typing import Any

from hwnas.latency.devices.adapted import AdaptedDevice
from hwnas.latency.devices.base import KINDS, Device, DeviceInfo, resolve_space, space_name
from hwnas.latency.devices.estimated import EstimatedDevice
from hwnas.latency.devices.measured import MeasuredDevice, cpu_device_factory, parse_cpu_device
from hwnas.latency.devices.registry import (
    builtin_device_names,
    device_registry,
    register_device,
    registry_infos,
)
from hwnas.latency.devices.table import (
    MEASURED_TABLES_ENV,
    MIN_RELIABILITY,
    TableDevice,
    measured_tables,
    measured_tables_dir,
    packaged_tables_dir,
    reliability,
    session_agreement,
    table_description,
)
from hwnas.latency.profiles import find_profile, list_profiles
from hwnas.latency.tables import TABLE_FILES, latency_tables
from hwnas.supernet.space import SearchSpace

from hwnas.core.errors import UserError

__all__ = [
    "KINDS",
    "Device",
    "DeviceInfo",
    "MeasuredDevice",
    "TableDevice",
    "EstimatedDevice",
    "AdaptedDevice",
    "available_devices",
    "device_names",
    "device_registry",
    "get_device",
    "register_device",
    "builtin_device_names",
    "latency_tables",
    "measured_tables",
    "measured_tables_dir",
    "packaged_tables_dir",
    "parse_cpu_device",
    "reliability",
    "session_agreement",
    "resolve_space",
    "table_description",
    "MEASURED_TABLES_ENV",
    "MIN_RELIABILITY",
    "TABLE_FILES",
]


def available_devices(space: SearchSpace | str | None = None) -> list[DeviceInfo]:
    """Every device (optionally: those covering ``space``), in :data:`KINDS` order then name.

    Examples:
        >>> from hwnas.latency import available_devices
        >>> infos = available_devices("nb201")
        >>> sorted({i.kind for i in infos}) >= ['estimated', 'measured', 'table']
        True
        >>> next(i for i in infos if i.name == "xeon-ort-1t").kind   # a measured table, shipped
        'table'
    """
    reg = device_registry()
    infos = registry_infos(reg)
    infos += [AdaptedDevice(p).info() for p in list_profiles() if p.name not in reg]
    name = space_name(space)
    infos = [i for i in infos if name is None or i.spaces is None or name in i.spaces]
    return sorted(infos, key=lambda i: (KINDS.index(i.kind), i.name))


def device_names(space: SearchSpace | str | None = None) -> list[str]:
    return [i.name for i in available_devices(space)]


def get_device(name: str, space: SearchSpace | str | None = None, **options: Any) -> Device:
    """The device ``name``; with ``space``, also check that it covers that space.

    ``options`` go to the device's constructor (e.g. ``model_fn``, ``repeats`` and ``warmup``
    for measured devices). Unknown names raise :class:`UserError` listing close names.

    Examples:
        >>> from hwnas.latency import get_device
        >>> get_device("cpu-ort-1t").kind, get_device("xeon-ort-1t", "nb201").kind
        ('measured', 'table')
    """
    if not isinstance(name, str) or not name:
        raise UserError(f"device name must be a non-empty string, got {name!r}")
    reg = device_registry()
    factory = reg.get(name) if name in reg else cpu_device_factory(name)
    if factory is not None:
        try:
            device = factory(**options)
        except TypeError as exc:  # an option the device does not take
            raise UserError(f"device {name!r}: bad option(s) {sorted(options)}: {exc}") from None
    else:
        profile = find_profile(name)
        if profile is None:
            known = device_names()
            close = difflib.get_close_matches(name, known, n=4, cutoff=0.5)
            hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
            raise UserError(f"unknown device {name!r}; {hint}see 'hwnas latency devices' for the "
                            f"{len(known)} available devices")
        if options:
            raise UserError(f"device {name!r} (adapted) takes no options, got {sorted(options)}")
        device = AdaptedDevice(profile)
    if space is not None:
        device.check_space(space)
    return device
