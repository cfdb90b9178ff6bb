"""The requantization points of a QDQ graph, on the PyTorch side: their 8-bit ranges,
calibrated on the fake-quant model, and :class:`DeployedReference`, the fake-quant model made to
compute what the rewritten graph computes (int32 biases, requantizations, integer element-wise
ops), so an export can be shown exact up to float rounding."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from hwnas.export.integer_ops import HSIG_Q_SCALE, UNIT_SCALE, ElementwiseRewrite
from hwnas.export.qdq.builder import LayerQuant, QdqGraphBuilder
from hwnas.quant.fake_quant import fake_quant_per_tensor
from hwnas.quant.ptq import PTQConfig
from torch import nn

from hwnas.core.cooperate import yield_point

__all__ = ["DeployedReference", "RoundingPoint", "calibrate_requant"]


@dataclass(frozen=True)
class RoundingPoint:
    """One rounding of :class:`DeployedReference`'s hooks, for the code trace
    (:func:`hwnas.export.code_trace.trace_codes`): a forward hook of ``module`` rounds
    ``value(inputs, output)`` (the float values before rounding) to the uint8 grid of
    (``scale``, ``zero_point``), where the graph's QuantizeLinear ``node`` does. ``kind``:
    ``requant``, ``residual``, ``se_gate``, ``hsigmoid`` or ``hswish``. Traced before the hook
    rounds: the next quantizer sees these values on its grid already, 0.5 level from any
    boundary, and a near-tie flip here would show there as a whole-level difference."""

    module: str
    kind: str
    scale: float
    zero_point: int
    node: str
    value: Callable[[tuple, torch.Tensor], torch.Tensor]
    #: where a different code there can change what follows (None: everywhere)
    live: Callable[[tuple, torch.Tensor], torch.Tensor] | None = None

    @property
    def name(self) -> str:
        """The trace's name for it: ``<module>.<kind>``."""
        return f"{self.module}.{self.kind}"


class DeployedReference:
    """Context manager that makes a fake-quant model compute what the QDQ graph computes: the
    biases of integer layers rounded to int32 on ``input_scale * weight_scale`` (as integer
    kernels add them) and the exporter's requantization points (forward hooks). The model is
    restored on exit. Used to show that an export is exact up to float rounding, beside its
    agreement with the plain fake-quant model. ``integer``: the layers whose bias the graph
    stores as int32 (:meth:`QdqGraphBuilder.int32_bias_layers`); ``rewrite``: the integer
    element-wise ops of the graph (:mod:`hwnas.export.integer_ops`), mirrored by hooks on their
    modules."""

    def __init__(self, qmodel: nn.Module, layers: Mapping[str, LayerQuant],
                 integer: Iterable[str], requant: Iterable[str],
                 rewrite: ElementwiseRewrite | None = None) -> None:
        self.qmodel, self.layers = qmodel, layers
        self.integer, self.requant = set(integer), set(requant)
        self.rewrite = rewrite
        self.handles: list[Any] = []
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> nn.Module:
        modules = dict(self.qmodel.named_modules())
        for name in self.integer:
            lq, module = self.layers[name], modules[name]
            if module.bias is None:
                continue
            b_scale = torch.from_numpy((np.float32(lq.act_scale) * lq.weight_scale)
                                       .astype(np.float32)).to(module.bias.device)
            self.saved.append((module.bias, module.bias.detach().clone()))
            with torch.no_grad():
                module.bias.copy_((torch.round(module.bias.double() / b_scale.double())
                                   * b_scale.double()).to(module.bias.dtype))
        # the roundings of one module's output are hooks made from the points the code trace
        # reads (rounding_points), so the two cannot drift apart; h-swish rounds twice inside
        # its own computation and keeps a hook of its own
        for p in self.rounding_points():
            if p.kind in ("requant", "se_gate", "residual"):
                self.handles.append(modules[p.module].register_forward_hook(
                    lambda _m, inp, out, p=p: _fq8(p.value(inp, out), p.scale, p.zero_point)))
        rw = self.rewrite or ElementwiseRewrite(onnx.ModelProto())
        for name, qparams in rw.hswish.items():
            def hswish(_m, inp, out, qparams=qparams):
                x = inp[0].float()
                y = x * _hsigmoid(x)
                return (y if qparams is None else _fq8(y, *qparams)).to(out.dtype)
            self.handles.append(modules[name].register_forward_hook(hswish))
        return self.qmodel

    def requant_points(self) -> dict[str, tuple[float, float, bool]]:
        """``layer -> (scale, zero point, after ReLU)`` of each 8-bit requantization point."""
        rw = self.rewrite or ElementwiseRewrite(onnx.ModelProto())
        return {name: (*rw.requant.get(name, self.layers[name].requant),
                       bool(self.layers[name].requant_after_relu)) for name in self.requant}

    def rounding_points(self) -> list[RoundingPoint]:
        """Every rounding the hooks of :meth:`__enter__` add (requantizations, h-swish,
        squeeze-excitation gates, residual adds), with the graph's QuantizeLinear node of each."""
        def out(relu: bool = False):  # noqa: ANN202 - the module's output, before the hook
            return lambda _inp, y: torch.relu(y) if relu else y

        points = [RoundingPoint(name, "requant", scale, int(zp), f"/{name}/requant_q", out(relu))
                  for name, (scale, zp, relu) in self.requant_points().items()]
        rw = self.rewrite or ElementwiseRewrite(onnx.ModelProto())
        value = {"hsigmoid": lambda inp, _y: inp[0].float() + 3.0,
                 "hswish": lambda inp, _y: inp[0].float() * _hsigmoid(inp[0].float()),
                 "se_gate": out(), "residual": out()}
        params = {"hsigmoid": lambda m: (float(HSIG_Q_SCALE), 0),
                  "hswish": lambda m: rw.hswish[m], "se_gate": lambda m: (float(UNIT_SCALE), 0),
                  "residual": lambda m: rw.residual[m]}
        # h-swish is x * hsigmoid(x): at x = 0 (its input's zero point) the gate's code changes
        # nothing, and onnxruntime rounded that exact tie, 3 / (6/255) = 127.5, to 127 where
        # PyTorch rounds it to 128 (an mbv3 file, every image: they would hide what follows)
        live = {"hsigmoid": lambda inp, _y: inp[0] != 0}
        for (module, kind), node in rw.nodes.items():
            scale, zp = params[kind](module)
            points.append(RoundingPoint(module, kind, float(scale), int(zp), node, value[kind],
                                        live.get(kind)))
        return points

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        with torch.no_grad():
            for param, value in self.saved:
                param.copy_(value)
        self.saved.clear()


def _hsigmoid(x: torch.Tensor) -> torch.Tensor:
    """``relu6(x + 3) / 6`` as the rewritten graph computes it: ``x + 3`` on the uint8 grid of
    scale 6/255, read back on 1/255."""
    return _fq8(x + 3.0, float(HSIG_Q_SCALE), 0) / 6.0


def _fq8(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """``x`` on the uint8 grid of (scale, zero point), as Q then DQ compute it (PyTorch's
    kernel takes the scale as float32; on the CPU its faster bit-identical twin runs)."""
    if x.device.type == "cpu" and not (torch.is_grad_enabled() and x.requires_grad):
        return fake_quant_per_tensor(
            x.float(), torch.tensor(float(scale), dtype=torch.float32, device=x.device),
            torch.tensor(int(zero_point), device=x.device), 0, 255).to(x.dtype)
    return torch.fake_quantize_per_tensor_affine(x.float(), float(scale), int(zero_point), 0,
                                                 255).to(x.dtype)


@torch.no_grad()
def calibrate_requant(build_layers: dict[str, LayerQuant], builder: QdqGraphBuilder,
                       qmodel: nn.Module, xs: list[torch.Tensor], config: PTQConfig,
                       observer: str | None = None) -> None:
    """8-bit (scale, zero point) of every integer conv's output (after its ReLU where one
    follows), observed on the fake-quant model with ``observer`` (default: the PTQ config's
    activation observer)."""
    from hwnas.quant.observers import ActivationObserver

    todo = [n for n in builder.requant_tensor if build_layers[n].category == "int"]
    if not todo:
        return
    modules = dict(qmodel.named_modules())
    per_update = max(1, config.max_samples // max(1, len(xs)))
    method = observer or config.act_observer
    observers = {n: ActivationObserver(per_update, seed=config.seed + 7919 + i,
                                       keep_sample=method != "minmax")
                 for i, n in enumerate(todo)}
    handles = []
    for name in todo:
        def hook(_m, _inp, out, name=name):
            yield_point()  # between layers: a timing another worker waits for may run
            observers[name].update(torch.relu(out) if builder.after_relu[name] else out)
        handles.append(modules[name].register_forward_hook(hook))
    try:
        qmodel.eval()
        for x in xs:
            qmodel(x)
    finally:
        for h in handles:
            h.remove()
    for name in todo:
        scale, zp = observers[name].qparams(8, method,
                                            percentile=config.percentile, grid=config.mse_grid)
        build_layers[name].requant = (max(float(scale.reshape(-1)[0]), 1e-8),
                                      int(round(float(zp.reshape(-1)[0]))))
        build_layers[name].requant_after_relu = builder.after_relu[name]
