"""Latency measurement and prediction.

Keep this package importable without torch: ``hwnas.latency.onnx_measure`` is also used on
target devices that have only onnxruntime and numpy.
"""

from hwnas.latency.onnx_measure import LatencyStats, measure_onnx

#: Names re-exported lazily (on first access), so that ``import latency`` stays light.
_LAZY = {
    "Device": "hwnas.latency.devices",
    "available_devices": "hwnas.latency.devices",
    "get_device": "hwnas.latency.devices",
    "available_estimators": "hwnas.latency.estimators",
    "get_estimator": "hwnas.latency.estimators",
    "get_predictor": "hwnas.latency.predictors",
    "load_pretrained": "hwnas.latency.predictors",
    "load_shared_table": "hwnas.latency.tables",
    "help_protocol": "hwnas.latency.tables",
    "fewshot_scores": "hwnas.latency.fewshot",
    "choose_measurements": "hwnas.latency.fewshot",
    "spearman": "hwnas.latency.fewshot",
}

#: The supported names (the docs' API reference); ``LatencyStats`` (what :func:`measure_onnx`
#: returns) stays importable here.
__all__ = ["measure_onnx", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'latency' has no attribute {name!r}")
