"""Export a PyTorch model to ONNX and check that the export computes the same thing.

The exported file is what gets deployed and what the latency of a subnet is measured
on, so it must be valid ONNX, carry its provenance (``metadata``), accept any batch size,
and agree numerically with the PyTorch model it came from (:func:`check_parity`).

We use the legacy TorchScript exporter (``dynamo=False``): for the small CNNs of this
project it is about 20x faster than the dynamo exporter (latency search exports many
candidates) and it does not need onnxscript.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from hwnas.latency.onnx_measure import make_session
from hwnas.supernet.onnx import onnx_bytes

from hwnas.core.errors import UserError
from hwnas.core.io import first_line, write_atomic

__all__ = ["export_onnx", "onnx_bytes", "check_parity", "ParityReport"]

def _metadata_value(value: object) -> str:
    """ONNX metadata values are strings: keep strings, JSON-encode dicts/lists, str() the rest."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def export_onnx(
    model: torch.nn.Module,
    example: torch.Tensor,
    path: str | Path,
    *,
    opset: int = 17,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Export ``model`` to an ONNX file at ``path`` and return the path.

    Same graph as :func:`onnx_bytes`, plus ``metadata`` stored as ONNX
    ``metadata_props`` (values stringified; dicts and lists JSON-encoded) so the file
    records e.g. which architecture it is. The model is validated with
    ``onnx.checker.check_model`` before anything is written, parent directories are
    created, and the file is written atomically: a failure never leaves a half-written
    file (or a stray temp file) behind.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"ONNX output path {str(path)!r} is a directory; expected a file path such as model.onnx")

    proto = onnx.load_from_string(onnx_bytes(model, example, opset=opset))
    if metadata:
        props = {p.key: p.value for p in proto.metadata_props}
        props.update({str(k): _metadata_value(v) for k, v in metadata.items()})
        del proto.metadata_props[:]
        for key, value in props.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
    onnx.checker.check_model(proto)

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, proto.SerializeToString())
    return path


@dataclass(frozen=True)
class ParityReport:
    """How closely an ONNX export reproduces its PyTorch model on the same inputs.

    ``max_abs_diff`` is the largest absolute logit difference over all ``n`` samples,
    ``top1_agreement`` the fraction of samples whose arg-max class agrees, and
    ``passed`` is ``max_abs_diff <= atol`` (False if any output is NaN).
    """

    max_abs_diff: float
    top1_agreement: float
    n: int
    atol: float
    passed: bool

    def as_dict(self) -> dict:
        """Plain ``dict`` of all fields, ready for JSON output."""
        return asdict(self)


def check_parity(
    path_or_bytes: str | Path | bytes,
    model: torch.nn.Module,
    inputs: torch.Tensor,
    *,
    atol: float = 1e-4,
    batch_size: int = 256,
) -> ParityReport:
    """Compare the logits of an ONNX model (file or bytes) with those of ``model``.

    Both run on the same float32 ``inputs`` (first axis = samples), in chunks of
    ``batch_size`` to bound memory; PyTorch runs in eval mode under ``no_grad`` (the
    model's previous mode is restored). Raises :class:`UserError` for bad arguments or
    when the two produce outputs of different shapes.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.dim() < 1 or inputs.shape[0] < 1:
        raise UserError("inputs must be a torch.Tensor with at least one sample along axis 0")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not atol >= 0:  # also rejects NaN
        raise UserError(f"atol must be >= 0, got {atol!r}")

    session = make_session(path_or_bytes, threads=1)
    onnx_inputs = session.get_inputs()
    if len(onnx_inputs) != 1:
        raise UserError(f"the ONNX model has {len(onnx_inputs)} inputs; expected exactly one")
    input_name = onnx_inputs[0].name

    data = inputs.detach().to(device="cpu", dtype=torch.float32)
    n = int(data.shape[0])
    max_diff = 0.0
    agree = 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                chunk = data[start : start + batch_size]
                expected = model(chunk).detach().cpu().numpy()
                try:
                    got = session.run(None, {input_name: chunk.numpy()})[0]
                except Exception as exc:
                    raise UserError(
                        f"onnxruntime failed on inputs of shape {list(chunk.shape)}: {first_line(exc)}"
                    ) from exc
                if got.shape != expected.shape:
                    raise UserError(
                        f"ONNX output shape {list(got.shape)} differs from PyTorch output shape "
                        f"{list(expected.shape)}; expected the export of this model"
                    )
                # np.max propagates NaN; builtin max would drop it depending on argument order.
                max_diff = float(np.max([max_diff, np.max(np.abs(got.astype(np.float64) - expected))]))
                rows = len(chunk)
                agree += int(
                    np.sum(got.reshape(rows, -1).argmax(axis=1) == expected.reshape(rows, -1).argmax(axis=1))
                )
    finally:
        model.train(was_training)

    return ParityReport(
        max_abs_diff=max_diff,
        top1_agreement=agree / n,
        n=n,
        atol=float(atol),
        passed=bool(max_diff <= atol),
    )
