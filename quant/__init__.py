"""Quantization for hwnas: policies, cost models, device rules, PTQ, QAT and mixed precision.

Torch-free (import eagerly, usable by latency predictors and search without torch):
:mod:`hwnas.quant.policy` (QuantPolicy and helpers), :mod:`hwnas.quant.cost` (size, BOPs),
:mod:`hwnas.quant.device_rules` (which bit-widths a device runs natively and what it gains),
:mod:`hwnas.quant.allocate` (mixed-precision allocation under a budget).

Torch-based (imported lazily on first use of a name): :mod:`hwnas.quant.fake_quant`,
:mod:`hwnas.quant.fold`, :mod:`hwnas.quant.observers`, :mod:`hwnas.quant.ptq`, :mod:`hwnas.quant.qat`,
:mod:`hwnas.quant.sensitivity`. The functions ``ptq`` and ``qat`` share their
modules' names: import them as ``from hwnas.quant.ptq import ptq`` and
``from hwnas.quant.qat import qat``.
"""

from __future__ import annotations

import importlib
from typing import Any

from hwnas.quant.allocate import Allocation, allocate, greedy_pareto_walk
from hwnas.quant.cost import bops, layer_cost, model_size_bytes, weight_bits_budget_bytes
from hwnas.quant.device_rules import (
    DeviceQuantRules,
    device_size_bytes,
    effective_layers,
    get_device_rules,
    layer_latency_fn,
    measure_int8_speedup,
)
from hwnas.quant.policy import (
    SUPPORTED_BITS,
    QuantPolicy,
    apply_to_layers,
    average_weight_bits,
    first_last_8bit,
    product_sources,
    uniform,
)

_LAZY = {
    "fold_bn": "hwnas.quant.fold",
    "FakeQuantize": "hwnas.quant.fake_quant",
    "QuantConv2d": "hwnas.quant.fake_quant",
    "QuantLinear": "hwnas.quant.fake_quant",
    "QuantMatMul": "hwnas.quant.fake_quant",
    "SharedAddQuant": "hwnas.quant.fake_quant",
    "PTQConfig": "hwnas.quant.ptq",
    "quantize_model": "hwnas.quant.ptq",
    "calibrate": "hwnas.quant.ptq",
    "policy_of": "hwnas.quant.ptq",
    "QATConfig": "hwnas.quant.qat",
    "hessian_sensitivity": "hwnas.quant.sensitivity",
    "measured_sensitivity": "hwnas.quant.sensitivity",
    "hutchinson_trace": "hwnas.quant.sensitivity",
}

#: Importable here but internal (building blocks of the functions below; may change).
_INTERNAL = {"Allocation", "DeviceQuantRules", "greedy_pareto_walk", "product_sources",
             "FakeQuantize", "QuantConv2d", "QuantLinear", "QuantMatMul", "SharedAddQuant",
             "calibrate", "policy_of", "hutchinson_trace"}

#: The supported names (the docs' API reference).
__all__ = [n for n in [
    "SUPPORTED_BITS",
    "Allocation",
    "DeviceQuantRules",
    "QuantPolicy",
    "allocate",
    "apply_to_layers",
    "average_weight_bits",
    "bops",
    "device_size_bytes",
    "effective_layers",
    "first_last_8bit",
    "get_device_rules",
    "greedy_pareto_walk",
    "layer_cost",
    "layer_latency_fn",
    "measure_int8_speedup",
    "model_size_bytes",
    "product_sources",
    "uniform",
    "weight_bits_budget_bytes",
    *_LAZY,
] if n not in _INTERNAL]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'quant' has no attribute {name!r}")
