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
from typing import Any

import numpy as np
import onnx
import torch
from hwnas.latency.onnx_measure import make_session
from hwnas.supernet.onnx import onnx_bytes, set_metadata

from hwnas.core.errors import UserError
from hwnas.core.io import first_line, write_atomic

__all__ = ["export_onnx", "onnx_bytes", "check_parity", "parity_of", "ParityReport", "InputSpec",
           "describe_model", "with_uint8_input", "read_metadata", "set_metadata"]

def read_metadata(model: onnx.ModelProto) -> dict[str, Any]:
    """``metadata_props`` of a model, JSON values decoded (written by :func:`set_metadata`)."""
    out: dict[str, Any] = {}
    for p in model.metadata_props:
        try:
            out[p.key] = json.loads(p.value)
        except (json.JSONDecodeError, ValueError):
            out[p.key] = p.value
    return out


def export_onnx(
    model: torch.nn.Module,
    example: torch.Tensor,
    path: str | Path,
    *,
    opset: int = 17,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Export ``model`` to an ONNX file at ``path`` and return the path.

    Same graph as :func:`onnx_bytes`, plus ``metadata`` stored as ONNX ``metadata_props``
    (:func:`~hwnas.supernet.onnx.set_metadata`: values stringified, dicts and lists
    JSON-encoded, None left out) so the file records e.g. which architecture it is. The model
    is validated with ``onnx.checker.check_model`` before anything is written, parent
    directories are created, and the file is written atomically: a failure never leaves a
    half-written file (or a stray temp file) behind.

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        ...                             torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)).eval()
        >>> from hwnas.export import export_onnx
        >>> path = export_onnx(model, torch.zeros(1, 1, 8, 8), "tiny.onnx")
        >>> str(path).endswith("tiny.onnx")
        True
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"ONNX output path {str(path)!r} is a directory; expected a file path such as model.onnx")

    proto = onnx.load_from_string(onnx_bytes(model, example, opset=opset))
    if metadata:
        set_metadata(proto, metadata)
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


def parity_of(got: np.ndarray, expected: np.ndarray, *, atol: float = 1e-4) -> ParityReport:
    """The :class:`ParityReport` of ONNX logits ``got`` against PyTorch logits ``expected``
    (same samples, first axis), so that one pass of each can serve several comparisons.
    Raises :class:`UserError` when their shapes differ."""
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        raise UserError(f"ONNX output shape {list(got.shape)} differs from PyTorch output shape "
                        f"{list(expected.shape)}; expected the export of this model")
    n = int(got.shape[0])
    # np.max propagates NaN; builtin max would drop it depending on argument order.
    max_diff = float(np.max(np.abs(got.astype(np.float64) - expected))) if got.size else 0.0
    agree = int(np.sum(got.reshape(n, -1).argmax(axis=1) == expected.reshape(n, -1).argmax(axis=1)))
    return ParityReport(max_abs_diff=max_diff, top1_agreement=agree / n, n=n, atol=float(atol),
                        passed=bool(max_diff <= atol))


#: a logit vector counts as reproduced exactly within this fraction of its range
EXACT_TOLERANCE = 1e-3
#: share of images an integer graph must reproduce exactly for its disagreements to be taken
#: as rounding flips (an error of scale, layer, grid or bias changes every image)
MIN_EXACT_SHARE = 0.5
#: a reference prediction is confident when its softmax top-1 probability reaches this
CONFIDENT_PROBABILITY = 0.5
#: fewest confident images on which agreement among them is judged
MIN_CONFIDENT_IMAGES = 20


@dataclass
class DivergenceReport:
    """Why an integer graph's top-1 agreement with its fake-quant reference is low.

    ``exact_share``: images whose logits match within :data:`EXACT_TOLERANCE` of their range;
    ``confident``/``confident_agreement``: images whose reference softmax top-1 probability is
    at least :data:`CONFIDENT_PROBABILITY`, and the agreement among them; ``accuracy_delta``:
    test accuracy of the graph minus the reference's (points; None without labels).
    ``rounding`` says whether the disagreements are float-rounding flips on near-tied logits,
    not an export error: most images exact, every confident one (but ``1 - min_agreement``)
    agreeing, and no accuracy lost beyond ``max_accuracy_drop`` (``predictions_kept``: those
    last two)."""

    exact_share: float
    confident: int
    confident_agreement: float | None
    accuracy_delta: float | None
    rounding: bool
    predictions_kept: bool = True

    def describe(self) -> str:
        conf = (f"{100 * self.confident_agreement:.1f}% agreement on the {self.confident} "
                f"confident predictions" if self.confident_agreement is not None
                else f"only {self.confident} confident predictions")
        acc = ("" if self.accuracy_delta is None
               else f", test accuracy {self.accuracy_delta:+.2f} points")
        return f"{100 * self.exact_share:.1f}% of images exact, {conf}{acc}"


def divergence_of(got: np.ndarray, expected: np.ndarray, labels: np.ndarray | None = None, *,
                  min_agreement: float = 0.99,
                  max_accuracy_drop: float | None = 2.0) -> DivergenceReport:
    """Tell float-rounding flips from an export error when ``got`` (an integer graph's logits)
    agrees with ``expected`` (its fake-quant reference) on fewer top-1 predictions than
    wanted. An integer kernel accumulates exactly where PyTorch rounds in float, so a value at
    a rounding boundary of an activation quantizer may land one level apart; a deep network,
    more so an under-trained one, amplifies such a flip, and near-tied logits then change
    their argmax (an fbnet of 22 blocks trained two epochs on digits: the first differing
    value was one level at ``blocks.0.dw_conv`` in 1.4% of images, 53 levels by the
    classifier; 81% of images stayed exact). A wrong scale, layer, grid or bias instead moves
    every image's logits."""
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    n = int(got.shape[0])
    got, expected = got.reshape(n, -1), expected.reshape(n, -1)
    spread = expected.max(1) - expected.min(1)
    exact = np.abs(got - expected).max(1) <= EXACT_TOLERANCE * np.maximum(spread, 1e-12)
    z = expected - expected.max(1, keepdims=True)
    top = 1.0 / np.exp(z).sum(1)  # softmax probability of the top-1 class
    confident = top >= CONFIDENT_PROBABILITY
    agree = got.argmax(1) == expected.argmax(1)
    conf_agreement = float(agree[confident].mean()) if confident.sum() >= MIN_CONFIDENT_IMAGES else None
    delta = None
    if labels is not None:
        labels = np.asarray(labels)
        delta = float(100.0 * (np.mean(got.argmax(1) == labels) - np.mean(expected.argmax(1) == labels)))
    kept = ((conf_agreement is None or conf_agreement >= min_agreement)
            and (delta is None or max_accuracy_drop is None or delta >= -max_accuracy_drop))
    rounding = n > 0 and float(exact.mean()) >= MIN_EXACT_SHARE and kept
    return DivergenceReport(float(exact.mean()) if n else 0.0, int(confident.sum()),
                            conf_agreement, delta, bool(rounding), bool(n > 0 and kept))


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

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        ...                             torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)).eval()
        >>> from hwnas.export import check_parity, onnx_bytes
        >>> x = torch.randn(8, 1, 8, 8)
        >>> report = check_parity(onnx_bytes(model, x[:1]), model, x, atol=1e-4)
        >>> report.passed, report.top1_agreement
        (True, 1.0)
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
    got, expected = [], []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, int(data.shape[0]), batch_size):
                chunk = data[start : start + batch_size]
                expected.append(model(chunk).detach().cpu().numpy())
                try:
                    got.append(session.run(None, {input_name: chunk.numpy()})[0])
                except Exception as exc:
                    raise UserError(
                        f"onnxruntime failed on inputs of shape {list(chunk.shape)}: {first_line(exc)}"
                    ) from exc
                if got[-1].shape != expected[-1].shape:
                    parity_of(got[-1], expected[-1], atol=atol)  # raises: shapes differ
    finally:
        model.train(was_training)
    return parity_of(np.concatenate(got), np.concatenate(expected), atol=atol)


@dataclass(frozen=True)
class InputSpec:
    """How a deployed model's images must be fed: the per-channel ``mean``/``std`` of images
    scaled to [0, 1] (float input = ``(uint8 / 255 - mean) / std``, NCHW) and the class names
    of the output logits, in order. Written into every exported file so that a device
    can run it without hwnas."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.mean) != len(self.std) or not self.mean:
            raise UserError(f"mean and std need one value per channel, got {len(self.mean)} and "
                            f"{len(self.std)}")
        if not all(float(s) > 0 for s in self.std):
            raise UserError(f"std must be positive per channel, got {list(self.std)}")


#: where a file's input comes from: float NCHW normalised outside, or uint8 NHWC inside
LAYOUTS = {"NCHW": "float32 NCHW, (uint8 / 255 - mean) / std applied by the caller",
           "NHWC-uint8": "uint8 NHWC images as decoded (0..255); the graph transposes and "
                         "normalises"}


def describe_model(proto: onnx.ModelProto, spec: InputSpec | None,
                   metadata: dict[str, object] | None = None, *,
                   model_version: int = 1) -> onnx.ModelProto:
    """Make ``proto`` self-describing: ``metadata_props`` get the input's name, shape (batch
    first, ``"batch"`` when dynamic), layout and dtype, ``mean``/``std``/``class_names`` of
    ``spec``, the hwnas version and ``metadata`` (arch, policy, accuracy...; None values left
    out); ``model_version`` and a one-paragraph ``doc_string`` say the same for tools that only
    show those. Returns ``proto``."""
    from hwnas.core.version import __version__

    tensor = proto.graph.input[0]
    ttype = tensor.type.tensor_type
    shape = [d.dim_param or d.dim_value for d in ttype.shape.dim]
    layout = "NHWC-uint8" if ttype.elem_type == onnx.TensorProto.UINT8 else "NCHW"
    props = {"input_name": tensor.name, "input_shape": shape, "input_layout": layout,
             "input_dtype": onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type).name,
             "input_preprocessing": LAYOUTS[layout], "output_name": proto.graph.output[0].name,
             "hwnas_version": __version__}
    if spec is not None:
        props.update(mean=[float(m) for m in spec.mean], std=[float(s) for s in spec.std],
                     class_names=list(spec.classes))
    props.update({k: v for k, v in (metadata or {}).items() if v is not None})
    set_metadata(proto, props)
    proto.model_version = int(model_version)
    proto.producer_name, proto.producer_version = "hwnas", __version__
    what = f"{props.get('arch')}" if props.get("arch") else "an hwnas model"
    scaling = (f"mean {props['mean']}, std {props['std']}" if spec is not None
               else "see metadata")
    proto.doc_string = (f"{what}; precision {props.get('precision', 'fp32')}. Input "
                        f"'{tensor.name}' {shape} {LAYOUTS[layout]} ({scaling}); output "
                        f"'{proto.graph.output[0].name}': logits over "
                        f"{len(spec.classes) if spec is not None else '?'} classes "
                        f"(metadata 'class_names'). Exported by hwnas {__version__}.")
    return proto


def with_uint8_input(proto: onnx.ModelProto, spec: InputSpec, *,
                     name: str = "image") -> onnx.ModelProto:
    """A copy of ``proto`` (float NCHW input) taking uint8 NHWC images instead: the graph
    transposes them, scales to [0, 1] and normalises with ``spec``'s mean and std exactly as
    training did, so a device feeds decoded pixels as they are. Works for FP32 and QDQ graphs
    alike."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    old = graph.input[0]
    dims = old.type.tensor_type.shape.dim
    if len(dims) != 4 or old.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        raise UserError(f"a uint8 image input needs a float NCHW model input, got "
                        f"{len(dims)}-D input {old.name!r}")
    channels = dims[1].dim_value
    if channels != len(spec.mean):
        raise UserError(f"the model takes {channels} channels; mean/std have {len(spec.mean)}")
    inner = f"{old.name}_normalised"
    for node in graph.node:
        node.input[:] = [inner if i == old.name else i for i in node.input]
    h = onnx.helper

    def const(key: str, values) -> onnx.TensorProto:  # noqa: ANN001 - floats
        return h.make_tensor(key, onnx.TensorProto.FLOAT,
                             [1, channels, 1, 1] if len(values) > 1 else [],
                             [float(v) for v in values])
    graph.initializer.extend([const(f"{name}_scale", [255.0]),
                              const(f"{name}_mean", spec.mean), const(f"{name}_std", spec.std)])
    pre = [h.make_node("Transpose", [name], [f"{name}_nchw"], perm=[0, 3, 1, 2]),
           h.make_node("Cast", [f"{name}_nchw"], [f"{name}_float"], to=onnx.TensorProto.FLOAT),
           h.make_node("Div", [f"{name}_float", f"{name}_scale"], [f"{name}_unit"]),
           h.make_node("Sub", [f"{name}_unit", f"{name}_mean"], [f"{name}_centred"]),
           h.make_node("Div", [f"{name}_centred", f"{name}_std"], [inner])]
    nodes = pre + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    batch = dims[0].dim_param or dims[0].dim_value
    image = h.make_tensor_value_info(name, onnx.TensorProto.UINT8,
                                     [batch, dims[2].dim_value, dims[3].dim_value, channels])
    rest = list(graph.input)[1:]
    del graph.input[:]
    graph.input.extend([image, *rest])
    onnx.checker.check_model(out)
    return out
