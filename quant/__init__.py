"""Quantization for hwnas: policies, cost models, device rules, PTQ, QAT and mixed precision.

Torch-free (import eagerly, usable by latency predictors and search without torch):
:mod:`quant.policy` (QuantPolicy and helpers), :mod:`quant.cost` (size, BOPs),
:mod:`quant.device_rules` (which bit-widths a device runs natively and what it gains),
:mod:`quant.allocate` (mixed-precision allocation under a budget).

Torch-based (imported lazily on first use of a name): :mod:`quant.fake_quant`,
:mod:`quant.fold`, :mod:`quant.observers`, :mod:`quant.ptq`, :mod:`quant.qat`,
:mod:`quant.sensitivity`, :mod:`quant.benchmark`. The functions ``ptq`` and ``qat`` share their
modules' names: import them as ``from quant.ptq import ptq`` and ``from quant.qat import qat``.
"""

from __future__ import annotations

import importlib
from typing import Any

from quant.allocate import Allocation, allocate, greedy_pareto_walk
from quant.cost import bops, layer_cost, model_size_bytes
from quant.device_rules import DeviceQuantRules, effective_layers, get_device_rules
from quant.policy import (
    SUPPORTED_BITS,
    QuantPolicy,
    apply_to_layers,
    average_weight_bits,
    first_last_8bit,
    uniform,
)

_LAZY = {
    "fold_bn": "quant.fold",
    "FakeQuantize": "quant.fake_quant",
    "QuantConv2d": "quant.fake_quant",
    "QuantLinear": "quant.fake_quant",
    "SharedAddQuant": "quant.fake_quant",
    "PTQConfig": "quant.ptq",
    "quantize_model": "quant.ptq",
    "calibrate": "quant.ptq",
    "policy_of": "quant.ptq",
    "QATConfig": "quant.qat",
    "hessian_sensitivity": "quant.sensitivity",
    "measured_sensitivity": "quant.sensitivity",
    "hutchinson_trace": "quant.sensitivity",
}

__all__ = [
    "SUPPORTED_BITS",
    "Allocation",
    "DeviceQuantRules",
    "QuantPolicy",
    "allocate",
    "apply_to_layers",
    "average_weight_bits",
    "bops",
    "effective_layers",
    "first_last_8bit",
    "get_device_rules",
    "greedy_pareto_walk",
    "layer_cost",
    "model_size_bytes",
    "uniform",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'quant' has no attribute {name!r}")
