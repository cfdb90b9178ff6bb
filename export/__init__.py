"""Export trained subnets to ONNX (FP32 and QDQ) and check the export against PyTorch.

* :mod:`hwnas.export.onnx_export` - FP32 ONNX bytes/files and the parity check;
* :mod:`hwnas.export.qdq` - QDQ graphs from a policy and its PTQ fake-quant model;
* :mod:`hwnas.export.ort_profile` - onnxruntime's optimized graph, per-layer profiles, integer-kernel check;
* :mod:`hwnas.export.device_policy` - per-device int8-vs-float layer choice, measured;
* :mod:`hwnas.export.model_export` - one model's files, verified and timed, and the manifest;
* :mod:`hwnas.export.run_export` / :mod:`hwnas.export.cli` - ``hwnas export RUN_DIR``;
* :mod:`hwnas.export.finetune` - ``hwnas finetune``: one trial fine-tuned and exported again.

A finished run from Python is :func:`hwnas.load_run` (:mod:`hwnas.api`, on the top floor).

Names are imported on first use, so the command line can load this package without torch.
"""

#: The supported names (the docs' API reference); ``ParityReport`` (what :func:`check_parity`
#: returns) and ``export_model`` (one model's files; :func:`export_run` calls it) stay importable.
__all__ = ["export_onnx", "onnx_bytes", "check_parity", "build_qdq", "export_run",
           "ExportSettings", "OrtLayerTimer"]

_LAZY = {"export_onnx": "hwnas.export.onnx_export", "onnx_bytes": "hwnas.export.onnx_export",
         "check_parity": "hwnas.export.onnx_export", "ParityReport": "hwnas.export.onnx_export",
         "build_qdq": "hwnas.export.qdq", "export_model": "hwnas.export.model_export",
         "ExportSettings": "hwnas.export.model_export", "export_run": "hwnas.export.run_export",
         "OrtLayerTimer": "hwnas.export.layer_timer"}
#: names that moved to the top floor (hwnas.api): a pointer, not an import (imports point down)
_MOVED = {"load_run": "hwnas.load_run", "Run": "hwnas.Run"}


def __getattr__(name: str):  # noqa: ANN202 - module-level lazy import
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MOVED:
        raise AttributeError(f"module 'hwnas.export' has no attribute {name!r}: it is "
                             f"{_MOVED[name]} now")
    raise AttributeError(f"module 'hwnas.export' has no attribute {name!r}")
