"""AdaRound: learned up-or-down rounding of quantized weights, layer by layer, on calibration images.

Nagel et al., 2020, "Up or Down? Adaptive Rounding for Post-Training Quantization". Rounding
each weight to the nearest grid point minimises the weight error, not the layer's output error;
at 4 bits the difference costs about a point of CIFAR-10 top-1 on the mbv3 subnets
(``benchmarks/quant_peers.md``). Each layer's soft up/down choices are trained with Adam on its
output error, then stored on the ordinary weight grid, so every exporter and the portable 7-bit
grid apply unchanged (:class:`AdaRoundConfig` gives the loss, the sampling of positions and the
cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hwnas.quant.fake_quant import QuantConv2d, quant_layers, set_quantizers_enabled
from torch import nn
from torch.nn.modules.utils import _pair

from hwnas.core.cooperate import yield_point
from hwnas.core.errors import UserError

__all__ = ["AdaRoundConfig", "adaround", "adaround_layer", "adaround_targets", "learned_layers",
           "rectified_sigmoid"]

_ZETA, _GAMMA = 1.1, -0.1  # the rectified sigmoid's stretch (AdaRound's zeta, gamma)


@dataclass
class AdaRoundConfig:
    """Settings of :func:`adaround`: Adam steps per layer, output positions drawn per layer
    (``samples``) and per step (``batch_size``), learning rate, the rounding regulariser's
    weight, beta's annealing (start, end, fraction of steps before it starts) and the seed of
    the position draws.

    For each quantized Conv2d/Linear in module order, its weight scales fixed (set by the weight
    observer), a soft choice ``h`` in [0, 1] per weight (a rectified sigmoid of a learned ``V``)
    between floor and ceiling is trained with Adam:

        w~ = s * clamp(floor(w / s) + h(V), qmin, qmax)
        loss = mean over positions of sum over channels (layer(x_q; w~) - layer_fp(x_fp))^2
               + reg * sum(1 - |2h - 1|^beta),   beta annealed from 20 to 2 after a warm-up

    ``x_q`` is the layer's input in the quantized network with every layer before it already
    rounded (activation quantizers on, so errors before it are compensated), ``layer_fp(x_fp)``
    the float network's output of that layer (AdaRound's asymmetric reconstruction; AIMET's loss
    scaling). At the end ``h`` is rounded to {0, 1} and the weight is stored as ``s * integer``:
    the model's ordinary fake quantizer (nearest rounding, same scale and grid) then gives back
    exactly the learned integers, so every exporter and the portable 7-bit grid
    (:func:`hwnas.quant.ptq.int16_safe_layers`, the grid is read from the quantizer) apply
    unchanged.

    The loss is taken on ``samples`` output positions drawn once per layer (seeded) from all
    calibration images and positions (a convolution's input patches unfolded into rows, so each
    Adam step is a small matrix product instead of a convolution over whole images),
    ``batch_size`` of them per step. Two forward passes over the calibration images in all: a
    float pass records each layer's target at its positions, then one quantized pass learns each
    layer's rounding in a hook just before the layer runs, so the layers after it see its
    rounded output (the sequential algorithm at the cost of one pass, like
    :func:`hwnas.quant.ptq.bias_correct`). Beta decays linearly (AIMET's along a cosine).
    Deterministic for a given ``seed`` on the CPU.

    Examples:
        >>> AdaRoundConfig(iterations=200).iterations
        200
    """

    iterations: int = 200
    samples: int = 16384
    batch_size: int = 1024
    lr: float = 1e-2
    reg: float = 0.01
    beta_start: float = 20.0
    beta_end: float = 2.0
    warmup: float = 0.2
    seed: int = 0

    def validate(self) -> None:
        if min(self.iterations, self.samples, self.batch_size) < 1:
            raise UserError(f"AdaRound needs positive iterations, samples and batch_size, got "
                            f"{self.iterations}, {self.samples} and {self.batch_size}")
        if not 0.0 <= self.warmup < 1.0:
            raise UserError(f"AdaRound warmup must be in [0, 1), got {self.warmup}")
        if self.lr <= 0 or self.reg < 0:
            raise UserError(f"AdaRound needs lr > 0 and reg >= 0, got {self.lr} and {self.reg}")


def _stretched_sigmoid(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``sigmoid(v)``, ``sigmoid(v) * (zeta - gamma) + gamma``): the rectifier before its
    clamp, with the sigmoid its derivative needs (:class:`_RoundingLoss`)."""
    sig = torch.sigmoid(v)
    return sig, sig * (_ZETA - _GAMMA) + _GAMMA


def rectified_sigmoid(v: torch.Tensor) -> torch.Tensor:
    """``clamp(sigmoid(v) * (zeta - gamma) + gamma, 0, 1)``: reaches 0 and 1 exactly."""
    return torch.clamp(_stretched_sigmoid(v)[1], 0.0, 1.0)


def _inverse_rectified_sigmoid(h: torch.Tensor) -> torch.Tensor:
    return -torch.log((_ZETA - _GAMMA) / (h - _GAMMA) - 1.0)


def _groups(layer: nn.Module) -> int:
    return layer.groups if isinstance(layer, QuantConv2d) else 1


def _supported(layer: nn.Module) -> bool:
    """Convolutions are unfolded into rows: zero padding given as numbers only."""
    return not isinstance(layer, QuantConv2d) or (
        layer.padding_mode == "zeros" and not isinstance(layer.padding, str))


def _output_rows(layer: nn.Module, out: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A layer's output at positions ``pos`` as ``(len(pos), channels)``; a position indexes
    all images and positions, image-major (``image * H * W + y * W + x`` for a convolution).
    Gathered, not transposed whole: only the drawn positions are copied."""
    if isinstance(layer, QuantConv2d):
        flat = out.flatten(2)  # (images, channels, H*W)
        return flat[pos // flat.shape[2], :, pos % flat.shape[2]]
    return out.reshape(-1, out.shape[-1])[pos]


def _input_rows(layer: nn.Module, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The (input-quantized) patches behind output positions ``pos`` (see
    :func:`_output_rows`) of the layer on ``x``: ``(len(pos), groups, inputs per group)``, in
    :func:`torch.nn.functional.unfold`'s order (channel, kernel row, kernel column). Only the
    drawn patches are copied: unfolding every image cost ``kernel_size**2`` times the input per
    layer (most of AdaRound's time on the largest mbv3 subnet, whose 7x7 depthwise layers are
    wide; ``benchmarks/quant_peers.md``). Each patch's pixels are whole rows of the zero-padded
    input laid out channels-last, taken by one ``index_select``: 2-3x faster than advanced
    indexing of a strided window view, the same values (``benchmarks/adaround_steps.md``,
    Session 38)."""
    if not isinstance(layer, QuantConv2d):
        return x.reshape(-1, x.shape[-1]).index_select(0, pos).unsqueeze(1)
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (_pair(layer.kernel_size), _pair(layer.dilation),
                                              _pair(layer.padding), _pair(layer.stride))
    channels, hp, wp = x.shape[1], x.shape[2] + 2 * ph, x.shape[3] + 2 * pw
    out_w = (wp - dw * (kw - 1) - 1) // sw + 1
    per_image = ((hp - dh * (kh - 1) - 1) // sh + 1) * out_w
    pixels = F.pad(x, (pw, pw, ph, ph)).permute(0, 2, 3, 1).reshape(-1, channels)
    img, rest = pos // per_image, pos % per_image
    corner = img * (hp * wp) + (rest // out_w) * (sh * wp) + (rest % out_w) * sw
    offsets = (torch.arange(kh, device=pos.device).view(-1, 1) * (dh * wp)
               + torch.arange(kw, device=pos.device).view(1, -1) * dw).flatten()
    patches = pixels.index_select(0, (corner.view(-1, 1) + offsets).flatten())
    patches = patches.view(len(pos), kh * kw, channels).transpose(1, 2)  # (positions, C, kh*kw)
    return patches.reshape(len(pos), layer.groups, -1)


def _rows_forward(layer: nn.Module, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The layer's output at the positions of ``rows`` (see :func:`_input_rows`) with
    ``weight``: ``(positions, out channels)``. A depthwise layer's is one product per channel
    on a strided view of ``rows``: 2-3x faster than a multiply and a sum through a ``(rows,
    channels, K)`` temporary (``benchmarks/adaround_steps.md``, Session 38)."""
    g = rows.shape[1]
    w = weight.reshape(g, weight.shape[0] // g, -1)
    if w.shape[1] == 1:  # depthwise: one output per group
        out = torch.bmm(rows.transpose(0, 1), w.transpose(1, 2)).squeeze(-1).t()
    else:
        out = torch.einsum("rgk,gok->rgo", rows, w).reshape(len(rows), -1)
    return out + layer.bias.detach()


def _rows_weight_grad(rows: torch.Tensor, err: torch.Tensor) -> torch.Tensor:
    """d/dW of ``sum(err * (rows-forward of W))`` (see :func:`_rows_forward`): the weight
    gradient of a loss whose gradient at the layer's output is ``err`` ``(positions, out
    channels)``, as ``(groups, out per group, inputs per group)``."""
    e = err.view(len(rows), rows.shape[1], -1)
    if e.shape[2] == 1:  # depthwise
        return torch.bmm(e.permute(1, 2, 0), rows.transpose(0, 1))
    return torch.einsum("rgo,rgk->gok", e, rows)


class _RoundingLoss:
    """AdaRound's loss of one layer on a batch of its rows (:func:`_input_rows`) and its
    gradient with respect to ``V``, by hand: the forward of :func:`_rows_forward`, one product
    for the weight gradient, a dozen elementwise passes over the weights and no autograd graph
    (autograd's graph through the rectified sigmoid, the clamps and the regulariser cost about
    40 passes over the weights per step; ``benchmarks/adaround_steps.md``, Session 38)."""

    def __init__(self, layer: nn.Module, reg: float, batch: int) -> None:
        scale, _, self.qmin, self.qmax = layer.weight_quant.qparams()
        w = layer.weight.detach()
        self.layer, self.reg = layer, reg
        self.s = scale.detach().view([-1] + [1] * (w.dim() - 1))
        self.floor = torch.floor(w / self.s)
        # d loss / d w~ is 2 / batch * (layer-output error)^T rows; times d w~ / d h = s, zero
        # where the clamp to [qmin, qmax] holds w~ whatever h is (floor + h, h in [0, 1], stays
        # on the grid iff qmin <= floor <= qmax - 1), times the rectifier's slope zeta - gamma
        inside = (self.floor >= self.qmin) & (self.floor <= self.qmax - 1)
        self.dh = (2.0 * (_ZETA - _GAMMA) / batch) * self.s * inside.to(w.dtype)

    def weight(self, h: torch.Tensor) -> torch.Tensor:
        """``s * clamp(floor(w / s) + h, qmin, qmax)``."""
        return self.s * torch.clamp(self.floor + h, self.qmin, self.qmax)

    def grad(self, v: torch.Tensor, rows: torch.Tensor, target: torch.Tensor,
             beta: float | None) -> torch.Tensor:
        """d/d``v`` of ``mean over rows of sum over channels (output - target)^2 + reg *
        sum(1 - |2h - 1|^beta)``, ``rows`` a batch of the size given; the regulariser is left
        out when ``beta`` is None (warm-up)."""
        sig, h_raw = _stretched_sigmoid(v)
        h = h_raw.clamp(0.0, 1.0)
        err = _rows_forward(self.layer, rows, self.weight(h)) - target
        grad = _rows_weight_grad(rows, err).view_as(v).mul_(self.dh)
        if beta is not None:  # d/dh: -2 reg beta u |u|^(beta - 2), u = 2h - 1
            u = h * 2 - 1
            grad.addcmul_(u, u.abs().pow_(beta - 2), value=-2 * (_ZETA - _GAMMA) * self.reg * beta)
        # d h / d v / (zeta - gamma): sigmoid' inside the rectifier's clamp, 0 outside
        return grad.mul_(sig.addcmul_(sig, sig, value=-1.0)).masked_fill_(h_raw.ne(h), 0.0)


def adaround_layer(layer: nn.Module, rows: torch.Tensor, target: torch.Tensor,
                   config: AdaRoundConfig | None = None) -> dict[str, float]:
    """Learn the rounding of one quant layer's weights so that its output on ``rows`` (its
    input patches, input quantizer already applied: :func:`_input_rows`) matches ``target``
    ``(positions, out channels)``; the layer's weight is replaced by the rounded
    ``s * integer`` values. Returns the output MSE (summed over channels, mean over positions)
    with nearest and with learned rounding (``{"mse_nearest", "mse_adaround"}``).

    Each Adam step (fused Adam) takes the gradient on ``batch_size`` rows drawn with
    replacement, computed by hand (:class:`_RoundingLoss`): the integers autograd's steps
    learned, for 0.6x (smallest) to 0.8x (largest) their CPU time on the CIFAR-10 W4A8
    subnets (``benchmarks/adaround_steps.md``, Session 38)."""
    config = config or AdaRoundConfig()
    config.validate()
    wq = layer.weight_quant
    if wq.is_float:
        raise UserError("AdaRound needs a layer with quantized weights")

    def mse(weight: torch.Tensor) -> float:
        return float((_rows_forward(layer, rows, weight) - target).pow(2).sum(1).mean())

    gen = torch.Generator().manual_seed(config.seed)
    warm = int(config.warmup * config.iterations)
    batch = min(config.batch_size, len(rows))
    with torch.no_grad():
        w = layer.weight.detach()
        before = mse(wq(w))
        loss = _RoundingLoss(layer, config.reg, batch)
        rest = (w / loss.s - loss.floor).clamp(1e-4, 1 - 1e-4)
        v = nn.Parameter(_inverse_rectified_sigmoid(rest))
        opt = torch.optim.Adam([v], lr=config.lr, fused=v.device.type in ("cpu", "cuda"))
        # every step's draws at once (the same numbers as one draw per step) and on the rows'
        # device in one copy: a copy per step would wait for the GPU at every step
        draws = torch.randint(len(rows), (config.iterations, batch), generator=gen,
                              device="cpu").to(rows.device)
        for step in range(config.iterations):
            if step % 64 == 0:
                yield_point()
            idx = draws[step]
            beta = None
            if step >= warm:
                frac = (step - warm) / max(1, config.iterations - warm)
                beta = config.beta_start + frac * (config.beta_end - config.beta_start)
            v.grad = loss.grad(v, rows.index_select(0, idx), target.index_select(0, idx), beta)
            opt.step()
        layer.weight.copy_(loss.weight((v >= 0).to(w.dtype)))  # h(v) >= 0.5 <=> v >= 0
        return {"mse_nearest": before, "mse_adaround": mse(wq(layer.weight.detach()))}


def adaround_targets(qmodel: nn.Module) -> list[str]:
    """The quant layers of ``qmodel`` that :func:`adaround` learns, in module order: those with
    quantized weights, except convolutions whose padding is not zeros given as numbers."""
    return [n for n, m in quant_layers(qmodel) if not m.weight_quant.is_float and _supported(m)]


def learned_layers(qmodel: nn.Module) -> list[str]:
    """The quant layers of ``qmodel`` whose weights' rounding :func:`adaround` learned."""
    return [n for n, m in quant_layers(qmodel) if m.weight_rounding == "adaround"]


def adaround(qmodel: nn.Module, xs: Sequence[torch.Tensor],
             config: AdaRoundConfig | None = None) -> dict[str, dict[str, float]]:
    """AdaRound the quant layers :func:`adaround_targets` names of a calibrated fake-quant
    model (:func:`hwnas.quant.ptq.calibrate`), in module order, on the calibration inputs
    ``xs`` (one batch), the others keeping nearest rounding; in place, each learned layer
    marked (:func:`learned_layers`). Returns ``{layer: {"mse_nearest", "mse_adaround"}}``.

    Examples:
        >>> import torch
        >>> from hwnas.quant import uniform
        >>> from hwnas.quant.ptq import PTQConfig, ptq
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(),
        ...                             torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)).eval()
        >>> x = torch.randn(32, 1, 8, 8)
        >>> qmodel = ptq(model, uniform(model, 4, 8), [x], PTQConfig(bias_correction=False))
        >>> report = adaround(qmodel, [x], AdaRoundConfig(iterations=50))
        >>> sorted(report)
        ['0', '3']
    """
    config = config or AdaRoundConfig()
    config.validate()
    if not xs:
        raise UserError("AdaRound needs calibration inputs")
    x = torch.cat(list(xs)) if len(xs) > 1 else xs[0]
    chosen = set(adaround_targets(qmodel))  # a layer's seed: its index among all quant layers
    layers = [(i, n, m) for i, (n, m) in enumerate(quant_layers(qmodel)) if n in chosen]
    positions: dict[str, torch.Tensor] = {}
    targets: dict[str, torch.Tensor] = {}

    def record(index, name):
        def hook(module, _inputs, out):
            yield_point()
            if name in targets:
                return
            out = out.detach()
            n_rows = out.numel() // out.shape[1 if isinstance(module, QuantConv2d) else -1]
            gen = torch.Generator().manual_seed(config.seed * 100003 + index)
            pos = torch.randperm(n_rows, generator=gen, device="cpu")[:config.samples]
            pos = pos.to(out.device)
            positions[name], targets[name] = pos, _output_rows(module, out, pos)
        return hook

    report: dict[str, dict[str, float]] = {}

    def learn(name):
        def hook(module, inputs):
            if name in report or name not in targets:
                return
            yield_point()
            with torch.no_grad():
                rows = _input_rows(module, module.input_quant(inputs[0].detach()),
                                   positions[name])
            report[name] = adaround_layer(module, rows, targets.pop(name), config)
            module.weight_rounding = "adaround"
        return hook

    was_training = qmodel.training
    qmodel.eval()
    try:
        with torch.no_grad():
            handles = [m.register_forward_hook(record(i, n)) for i, n, m in layers]
            set_quantizers_enabled(qmodel, False)
            try:
                qmodel(x)
            finally:
                for h in handles:
                    h.remove()
                set_quantizers_enabled(qmodel, True)
            handles = [m.register_forward_pre_hook(learn(n)) for _, n, m in layers]
            try:
                qmodel(x)
            finally:
                for h in handles:
                    h.remove()
    finally:
        qmodel.train(was_training)
    missing = [n for _, n, _ in layers if n not in report]
    if missing:
        raise UserError(f"AdaRound: layer {missing[0]!r} was not run by the model's forward")
    return report
