"""Export trained subnets to ONNX and check the export against PyTorch."""

from export.onnx_export import ParityReport, check_parity, export_onnx, onnx_bytes

__all__ = ["export_onnx", "onnx_bytes", "check_parity", "ParityReport"]
