"""AdaRound (hwnas.quant.adaround): learned rounding lowers each layer's output error against
nearest rounding, stays on the quantizer's grid (the portable 7-bit one included), is
deterministic for a seed, leaves int8 models to nearest rounding unless told "adaround-all"
(the export's manifest names the layers that got it), is the export's default for files below
8 bits, and refuses bad settings in one line."""

from __future__ import annotations

import base64
import zlib

import numpy as np
import onnx
import pytest
import torch
from hwnas.export.qdq import build_qdq
from hwnas.export.qdq.int16 import int16_report
from hwnas.quant.adaround import (
    AdaRoundConfig,
    _RoundingLoss,
    _input_rows,
    _output_rows,
    _rows_forward,
    adaround,
    learned_layers,
    rectified_sigmoid,
)
from hwnas.quant.fake_quant import quant_layers
from hwnas.quant.policy import QuantPolicy, first_last_8bit, uniform
from hwnas.quant.ptq import ROUNDINGS, PTQConfig, ptq
from torch import nn

from hwnas.core.errors import UserError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, stride=2), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, groups=16), nn.ReLU(),
                         nn.Conv2d(16, 8, 1, groups=2), nn.Flatten(),
                         nn.Linear(8 * 2 * 2, 10)).eval()


def _calibrated(bits: int = 4) -> tuple[nn.Module, torch.Tensor]:
    model = _model()
    x = torch.randn(96, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    return ptq(model, uniform(model, bits, 8), [x], PTQConfig(bias_correction=False)), x


def test_rows_compute_the_layer_output():
    """The unfolded rows (plain, depthwise, grouped convolution; linear) give the layer's own
    output at the drawn positions."""
    qmodel, x = _calibrated()
    h = x
    for _, m in qmodel.named_children():
        if hasattr(m, "weight_quant"):
            y = m(h)
            channels = y.shape[1] if y.dim() == 4 else y.shape[-1]
            pos = torch.randperm(y.numel() // channels,
                                 generator=torch.Generator().manual_seed(0))[:50]
            rows = _input_rows(m, m.input_quant(h), pos)
            got = _rows_forward(m, rows, m.weight_quant(m.weight))
            assert torch.allclose(got, _output_rows(m, y, pos), atol=1e-5)
        h = m(h)


def test_rows_are_unfold_patches_with_dilation_stride_and_padding():
    """The gathered patches are exactly ``F.unfold``'s columns at the drawn positions, also for
    a non-square, dilated, strided, unevenly padded grouped convolution."""
    model = nn.Sequential(nn.Conv2d(6, 6, (3, 5), stride=2, padding=(2, 1), dilation=(2, 1),
                                    groups=3)).eval()
    x = torch.randn(5, 6, 11, 9, generator=torch.Generator().manual_seed(2))
    layer = dict(quant_layers(ptq(model, uniform(model, 4, 8), [x],
                                  PTQConfig(bias_correction=False))))["0"]
    cols = torch.nn.functional.unfold(x, (3, 5), (2, 1), (2, 1), 2)  # (images, C*k, positions)
    cols = cols.transpose(1, 2).reshape(-1, cols.shape[1])
    pos = torch.randperm(len(cols), generator=torch.Generator().manual_seed(0))[:40]
    assert torch.equal(_input_rows(layer, x, pos).reshape(len(pos), -1), cols[pos])


def test_hand_gradient_is_autograds():
    """The Adam steps' gradient, by hand (:class:`_RoundingLoss`), is autograd's of the loss on
    a batch of rows (output error plus the rounding regulariser, or without it in the warm-up),
    for plain, depthwise and grouped convolutions and a linear layer, with ``V`` inside and
    outside the rectifier's clamp and weights clipped by the grid."""
    qmodel, x = _calibrated()
    h = x
    for _, m in qmodel.named_children():
        if hasattr(m, "weight_quant"):
            with torch.no_grad():
                m.weight[0] *= 3  # some weights beyond the grid (clamped to qmin/qmax)
                y = m(h)
                channels = y.shape[1] if y.dim() == 4 else y.shape[-1]
                pos = torch.randperm(y.numel() // channels,
                                     generator=torch.Generator().manual_seed(0))[:200]
                rows = _input_rows(m, m.input_quant(h), pos)
                target = _output_rows(m, y, pos) + 0.1
                loss = _RoundingLoss(m, reg=0.05, batch=len(rows))
            v = torch.randn(m.weight.shape, generator=torch.Generator().manual_seed(4)) * 3
            for beta in (None, 11.0, 2.0):
                vg = v.clone().requires_grad_(True)
                hv = rectified_sigmoid(vg)
                ref = (_rows_forward(m, rows, loss.weight(hv)) - target).pow(2).sum(1).mean()
                if beta is not None:
                    ref = ref + 0.05 * (1 - (2 * hv - 1).abs().pow(beta)).sum()
                ref.backward()
                got = loss.grad(v, rows, target, beta)
                atol = 1e-5 * float(vg.grad.abs().max())
                assert torch.allclose(got, vg.grad, rtol=1e-4, atol=atol), beta
        with torch.no_grad():
            h = m(h)


def test_adaround_lowers_layer_output_error_and_stays_on_grid():
    qmodel, x = _calibrated()
    report = adaround(qmodel, [x], AdaRoundConfig(iterations=100))
    assert sorted(report) == ["0", "2", "4", "6"]
    for name, r in report.items():
        assert r["mse_adaround"] < r["mse_nearest"], name
    # by a margin: a tenth less error per layer on average (the first layer's input rounding
    # error, which no weight rounding removes, dominates its output error)
    assert np.mean([r["mse_adaround"] / r["mse_nearest"] for r in report.values()]) < 0.9
    for _, layer in quant_layers(qmodel):
        wq = layer.weight_quant
        scale = wq.qparams()[0].view(-1, *[1] * (layer.weight.dim() - 1))
        ints = layer.weight.detach() / scale
        assert torch.allclose(ints, ints.round(), atol=1e-4)
        assert ints.round().abs().max() <= wq.qmax
        # the ordinary fake quantizer gives back exactly the learned weights
        assert torch.equal(wq(layer.weight.detach()), layer.weight.detach())


def test_adaround_is_deterministic_for_a_seed():
    weights = []
    for _ in range(2):
        qmodel, x = _calibrated()
        adaround(qmodel, [x], AdaRoundConfig(iterations=40, seed=3))
        weights.append(torch.cat([m.weight.detach().flatten() for _, m in quant_layers(qmodel)]))
    assert torch.equal(weights[0], weights[1])
    nearest, _ = _calibrated()
    assert not torch.equal(weights[0], torch.cat([m.weight_quant(m.weight).detach().flatten()
                                                  for _, m in quant_layers(nearest)]))


#: the 960 integers autograd's steps learned before session 38 (seed 3, 60 steps; x86-64, torch
#: 2.13), zlib + base64
_AUTOGRAD_INTEGERS = (
    "eNoVk9sCwDAEQ93K/39uUZa9rZsiORlZ1hPyldlbj9Tqqc9ZjtvzvF7ddlVqvtVmj04on+asVm2xJTmRuOPOyXX9XN59"
    "2mpHbylXx3lzqYr4GQ45xIKGigH9cqToLC2fOLH3Heq8uWYXlW/33v1rN17oPfs8eVxMZ/KEJ2WVFtHJLEcJ0zAGZONT"
    "KKXWzJKzWyuUyhn6O9M2O8Zffb+sg3bigrP0jVqhStwZGSoVmjqpr6VFkk33rkJxkzHz5ePG+jLDSrHSmcEwV2sZX2Ud"
    "Lambbli3tk49WOrn+KhLmI3ydNc528f4uWY4nFqnf3cOKoIbCzAFQWhj5aQ590mJcdVo2OpN/SWmLXagN4yyzY64x06A"
    "1ujEA5fkH7eCYAy9iMqCwgd10xyJVxce8M4cuv2sYtbNbWp9rsbklW0B8r29m+gdxs4v5E6B4R4RyH7/Rgwro/0O0OdF"
    "/4bVYBjo5Xe9lvRsmmidYJARfnqllr1BG64OEuao65bI35ZlCIOlST4Wp3fw5CzPX/G5AeSBWF1gxei4aUz9R5BJQt6r"
    "WvDzIo9mfnAR+OBojM0u4Xew5ZfKb2SNfuMO7h54B3NOWgjF27fCe4kQ3KaH9JnBWmiV81Ao4uBwgG1bhZGuxN9g2AZZ"
    "qiMwGcE5CcX1+CHnSBj0mnLDM/GLZLUc4bBm9WuDcHKD1W822CDn+wGzzb8d")


def test_learned_integers_are_those_of_the_autograd_steps():
    """Session 38's hand gradient, fused Adam and ``index_select`` gathers learn the integers
    that autograd's steps learned before (recorded from the code before; on the machine that
    recorded them all 960 agree, and the smallest CIFAR-10 W4A8 subnet's 2.1 M integers too:
    benchmarks/adaround_steps.md, Session 38). Another CPU's float kernels may flip an integer
    sitting at a rounding tie, so up to 1 % may differ; a wrong step changes far more."""
    qmodel, x = _calibrated()
    adaround(qmodel, [x], AdaRoundConfig(iterations=60, seed=3))
    ints = torch.cat([torch.round(m.weight.detach() / m.weight_quant.qparams()[0].view(
        -1, *[1] * (m.weight.dim() - 1))).to(torch.int8).flatten()
        for _, m in quant_layers(qmodel)])
    before = torch.frombuffer(bytearray(zlib.decompress(base64.b64decode(_AUTOGRAD_INTEGERS))),
                              dtype=torch.int8)
    assert len(ints) == len(before) == 960
    assert (ints != before).sum().item() <= 9


def test_adaround_in_a_portable_qdq_export():
    """``PTQConfig(rounding="adaround-all")`` through the QDQ export: W8A8 layers learned keep
    the 7-bit grid (no 16-bit pair sum can saturate) and the file holds the learned integers."""
    model = _model()
    x = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    config = PTQConfig(rounding="adaround-all", adaround_iterations=30)
    built = build_qdq(model, uniform(model, 8, 8), [x], config=config)
    assert learned_layers(built.qmodel) == ["0", "2", "4", "6"]
    proto = built.proto()
    assert int16_report(proto)["int16_safe"]
    ints = [np.abs(onnx.numpy_helper.to_array(i)).max() for i in proto.graph.initializer
            if i.data_type == onnx.TensorProto.INT8]
    assert ints and max(ints) <= 63


def _weights(qmodel: nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.weight.detach().clone() for n, m in quant_layers(qmodel)}


def test_adaround_leaves_int8_and_w6_models_to_nearest_rounding_unless_forced():
    """A mixed policy (W4A8, first and last layer W8A8) under ``"adaround"``: every layer
    learned, the W8 ones too, as under ``"adaround-all"``. An int8 policy, or a W6A8 one (no
    weights below 6 bits), under ``"adaround"`` is the nearest-rounding PTQ, bit for bit;
    ``"adaround-all"`` learns it."""
    model = _model()
    x = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    mixed = first_last_8bit(uniform(model, 4, 8))
    assert [mixed.bits[n][0] for n in ("0", "2", "4", "6")] == [8, 4, 4, 8]
    nearest = ptq(model, mixed, [x], PTQConfig())
    some = ptq(model, mixed, [x], PTQConfig(rounding="adaround", adaround_iterations=20))
    every = ptq(model, mixed, [x], PTQConfig(rounding="adaround-all", adaround_iterations=20))
    assert learned_layers(nearest) == []
    assert learned_layers(some) == learned_layers(every) == ["0", "2", "4", "6"]
    w_near, w_some, w_every = _weights(nearest), _weights(some), _weights(every)
    for name in ("0", "2", "4", "6"):
        assert torch.equal(w_some[name], w_every[name]), name
        assert not torch.equal(w_some[name], w_near[name]), name
    for policy in (uniform(model, 8, 8), first_last_8bit(uniform(model, 6, 8))):
        plain = ptq(model, policy, [x], PTQConfig()).state_dict()
        asked = ptq(model, policy, [x], PTQConfig(rounding="adaround", adaround_iterations=20))
        assert learned_layers(asked) == []
        for key, value in asked.state_dict().items():
            assert torch.equal(value, plain[key]), key
    int8 = uniform(model, 8, 8)
    forced = ptq(model, int8, [x], PTQConfig(rounding="adaround-all", adaround_iterations=20))
    assert learned_layers(forced) == ["0", "2", "4", "6"]


def test_the_manifest_names_the_layers_that_got_adaround(qdq_net, qdq_images, tmp_path):
    """An export with ``rounding="adaround"``: the W4A8 policy's QDQ file's
    ``adaround_layers`` (manifest JSON and CSV) lists every layer, its W8 ones too; an int8
    policy's file lists none."""
    from hwnas.export.model_export import ExportSettings, export_model
    from hwnas.export.records import manifest_rows

    calib, test = qdq_images
    config = PTQConfig(rounding="adaround", adaround_iterations=5)
    settings = ExportSettings(warmup=1, rounds=1, rounding="adaround", verify_images=0)
    mixed = first_last_8bit(uniform(qdq_net, 4, 8))
    layers = list(mixed.layer_names)
    assert 0 < sum(mixed.bits[n][0] < 8 for n in layers) < len(layers)
    got = {}
    for kind, policy in (("mixed", mixed), ("int8", uniform(qdq_net, 8, 8))):
        result = export_model(qdq_net, name=kind, out_dir=tmp_path / kind, example=test[:1],
                              test_images=test, policy=policy, calibration=[calib],
                              ptq_config=config, settings=settings)
        assert result.status == "ok", result.errors
        got[kind] = {r["path"]: r["adaround_layers"] for r in manifest_rows([result])}
        report = next(f for f in result.files if f.path == f"qdq/{kind}.onnx")
        assert report.adaround_layers == (layers if kind == "mixed" else [])
    assert got["mixed"] == {"mixed.onnx": "", "qdq/mixed.onnx": " ".join(layers)}
    assert got["int8"] == {"int8.onnx": "", "qdq/int8.onnx": ""}


@pytest.mark.parametrize("rounding", [None, "nearest"])
def test_the_export_default_learns_sub_6_bit_files_only(qdq_net, qdq_images, tmp_path,
                                                         rounding):
    """The export's default rounding (no ``ptq_config``: ``ExportSettings.rounding``, 200 steps
    per layer) learns every layer of a file with a layer below 6 bits (one W4 layer among W6
    and W8 ones) and leaves a W6/W8 file and an int8 file to nearest rounding; each QDQ file's
    ``rounding`` says which it got. ``"nearest"`` stays an explicit choice (``"adaround-all"``:
    the test above)."""
    from hwnas.export.model_export import ExportSettings, export_model

    calib, test = qdq_images
    kw = {} if rounding is None else {"rounding": rounding}
    settings = ExportSettings(warmup=1, rounds=1, verify_images=0, **kw)
    assert settings.rounding == (rounding or "adaround")
    w6 = first_last_8bit(uniform(qdq_net, 6, 8))
    layers = list(w6.layer_names)
    mixed = QuantPolicy({**w6.bits, layers[1]: (4, 8)})
    assert sorted(b for b, _ in mixed.bits.values())[:2] == [4, 6]
    learned = {"mixed": {None: layers, "nearest": []}, "w6": {None: [], "nearest": []},
               "int8": {None: [], "nearest": []}}
    for kind, policy in (("mixed", mixed), ("w6", w6), ("int8", uniform(qdq_net, 8, 8))):
        result = export_model(qdq_net, name=kind, out_dir=tmp_path / kind, example=test[:1],
                              test_images=test, policy=policy, calibration=[calib],
                              settings=settings)
        assert result.status == "ok", result.errors
        files = {f.path: f for f in result.files}
        qdq = files[f"qdq/{kind}.onnx"]
        assert qdq.adaround_layers == learned[kind][rounding]
        assert qdq.rounding == ("adaround" if learned[kind][rounding] else "nearest")
        assert files[f"{kind}.onnx"].rounding == ""  # FP32


def test_rounding_flags_of_export_and_run() -> None:
    """``--rounding`` of ``hwnas export`` and ``hwnas run``: default the export settings'
    ("adaround"), every rounding a choice."""
    from hwnas.cli import _subparsers, build_parser
    from hwnas.export.model_export import ExportSettings

    parser = build_parser()
    assert ExportSettings().rounding == "adaround"
    assert parser.parse_args(["export", "RUN"]).rounding == "adaround"
    assert parser.parse_args(["run"]).rounding == "adaround"
    for command in ("export", "run"):
        flag = next(a for a in _subparsers(parser)[command]._actions if a.dest == "rounding")
        assert tuple(flag.choices) == ROUNDINGS
    assert parser.parse_args(["run", "--rounding", "nearest"]).rounding == "nearest"
    assert parser.parse_args(["export", "RUN", "--rounding", "adaround-all"]).rounding \
        == "adaround-all"


def test_every_rounding_is_a_cli_choice() -> None:
    from hwnas.cli import _subparsers, build_parser

    export = _subparsers(build_parser())["export"]
    flag = next(a for a in export._actions if a.dest == "rounding")
    assert tuple(flag.choices) == ROUNDINGS


@pytest.mark.parametrize("kwargs", [{"rounding": "stochastic"}, {"adaround_iterations": 0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(UserError):
        PTQConfig(**kwargs).validate()
    with pytest.raises(UserError):
        AdaRoundConfig(iterations=0).validate()


def test_export_setting_rounding_is_checked() -> None:
    from hwnas.export.model_export import ExportSettings

    ExportSettings(rounding="adaround").validate()
    ExportSettings(rounding="adaround-all").validate()
    with pytest.raises(UserError, match="rounding 'learned'"):
        ExportSettings(rounding="learned").validate()
