"""Quantization: cost models now; PTQ, QAT and mixed precision build on them."""

from quant.cost import bops, model_size_bytes

__all__ = ["bops", "model_size_bytes"]
