"""Tests for the export's cheaper PTQ and int8/float choice: the float pass calibration and
bias correction share, PTQ's calibration device, and the in-context profile skipped when its
answer is already decided (the tiny net and its images: tests/conftest.py)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hwnas.export.qdq import build_qdq
from hwnas.quant.fake_quant import quant_layers
from hwnas.quant.policy import uniform
from hwnas.quant.ptq import PTQConfig, bias_correct, calibrate, quantize_model


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("observer", ["minmax", "mse"])
def test_one_batch_calibration_shares_the_float_pass_bit_for_bit(qdq_net, qdq_images,
                                                                 observer, monkeypatch) -> None:
    """One calibration batch: the bias-corrected model equals, bit for bit, calibration
    without correction followed by the two-pass bias correction, and one float pass is saved."""
    calib = qdq_images[0]
    policy = uniform(qdq_net, 8, 8)
    config = PTQConfig(act_observer=observer, max_images=128, batch_size=128)
    shared = calibrate(quantize_model(qdq_net, policy), [calib], config)

    two_pass = quantize_model(qdq_net, policy)
    calibrate(two_pass, [calib], PTQConfig(**{**config.__dict__, "bias_correction": False}))
    bias_correct(two_pass, [calib])

    a, b = _state(shared), _state(two_pass)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[f"{n}.bias"], _state(quantize_model(qdq_net, policy))[f"{n}.bias"])
               for n, _ in quant_layers(shared))  # the correction did change biases

    forwards: list[int] = []
    real = torch.nn.Module.__call__
    net = quantize_model(qdq_net, policy)

    def counting(self, *args, **kwargs):  # noqa: ANN001, ANN202 - counts top-level passes
        if self is net:
            forwards.append(1)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(torch.nn.Module, "__call__", counting)
    calibrate(net, [calib], config)
    assert len(forwards) == 3  # input check, float pass (ranges + means), quantized pass


def test_several_batches_keep_the_separate_float_pass(qdq_net, qdq_images) -> None:
    """With several batches the float means come from one pass over their concatenation, as
    before (the calibration pass sees them batch by batch)."""
    calib = qdq_images[0]
    policy = uniform(qdq_net, 8, 8)
    config = PTQConfig(max_images=128, batch_size=32)
    many = calibrate(quantize_model(qdq_net, policy), [calib], config)
    ref = quantize_model(qdq_net, policy)
    calibrate(ref, [calib], PTQConfig(**{**config.__dict__, "bias_correction": False}))
    bias_correct(ref, list(calib.split(32)))
    a, b = _state(many), _state(ref)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_build_qdq_on_an_explicit_device_matches_and_returns_a_cpu_model(qdq_net,
                                                                         qdq_images) -> None:
    calib = qdq_images[0]
    policy = uniform(qdq_net, 8, 8)
    default = build_qdq(qdq_net, policy, [calib])
    explicit = build_qdq(copy.deepcopy(qdq_net), policy, [calib], device="cpu")
    assert all(p.device.type == "cpu" for p in explicit.qmodel.parameters())
    assert default.proto().SerializeToString() == explicit.proto().SerializeToString()
    assert {n: lq.requant for n, lq in default.layers.items()} == \
        {n: lq.requant for n, lq in explicit.layers.items()}


@pytest.mark.parametrize("int8_ms, profiles", [(0.5, 2), (2.0, 2), ({"a": 0.5, "b": 2.0}, 3)])
def test_choice_profiles_in_context_only_when_undecided(monkeypatch, int8_ms, profiles) -> None:
    """No layer losing in int8 (the all-int8 graph is the one just profiled) or all losing
    (all float is FP32): two profiles; a mixed verdict: the third, in-context profile."""
    import hwnas.export.device_policy as dp

    seen: list[bytes] = []

    def fake_per_layer(index, model, **kw):  # noqa: ANN001, ANN202
        seen.append(model)
        if model == b"fp32":
            return {"a": 1.0, "b": 1.0}
        return dict(int8_ms) if isinstance(int8_ms, dict) else {"a": int8_ms, "b": int8_ms}

    def fake_time(models, **kw):  # noqa: ANN001, ANN202 - FP32 10 ms, every variant 8 ms
        return {label: np.full((2, 3), 10.0 if label == "fp32" else 8.0) for label in models}

    monkeypatch.setattr(dp, "_per_layer", fake_per_layer)
    monkeypatch.setattr(dp, "time_rounds", fake_time)
    choice = dp.choose_float_layers(lambda fl: ("q:" + ",".join(fl)).encode(), b"fp32",
                                    ["a", "b"], {}, fp32_index=None, qdq_index=None)
    assert len(seen) == profiles
    labels = {c.label: c.float_layers for c in choice.candidates}
    assert labels["all-int8"] == []
    if profiles == 3:
        assert labels["profile"] == ["b"]
    assert choice.chosen_ms == 8.0


def test_an_observer_without_sample_gives_the_same_minmax_range() -> None:
    from hwnas.quant.observers import ActivationObserver

    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(4, 8, 5, 5, generator=g) * (i + 1) for i in range(3)]
    full, lean = ActivationObserver(100, seed=1), ActivationObserver(100, seed=1, keep_sample=False)
    for x in xs:
        full.update(x)
        lean.update(x)
    assert lean.range("minmax") == full.range("minmax")
    assert float(lean.min) == float(torch.cat([x.flatten() for x in xs]).min())
    assert all(torch.equal(a, b) for a, b in zip(lean.qparams(8), full.qparams(8)))
    with pytest.raises(RuntimeError, match="keeps no sample"):
        lean.range("mse")


def test_minmax_calibration_is_unchanged_without_samples(qdq_net, qdq_images, monkeypatch) -> None:
    """PTQ with the minmax observer keeps no value sample; its model is bit-identical."""
    import hwnas.quant.ptq as ptq_mod
    from hwnas.quant.observers import ActivationObserver

    policy = uniform(qdq_net, 8, 8)
    config = PTQConfig(max_images=128, batch_size=32)
    lean = _state(calibrate(quantize_model(qdq_net, policy), [qdq_images[0]], config))

    class Sampling(ActivationObserver):
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            kwargs["keep_sample"] = True
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(ptq_mod, "ActivationObserver", Sampling)
    full = _state(calibrate(quantize_model(qdq_net, policy), [qdq_images[0]], config))
    assert all(torch.equal(lean[k], full[k]) for k in lean)


def test_cpu_reference_passes_run_in_small_chunks(qdq_net, qdq_images) -> None:
    """PyTorch passes on the CPU go in chunks of ``cpu_batch_size`` (onnxruntime's keep
    ``batch_size``); the logits match one pass over all images."""
    from hwnas.export.passes import ImagePasses

    x = qdq_images[1]  # 64 images
    sizes: list[int] = []
    handle = qdq_net.register_forward_pre_hook(lambda _m, inp: sizes.append(len(inp[0])))
    try:
        got = ImagePasses(x, cpu_batch_size=24).torch("float", qdq_net)
    finally:
        handle.remove()
    assert sizes == [24, 24, 16]
    with torch.no_grad():
        want = qdq_net(x).numpy()
    assert got.shape == want.shape
    assert abs(got - want).max() <= 1e-5
    assert ImagePasses(x).cpu_batch_size == 64 and ImagePasses(x).batch_size == 256
