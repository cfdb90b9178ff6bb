"""The objectives of one architecture: supernet accuracy, FLOPs, size and measured latency.

Accuracy comes from the supernet: the subnet is extracted, its BatchNorm recalibrated on
training images, and it is scored on the validation split (never the test split, which is kept
for reporting the chosen models). Latency is measured on this CPU with onnxruntime on the same
recalibrated subnet exported to ONNX in memory. Results are cached by architecture string, so
a repeated suggestion or a resumed study costs nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from export.onnx_export import onnx_bytes
from latency.onnx_measure import measure_onnx
from quant.cost import model_size_bytes
from supernet.data import DatasetSplits
from supernet.evaluate import evaluate_subnet
from supernet.layers import total_flops, total_params
from supernet.space import SearchSpace


@dataclass
class EvalSettings:
    """How architectures are scored; stored in the run directory."""

    calib_batches: int = 10
    latency_threads: int = 1
    latency_warmup: int = 10
    latency_repeats: int = 50
    latency_batch: int = 1
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: metric name -> (Optuna direction, unit / description) for the objectives of ``hwnas run``.
OBJECTIVES: dict[str, str] = {
    "accuracy": "maximize",
    "flops": "minimize",
    "latency_ms": "minimize",
}


class SubnetEvaluator:
    """Scores architectures of ``space`` with ``supernet`` on ``data``; see the module docstring."""

    def __init__(self, space: SearchSpace, supernet: nn.Module, data: DatasetSplits,
                 settings: EvalSettings | None = None) -> None:
        self.space, self.supernet, self.data = space, supernet, data
        self.settings = settings or EvalSettings()
        self.cache: dict[str, dict[str, float]] = {}

    def build(self, arch) -> tuple[float, nn.Module]:
        """(validation accuracy %, the recalibrated standalone subnet) — deterministic per arch."""
        s = self.settings
        return evaluate_subnet(self.supernet, arch, self.data, split="val",
                               calib_batches=s.calib_batches, seed=s.seed)

    def __call__(self, arch) -> dict[str, float]:
        key = self.space.to_string(arch)
        if key in self.cache:
            return self.cache[key]
        s = self.settings
        acc, model = self.build(arch)
        layers = self.space.layers(arch)
        example = torch.zeros(1, *self.space.input_shape)
        stats = measure_onnx(onnx_bytes(model.cpu(), example), batch=s.latency_batch,
                             warmup=s.latency_warmup, repeats=s.latency_repeats,
                             threads=s.latency_threads, seed=s.seed)
        metrics = {
            "accuracy": acc,
            "flops": float(total_flops(layers)),
            "params": float(total_params(layers)),
            "size_bytes": float(model_size_bytes(layers)),
            "latency_ms": stats.median_ms,
            "latency_p95_ms": stats.p95_ms,
            "latency_cv": stats.cv,
        }
        self.cache[key] = metrics
        return metrics
