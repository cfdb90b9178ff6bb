"""Fake quantization (simulated integer arithmetic in float) for Conv2d/Linear layers.

Scheme (the one integer runtimes and accelerators use, Krishnamoorthi 2018): **weights**
symmetric per output channel on ``[-(2^(b-1)-1), 2^(b-1)-1]`` (at most ``2^b - 1`` levels, zero
exact, no zero point); **activations** affine (asymmetric) per tensor on ``[0, 2^b-1]`` with an
integer zero point, so post-ReLU/h-swish ranges waste no level; **bits** in
:data:`SUPPORTED_BITS`, 32 = float (identity). Rounding uses the straight-through estimator
(:class:`FakeQuantize`).

Where the quantizers sit: each ``nn.Conv2d``/``nn.Linear`` becomes a
:class:`QuantConv2d`/:class:`QuantLinear` (a subclass, same qualified name and parameter names)
that quantizes its **input** activation and its weight, so the activation bit-width of layer L
in a :class:`hwnas.quant.policy.QuantPolicy` is the bit-width of L's input. Attention products
become :class:`QuantMatMul` (following their projection's activation bits); residual adds may
share one quantizer (:class:`SharedAddQuant`). LayerNorm, softmax and GELU stay float.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from hwnas.quant.policy import FLOAT_BITS, SUPPORTED_BITS, quantizable_layer_names
from hwnas.supernet.nn.vit import MatMul
from torch import nn

__all__ = [
    "FakeQuantize",
    "QuantConv2d",
    "QuantLinear",
    "QuantMatMul",
    "SharedAddQuant",
    "quant_layers",
    "quant_products",
    "quantizable_layer_names",
    "quantizers",
    "fake_quant_per_tensor",
    "per_tensor_levels",
    "INT16_PAIR_LIMIT",
    "int16_safe_grid_bits",
    "reference_fake_quant",
    "round_ste",
    "set_quantizers_enabled",
]

_EPS = 1e-8

#: What one 16-bit intermediate of x86 U8S8 integer kernels without VNNI can hold: AVX2 and
#: AVX-512BW ``vpmaddubsw`` adds two uint8 x int8 products into a *saturating* int16
#: (onnxruntime's MLAS, OpenVINO's oneDNN). VNNI/AMX accumulate in int32 and never saturate.
INT16_PAIR_LIMIT = 32767


def int16_safe_grid_bits(w_bits: int, a_bits: int) -> int:
    """The weight grid width at which a layer of ``w_bits`` weights and ``a_bits`` activations
    cannot saturate a 16-bit pair sum on any x86 ISA: ``w_bits`` itself when two products of the
    largest values fit (``2 * (2^a - 1) * (2^(w-1) - 1) <= 32767``), one bit less otherwise
    (W8A8: 7-bit weights in [-63, 63], onnxruntime's ``reduce_range``, NNCF's overflow fix).
    Float sides give their own width back."""
    if w_bits >= FLOAT_BITS or a_bits >= FLOAT_BITS:
        return w_bits
    bits = w_bits
    while bits > 2 and 2 * (2 ** a_bits - 1) * (2 ** (bits - 1) - 1) > INT16_PAIR_LIMIT:
        bits -= 1
    return bits


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """``round(x)`` forward, identity backward (straight-through estimator)."""
    return (x.round() - x).detach() + x


def _scale_grad(x: torch.Tensor, g: float) -> torch.Tensor:
    """``x`` forward, gradient multiplied by ``g`` backward (LSQ's gradient scaling)."""
    return (x - x * g).detach() + x * g


def reference_fake_quant(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                         qmin: int, qmax: int, grad_scale: float = 1.0) -> torch.Tensor:
    """The fake quantizer written out with autograd (STE rounding, LSQ scale gradient):
    ``(clamp(round_ste(x / s) + z, qmin, qmax) - z) * s``. ``scale``/``zero_point`` must already
    broadcast against ``x``. :class:`FakeQuantize` runs PyTorch's fused kernels, which compute
    the same values and gradients (checked by the tests); this is their readable definition."""
    s = _scale_grad(scale, grad_scale)
    return (torch.clamp(round_ste(x / s) + zero_point, qmin, qmax) - zero_point) * s


def fake_quant_per_tensor(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                          qmin: int, qmax: int) -> torch.Tensor:
    """``torch.fake_quantize_per_tensor_affine(x, scale, zero_point, qmin, qmax)`` bit for bit
    (float32 ``x``, one-element ``scale``/``zero_point`` tensors), for inference on the CPU:
    PyTorch's CPU kernel also builds the gradient mask and runs ~3x slower than these in-place
    ops, which repeat its arithmetic - ``x * (1/s)`` in float32, rounded half to even, ``+ z``,
    NaN to ``qmin``, clamped, ``- z``, ``* s`` - and with it the parity passes of an export."""
    s = scale.reshape(())
    z = zero_point.reshape(()).to(torch.int32).to(torch.float32)  # as the kernel takes it
    lo, hi = float(qmin), float(qmax)
    return (per_tensor_levels(x, s).round_().add_(z).nan_to_num_(lo, hi, lo).clamp_(lo, hi)
            .sub_(z).mul_(s))


def per_tensor_levels(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` in levels of the one-element ``scale``, before rounding, as PyTorch's per-tensor
    fake-quant kernels compute it: ``x * (1/s)`` in float32. onnxruntime's QuantizeLinear
    divides, ``x / s``; the two round a value within an ulp of ``k + 1/2`` to neighbouring
    codes, so whoever compares codes with a fake-quant model must take them from here."""
    s = scale.reshape(())
    # x keeps its dtype (a bf16 activation under autocast stays bf16, as before this helper)
    return torch.mul(x, torch.ones((), dtype=torch.float32, device=s.device).div(s))


class FakeQuantize(nn.Module):
    """Quantize-dequantize of a weight (symmetric, per channel along ``ch_axis``) or an
    activation (affine, per tensor).

    ``scale`` (and, for activations, the integer ``zero_point``) are set by calibration
    (:mod:`hwnas.quant.ptq`); until then an enabled activation quantizer refuses to run, so an
    uncalibrated model can never be evaluated by mistake. ``enabled=False`` makes it the
    identity (used to observe float activations and to quantize one layer at a time).
    ``device``: where its parameters and buffers are made (the model's device: made on the
    default device and moved, they would cost a copy each, and one left behind fails on a GPU).

    Rounding uses the straight-through estimator (STE): the gradient of ``round`` is taken as 1,
    the gradient of the clamp is 0 outside the range. The scale is an ``nn.Parameter`` so that
    LSQ (:mod:`hwnas.quant.qat`) can learn it; its gradient is then scaled by
    ``g = 1/sqrt(numel * Qp)`` (Esser et al., 2020), applied when :attr:`grad_scale` is set.
    """

    def __init__(self, bits: int, kind: str, channels: int = 1, ch_axis: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if bits not in SUPPORTED_BITS:
            raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
        if kind not in ("weight", "act"):
            raise ValueError(f"kind must be 'weight' or 'act', got {kind!r}")
        if kind == "act" and channels != 1:
            raise ValueError("activation quantizers are per tensor (channels=1)")
        self.bits, self.kind, self.ch_axis = int(bits), kind, ch_axis
        #: weights only: the integer grid is ``grid_bits`` wide inside the ``bits`` container
        #: (:func:`int16_safe_grid_bits`); ``None`` = the full ``bits`` grid
        self.grid_bits: int | None = None
        self.scale = nn.Parameter(torch.ones(channels, device=device), requires_grad=False)
        self.register_buffer("zero_point", torch.zeros(channels, device=device))
        # persisted in the state dict; mirrored in a Python bool so that forward never syncs
        # with the GPU to read it
        self.register_buffer("calibrated_flag", torch.tensor(False, device=device))
        self._calibrated = False
        self.enabled = True
        #: LSQ gradient scale g; ``None`` = scale is not being learned
        self.grad_scale: float | None = None
        #: elements per sample seen by an activation quantizer (for LSQ's g), set by calibration
        self.numel_per_sample: int | None = None

    @property
    def is_float(self) -> bool:
        return self.bits >= FLOAT_BITS

    @property
    def active(self) -> bool:
        """Whether this quantizer changes its input (enabled and not float)."""
        return self.enabled and not self.is_float

    @property
    def levels_bits(self) -> int:
        """The width of the integer grid actually used (``grid_bits`` if narrowed, else
        ``bits``)."""
        return self.bits if self.grid_bits is None else self.grid_bits

    @property
    def qmin(self) -> int:
        return -(2 ** (self.levels_bits - 1) - 1) if self.kind == "weight" else 0

    @property
    def qmax(self) -> int:
        return 2 ** (self.levels_bits - 1) - 1 if self.kind == "weight" else 2 ** self.bits - 1

    @torch.no_grad()
    def set_qparams(self, scale: torch.Tensor | float, zero_point: torch.Tensor | float = 0.0) -> None:
        """Set the scale (clamped to a tiny positive value) and zero point; marks calibrated."""
        scale_t = torch.as_tensor(scale, dtype=torch.float32, device=self.scale.device).reshape(-1)
        zp_t = torch.as_tensor(zero_point, dtype=torch.float32, device=self.scale.device).reshape(-1)
        self.scale.copy_(scale_t.clamp_min(_EPS).expand_as(self.scale))
        self.zero_point.copy_(zp_t.round().clamp(self.qmin, self.qmax).expand_as(self.zero_point))
        self.calibrated_flag.fill_(True)
        self._calibrated = True

    @property
    def calibrated(self) -> bool:
        return self._calibrated

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # noqa: ANN001
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._calibrated = bool(self.calibrated_flag)

    def qparams(self) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """``(scale, zero_point, qmin, qmax)`` as used in the forward pass (for export)."""
        return self.scale.detach().abs().clamp_min(_EPS), self.zero_point.clone(), self.qmin, self.qmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return x
        if not self._calibrated:
            raise RuntimeError(
                f"{self.kind} quantizer ({self.bits} bits) used before calibration; run "
                f"hwnas.quant.ptq.calibrate (or quant.ptq.ptq) on the quantized model first"
            )
        # computed in float32 even under autocast: bf16 cannot hold the integer grid exactly
        xf = x.float()
        per_channel = self.kind == "weight"
        if self.scale.requires_grad:
            # LSQ: PyTorch's fused learnable fake-quant computes exactly the STE/LSQ gradients
            # of reference_fake_quant (d/dx: 1 inside the range, 0 outside; d/ds: round(x/s) -
            # x/s inside, the clipped level outside; times grad_scale). The trainer keeps the
            # scale positive (quant.qat clamps it after each step).
            g = 1.0 if self.grad_scale is None else self.grad_scale
            if per_channel:
                out = torch._fake_quantize_learnable_per_channel_affine(
                    xf, self.scale, self.zero_point, self.ch_axis, self.qmin, self.qmax, g)
            else:
                out = torch._fake_quantize_learnable_per_tensor_affine(
                    xf, self.scale, self.zero_point, self.qmin, self.qmax, g)
        elif per_channel:
            out = torch.fake_quantize_per_channel_affine(
                xf, self.scale.clamp_min(_EPS), self.zero_point.to(torch.int32), self.ch_axis,
                self.qmin, self.qmax)
        elif xf.device.type == "cpu" and not (torch.is_grad_enabled() and xf.requires_grad):
            out = fake_quant_per_tensor(xf, self.scale.clamp_min(_EPS), self.zero_point,
                                        self.qmin, self.qmax)  # the same values, faster
        else:
            out = torch.fake_quantize_per_tensor_affine(
                xf, self.scale.clamp_min(_EPS), self.zero_point.to(torch.int32), self.qmin, self.qmax)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        grid = "" if self.grid_bits is None else f", grid_bits={self.grid_bits}"
        return f"bits={self.bits}{grid}, kind={self.kind}, enabled={self.enabled}"


def _act_quant(bits: int, device: torch.device | str | None = None) -> FakeQuantize:
    return FakeQuantize(bits, "act", device=device)


class _FakeQuantLayer:
    """What :class:`QuantConv2d` and :class:`QuantLinear` share: the float layer's weight and
    bias copied in (a zero bias where it had none), the weight and input fake quantizers, and
    their bit widths."""

    #: how the weights were put on their grid: "nearest" (the fake quantizer's own rounding)
    #: or "adaround" (learned, set by :func:`hwnas.quant.adaround.adaround`); what an export
    #: records per file
    weight_rounding: str = "nearest"

    def _take_float(self, layer: nn.Module, w_bits: int, a_bits: int, channels: int,
                    numel_per_sample: int) -> None:
        with torch.no_grad():
            self.weight.copy_(layer.weight)
            if layer.bias is not None:
                self.bias.copy_(layer.bias)
            else:
                self.bias.zero_()
        self.weight_quant = FakeQuantize(w_bits, "weight", channels, 0, device=layer.weight.device)
        self.input_quant = _act_quant(a_bits, layer.weight.device)
        self.weight_quant.numel_per_sample = numel_per_sample
        self.train(layer.training)

    @property
    def w_bits(self) -> int:
        return self.weight_quant.bits

    @property
    def a_bits(self) -> int:
        return self.input_quant.bits


class QuantConv2d(_FakeQuantLayer, nn.Conv2d):
    """An ``nn.Conv2d`` whose weight and input activation pass through fake quantizers.

    Build it with :meth:`from_float`; parameter names stay ``weight``/``bias``. A bias is always
    present (zeros if the float conv had none) so that bias correction has somewhere to go; that
    changes nothing numerically.
    """

    @classmethod
    def from_float(cls, conv: nn.Conv2d, w_bits: int, a_bits: int) -> QuantConv2d:
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                  conv.dilation, conv.groups, True, conv.padding_mode,
                  device=conv.weight.device, dtype=conv.weight.dtype)
        new._take_float(conv, w_bits, a_bits, conv.out_channels, conv.weight[0].numel())
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(self.input_quant(x), self.weight_quant(self.weight), self.bias)


class QuantLinear(_FakeQuantLayer, nn.Linear):
    """An ``nn.Linear`` whose weight and input activation pass through fake quantizers."""

    @classmethod
    def from_float(cls, linear: nn.Linear, w_bits: int, a_bits: int) -> QuantLinear:
        new = cls(linear.in_features, linear.out_features, True,
                  device=linear.weight.device, dtype=linear.weight.dtype)
        new._take_float(linear, w_bits, a_bits, linear.out_features, linear.in_features)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.input_quant(x), self.weight_quant(self.weight), self.bias)


class SharedAddQuant(nn.Module):
    """A residual addition ``a + b`` whose two inputs share one affine activation quantizer.

    Calibration observes both inputs into the one quantizer, so the range covers both; the sum
    of the two quantized tensors is then an exact integer sum on that one scale, which is what a
    runtime that adds integer tensors without requantizing needs. ``bits=32`` is a float add.

    Why: ``x + y`` in a block's ``forward`` is not a module. An integer runtime either
    requantizes both inputs to the output scale inside the add (onnxruntime's QLinearAdd,
    TFLite's ADD: scales may differ) or needs both inputs on one shared scale (accelerators that
    add int accumulators directly); this simulates the latter.
    :func:`hwnas.quant.ptq.quantize_model` inserts it (``residual="shared"``) by rewriting every
    tensor + tensor addition with ``torch.fx`` into a call of a ``SharedAddQuant`` module named
    ``<block>.add``, the name the layer list gives that addition. With ``residual="float"``
    (the default) adds stay in float, the common simplification of QAT tools.
    """

    def __init__(self, bits: int = 8, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.input_quant = _act_quant(bits, device)

    @property
    def a_bits(self) -> int:
        return self.input_quant.bits

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.input_quant(a) + self.input_quant(b)


class QuantMatMul(MatMul):
    """A product of two activations whose inputs pass through per-tensor affine quantizers
    (``a_quant``, ``b_quant``) at the activation bits of the policy layer it ``follows``.

    Attention's Q·Kᵀ and attention × V (the :class:`hwnas.supernet.nn.vit.MatMul` modules):
    both inputs (q and k; the softmax output and v) quantized per tensor, affine, what
    onnxruntime's integer MatMul kernels take. A product has no weights and no bit-widths of its
    own in a policy: it takes the activation bits of the layer it follows
    (:func:`hwnas.quant.policy.product_sources`, the block's Q/K/V projection), and stays float
    when that layer's activations do.
    """

    follows: str = ""

    @classmethod
    def from_float(cls, matmul: MatMul, a_bits: int, follows: str,
                   device: torch.device | str | None = None) -> QuantMatMul:
        """``device``: the model's (a product has no tensors of its own to take it from)."""
        new = cls(matmul.transpose_b, matmul.scale)
        new.a_quant, new.b_quant = _act_quant(a_bits, device), _act_quant(a_bits, device)
        new.follows = follows
        new.train(matmul.training)
        return new

    @property
    def a_bits(self) -> int:
        return self.a_quant.bits

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return super().forward(self.a_quant(a), self.b_quant(b))


QUANT_LAYER_TYPES = (QuantConv2d, QuantLinear)



def quant_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every QuantConv2d/QuantLinear, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QUANT_LAYER_TYPES)]


def quantizers(model: nn.Module) -> list[tuple[str, FakeQuantize]]:
    """``(name, quantizer)`` of every FakeQuantize in ``model``, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, FakeQuantize)]


def quant_products(model: nn.Module) -> list[tuple[str, QuantMatMul]]:
    """``(name, module)`` of every QuantMatMul (quantized product of two activations)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QuantMatMul)]


def set_quantizers_enabled(model: nn.Module, enabled: bool, *, names: set[str] | None = None) -> None:
    """Enable or disable the quantizers of the quant layers ``names`` (default: all, adds and
    products included; a product goes with the layer it follows). Float (32-bit) quantizers
    stay the identity either way."""
    for name, module in model.named_modules():
        if not isinstance(module, (*QUANT_LAYER_TYPES, SharedAddQuant, QuantMatMul)):
            continue
        if names is None or name in names or getattr(module, "follows", None) in names:
            for q in module.modules():
                if isinstance(q, FakeQuantize):
                    q.enabled = enabled


def lsq_grad_scale(numel: int, qmax: int) -> float:
    """LSQ's gradient scale ``g = 1 / sqrt(numel * Qp)``."""
    return 1.0 / math.sqrt(max(1, numel) * max(1, qmax))
