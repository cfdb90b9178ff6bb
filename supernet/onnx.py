"""A torch module as ONNX bytes, in memory: what a measured device times and what the export
writes to disk (:mod:`hwnas.export.onnx_export` adds files and parity checks), and the
``metadata_props`` that make a file say which architecture it is (:func:`set_metadata`).

The legacy TorchScript exporter (``dynamo=False``) is used on purpose: for the small CNNs of
this project it is much faster than the dynamo exporter and it does not need onnxscript.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from hwnas.core.errors import UserError

__all__ = ["INPUT_NAME", "OUTPUT_NAME", "metadata_value", "onnx_bytes", "set_metadata"]

INPUT_NAME = "input"
OUTPUT_NAME = "logits"


def onnx_bytes(model: torch.nn.Module, example: torch.Tensor, *, opset: int = 17) -> bytes:
    """Export ``model`` (traced on ``example``) to serialized ONNX bytes, in memory.

    The graph has one input ``"input"`` and one output ``"logits"``, both with a dynamic
    batch dimension (axis 0), and constant folding applied. The model is traced in eval
    mode (BatchNorm uses running statistics, dropout is off); its previous train/eval
    mode is restored afterwards. Useful to measure latency without touching the disk.

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        ...                             torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)).eval()
        >>> from hwnas.export import onnx_bytes
        >>> data = onnx_bytes(model, torch.zeros(1, 1, 8, 8))   # feed it to onnxruntime or save it
        >>> data[:2] != b"", len(data) > 1000
        (True, True)
    """
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example, torch.Tensor):
        raise UserError(f"example must be a torch.Tensor (one example input batch), got {type(example).__name__}")
    if example.dim() < 1:
        raise UserError("example must have a batch dimension (at least 1-D), got a scalar tensor")

    was_training = model.training
    model.eval()
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings():
            # The legacy exporter warns that it is deprecated; we choose it on purpose.
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                model,
                (example,),
                buffer,
                dynamo=False,
                opset_version=opset,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                do_constant_folding=True,
            )
    finally:
        model.train(was_training)
    return buffer.getvalue()


def metadata_value(value: object) -> str:
    """ONNX metadata values are strings: keep strings, JSON-encode dicts/lists, str() the rest."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def set_metadata(proto: Any, metadata: Mapping[str, object]) -> Any:
    """Merge ``metadata`` into the ``metadata_props`` of an ONNX ``ModelProto`` in place (values
    by :func:`metadata_value`, ``None`` values left out, a key already there takes the new
    value); returns ``proto``. The on-device script reads the ``arch`` entry."""
    props = {p.key: p.value for p in proto.metadata_props}
    props.update({str(k): metadata_value(v) for k, v in metadata.items() if v is not None})
    del proto.metadata_props[:]
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    return proto
