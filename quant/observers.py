"""Range observers: from calibration data to quantization parameters (scale, zero point).

Activations (affine, per tensor): :class:`ActivationObserver` keeps the exact min and max of
everything it saw plus a uniform random sample of the values (a fixed number per batch, so every
batch weighs the same), from which :meth:`ActivationObserver.range` picks ``minmax`` (the full
range), ``percentile`` (ignores rare outliers) or ``mse`` (the range minimising the squared
quantization error on the sample: clipping error vs rounding error).

Weights (symmetric, per output channel): :func:`weight_qparams` with ``minmax`` (the channel's
``max |w|``) or ``mse`` (per channel, the clipping ratio minimising that channel's squared error).

Every range is widened to include 0 so that zero (padding, ReLU) is exactly representable.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "ACT_OBSERVERS",
    "WEIGHT_OBSERVERS",
    "ActivationObserver",
    "affine_qparams",
    "fake_quant_affine",
    "weight_qparams",
]

ACT_OBSERVERS = ("minmax", "percentile", "mse")
WEIGHT_OBSERVERS = ("minmax", "mse")


def affine_qparams(lo: torch.Tensor | float, hi: torch.Tensor | float, bits: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and integer zero point mapping ``[lo, hi]`` (widened to include 0) onto
    ``[0, 2^bits - 1]``. On the device of ``lo`` when it is a tensor, else on the CPU (two host
    scalars: never on whatever the default device is)."""
    device = lo.device if isinstance(lo, torch.Tensor) else "cpu"
    lo_t = torch.as_tensor(lo, dtype=torch.float32, device=device).clamp(max=0.0)
    hi_t = torch.as_tensor(hi, dtype=torch.float32, device=device).clamp(min=0.0)
    qmax = 2 ** bits - 1
    scale = ((hi_t - lo_t) / qmax).clamp_min(1e-8)
    zero_point = torch.round(-lo_t / scale).clamp(0, qmax)
    return scale, zero_point


def fake_quant_affine(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, bits: int
                      ) -> torch.Tensor:
    qmax = 2 ** bits - 1
    return (torch.clamp(torch.round(x / scale) + zero_point, 0, qmax) - zero_point) * scale


class ActivationObserver:
    """Collects the range and a value sample of one activation tensor over calibration batches.

    ``samples_per_update`` values are drawn (with replacement, from a seeded generator) from
    each observed tensor; the caller sets it to ``max_samples // number_of_batches``.
    ``keep_sample=False``: the exact range only (all ``minmax`` needs; sampling a large
    activation costs more than its min and max).
    """

    def __init__(self, samples_per_update: int = 1 << 16, seed: int = 0, *,
                 keep_sample: bool = True) -> None:
        self.samples_per_update = max(1, int(samples_per_update))
        self.seed = seed
        self.keep_sample = keep_sample
        self.min: torch.Tensor | None = None
        self.max: torch.Tensor | None = None
        self.numel_per_sample: int | None = None
        self._samples: list[torch.Tensor] = []
        self._generator: torch.Generator | None = None

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.detach().float()
        if self.numel_per_sample is None and x.dim() > 0:
            self.numel_per_sample = int(x[0].numel()) if x.dim() > 1 else int(x.numel())
        flat = x.reshape(-1)
        lo, hi = torch.aminmax(flat)
        self.min = lo if self.min is None else torch.minimum(self.min, lo)
        self.max = hi if self.max is None else torch.maximum(self.max, hi)
        if not self.keep_sample:
            return
        if self._generator is None or self._generator.device != flat.device:
            self._generator = torch.Generator(device=flat.device).manual_seed(self.seed)
        if flat.numel() <= self.samples_per_update:
            self._samples.append(flat.clone())
        else:
            idx = torch.randint(flat.numel(), (self.samples_per_update,), device=flat.device,
                                generator=self._generator)
            self._samples.append(flat[idx])

    @property
    def empty(self) -> bool:
        return self.min is None

    def sample(self) -> torch.Tensor:
        if not self.keep_sample:
            raise RuntimeError("this observer keeps no sample (keep_sample=False): only the "
                               "minmax range is available")
        return torch.cat(self._samples)

    @torch.no_grad()
    def range(self, method: str = "minmax", bits: int = 8, *, percentile: float = 99.99,
              grid: int = 40, max_mse_samples: int = 1 << 15) -> tuple[float, float]:
        """The clipping range ``(lo, hi)`` chosen by ``method`` for ``bits``-bit quantization.

        ``minmax``: the full observed range; ``percentile``: the ``p`` and ``100 - p``
        percentiles (default 99.99), which ignores rare outliers; ``mse``: the range inside
        ``[min, max]`` that minimises the mean squared quantization error on the sample (clipping
        error vs rounding error): one common shrink ratio on a grid in (0, 1], then each end
        refined separately.
        """
        if self.empty:
            raise RuntimeError("observer saw no data")
        lo, hi = float(self.min), float(self.max)
        if method == "minmax":
            return lo, hi
        values = self.sample()
        if method == "percentile":
            if not 50.0 < percentile <= 100.0:
                raise ValueError(f"percentile must be in (50, 100], got {percentile}")
            n = values.numel()
            tail = int(round(n * (1.0 - percentile / 100.0)))  # values beyond the percentile
            plo = float(values.kthvalue(min(n, tail + 1)).values)
            phi = float(values.kthvalue(max(1, n - tail)).values)
            return max(lo, plo), min(hi, phi)
        if method == "mse":
            if values.numel() > max_mse_samples:
                g = torch.Generator(device=values.device).manual_seed(self.seed + 1)
                values = values[torch.randint(values.numel(), (max_mse_samples,),
                                              device=values.device, generator=g)]
            return _mse_range(values, min(lo, 0.0), max(hi, 0.0), bits, grid)
        raise ValueError(f"unknown activation observer {method!r}; expected one of {ACT_OBSERVERS}")

    def qparams(self, bits: int, method: str = "minmax", **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = self.range(method, bits, **kwargs)
        return affine_qparams(lo, hi, bits)


def _range_errors(values: torch.Tensor, los: torch.Tensor, his: torch.Tensor, bits: int
                  ) -> torch.Tensor:
    """Mean squared quantization error of ``values`` for each candidate range ``[lo_i, hi_i]``.
    One (candidates, values) buffer updated in place: the same element-wise operations as
    ``((fake_quant(values) - values) ** 2).mean(1)``, bit for bit, without a temporary per
    step (this is the export's most frequent kernel)."""
    qmax = 2 ** bits - 1
    scale = ((his - los) / qmax).clamp_min(1e-8)[:, None]
    zp = torch.round(-los[:, None] / scale).clamp(0, qmax)
    q = torch.div(values[None, :], scale)
    q.round_().add_(zp).clamp_(0, qmax).sub_(zp).mul_(scale).sub_(values[None, :])
    return q.square_().mean(dim=1)


def _best_ratio(values: torch.Tensor, bits: int, grid: int, make) -> float:
    """The ratio in (0, 1] whose range ``make(ratios)`` has the lowest error: a coarse grid of
    ``grid`` ratios, then a fine grid around the best."""
    coarse = torch.linspace(1.0 / grid, 1.0, grid, device=values.device)
    best = float(coarse[int(torch.argmin(_range_errors(values, *make(coarse), bits)))])
    step = 1.0 / grid
    fine = torch.linspace(max(best - step, step / 10), min(best + step, 1.0), 21, device=values.device)
    return float(fine[int(torch.argmin(_range_errors(values, *make(fine), bits)))])


def _mse_range(values: torch.Tensor, lo: float, hi: float, bits: int, grid: int
               ) -> tuple[float, float]:
    """Shrink ``[lo, hi]`` by one common ratio, then refine the two ends separately (two rounds
    of coordinate descent), each time minimising the quantization MSE on ``values``."""
    if hi - lo <= 0:
        return lo, hi
    ones = lambda r: torch.ones_like(r)  # noqa: E731
    r = _best_ratio(values, bits, grid, lambda rs: (lo * rs, hi * rs))
    cur_lo, cur_hi = lo * r, hi * r
    for _ in range(2):
        if hi > 0:
            r = _best_ratio(values, bits, grid, lambda rs: (cur_lo * ones(rs), hi * rs))
            cur_hi = hi * r
        if lo < 0:
            r = _best_ratio(values, bits, grid, lambda rs: (lo * rs, cur_hi * ones(rs)))
            cur_lo = lo * r
    return cur_lo, cur_hi


@torch.no_grad()
def weight_qparams(weight: torch.Tensor, bits: int, method: str = "minmax", *, grid: int = 100,
                   ch_axis: int = 0) -> torch.Tensor:
    """Per-channel symmetric scales (``max|w| * ratio / (2^(bits-1) - 1)``) for ``weight``."""
    if method not in WEIGHT_OBSERVERS:
        raise ValueError(f"unknown weight observer {method!r}; expected one of {WEIGHT_OBSERVERS}")
    w = weight.detach().float().transpose(0, ch_axis).reshape(weight.shape[ch_axis], -1)
    qmax = 2 ** (bits - 1) - 1
    absmax = w.abs().amax(dim=1).clamp_min(1e-8)
    if method == "minmax":
        return absmax / qmax
    best_err = torch.full_like(absmax, math.inf)
    best_scale = absmax / qmax
    for r in torch.linspace(1.0 / grid, 1.0, grid, device="cpu").tolist():
        scale = (absmax * r / qmax)[:, None]
        err = ((torch.clamp(torch.round(w / scale), -qmax, qmax) * scale - w) ** 2).sum(dim=1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, scale[:, 0], best_scale)
    return best_scale
