"""The metrics of one candidate: an architecture and (optionally) its quantization policy.

* accuracy (:class:`TrialEvaluator`): the subnet extracted from the supernet, its BatchNorm
  recalibrated, quantized by PTQ when a policy is given, scored on the validation split (the
  test split is kept for reporting).
* size, BOPs, FLOPs, params, average weight bits: from the layer list with the policy's widths
  (:data:`COST_METRICS`, :mod:`hwnas.quant.cost`; size counts weights at their true width).
* latency per device (:func:`device_latencies`): as the device executes the policy (its
  quantization rules), so an Edge TPU sees int8 and host fallbacks, an FPGA the bit-widths.

Results are cached by (architecture, policy), so repeats and resumed studies cost nothing; the
scoring inputs (BN recalibration batches, PTQ calibration images, validation and test loaders)
are drawn once per evaluator, and the last few recalibrated float subnets are kept, so the
policies of one architecture (the seeds, the front's test scores) share one recalibration.
:class:`CheapMetrics` gives the metrics that need no model (cost models, latency on devices not
measured here) for many candidates at once, with the same functions: the screening sampler's
view of candidates it has not evaluated.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from hwnas.latency.devices import Device, EstimatedDevice, MeasuredDevice, get_device
from hwnas.quant.cost import bops, model_size_bytes
from hwnas.quant.device_rules import (
    DeviceQuantRules,
    effective_layers,
    get_device_rules,
    speed_factor,
)
from hwnas.quant.policy import (
    FLOAT_BITS,
    QuantPolicy,
    apply_to_layers,
    average_weight_bits,
)
from hwnas.search.objectives import Metric, is_cheap
from hwnas.supernet.data.loader import BatchLoader
from hwnas.supernet.data.splits import DatasetSplits
from hwnas.supernet.evaluate import (
    accuracy,
    bn_calibration_batches,
    calibration_loader,
    eval_loader,
    recalibrated_subnet,
)
from hwnas.supernet.layers import Layer, total_flops, total_params
from hwnas.supernet.space import SearchSpace
from torch import nn

from hwnas.core.errors import UserError


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


def quantized_layers(space: SearchSpace, arch: Any, policy: QuantPolicy | None
                     ) -> tuple[list[Layer], list[Layer]]:
    """(layer list of ``arch``, the same with ``policy``'s bit-widths; the float list when
    ``policy`` is ``None``)."""
    layers = space.layers(arch)
    return layers, (layers if policy is None else apply_to_layers(policy, layers))


#: metrics priced from the layer list alone (:mod:`hwnas.quant.cost`): column -> f(layers, quantized
#: layers, policy). The trial evaluator and the screening sampler's cheap metrics both use it.
COST_METRICS: dict[str, Callable[[list[Layer], list[Layer], QuantPolicy | None], float]] = {
    "size_bytes": lambda layers, q_layers, policy: float(model_size_bytes(q_layers)),
    "bops": lambda layers, q_layers, policy: float(bops(q_layers)),
    "flops": lambda layers, q_layers, policy: float(total_flops(layers)),
    "params": lambda layers, q_layers, policy: float(total_params(layers)),
    "avg_weight_bits": lambda layers, q_layers, policy: float(
        FLOAT_BITS if policy is None else average_weight_bits(policy, layers)),
}


def device_latencies(device: Device, space: SearchSpace, archs: Sequence[Any],
                     policies: Sequence[QuantPolicy | None],
                     q_layers: Sequence[list[Layer]] | None = None,
                     float_latency: tuple[Any, Any] | None = None,
                     ) -> tuple[np.ndarray, np.ndarray | None]:
    """(latency ms, std or None) of each ``archs[i]`` under ``policies[i]`` on ``device``;
    ``q_layers`` are the candidates' quantized layer lists when already built, ``float_latency``
    the device's ``latency_with_std`` of ``archs`` when already measured. Table and adapted
    devices answer the whole batch in one call.

    How quantization enters: estimated devices run their estimator on the layer list *as the
    device executes it* (:func:`hwnas.quant.device_rules.effective_layers`), so an Edge TPU sees
    int8 and host fallbacks, an FPGA sees the bit-widths; measured devices time the float subnet
    (once per architecture); table, adapted and measured devices scale their float latency by
    the device family's per-layer speed factors (:func:`hwnas.quant.device_rules.speed_factor`),
    weighted by each layer's share of the multiply-accumulates. onnxruntime/GPU-class families
    assume *no* int8 gain unless a measured speed-up table says otherwise (int8 can be slower).
    """
    if q_layers is None:
        q_layers = [quantized_layers(space, a, p)[1] for a, p in zip(archs, policies)]
    rules = get_device_rules(device.quant_rules)
    if device.int8_speedup:
        rules = rules.with_speedups(device.int8_speedup)
    if isinstance(device, EstimatedDevice):
        return np.array([float(device.estimator.estimate(effective_layers(q, rules)))
                         for q in q_layers], dtype=np.float64), None
    mean, std = float_latency or device.latency_with_std(space, list(archs))
    factor = np.array([1.0 if p is None else _mac_weighted_factor(q, rules)
                       for p, q in zip(policies, q_layers)])
    mean = np.asarray(mean, dtype=np.float64) * factor
    return mean, (None if std is None else np.asarray(std, dtype=np.float64) * factor)


def device_latency(device: Device, space: SearchSpace, arch: Any, policy: QuantPolicy | None,
                   float_latency: tuple[Any, Any] | None = None) -> tuple[float, float | None]:
    """(latency ms, std or None) of ``arch`` under ``policy`` on ``device``: the one-candidate
    case of :func:`device_latencies`."""
    mean, std = device_latencies(device, space, [arch], [policy], float_latency=float_latency)
    return float(mean[0]), (None if std is None else float(std[0]))


class TrialEvaluator:
    """Scores (architecture, policy) candidates of ``space``; see the module docstring.

    Accuracy: the subnet is extracted from the supernet, its BatchNorm recalibrated on augmented
    training images, and, when a policy is given, quantized by PTQ (:func:`hwnas.quant.ptq.ptq`,
    calibrated on clean training images); then scored on the validation split (the test split
    is kept for reporting). Latency: :func:`device_latencies`.
    """

    def __init__(self, space: SearchSpace, supernet: nn.Module, data: DatasetSplits,
                 devices: list[str], settings: EvalSettings | None = None,
                 accuracy_fn: Callable[[Any, QuantPolicy | None], float] | None = None,
                 int8_speedups: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """``int8_speedups``: ``{device: measured int8 speed-up per layer shape}`` that replace
        the devices' default int8 gain (a run's export writes them)."""
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
            if (int8_speedups or {}).get(name):
                device.int8_speedup = dict(int8_speedups[name])
            self.devices[name] = device
        self.cache: dict[tuple[str, str], dict[str, float]] = {}
        #: (device, arch) -> the float (ms, std) of a device measured here: timed once per
        #: architecture, so every policy of it scales the same timing (timed again per policy,
        #: a noisy machine once ranked an int8 copy slower than its float subnet)
        self._float_ms: dict[tuple[str, str], tuple[Any, Any]] = {}
        #: drawn once: (BN batches, PTQ images, {split: loader}); the same seeded draws every
        #: candidate's own loaders would give (:meth:`_inputs`)
        self._drawn: tuple[list, list[torch.Tensor], dict[str, BatchLoader]] | None = None
        #: arch string -> its recalibrated float subnet, the most recent :data:`KEPT_FLOAT` ones
        self._floats: OrderedDict[str, nn.Module] = OrderedDict()

    #: recalibrated float subnets kept for the next candidates of the same architecture
    KEPT_FLOAT = 2

    def _device(self) -> torch.device:
        return next(self.supernet.parameters()).device

    def _inputs(self) -> tuple[list, list[torch.Tensor], dict[str, BatchLoader]]:
        """(BN recalibration batches, PTQ calibration images, evaluation loaders), on the
        supernet's device, drawn on first use: the loaders are seeded, so every candidate got
        these same tensors when each built its own."""
        if self._drawn is None:
            from hwnas.quant.ptq import calibration_batches

            s, device = self.settings, self._device()
            bn = bn_calibration_batches(self.data, s.calib_batches, seed=s.seed, device=device)
            ptq_x = calibration_batches(self.calibration_batches(device), s.ptq_images, device)
            self._drawn = (bn, ptq_x, {})
        return self._drawn

    def _loader(self, split: str) -> BatchLoader:
        """The evaluation loader of ``split`` (unshuffled: every pass gives the same batches)."""
        loaders = self._inputs()[2]
        if split not in loaders:
            loaders[split] = eval_loader(self.data, getattr(self.data, split),
                                         device=self._device())
        return loaders[split]

    def _float(self, arch: Any) -> nn.Module:
        """:meth:`float_model`, shared: kept for the next candidates of ``arch`` (callers
        must not change it; PTQ copies it)."""
        key = self.space.to_string(arch)
        if key in self._floats:
            self._floats.move_to_end(key)
            return self._floats[key]
        s = self.settings
        model = recalibrated_subnet(self.supernet, arch, self.data,
                                    calib_batches=s.calib_batches, seed=s.seed,
                                    batches=self._inputs()[0])
        self._floats[key] = model
        while len(self._floats) > self.KEPT_FLOAT:
            self._floats.popitem(last=False)
        return model

    def _model_of(self, arch: Any) -> nn.Module:
        return self._current[self.space.to_string(arch)]

    def float_model(self, arch: Any) -> nn.Module:
        """The BN-recalibrated float subnet — deterministic per arch; a fresh copy of the
        caller's own."""
        return copy.deepcopy(self._float(arch))

    def scored_model(self, arch: Any, policy: QuantPolicy | None, split: str = "val"
                     ) -> tuple[float, nn.Module]:
        """(accuracy % on ``split``, the model as searched: float, or PTQ under ``policy``;
        the caller's own)."""
        model = self.searched_model(arch, policy)
        model = copy.deepcopy(model) if policy is None else model
        return accuracy(model, self._loader(split)), model

    def front_scores(self, pairs: Sequence[tuple[str, Any]]) -> dict[tuple[str, str], tuple]:
        """(arch string, policy text) -> (validation, test) accuracy % of each pair (policy
        text as in trials.csv): the validation accuracy this evaluator's trial measured when
        it has one (the same computation, not repeated), the test accuracy of the model rebuilt
        as searched. The pairs of one architecture run in a row, sharing its recalibration."""
        pairs = list(dict.fromkeys((a, p if isinstance(p, str) else "") for a, p in pairs))
        first = {a: i for i, a in enumerate(dict.fromkeys(a for a, _ in pairs))}
        out = {}
        for arch_str, ptext in sorted(pairs, key=lambda pair: first[pair[0]]):
            arch, policy = self.space.from_string(arch_str), policy_from_text(ptext)
            model = self.searched_model(arch, policy)
            known = self.cache.get((arch_str, policy_text(policy)))
            val = (known["accuracy"] if known and self.accuracy_fn is None
                   else accuracy(model, self._loader("val")))
            out[(arch_str, ptext)] = (val, accuracy(model, self._loader("test")))
        return out

    def searched_model(self, arch: Any, policy: QuantPolicy | None) -> nn.Module:
        """The model as searched (float, or PTQ under ``policy``), unscored; the float one is
        shared with later candidates of ``arch`` (do not train it: :meth:`float_model` is a
        copy)."""
        model = self._float(arch)
        return model if policy is None else self.quantized_model(model, policy)

    def calibration_batches(self, device: torch.device | str = "cpu") -> BatchLoader:
        return calibration_loader(self.data, batch_size=128, seed=self.settings.seed, device=device)

    def quantized_model(self, model: nn.Module, policy: QuantPolicy) -> nn.Module:
        """PTQ of a float subnet under ``policy`` (the model export/ rebuilds)."""
        from hwnas.quant.ptq import PTQConfig, ptq

        device = next(model.parameters()).device
        config = PTQConfig(max_images=self.settings.ptq_images, seed=self.settings.seed)
        images = self._inputs()[1]
        if images[0].device != device:  # a model moved off the supernet's device
            images = self.calibration_batches(device)
        return ptq(model, policy, images, config)

    def __call__(self, arch: Any, policy: QuantPolicy | None = None) -> dict[str, float]:
        key = (self.space.to_string(arch), policy_text(policy))
        if key in self.cache:
            return self.cache[key]
        if self.accuracy_fn is not None:
            acc = self.accuracy_fn(arch, policy)
            model = self.supernet.extract(arch)  # for measured latency; weights do not matter
        else:
            model = self._float(arch)
            acc = accuracy(self.searched_model(arch, policy), self._loader("val"))
        layers, q_layers = quantized_layers(self.space, arch, policy)
        metrics: dict[str, float] = {"accuracy": float(acc)}
        metrics.update({col: f(layers, q_layers, policy) for col, f in COST_METRICS.items()})
        if any(isinstance(d, MeasuredDevice) for d in self.devices.values()):
            # a copy: a measured device may move it (the kept float subnet stays put)
            self._current = {key[0]: copy.deepcopy(model).cpu().eval()}
        for name, device in self.devices.items():
            timed = None
            if isinstance(device, MeasuredDevice):
                if (name, key[0]) not in self._float_ms:
                    self._float_ms[(name, key[0])] = device.latency_with_std(self.space, [arch])
                timed = self._float_ms[(name, key[0])]
            mean, std = device_latency(device, self.space, arch, policy, float_latency=timed)
            if not np.isfinite(mean) or mean <= 0:
                raise UserError(f"device {name!r} gave latency {mean!r} for {key[0]}; expected a "
                                f"positive number of ms")
            metrics[f"latency_ms:{name}"] = mean
            metrics[f"latency_std_ms:{name}"] = float("nan") if std is None else std
        self._current = {}
        self.cache[key] = metrics
        return metrics


class CheapMetrics:
    """The metrics of candidates that cost nothing per query (:func:`hwnas.search.objectives.is_cheap`):
    the cost-model metrics (:data:`COST_METRICS`) and latency on devices that look it up,
    estimate or predict it. Computed by the same functions as :class:`TrialEvaluator`, so a
    candidate's value here is the value its trial reports. What the screening sampler knows of
    every candidate before it chooses one.

    ``metrics`` fixes the columns of the result; ``devices`` maps device names to devices (the
    evaluator's). A call takes (architecture, policy) pairs and returns ``(values, std)``, both
    ``len(candidates) x len(metrics)``; std is 0 where the device gives none.
    """

    def __init__(self, space: SearchSpace, devices: Mapping[str, Device],
                 metrics: Sequence[Metric]) -> None:
        self.space = space
        self.metrics = list(metrics)
        for m in self.metrics:
            if not is_cheap(m):
                raise UserError(f"metric {m.key!r} needs an evaluation of the model; it is not "
                                f"a cheap metric")
            if m.device is not None and m.device not in devices:
                raise UserError(f"metric {m.key!r}: device {m.device!r} is not among the "
                                f"search's devices {sorted(devices)}")
        self.devices = {m.device: devices[m.device] for m in self.metrics if m.device}

    def __call__(self, candidates: Sequence[tuple[Any, QuantPolicy | None]]
                 ) -> tuple[np.ndarray, np.ndarray]:
        n, k = len(candidates), len(self.metrics)
        values, std = np.zeros((n, k)), np.zeros((n, k))
        if n == 0 or k == 0:
            return values, std
        archs = [a for a, _ in candidates]
        policies = [p for _, p in candidates]
        built = [quantized_layers(self.space, a, p) for a, p in candidates]
        latency = {name: device_latencies(device, self.space, archs, policies,
                                          [q for _, q in built])
                   for name, device in self.devices.items()}
        for j, m in enumerate(self.metrics):
            if m.device is not None:
                mean, sd = latency[m.device]
                values[:, j] = mean
                if sd is not None:
                    std[:, j] = sd
            else:
                f = COST_METRICS[m.column]
                values[:, j] = [f(layers, q, p) for (layers, q), p in zip(built, policies)]
        return values, std


def metric_columns(devices: list[str]) -> list[str]:
    """The metric columns of trials.csv, in order."""
    cols = ["accuracy", *COST_METRICS]
    for d in devices:
        cols += [f"latency_ms:{d}", f"latency_std_ms:{d}"]
    return cols


def check_devices(space: SearchSpace, devices: list[str]) -> None:
    """Every device exists and has a latency model for ``space`` (UserError naming the first
    that does not)."""
    for name in devices:
        get_device(name, space)


def check_cheap_bounds(space: SearchSpace, constraints: Sequence[Any], *, bits: bool,
                       bit_choices: Sequence[int] = ()) -> None:
    """UserError when a cheap constraint (:func:`hwnas.search.objectives.is_cheap`) rules out
    the whole space before anything is trained: its bound lies beyond the best value of the
    space's smallest and largest architectures under every uniform bit-width (the extremes of
    size, FLOPs, parameters, BOPs and estimated latency), so no trial could meet it."""
    from hwnas.search.bits import bit_groups, policy_for, uniform_groups

    cheap = [c for c in constraints if is_cheap(c.metric)]
    if not cheap:
        return
    metrics: list[Metric] = []
    for c in cheap:
        if c.metric not in metrics:
            metrics.append(c.metric)
    devices = {m.device: get_device(m.device, space) for m in metrics if m.device}
    groups = bit_groups(space) if bits else []
    candidates = [(arch, policy_for(space, arch, uniform_groups(groups, b)) if bits else None)
                  for arch in (space.smallest(), space.largest())
                  for b in (bit_choices if bits else (32,))]
    values, _ = CheapMetrics(space, devices, metrics)(candidates)
    for c in cheap:
        column = values[:, metrics.index(c.metric)]
        best = column.min() if c.op == "<=" else column.max()
        if not c.satisfied(float(best)):
            raise UserError(f"constraint {c.text!r} rules out every candidate of space "
                            f"{space.name}: {c.metric.key} goes from {column.min():.4g} to "
                            f"{column.max():.4g} {c.metric.unit} between its smallest and largest "
                            f"models; relax the bound")
