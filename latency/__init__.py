"""Latency measurement and prediction.

Keep this package importable without torch: ``latency.onnx_measure`` is also used on
target devices that have only onnxruntime and numpy.
"""

from latency.onnx_measure import LatencyStats, measure_onnx

__all__ = ["LatencyStats", "measure_onnx"]
