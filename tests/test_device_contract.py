"""The device contract, parametrised over the device registry: every built-in device (measured,
table, estimated), a device profile (adapted) and a device a user registers with
``register_device`` must satisfy the same checks - name and kind, its listing, finite positive
latencies of the right shape for architectures of a space it covers, and one UserError for bad
input."""

from __future__ import annotations

import csv
import functools

import numpy as np
import pytest
from hwnas.latency import profiles
from hwnas.latency.devices import (
    KINDS,
    Device,
    MeasuredDevice,
    available_devices,
    device_registry,
    get_device,
    register_device,
)
from hwnas.latency.devices import registry as registry_module
from hwnas.latency.profiles import read_measurements, save_profile
from hwnas.latency.tables import open_table_text
from hwnas.supernet.spaces import get_space
from latency_support import SPACE, sample_archs, tiny_onnx, write_measurements
from test_latency_profiles import FlopsPredictor

from hwnas.core.errors import UserError
from hwnas.core.registry import Registry

USER_DEVICE = "my-flops-board"
PROFILE_DEVICE = "my-adapted-board"


class FlopsDevice(Device):
    """What a user might register: latency proportional to the FLOPs of the layer list."""

    kind = "estimated"
    description = "FLOPs / 300 MFLOP per ms (a user's device)"

    def __init__(self, name: str = USER_DEVICE) -> None:
        self.name = name

    def latency(self, space, archs):
        from hwnas.latency.devices.base import parse_archs, resolve_space

        space = resolve_space(space)
        return np.array([space.flops(a) / 3e8 for a in parse_archs(space, archs)])


@pytest.fixture()
def devices(profile_dir, tmp_path, monkeypatch):
    """A fresh user registry with ``USER_DEVICE`` and a profile ``PROFILE_DEVICE`` on disk."""
    monkeypatch.setattr(registry_module, "_USER", Registry("device"))
    register_device(USER_DEVICE, FlopsDevice, kind="estimated", description=FlopsDevice.description)
    monkeypatch.setattr(profiles, "TRUSTED_PREDICTOR_PACKAGES",
                        profiles.TRUSTED_PREDICTOR_PACKAGES + [FlopsPredictor.__module__])
    archs, ms = write_measurements(tmp_path / "m.csv", 8)
    space = get_space(SPACE)
    save_profile(PROFILE_DEVICE, space, FlopsPredictor().adapt(archs, ms),
                 read_measurements(tmp_path / "m.csv", space))


@functools.cache
def _table_archs(path: str) -> tuple[str, ...]:
    """The first architectures a latency table holds (a table device knows only those)."""
    with open_table_text(path) as fh:
        rows = csv.DictReader(fh)
        return tuple(next(rows)["arch"] for _ in range(3))


def _space_and_archs(device: Device) -> tuple[str, list[str]]:
    """A space the device covers and three architectures of it the device can answer for."""
    space = device.spaces[0] if device.spaces else SPACE
    if device.kind == "table":
        return space, list(_table_archs(str(device.tables[space])))
    return space, sample_archs(3, space_name=space)


def _build(name: str) -> Device:
    """The device, a measured one timing a tiny model briefly (its subnet is not the point)."""
    info = {i.name: i for i in available_devices()}[name]
    if info.kind == "measured":
        return get_device(name, model_fn=lambda arch: tiny_onnx(), repeats=2, warmup=0)
    return get_device(name)


NAMES = [*device_registry().names(), USER_DEVICE, PROFILE_DEVICE]


@pytest.mark.parametrize("name", NAMES)
def test_device_contract(name, devices):
    device = _build(name)
    assert isinstance(device, Device)
    assert device.name == name and device.kind in KINDS
    info = device.info()
    listed = {i.name: i for i in available_devices()}[name]
    assert (info.name, info.kind, info.spaces) == (listed.name, listed.kind, listed.spaces)
    assert isinstance(info.description, str) and info.description
    assert isinstance(device.quant_rules, str) and device.quant_rules
    space_name, archs = _space_and_archs(device)
    assert device.supports(space_name)
    ms = device.latency(space_name, archs)
    assert isinstance(ms, np.ndarray) and ms.shape == (3,)
    assert np.all(np.isfinite(ms)) and np.all(ms > 0)
    mean, std = device.latency_with_std(get_space(space_name), archs)
    assert mean.shape == (3,) and np.all(np.isfinite(mean)) and np.all(mean > 0)
    assert std is None or (std.shape == (3,) and np.all(std >= 0))
    with pytest.raises(UserError, match="single string"):
        device.latency(space_name, archs[0])
    with pytest.raises(UserError, match="architecture #1"):
        device.latency(space_name, [archs[0], "not-an-architecture"])
    if device.spaces is not None:
        other = next(s for s in ("nb201", "fbnet", "mbv3-tiny", "vit") if s not in device.spaces)
        with pytest.raises(UserError, match="has no latency for space"):
            get_device(name, other)
    if not isinstance(device, MeasuredDevice):
        with pytest.raises(UserError, match="takes no options|bad option"):
            get_device(name, repeats=3)


def test_the_registry_lists_every_device_once_in_kind_order(devices):
    infos = available_devices()
    names = [i.name for i in infos]
    assert len(names) == len(set(names))
    assert all(i.kind in KINDS for i in infos)
    for name in ("cpu-ort-1t", "cpu-ort-all", "fpga-zcu102-est", "edgetpu-est", "raspi4-est",
                 USER_DEVICE, PROFILE_DEVICE):
        assert name in names
    assert {i.kind for i in infos} >= {"measured", "estimated", "adapted"}
    assert [KINDS.index(i.kind) for i in infos] == sorted(KINDS.index(i.kind) for i in infos)


def test_registering_is_checked(devices):
    reg = device_registry()
    assert reg.is_builtin("edgetpu-est") and not reg.is_builtin(USER_DEVICE)
    with pytest.raises(UserError, match="taken by a built-in device"):
        register_device("edgetpu-est", FlopsDevice, kind="estimated")
    with pytest.raises(UserError, match="device kind 'fast'"):
        register_device("x-board", FlopsDevice, kind="fast")
    with pytest.raises(UserError, match="not callable"):
        register_device("x-board", "not a factory", kind="estimated")
    register_device(USER_DEVICE, lambda: FlopsDevice(), kind="estimated")  # a user's, again
    assert get_device(USER_DEVICE).name == USER_DEVICE
    with pytest.raises(UserError, match=r"unknown device 'raspi4-ets'.*did you mean 'raspi4-est'"):
        get_device("raspi4-ets")
    with pytest.raises(UserError, match="non-empty string"):
        get_device("")
