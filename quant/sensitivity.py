"""Per-layer quantization sensitivity, the input of mixed-precision allocation.

Two estimators, both returning a :class:`hwnas.quant.allocate.SensitivityTable`
(layer -> {(w_bits, a_bits): sensitivity}):

* :func:`hessian_sensitivity` (HAWQ-V2, Dong et al. 2020): the second-order loss increase from
  quantizing a layer's (BN-folded) weights, ``Tr(H_L) / n_L * ||Q_b(W_L) - W_L||^2``, with the
  Hessian trace estimated by Hutchinson's method. Cheap, but prices weights only.
* :func:`measured_sensitivity`: quantize *only* layer L to each candidate and measure the loss
  increase (or the top-1 drop) on held-out batches. Covers weights and activations, costs one
  evaluation per layer and candidate.

Attention products (:class:`hwnas.quant.fake_quant.QuantMatMul`) are not layers of a policy:
they follow the activation bits of the block's Q/K/V projection, and only
:func:`measured_sensitivity` sees them (quantized together with that layer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from hwnas.quant.allocate import SensitivityTable
from hwnas.quant.fake_quant import (
    quant_layers,
    quantizable_layer_names,
    set_quantizers_enabled,
)
from hwnas.quant.fold import fold_bn
from hwnas.quant.observers import weight_qparams
from hwnas.quant.policy import FLOAT_BITS, check_bits, uniform
from hwnas.quant.ptq import PTQConfig, _model_device, calibration_batches, ptq
from hwnas.supernet.nn.dynamic_ops import depthwise_grads
from torch import nn
from tqdm.auto import tqdm

from hwnas.core.errors import UserError

__all__ = ["hessian_sensitivity", "hutchinson_trace", "measured_sensitivity", "weight_perturbation"]

Pair = tuple[int, int]


class _Hardsigmoid2(nn.Module):
    """``hardsigmoid`` written with ``clamp``, which autograd can differentiate twice
    (PyTorch has no derivative for ``hardsigmoid_backward``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)


class _Hardswish2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)


class _DepthwiseGrads(torch.autograd.Function):
    """The gradients of a depthwise convolution, differentiable once more through first-order
    convolutions: PyTorch's own double backward of a grouped convolution runs one convolution
    per channel (9,465 of them per Hessian-vector product of the largest mbv3 subnet on 32
    CIFAR-10 images), most of the sensitivity seeds' time (benchmarks/gpu_matrix_timing.md).
    Both derivatives are linear in each input, so each term is one convolution. On the CPU
    the two take the same time (13.45 vs 13.69 CPU s); the gain is in kernel launches, i.e. on
    a GPU (benchmarks/hessian_depthwise_probe.py measures both there)."""

    @staticmethod
    def forward(ctx, g, x, w, stride, padding, need_x):
        ctx.save_for_backward(g, x, w)
        ctx.conf = stride, padding
        ctx.set_materialize_grads(False)
        return depthwise_grads(g, x, w, stride, padding, (need_x, True))

    @staticmethod
    def backward(ctx, ggx, ggw):
        g, x, w = ctx.saved_tensors
        stride, padding = ctx.conf
        dg = dx = dw = None
        if ggw is not None:  # grad_weight = corr(x, g): linear in x and in g
            dg = F.conv2d(x, ggw, None, stride, padding, 1, w.shape[0])
            dx = depthwise_grads(g, x, ggw, stride, padding, (True, False))[0]
        if ggx is not None:  # grad_input = conv_transpose(g, w): linear in g and in w
            term = F.conv2d(ggx, w, None, stride, padding, 1, w.shape[0])
            dg = term if dg is None else dg + term
            dw = depthwise_grads(g, ggx, w, stride, padding, (False, True))[1]
        return dg, dx, dw, None, None, None


class _DepthwiseConv(torch.autograd.Function):
    """``F.conv2d`` of a depthwise convolution (the same forward kernel) whose backward is
    :class:`_DepthwiseGrads`."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding):
        ctx.save_for_backward(x, w)
        ctx.conf = stride, padding
        return F.conv2d(x, w, b, stride, padding, 1, w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx, gw = _DepthwiseGrads.apply(g, x, w, *ctx.conf, ctx.needs_input_grad[0])
        gb = g.sum((0, 2, 3)) if ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None


class _Depthwise2(nn.Conv2d):
    """A depthwise ``nn.Conv2d`` through :class:`_DepthwiseConv`: the same values, a fast
    second derivative."""

    def _conv_forward(self, x, weight, bias):
        return _DepthwiseConv.apply(x, weight, bias, self.stride, self.padding)


def _is_depthwise(m: nn.Module) -> bool:
    return (type(m) is nn.Conv2d and m.groups == m.in_channels == m.out_channels > 1
            and m.dilation == (1, 1) and m.padding_mode == "zeros"
            and not isinstance(m.padding, str))


def _twice_differentiable(model: nn.Module, depthwise: bool | None = None) -> nn.Module:
    """Swap (in place) activation modules without second derivatives for equivalent ones, and,
    if ``depthwise`` (default: the model is not on the CPU, where the two double backwards
    cost the same), depthwise convolutions for :class:`_Depthwise2` (same weights, same
    forward)."""
    if depthwise is None:
        depthwise = _model_device(model).type != "cpu"
    for name, module in list(model.named_modules()):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if isinstance(module, (nn.Hardsigmoid, nn.Hardswish)):
            setattr(parent, child, _Hardsigmoid2() if isinstance(module, nn.Hardsigmoid) else _Hardswish2())
        elif depthwise and _is_depthwise(module):
            module.__class__ = _Depthwise2  # a subclass adding no state: the module kept as is
    return model


def hutchinson_trace(loss_fn: Callable[[], torch.Tensor] | Sequence[Callable[[], torch.Tensor]],
                     params: Mapping[str, torch.Tensor], *, n_samples: int = 32,
                     seed: int = 0, batch: int | None = None) -> dict[str, float]:
    """Hutchinson estimates of ``Tr(H_p)`` for each parameter ``p`` (the diagonal block of the
    Hessian of the loss w.r.t. ``p``), averaged over ``n_samples`` Rademacher vectors.

    ``loss_fn``: one closure giving the loss, or several whose losses add up to it (e.g. one
    per chunk of images). The Hessian is linear in the loss, so each part's double-backward
    graph is built, used for every vector and freed before the next part: peak memory is one
    part's graph, and the estimate is the one-closure estimate (the same vectors, drawn again
    from ``seed`` for each part rather than all kept: they would weigh ``n_samples`` times the
    parameters).

    ``batch`` vectors go through one batched double-backward pass (``is_grads_batched``, vmap
    over the backward graph): the same products as one pass per vector, in larger kernels and
    fewer launches. Default: one at a time on the CPU (batched, it measured 19-23 % slower
    there: benchmarks/hessian_batched.md), 8 on other devices, where launches dominate. The
    vectors are drawn on the CPU from ``seed`` (the same on every device) and the sums stay on
    the parameters' device until the end (one host sync, not one per vector and layer).
    """
    if n_samples < 1:
        raise UserError(f"n_samples must be positive, got {n_samples}")
    if batch is not None and batch < 1:
        raise UserError(f"batch must be positive, got {batch}")
    parts = [loss_fn] if callable(loss_fn) else list(loss_fn)
    names, tensors = list(params), list(params.values())
    if batch is None:
        batch = 1 if not tensors or tensors[0].device.type == "cpu" else 8
    sums = [torch.zeros((), dtype=torch.float64, device=t.device) for t in tensors]
    for part in parts:
        # a parameter the loss does not use (a layer cut off by a "none" edge) has trace 0
        grads = torch.autograd.grad(part(), tensors, create_graph=True, allow_unused=True)
        used = [k for k, g in enumerate(grads) if g is not None and g.requires_grad]
        outs = [grads[k] for k in used]
        gen = torch.Generator(device="cpu").manual_seed(seed)
        for start in range(0, n_samples, batch):
            n = min(batch, n_samples - start)
            # vector i of every tensor, in the order one vector at a time would draw them
            drawn = [[torch.randint(0, 2, t.shape, generator=gen, device="cpu") for t in tensors]
                     for _ in range(n)]
            if not outs:
                continue
            vs = [torch.stack([d[k] for d in drawn]).to(tensors[k].device, tensors[k].dtype)
                  .mul_(2).sub_(1) for k in used]
            retain = start + n < n_samples
            if n == 1:
                hvs = torch.autograd.grad(outs, tensors, grad_outputs=[v[0] for v in vs],
                                          retain_graph=retain, allow_unused=True)
                hvs = [None if h is None else h.unsqueeze(0) for h in hvs]
            else:
                hvs = torch.autograd.grad(outs, tensors, grad_outputs=vs, retain_graph=retain,
                                          is_grads_batched=True, allow_unused=True)
            for v, k in zip(vs, used):
                if hvs[k] is not None:
                    sums[k] += (v * hvs[k]).sum(dtype=torch.float64)
        del grads, outs
    totals = torch.stack([s.to("cpu") for s in sums]).tolist() if sums else []
    return {n: s / n_samples for n, s in zip(names, totals)}


@torch.no_grad()
def weight_perturbation(weight: torch.Tensor, bits: int, method: str = "minmax") -> float:
    """``||Q(W) - W||^2`` for symmetric per-channel quantization at ``bits`` (0 for float)."""
    if bits >= FLOAT_BITS:
        return 0.0
    scale = weight_qparams(weight, bits, method).view(-1, *([1] * (weight.dim() - 1)))
    qmax = 2 ** (bits - 1) - 1
    q = torch.clamp(torch.round(weight / scale), -qmax, qmax) * scale
    return float(((q - weight) ** 2).sum())


def _check_candidates(candidates: Sequence[Pair]) -> list[Pair]:
    if not candidates:
        raise UserError("sensitivity needs at least one candidate (w_bits, a_bits)")
    out = []
    for pair in candidates:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise UserError(f"candidates must be (w_bits, a_bits) pairs, got {pair!r}")
        out.append((check_bits(pair[0], "weight", "<candidate>"), check_bits(pair[1], "activation", "<candidate>")))
    return out


def _labelled(batches: Iterable, max_images: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys, seen = [], [], 0
    for batch in batches:
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise UserError("sensitivity needs labelled batches: (inputs, labels) pairs")
        x, y = batch[0], batch[1]
        take = min(x.shape[0], max_images - seen)
        xs.append(x[:take].to(device))
        ys.append(y[:take].to(device))
        seen += take
        if seen >= max_images:
            break
    if not xs:
        raise UserError("sensitivity data is empty; expected (inputs, labels) batches")
    return torch.cat(xs), torch.cat(ys)


def hessian_sensitivity(model: nn.Module, batches: Iterable, candidates: Sequence[Pair], *,
                        max_images: int = 512, n_samples: int = 32, weight_observer: str = "minmax",
                        seed: int = 0, chunk: int = 32, probe_batch: int | None = None) -> SensitivityTable:
    """HAWQ-V2 sensitivity of every Conv2d/Linear of ``model`` (BN folded; ``model`` unchanged)
    for each candidate, from the cross-entropy loss on up to ``max_images`` labelled images.

    ``Omega_L(b) = Tr(H_L) / n_L * ||Q_b(W_L) - W_L||^2`` (HAWQ-V2): the second-order loss
    increase from quantizing layer L's ``n_L`` (BN-folded) weights to ``b`` bits. The Hessian
    trace w.r.t. those weights is estimated by Hutchinson's method (``E[v^T H v]`` with
    Rademacher ``v``; one Hessian-vector product per sample gives every layer's trace, because
    the cross terms of independent ``v`` vanish in expectation). It prices weights only:
    candidates that differ only in ``a_bits`` get equal values, and attention products are not
    seen. Non-positive traces (non-convex regions, estimator noise) are floored at 1e-3 of the
    mean positive average trace. Hard-sigmoid/h-swish modules are swapped for clamp-based
    equivalents in the (folded) copy, since PyTorch cannot differentiate them twice.

    The Hessian-vector products run ``chunk`` images at a time (:func:`hutchinson_trace` with
    one loss per chunk), so only one chunk's double-backward graph is held at once: over all
    images it was the memory peak of a whole ``hwnas run`` on the CPU
    (benchmarks/hessian_memory.md). ``probe_batch`` Rademacher vectors share one batched
    Hessian-vector product (default: see :func:`hutchinson_trace`).

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        ...                             torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)).eval()
        >>> from hwnas.quant import hessian_sensitivity
        >>> batches = [(torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,)))]
        >>> table = hessian_sensitivity(model, batches, [(8, 8), (4, 8)], n_samples=2)
        >>> sorted(table.values), table.values["0"][(4, 8)] >= table.values["0"][(8, 8)]
        (['0', '4'], True)
    """
    candidates = _check_candidates(candidates)
    if chunk < 1:
        raise UserError(f"chunk must be positive, got {chunk}")
    device = _model_device(model)
    folded = _twice_differentiable(fold_bn(model).eval())
    x, y = _labelled(batches, max_images, device)
    names = quantizable_layer_names(folded)
    modules = dict(folded.named_modules())
    params = {n: modules[n].weight for n in names}
    for p in folded.parameters():
        p.requires_grad_(False)
    for p in params.values():
        p.requires_grad_(True)

    def chunk_loss(i: int) -> Callable[[], torch.Tensor]:  # this chunk's share of the mean loss
        return lambda: F.cross_entropy(folded(x[i:i + chunk]), y[i:i + chunk],
                                       reduction="sum") / x.shape[0]

    traces = hutchinson_trace([chunk_loss(i) for i in range(0, x.shape[0], chunk)], params,
                              n_samples=n_samples, seed=seed, batch=probe_batch)
    # Away from a minimum (or from estimator noise) a layer's trace can come out <= 0; the
    # quadratic model then promises a free lunch, which is wrong. Such traces are floored at a
    # small fraction of the mean positive average trace, keeping the order by perturbation.
    avg = {n: traces[n] / params[n].numel() for n in names}
    positive = [v for v in avg.values() if v > 0]
    floor = 1e-3 * (sum(positive) / len(positive)) if positive else 1e-12
    values: dict[str, dict[Pair, float]] = {}
    for n in names:
        w = params[n].detach()
        avg_trace = max(avg[n], floor)
        values[n] = {(wb, ab): avg_trace * weight_perturbation(w, wb, weight_observer)
                     for wb, ab in candidates}
    return SensitivityTable(values, "hessian", {"traces": traces, "trace_floor": floor,
                                                "n_samples": n_samples,
                                                "images": int(x.shape[0])})


@torch.no_grad()
def _loss_acc(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 512) -> tuple[float, float]:
    loss = correct = 0.0
    for i in range(0, x.shape[0], chunk):
        out = model(x[i:i + chunk]).float()
        loss += float(F.cross_entropy(out, y[i:i + chunk], reduction="sum"))
        correct += float((out.argmax(1) == y[i:i + chunk]).sum())
    return loss / x.shape[0], 100.0 * correct / x.shape[0]


def measured_sensitivity(model: nn.Module, calib_batches: Iterable, eval_batches: Iterable,
                         candidates: Sequence[Pair], *, metric: str = "loss",
                         config: PTQConfig | None = None, max_eval_images: int = 1024,
                         progress: bool = False) -> SensitivityTable:
    """Sensitivity by measurement: for each candidate, the network is quantized and calibrated
    once (PTQ ranges come from float activations, so they do not depend on the other layers),
    then each layer alone is switched on and the loss increase (``metric="loss"``) or top-1
    drop in points (``"accuracy"``) vs float is measured on ``eval_batches``. An attention
    product (:class:`hwnas.quant.fake_quant.QuantMatMul`) is quantized together with the layer
    it follows (the block's Q/K/V projection), so that layer's entry covers it.

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        ...                             torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)).eval()
        >>> from hwnas.quant import measured_sensitivity
        >>> batches = [(torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,)))]
        >>> table = measured_sensitivity(model, batches, batches, [(8, 8), (2, 8)])
        >>> sorted(table.values), table.kind
        (['0', '4'], 'loss')
    """
    if metric not in ("loss", "accuracy"):
        raise UserError(f"unknown sensitivity metric {metric!r}; expected 'loss' or 'accuracy'")
    candidates = _check_candidates(candidates)
    config = config or PTQConfig()
    config = PTQConfig(**{**config.__dict__, "bias_correction": False})
    device = _model_device(model)
    calib = calibration_batches(calib_batches, config.max_images, device)
    x, y = _labelled(eval_batches, max_eval_images, device)
    names = quantizable_layer_names(model)
    values: dict[str, dict[Pair, float]] = {n: {} for n in names}
    base: tuple[float, float] | None = None
    bar = tqdm(total=len(candidates) * len(names), desc="sensitivity", disable=not progress, leave=False)
    for w_bits, a_bits in candidates:
        if (w_bits, a_bits) == (FLOAT_BITS, FLOAT_BITS):
            for n in names:
                values[n][(w_bits, a_bits)] = 0.0
            bar.update(len(names))
            continue
        qmodel = ptq(model, uniform(model, w_bits, a_bits), calib, config)
        if base is None:
            set_quantizers_enabled(qmodel, False)
            base = _loss_acc(qmodel, x, y)
        for n, _ in quant_layers(qmodel):
            set_quantizers_enabled(qmodel, False)
            set_quantizers_enabled(qmodel, True, names={n})
            loss, acc = _loss_acc(qmodel, x, y)
            values[n][(w_bits, a_bits)] = loss - base[0] if metric == "loss" else base[1] - acc
            bar.update(1)
    bar.close()
    return SensitivityTable(values, metric, {"float_loss": base[0] if base else None,
                                             "float_top1": base[1] if base else None})
