"""The CPU inference path of the per-tensor fake quantizer gives PyTorch's kernel's values
bit for bit (the export's parity passes run it on every activation)."""

from __future__ import annotations

import pytest
import torch
from hwnas.quant.fake_quant import FakeQuantize, fake_quant_per_tensor


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("signed", [False, True])
def test_fake_quant_per_tensor_matches_the_kernel_bit_for_bit(bits: int, signed: bool) -> None:
    g = torch.Generator().manual_seed(bits + 10 * signed)
    qmin, qmax = ((-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1))
    for trial in range(30):
        scale = torch.rand(1, generator=g) * 0.1 + 1e-6
        zp = torch.randint(qmin, qmax + 1, (1,), generator=g).float()
        x = torch.randn(6, 5, 7, 4, generator=g) * float(scale) * (1 << bits)
        flat = x.view(-1)
        # exact half-way points (round half to even), the range's ends and beyond, specials
        flat[:40] = (torch.randint(qmin - 3, qmax + 3, (40,), generator=g).float() + 0.5) * scale
        flat[40:44] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
        if trial % 3 == 1:
            x = x.transpose(1, 3)  # not contiguous
        elif trial % 3 == 2:
            x = x.contiguous(memory_format=torch.channels_last)
        want = torch.fake_quantize_per_tensor_affine(x, scale, zp.to(torch.int32), qmin, qmax)
        got = fake_quant_per_tensor(x, scale, zp, qmin, qmax)
        assert torch.equal(got, want), (trial, (got - want).abs().max())
        assert not torch.isnan(got).any()


def test_fake_quantize_uses_it_for_inference_only() -> None:
    torch.manual_seed(0)
    q = FakeQuantize(8, "act")
    q.set_qparams(torch.tensor([0.0371]), torch.tensor([117.0]))
    x = torch.randn(4, 3, 9, 9) * 4
    want = torch.fake_quantize_per_tensor_affine(x, q.scale.detach().clamp_min(1e-8),
                                                 q.zero_point.to(torch.int32), 0, 255)
    with torch.no_grad():
        assert torch.equal(q(x), want)
    before = x.clone()
    assert torch.equal(q(x), want) and torch.equal(x, before)  # the input is not changed
    xg = x.clone().requires_grad_(True)  # training: PyTorch's kernel and its STE gradient
    out = q(xg)
    out.sum().backward()
    assert torch.equal(out.detach(), want)
    inside = ((x / 0.0371).round() + 117).clamp(0, 255) == ((x / 0.0371).round() + 117)
    assert torch.equal(xg.grad, inside.float())


def test_requantization_points_take_a_python_scale_as_the_kernel_does() -> None:
    """The deployed reference's requantization (``_fq8``: a float scale, an int zero point)
    gives the kernel's values for scales that float32 does not hold exactly."""
    import random

    from hwnas.export.qdq.requant import _fq8

    rng, g = random.Random(1), torch.Generator().manual_seed(1)
    for trial in range(60):
        scale = rng.uniform(1e-4, 0.2) if trial % 5 else rng.choice([1e-8, 1 / 3, 0.0370000001])
        zp = rng.randint(0, 255)
        x = torch.randn(2000, generator=g) * scale * 100
        x[:50] = ((torch.randint(-5, 260, (50,), generator=g).double() + 0.5 - zp) * scale).float()
        want = torch.fake_quantize_per_tensor_affine(x, scale, zp, 0, 255)
        with torch.no_grad():
            assert torch.equal(_fq8(x, scale, zp), want), trial
