"""Weight-sharing operators of every supernet (Once-for-All / AutoFormer style): one max-size
weight, sliced per active subnet.

Each operator keeps its full-size parameters; a forward pass uses the leading slice that the
active configuration needs. Input channels always follow the incoming tensor, output channels
and kernel size are passed explicitly, so no operator holds global state. ``static(...)``
returns an ordinary ``nn.Conv2d`` / ``nn.BatchNorm2d`` / ``nn.Linear`` / ``nn.LayerNorm`` with
copies of the active slice, which is what extraction (:meth:`Supernet.extract
<hwnas.supernet.nn.supernet.Supernet.extract>`) and export want.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.utils import _pair


class DynamicConv2d(nn.Module):
    """A dense (groups=1) convolution whose input and output channels can shrink."""

    def __init__(self, max_in: int, max_out: int, kernel: int = 1, stride: int = 1,
                 bias: bool = False) -> None:
        super().__init__()
        self.kernel, self.stride = kernel, stride
        self.weight = nn.Parameter(torch.empty(max_out, max_in, kernel, kernel))
        nn.init.kaiming_normal_(self.weight, mode="fan_out")
        self.bias = nn.Parameter(torch.zeros(max_out)) if bias else None

    def active_weight(self, in_ch: int, out_ch: int) -> torch.Tensor:
        return self.weight[:out_ch, :in_ch]

    def forward(self, x: torch.Tensor, out_ch: int) -> torch.Tensor:
        w = self.active_weight(x.size(1), out_ch)
        b = self.bias[:out_ch] if self.bias is not None else None
        return F.conv2d(x, w, b, self.stride, self.kernel // 2)

    def static(self, in_ch: int, out_ch: int) -> nn.Conv2d:
        conv = nn.Conv2d(in_ch, out_ch, self.kernel, self.stride, self.kernel // 2,
                         bias=self.bias is not None)
        conv.weight.data.copy_(self.active_weight(in_ch, out_ch))
        if self.bias is not None:
            conv.bias.data.copy_(self.bias[:out_ch])
        return conv


def depthwise_grads(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, stride, padding,
                    mask: tuple[bool, bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(grad_input, grad_weight)`` of the depthwise ``F.conv2d(x, w, None, stride, padding)``
    for the output gradient ``grad`` (``mask``: which of the two), by PyTorch's first-order
    kernels; ``stride`` / ``padding`` an int or a pair."""
    gx, gw, _ = torch.ops.aten.convolution_backward(
        grad, x, w, None, list(_pair(stride)), list(_pair(padding)), [1, 1], False, [0, 0],
        w.shape[0], [mask[0], mask[1], False])
    return gx, gw


class _NativeDepthwise(torch.autograd.Function):
    """Depthwise convolution with cuDNN off in forward and backward (PyTorch's own kernels)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.stride, ctx.padding = stride, padding
        with torch.backends.cudnn.flags(enabled=False):
            return F.conv2d(x, w, None, stride, padding, 1, x.size(1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        with torch.backends.cudnn.flags(enabled=False):
            gx, gw = depthwise_grads(grad, x, w, ctx.stride, ctx.padding, ctx.needs_input_grad[:2])
        return gx, gw, None, None


def depthwise_conv2d(x: torch.Tensor, w: torch.Tensor, stride: int, padding: int,
                     native: bool | None = None) -> torch.Tensor:
    """``F.conv2d(x, w, None, stride, padding, 1, channels)``; on a GPU (``native`` None) or
    when ``native``, through PyTorch's own depthwise kernels instead of cuDNN.

    Why: a supernet step meets new depthwise shapes (channels x kernel x resolution) for many
    steps, and cuDNN 9 builds a plan for each new one: 0.9 s median per new shape (up to 4.4 s)
    on an H100, against 0.9 ms for PyTorch's kernels, which are also faster once warm (0.74 vs
    1.07 ms): `benchmarks/gpu_matrix.md`, "Session 35" (step_probe). Autocast is applied here
    (inputs cast to its dtype, the Function run outside it), as ``F.conv2d`` would.
    """
    if native is None:
        native = x.is_cuda and not torch.compiler.is_compiling()
    if not native:
        return F.conv2d(x, w, None, stride, padding, 1, x.size(1))
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        x, w = x.to(dtype), w.to(dtype)
    with torch.autocast(kind, enabled=False):
        return _NativeDepthwise.apply(x, w.to(x.dtype), stride, padding)


class DynamicDepthwiseConv2d(nn.Module):
    """A depthwise convolution with elastic channels and elastic kernel size.

    Smaller kernels take the centre of the next larger one and pass it through a small learned
    linear transform (initialised to the identity), as in Once-for-All: the centre crop alone
    forces one set of weights to serve two roles, the transform relieves that.
    """

    def __init__(self, max_channels: int, kernel_choices: tuple[int, ...], stride: int = 1) -> None:
        super().__init__()
        self.kernel_choices = tuple(sorted(kernel_choices))
        self.max_kernel = self.kernel_choices[-1]
        self.stride = stride
        self.weight = nn.Parameter(torch.empty(max_channels, 1, self.max_kernel, self.max_kernel))
        nn.init.kaiming_normal_(self.weight, mode="fan_out")
        # transform for the step from the next larger kernel down to kernel k
        self.transforms = nn.ParameterDict(
            {
                f"{k}": nn.Parameter(torch.eye(k * k))
                for k in self.kernel_choices[:-1]
            }
        )

    def active_weight(self, channels: int, kernel: int) -> torch.Tensor:
        if kernel not in self.kernel_choices:
            raise ValueError(f"kernel {kernel} not in {self.kernel_choices}")
        filt = self.weight[:channels]
        for k in reversed(self.kernel_choices[:-1]):
            if k < kernel:
                break
            start = (filt.size(-1) - k) // 2
            centre = filt[:, :, start : start + k, start : start + k]
            flat = centre.reshape(channels, k * k)
            filt = F.linear(flat, self.transforms[f"{k}"]).reshape(channels, 1, k, k)
        return filt

    def forward(self, x: torch.Tensor, kernel: int) -> torch.Tensor:
        channels = x.size(1)
        return depthwise_conv2d(x, self.active_weight(channels, kernel), self.stride, kernel // 2)

    def static(self, channels: int, kernel: int) -> nn.Conv2d:
        conv = nn.Conv2d(channels, channels, kernel, self.stride, kernel // 2, groups=channels,
                         bias=False)
        conv.weight.data.copy_(self.active_weight(channels, kernel))
        return conv


class DynamicBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm over the leading ``C`` channels of its max-size statistics and affine terms.

    In training mode the running statistics of the active slice are updated in place (slices are
    views), so the largest subnet's statistics are shared with smaller ones; subnets are
    recalibrated before evaluation (:func:`hwnas.supernet.evaluate.recalibrate_bn`).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        c = x.size(1)
        if c == self.num_features:
            return super().forward(x)
        # Same momentum handling as nn.BatchNorm2d: momentum=None means a cumulative average
        # (what recalibrate_bn relies on), which needs num_batches_tracked to count here too.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        use_stats = self.training or self.running_mean is None
        return F.batch_norm(
            x,
            self.running_mean[:c] if self.running_mean is not None else None,
            self.running_var[:c] if self.running_var is not None else None,
            self.weight[:c],
            self.bias[:c],
            use_stats,
            factor,
            self.eps,
        )

    def static(self, channels: int) -> nn.BatchNorm2d:
        bn = nn.BatchNorm2d(channels, eps=self.eps, momentum=self.momentum)
        bn.weight.data.copy_(self.weight[:channels])
        bn.bias.data.copy_(self.bias[:channels])
        bn.running_mean.copy_(self.running_mean[:channels])
        bn.running_var.copy_(self.running_var[:channels])
        bn.num_batches_tracked.copy_(self.num_batches_tracked)
        return bn


class SqueezeExcite(nn.Module):
    """Static squeeze-and-excitation: global pool, 1×1 reduce + ReLU, 1×1 expand + h-sigmoid,
    channel-wise scale (MobileNetV3 / Once-for-All). Module names match the layer list."""

    def __init__(self, reduce: nn.Conv2d, expand: nn.Conv2d) -> None:
        super().__init__()
        self.reduce, self.act, self.expand, self.gate = reduce, nn.ReLU(), expand, nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


class DynamicSE(nn.Module):
    """Squeeze-and-excitation whose width follows the active channels (OFA's ``DynamicSE``).

    With ``C`` active channels the hidden width is ``hidden_fn(C)``; both 1×1 convolutions use
    the leading slices of their max-size weights and biases.
    """

    def __init__(self, max_channels: int, hidden_fn) -> None:
        super().__init__()
        self.hidden_fn = hidden_fn
        max_hidden = hidden_fn(max_channels)
        self.reduce = DynamicConv2d(max_channels, max_hidden, 1, bias=True)
        self.expand = DynamicConv2d(max_hidden, max_channels, 1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the 1x1 convolutions on a 1x1 map are matrix products: F.linear on the pooled vector
        # (cheaper than a convolution call, and indifferent to the input's memory format)
        c = x.size(1)
        h = self.hidden_fn(c)
        s = x.mean((2, 3))
        s = F.relu(F.linear(s, self.reduce.weight[:h, :c, 0, 0], self.reduce.bias[:h]))
        s = F.hardsigmoid(F.linear(s, self.expand.weight[:c, :h, 0, 0], self.expand.bias[:c]))
        return x * s[:, :, None, None]

    def static(self, channels: int) -> SqueezeExcite:
        hidden = self.hidden_fn(channels)
        return SqueezeExcite(self.reduce.static(channels, hidden), self.expand.static(hidden, channels))


# -- transformer operators (AutoFormer's weight entanglement) -----------------------------------

#: ViT/timm: truncated normal weights for the linear layers
_INIT_STD = 0.02


class DynamicLinear(nn.Module):
    """A linear layer whose input and output features can shrink (leading slices)."""

    def __init__(self, max_in: int, max_out: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_out, max_in))
        nn.init.trunc_normal_(self.weight, std=_INIT_STD)
        self.bias = nn.Parameter(torch.zeros(max_out)) if bias else None

    def forward(self, x: torch.Tensor, out_features: int) -> torch.Tensor:
        b = self.bias[:out_features] if self.bias is not None else None
        return F.linear(x, self.weight[:out_features, : x.size(-1)], b)

    def static(self, in_features: int, out_features: int) -> nn.Linear:
        lin = nn.Linear(in_features, out_features, bias=self.bias is not None)
        lin.weight.data.copy_(self.weight[:out_features, :in_features])
        if self.bias is not None:
            lin.bias.data.copy_(self.bias[:out_features])
        return lin


class DynamicQKV(nn.Module):
    """The fused Q/K/V projection with elastic heads: one max-size weight per Q, K and V, each
    sliced to its first ``heads × head_dim`` rows (so a subnet's heads are the first heads of
    the supernet's, in Q, K and V alike)."""

    def __init__(self, max_in: int, max_heads: int, head_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.weight = nn.Parameter(torch.empty(3, max_heads * head_dim, max_in))
        nn.init.trunc_normal_(self.weight, std=_INIT_STD)
        # 1-D like every bias (training exempts 1-D parameters from weight decay); CCT has none
        self.bias = nn.Parameter(torch.zeros(3 * max_heads * head_dim)) if bias else None

    def active(self, in_features: int, heads: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        width = heads * self.head_dim
        bias = (self.bias.view(3, -1)[:, :width].reshape(3 * width)
                if self.bias is not None else None)
        return self.weight[:, :width, :in_features].reshape(3 * width, in_features), bias

    def forward(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return F.linear(x, *self.active(x.size(-1), heads))

    def static(self, in_features: int, heads: int) -> nn.Linear:
        w, b = self.active(in_features, heads)
        lin = nn.Linear(in_features, w.size(0), bias=b is not None)
        lin.weight.data.copy_(w)
        if b is not None:
            lin.bias.data.copy_(b)
        return lin


class DynamicLayerNorm(nn.LayerNorm):
    """LayerNorm over the active (leading) channels, with the leading slices of its affine
    terms; the statistics are those of the active channels only, as in AutoFormer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        c = x.size(-1)
        return F.layer_norm(x, (c,), self.weight[:c], self.bias[:c], self.eps)

    def static(self, channels: int) -> nn.LayerNorm:
        ln = nn.LayerNorm(channels, eps=self.eps)
        ln.weight.data.copy_(self.weight[:channels])
        ln.bias.data.copy_(self.bias[:channels])
        return ln


def activation(name: str | None) -> nn.Module:
    """The activation module for a name used in layer lists."""
    if name is None:
        return nn.Identity()
    table = {"relu": nn.ReLU, "hswish": nn.Hardswish, "hsigmoid": nn.Hardsigmoid}
    if name not in table:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(table)}")
    return table[name]()
