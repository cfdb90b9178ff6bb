"""The device registry: one :class:`hwnas.core.registry.Registry` of every device reachable by
name, each entry a factory (``**options`` -> :class:`Device`) with its kind, spaces and
description. Built-ins (measured, table, estimated) are protected; :func:`register_device` adds
a user's device through the same ``register`` call, so the device contract test
(``tests/test_device_contract.py``) checks it like ours. The built-ins follow this machine and
the tables present, so :func:`device_registry` assembles the registry from them on each call.
Device profiles (kind ``adapted``) live on disk and are looked up after it
(:func:`hwnas.latency.devices.get_device`); they may not take a built-in name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hwnas.latency.devices.base import KINDS, Device, DeviceInfo
from hwnas.latency.devices.estimated import EstimatedDevice
from hwnas.latency.devices.measured import _measured_factories
from hwnas.latency.devices.table import TableDevice, _table_entries, table_description
from hwnas.latency.estimators import available_estimators, get_estimator

from hwnas.core.errors import UserError
from hwnas.core.registry import Registry

#: The devices users registered (merged after the built-ins by :func:`device_registry`).
_USER: Registry[Callable[..., Device]] = Registry("device")


def _no_options(name: str, kind: str, build: Callable[[], Device]) -> Callable[..., Device]:
    """A factory for a device that takes no options (tables, estimators)."""
    def factory(**options: Any) -> Device:
        if options:
            raise UserError(f"device {name!r} ({kind}) takes no options, got {sorted(options)}")
        return build()
    return factory


def _estimated(name: str) -> Device:
    return EstimatedDevice(get_estimator(name))


def device_registry() -> Registry[Callable[..., Device]]:
    """Every device by name except profiles: estimated, table and measured built-ins (a later
    kind wins a name clash, as measured devices always have), then the users' devices."""
    reg: Registry[Callable[..., Device]] = Registry("device")
    for name in available_estimators():
        build = functools.partial(_estimated, name)
        reg.register(name, _no_options(name, "estimated", build), builtin=True, kind="estimated",
                     spaces=None, description=lambda n=name: get_estimator(n).description)
    for name, tables in sorted(_table_entries().items()):
        build = functools.partial(TableDevice, name, tables)
        reg.register(name, _no_options(name, "table", build), builtin=True, kind="table",
                     spaces=tuple(sorted(tables)),
                     description=functools.partial(table_description, name, tables))
    for name, (factory, description) in _measured_factories().items():
        reg.register(name, factory, builtin=True, kind="measured", spaces=None,
                     description=description)
    for name in _USER:
        if name not in reg:
            reg.register(name, _USER.get(name), **_USER.info(name))
    return reg


def register_device(name: str, factory: Callable[..., Device], *, kind: str,
                    spaces: tuple[str, ...] | None = None, description: str = "") -> None:
    """Make a device available by name: ``factory(**options)`` returns it. Built-in names (and
    profiles) cannot be shadowed; a user's device may be registered again.

    Examples:
        >>> from hwnas.latency.devices import EstimatedDevice, get_device, register_device
        >>> from hwnas.latency.estimators import get_estimator
        >>> register_device("my-tpu", lambda: EstimatedDevice(get_estimator("edgetpu-est"),
        ...                 "my-tpu"), kind="estimated", description="my Edge TPU")
        >>> get_device("my-tpu").name
        'my-tpu'
    """
    if kind not in KINDS:
        raise UserError(f"device kind {kind!r}; expected one of {list(KINDS)}")
    if device_registry().is_builtin(name):
        raise UserError(f"device name {name!r} is taken by a built-in device")
    _USER.register(name, factory, kind=kind, spaces=None if spaces is None else tuple(spaces),
                   description=description)


def builtin_device_names() -> set[str]:
    """Names of the measured, table and estimated devices (profiles may not take them)."""
    reg = device_registry()
    return {name for name in reg if reg.is_builtin(name)}


def registry_infos(reg: Registry[Callable[..., Device]]) -> list[DeviceInfo]:
    """A :class:`DeviceInfo` per entry of ``reg`` (descriptions computed now)."""
    out = []
    for name in reg:
        info = reg.info(name)
        text = info["description"]
        out.append(DeviceInfo(name, info["kind"], info["spaces"], text() if callable(text) else text))
    return out
