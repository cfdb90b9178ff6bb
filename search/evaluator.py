"""The metrics of one candidate: an architecture and (optionally) its quantization policy.

* accuracy: the subnet is extracted from the supernet, its BatchNorm recalibrated on training
  images, and — when a policy is given — quantized by PTQ (:func:`quant.ptq.ptq`, calibrated on
  training images); then scored on the validation split (the test split is kept for reporting).
* size, BOPs, FLOPs, params, average weight bits: from the layer list with the policy's widths
  (:mod:`quant.cost`; size counts weights at their true width).
* latency per device (:func:`device_latency`): estimated devices run their estimator on the
  layer list *as the device executes it* (:func:`quant.device_rules.effective_layers`), so an
  Edge TPU sees int8 and host fallbacks, an FPGA sees the bit-widths; measured devices time the
  float subnet here; table, adapted and measured devices scale their float latency by the
  device family's per-layer speed factors (:func:`quant.device_rules.speed_factor`), weighted by
  each layer's share of the multiply-accumulates. onnxruntime/GPU-class families assume *no*
  int8 gain unless a measured speed-up table says otherwise (issue 5: int8 can be slower).

Results are cached by (architecture, policy), so repeats and resumed studies cost nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from latency.devices import Device, EstimatedDevice, MeasuredDevice, get_device
from quant.cost import bops, model_size_bytes
from quant.device_rules import DeviceQuantRules, effective_layers, get_device_rules, speed_factor
from quant.policy import FLOAT_BITS, QuantPolicy, apply_to_layers, average_weight_bits
from supernet.data import BatchLoader, DatasetSplits
from supernet.errors import UserError
from supernet.evaluate import accuracy, calibration_loader, eval_loader, recalibrated_subnet
from supernet.layers import Layer, total_flops, total_params
from supernet.space import SearchSpace


@dataclass
class EvalSettings:
    """How candidates are scored; stored in the run directory's config.json."""

    calib_batches: int = 10
    ptq_images: int = 256
    latency_repeats: int = 30
    latency_warmup: int = 5
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rules_family(device_name: str) -> str:
    """The quantization-rules family (:mod:`quant.device_rules`) of a latency device."""
    name = device_name.lower()
    if "edgetpu" in name:
        return "edgetpu"
    if name.startswith("fpga"):
        return "fpga"
    return "cpu-ort"


def policy_text(policy: QuantPolicy | None) -> str:
    """The policy as stored in trials.csv: JSON of ``to_dict()``, or empty for a float model."""
    return "" if policy is None else json.dumps(policy.to_dict(), sort_keys=True)


def policy_from_text(text: Any) -> QuantPolicy | None:
    if text is None or (isinstance(text, float) and np.isnan(text)) or not str(text).strip():
        return None
    return QuantPolicy.from_dict(json.loads(text), source="policy column")


def _mac_weighted_factor(layers: list[Layer], rules: DeviceQuantRules) -> float:
    """Latency of the quantized network relative to the float one, each layer weighted by its
    multiply-accumulates (a roofline-free proxy of its share of the time)."""
    weights = np.array([max(layer.macs, 1) for layer in layers], dtype=np.float64)
    factors = np.array([speed_factor(layer, rules) for layer in layers])
    return float((weights * factors).sum() / weights.sum())


def device_latency(device: Device, space: SearchSpace, arch: Any, policy: QuantPolicy | None,
                   ) -> tuple[float, float | None]:
    """(latency ms, std or None) of ``arch`` under ``policy`` on ``device``; see the module
    docstring for how quantization enters."""
    layers = space.layers(arch)
    q_layers = layers if policy is None else apply_to_layers(policy, layers)
    rules = get_device_rules(rules_family(device.name))
    if isinstance(device, EstimatedDevice):
        return float(device.estimator.estimate(effective_layers(q_layers, rules))), None
    mean, std = device.latency_with_std(space, [arch])
    factor = 1.0 if policy is None else _mac_weighted_factor(q_layers, rules)
    return float(mean[0]) * factor, (None if std is None else float(std[0]) * factor)


class TrialEvaluator:
    """Scores (architecture, policy) candidates of ``space``; see the module docstring."""

    def __init__(self, space: SearchSpace, supernet: nn.Module, data: DatasetSplits,
                 devices: list[str], settings: EvalSettings | None = None,
                 accuracy_fn: Callable[[Any, QuantPolicy | None], float] | None = None) -> None:
        self.space, self.supernet, self.data = space, supernet, data
        self.settings = settings or EvalSettings()
        #: replaces the supernet evaluation of accuracy (an accuracy predictor), when given
        self.accuracy_fn = accuracy_fn
        self._current: dict[str, nn.Module] = {}
        self.devices: dict[str, Device] = {}
        for name in devices:
            device = get_device(name, space)
            if isinstance(device, MeasuredDevice):  # time our own subnet, not a fresh one
                device = get_device(name, space, model_fn=self._model_of,
                                    repeats=self.settings.latency_repeats,
                                    warmup=self.settings.latency_warmup)
            self.devices[name] = device
        self.cache: dict[tuple[str, str], dict[str, float]] = {}

    def _model_of(self, arch: Any) -> nn.Module:
        return self._current[self.space.to_string(arch)]

    def float_model(self, arch: Any) -> nn.Module:
        """The BN-recalibrated float subnet — deterministic per arch."""
        s = self.settings
        return recalibrated_subnet(self.supernet, arch, self.data, calib_batches=s.calib_batches,
                                   seed=s.seed)

    def scored_model(self, arch: Any, policy: QuantPolicy | None, split: str = "val"
                     ) -> tuple[float, nn.Module]:
        """(accuracy % on ``split``, the model as searched: float, or PTQ under ``policy``)."""
        model = self.float_model(arch)
        if policy is not None:
            model = self.quantized_model(model, policy)
        device = next(model.parameters()).device
        return accuracy(model, eval_loader(self.data, getattr(self.data, split), device=device)), model

    def calibration_batches(self, device: torch.device | str = "cpu") -> BatchLoader:
        return calibration_loader(self.data, batch_size=128, seed=self.settings.seed, device=device)

    def quantized_model(self, model: nn.Module, policy: QuantPolicy) -> nn.Module:
        """PTQ of a float subnet under ``policy`` (the model export/ rebuilds)."""
        from quant.ptq import PTQConfig, ptq

        device = next(model.parameters()).device
        config = PTQConfig(max_images=self.settings.ptq_images, seed=self.settings.seed)
        return ptq(model, policy, self.calibration_batches(device), config)

    def __call__(self, arch: Any, policy: QuantPolicy | None = None) -> dict[str, float]:
        key = (self.space.to_string(arch), policy_text(policy))
        if key in self.cache:
            return self.cache[key]
        if self.accuracy_fn is not None:
            acc = self.accuracy_fn(arch, policy)
            model = self.supernet.extract(arch)  # for measured latency; weights do not matter
        else:
            model = self.float_model(arch)
            scored = model if policy is None else self.quantized_model(model, policy)
            acc = accuracy(scored, eval_loader(self.data, self.data.val,
                                               device=next(model.parameters()).device))
        layers = self.space.layers(arch)
        q_layers = layers if policy is None else apply_to_layers(policy, layers)
        metrics: dict[str, float] = {
            "accuracy": float(acc),
            "size_bytes": float(model_size_bytes(q_layers)),
            "bops": float(bops(q_layers)),
            "flops": float(total_flops(layers)),
            "params": float(total_params(layers)),
            "avg_weight_bits": float(FLOAT_BITS if policy is None else average_weight_bits(policy, layers)),
        }
        self._current = {key[0]: model.cpu().eval()}
        for name, device in self.devices.items():
            mean, std = device_latency(device, self.space, arch, policy)
            if not np.isfinite(mean) or mean <= 0:
                raise UserError(f"device {name!r} gave latency {mean!r} for {key[0]}; expected a "
                                f"positive number of ms")
            metrics[f"latency_ms:{name}"] = mean
            metrics[f"latency_std_ms:{name}"] = float("nan") if std is None else std
        self._current = {}
        self.cache[key] = metrics
        return metrics


def metric_columns(devices: list[str]) -> list[str]:
    """The metric columns of trials.csv, in order."""
    cols = ["accuracy", "size_bytes", "bops", "flops", "params", "avg_weight_bits"]
    for d in devices:
        cols += [f"latency_ms:{d}", f"latency_std_ms:{d}"]
    return cols


def check_devices(space: SearchSpace, devices: list[str]) -> None:
    """Every device exists and has a latency model for ``space`` (UserError naming the first
    that does not)."""
    for name in devices:
        get_device(name, space)
