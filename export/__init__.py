"""Export trained subnets to ONNX (FP32 and QDQ) and check the export against PyTorch.

* :mod:`hwnas.export.onnx_export` - FP32 ONNX bytes/files and the parity check;
* :mod:`hwnas.export.qdq` - QDQ graphs from a policy and its PTQ fake-quant model;
* :mod:`hwnas.export.ort_profile` - onnxruntime's optimized graph, per-layer profiles, integer-kernel check;
* :mod:`hwnas.export.device_policy` - per-device int8-vs-float layer choice, measured;
* :mod:`hwnas.export.model_export` - one model's files, verified and timed, and the manifest;
* :mod:`hwnas.export.run_export` / :mod:`hwnas.export.cli` - ``hwnas export RUN_DIR``;
* :mod:`hwnas.export.run_api` - :func:`load_run`, a finished run from Python.

The heavier names are imported on first use.
"""

from hwnas.export.onnx_export import ParityReport, check_parity, export_onnx, onnx_bytes

__all__ = ["export_onnx", "onnx_bytes", "check_parity", "ParityReport", "build_qdq",
           "export_model", "export_run", "ExportSettings", "load_run", "Run"]

_LAZY = {"build_qdq": "hwnas.export.qdq", "export_model": "hwnas.export.model_export",
         "ExportSettings": "hwnas.export.model_export", "export_run": "hwnas.export.run_export",
         "load_run": "hwnas.export.run_api", "Run": "hwnas.export.run_api"}


def __getattr__(name: str):  # noqa: ANN202 - module-level lazy import
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'export' has no attribute {name!r}")
