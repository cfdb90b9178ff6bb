"""Catch tensors on the wrong device without a second device (tests/test_device_safety.py).

On a GPU the failures look like "Expected all tensors to be on the same device, but got scale
is on cpu": a tensor made without ``device=`` (on the default device, the CPU) meets the
model's tensors (on cuda). CI has no GPU, so the same situation is mirrored on the CPU:

* :func:`foreign_default_device`: the model and the data stay on the CPU while the *default*
  device is ``meta``, so every tensor a step creates without ``device=`` lands on ``meta``; a
  dispatch mode records every operator that mixes ``meta`` with ``cpu`` tensors (PyTorch does
  not refuse all of them: an in-place op with a ``meta`` operand quietly keeps its ``cpu``
  result) together with the line of the toolkit that called it. Data-dependent steps
  (calibration's min/max, ``.item()``) still run, on real CPU tensors.
* :func:`meta_forward`: a model moved with ``.to("meta")`` runs a forward pass on a ``meta``
  input; a tensor that ``.to()`` left on the CPU (an attribute that is not a registered
  parameter or buffer) mixes with ``meta`` and is recorded. PyTorch has no ``meta`` kernels for
  its fake-quantize operators; the mode answers them with empty tensors of the right shapes.

Explicit transfers (``.to(device)``, ``copy_`` between devices) are what device-safe code
does, so they are allowed.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_REPO = Path(__file__).resolve().parents[1]
_TRANSFERS = {"aten::_to_copy", "aten::copy_", "aten::to", "aten::lift_fresh",
              "aten::_has_compatible_shallow_copy_type"}
_aten = torch.ops.aten
# PyTorch's fake-quantize kernels have no meta implementation: shapes of their outputs
_FAKE_QUANT = {
    _aten.fake_quantize_per_channel_affine_cachemask.default: lambda x, *_: (
        torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)),
    _aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default: lambda x, *_: (
        torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)),
    _aten.fake_quantize_per_tensor_affine_cachemask.default: lambda x, *_: (
        torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)),
    _aten._fake_quantize_learnable_per_channel_affine.default: lambda x, *_: torch.empty_like(x),
    _aten._fake_quantize_learnable_per_tensor_affine.default: lambda x, *_: torch.empty_like(x),
}


def _caller() -> str:
    """The innermost frame of the toolkit (not a test helper, not torch) on the stack."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if (_REPO in path.parents and ".venv" not in path.parts
                and path.name not in ("device_support.py",)):
            return f"{path.relative_to(_REPO)}:{frame.lineno} {frame.line}"
    return "<outside the repository>"


class DeviceMixError(RuntimeError):
    """An operator got tensors on more than one device: which one, and from which line."""


class DeviceMixCheck(TorchDispatchMode):
    """Raises :class:`DeviceMixError` at the first operator whose tensor arguments lie on more
    than one device type, naming the line of the toolkit that called it (also kept in
    ``found``)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        devices = {t.device.type for t in tensors}
        if len(devices) > 1 and func._schema.name not in _TRANSFERS:
            shown = ", ".join(f"{tuple(t.shape)}@{t.device.type}" for t in tensors[:4])
            self.found.append(f"{func._schema.name}({shown}) at {_caller()}")
            raise DeviceMixError(f"operator mixes devices: {self.found[-1]}")
        if devices == {"meta"} and func in _FAKE_QUANT:
            return _FAKE_QUANT[func](*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def foreign_default_device() -> Iterator[DeviceMixCheck]:
    """Run the body with ``meta`` as the default device while the model and its data stay on
    the CPU. A tensor made without ``device=`` that reaches a computation raises: a
    :class:`DeviceMixError` naming the line, or PyTorch's own error (``.item()`` of a ``meta``
    tensor, "Cannot copy out of meta tensor" for one made there and moved)."""
    check = DeviceMixCheck()
    with torch.device("meta"), check:
        yield check


def meta_forward(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Run ``model`` (already ``.to("meta")``) on ``x`` moved to ``meta``: a tensor that
    ``.to()`` left on the CPU raises :class:`DeviceMixError`, and so does an output that is not
    on ``meta``."""
    with DeviceMixCheck(), torch.no_grad():
        out = model(x.to("meta"))
    wrong = {t.device.type for t in tree_leaves(out) if isinstance(t, torch.Tensor)} - {"meta"}
    if wrong:
        raise DeviceMixError(f"the output of a model moved to meta is on {sorted(wrong)}")


def stray_tensor_attributes(model: torch.nn.Module) -> list[str]:
    """Tensors held as plain module attributes (neither parameter nor buffer): ``.to()`` and
    ``state_dict`` do not see them."""
    out = []
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not key.startswith("__"):
                out.append(f"{name or '<root>'}.{key}")
    return out
