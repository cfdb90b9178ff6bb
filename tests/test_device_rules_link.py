"""A device names its quantization rules; search reads them from the device, not its name."""

from __future__ import annotations

from hwnas.latency.devices import available_devices, get_device
from hwnas.quant.device_rules import available_device_rules


def test_every_registered_device_names_known_rules() -> None:
    known = set(available_device_rules())
    rules = {d.name: get_device(d.name).quant_rules for d in available_devices()}
    assert rules and set(rules.values()) <= known, rules
    assert rules["edgetpu-est"] == "edgetpu" and rules["fpga-zcu102-est"] == "fpga"
    assert rules["cpu-ort-1t"] == "cpu-ort"


def test_a_device_named_like_another_family_keeps_its_own_rules() -> None:
    from hwnas.latency.devices import EstimatedDevice
    from hwnas.latency.estimators import get_estimator

    device = EstimatedDevice(get_estimator("fpga-zcu102-est"), name="my-edgetpu-board")
    assert device.quant_rules == "fpga"  # the estimator decides, not a substring of the name
