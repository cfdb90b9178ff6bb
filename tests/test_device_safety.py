"""Device safety of every registered space under every kind of policy, checked on the CPU.

A tensor made without ``device=`` in a forward, calibration, QAT, sensitivity or BatchNorm
recalibration path, or one that ``.to()`` leaves behind, crashes on a GPU ("Expected all tensors
to be on the same device") and nowhere in a CPU-only CI. ``tests/device_support.py`` mirrors
the GPU situation on the CPU: the model and data on the CPU, the *default* device ``meta``
(a tensor made without ``device=`` lands there and is caught when it meets the model's), and
the finished models moved with ``.to("meta")`` and run there. Before the attention products'
quantizers were made on the model's device, vit with bits failed here as it did on an H200.

Spaces run in small configurations (a registered space without one here runs at 16x16
pixels), so each case takes about a second.
"""

from __future__ import annotations

import copy
import functools
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from device_support import (  # noqa: E402
    DeviceMixError,
    foreign_default_device,
    meta_forward,
    stray_tensor_attributes,
)
from hwnas.supernet.spaces import available_spaces, get_space  # noqa: E402

#: small configurations of the shipped spaces (config overrides, image size)
SMALL: dict[str, tuple[dict, int]] = {
    "mbv3-tiny": ({}, 8),
    "mbv3": ({"stage_channels": [16, 24, 32, 40, 48], "depth_choices": [1, 2],
              "head_channels": 64, "feature_mix_channels": 96}, 8),
    "fbnet": ({"stage_channels": [8, 8, 16, 16, 24, 24, 32], "stage_layers": [1] * 7,
               "head_channels": 64}, 8),
    "nb201": ({"init_channels": 8, "cells_per_stage": 1}, 8),
    "vit": ({"tokenizer_channels": [8], "embed_choices": [16, 24], "depth_choices": [1, 2],
             "heads_choices": [1, 2], "mlp_ratio_choices": [1.0, 2.0], "head_dim": 8}, 8),
}
POLICIES = ("int8", "mixed", "int8-shared-adds", "mixed-adaround")


def _small_space(name: str):
    overrides, size = SMALL.get(name, ({}, 16))
    base = get_space(name, image_size=size, num_classes=10)
    return get_space(name, image_size=size, num_classes=10,
                     config={**base.config(), **overrides})


class _Setup:
    """A small space, its supernet (one training step), random data, a BN-recalibrated subnet."""

    def __init__(self, name: str) -> None:
        from hwnas.supernet.data import DatasetSplits, ImageSplit
        from hwnas.supernet.evaluate import calibration_loader, recalibrated_subnet

        torch.manual_seed(0)
        self.space = _small_space(name)
        c, h, w = self.space.input_shape
        gen = torch.Generator().manual_seed(0)

        def split(n):
            return ImageSplit(torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=gen),
                              torch.randint(0, 10, (n,), generator=gen))

        self.data = DatasetSplits("random", split(32), split(16), split(16),
                                  [str(i) for i in range(10)], (0.5,) * c, (0.25,) * c, "shift")
        self.supernet = self.space.build_supernet()
        self.arch = self.space.sample(np.random.default_rng(1))
        self.model = recalibrated_subnet(self.supernet, self.arch, self.data, calib_batches=1,
                                         calib_batch_size=16).eval()
        self.batches = list(calibration_loader(self.data, batch_size=16))
        self.x = self.batches[0][0]


@pytest.fixture(scope="module", params=available_spaces())
def setup(request, one_torch_thread) -> _Setup:
    return _Setup(request.param)


def _policy(setup: _Setup, kind: str):
    from hwnas.quant.policy import SUPPORTED_BITS, QuantPolicy, uniform

    policy = uniform(setup.model, 8, 8)
    if kind.startswith("mixed"):  # every supported width, float included, spread over the layers
        rng = np.random.default_rng(0)
        policy = QuantPolicy({n: (int(rng.choice(SUPPORTED_BITS)), int(rng.choice(SUPPORTED_BITS)))
                              for n in policy.bits})
    return policy


def test_float_paths_keep_to_the_model_device(setup) -> None:
    """Supernet training, BN recalibration, evaluation, fine-tuning from a teacher and the
    Hessian sensitivity, with the default device foreign; then both networks after ``.to()``."""
    from hwnas.quant.qat import QATConfig, distill
    from hwnas.quant import sensitivity
    from hwnas.quant.sensitivity import hessian_sensitivity
    from hwnas.supernet.evaluate import accuracy, eval_loader, recalibrated_subnet
    from hwnas.supernet.train import TrainConfig, TrainStage, train_supernet

    twice_differentiable = sensitivity._twice_differentiable

    s = setup
    net = copy.deepcopy(s.supernet)
    with foreign_default_device():
        config = TrainConfig(stages=[TrainStage("s", 1, num_random=1)], batch_size=16,
                             warmup_epochs=0)
        train_supernet(net, s.space, s.data, config, progress=False, max_steps=1)
        model = recalibrated_subnet(net, s.arch, s.data, calib_batches=1, calib_batch_size=16)
        acc = accuracy(model, eval_loader(s.data, s.data.val, batch_size=16))
        teacher = net.extract(s.space.largest())
        distill(model, teacher, s.batches, QATConfig(epochs=1, max_steps=1), progress=False)
        # two vectors in one batched Hessian-vector product (a GPU's default), with PyTorch's
        # depthwise double backward (the CPU's) and with the first-order one (a GPU's)
        for depthwise in (False, True):
            with mock.patch.object(sensitivity, "_twice_differentiable", functools.partial(
                    twice_differentiable, depthwise=depthwise)):
                hessian_sensitivity(model, s.batches, [(4, 8), (8, 8)], max_images=8,
                                    n_samples=2, probe_batch=2)
    assert 0.0 <= acc <= 100.0
    for module in (model.eval(), net.eval()):
        assert not stray_tensor_attributes(module)
        meta_forward(copy.deepcopy(module).to("meta"), s.x)


@pytest.mark.parametrize("kind", POLICIES)
def test_quantized_paths_keep_to_the_model_device(setup, kind: str) -> None:
    """PTQ (calibration, bias correction), a forward, LSQ QAT steps from a teacher and the
    measured sensitivity, with the default device foreign; then the result after ``.to()``.
    On vit, int8 covers the attention products (QuantMatMul); mixed-adaround, learned rounding."""
    from hwnas.quant.fake_quant import QuantMatMul, quantizers
    from hwnas.quant.ptq import PTQConfig, ptq
    from hwnas.quant.qat import QATConfig, qat
    from hwnas.quant.sensitivity import measured_sensitivity

    s = setup
    policy = _policy(s, kind)
    ptq_config = PTQConfig(residual="shared" if kind == "int8-shared-adds" else "float",
                           rounding="adaround" if kind == "mixed-adaround" else "nearest",
                           adaround_iterations=2)
    teacher = s.supernet.extract(s.space.largest()).eval()
    with foreign_default_device():
        qmodel = ptq(s.model, policy, s.batches, ptq_config)
        with torch.no_grad():
            qmodel(s.x)
        result = qat(s.model, policy, s.batches, s.batches, QATConfig(epochs=1, max_steps=2),
                     init=qmodel, teacher=teacher, progress=False)
        if kind == "int8":
            measured_sensitivity(s.model, s.batches, s.batches, [(8, 8)], config=ptq_config,
                                 max_eval_images=16)
    assert any(q.active for _, q in quantizers(result.model))
    if kind == "int8" and s.space.name == "vit":
        assert any(True for m in result.model.modules() if isinstance(m, QuantMatMul))
    assert not stray_tensor_attributes(result.model)
    meta_forward(copy.deepcopy(result.model).to("meta"), s.x)


def test_the_check_sees_a_tensor_made_on_the_default_device() -> None:
    """The mechanism itself: a module that makes a tensor without ``device=`` in its forward
    is caught, and one holding a plain tensor attribute is caught after ``.to()``."""

    class MakesOne(torch.nn.Module):
        def forward(self, x):
            return x * torch.ones(x.shape[-1])

    class HoldsOne(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.offset = torch.ones(4)

        def forward(self, x):
            return x + self.offset

    class AddsInPlace(torch.nn.Module):  # PyTorch itself lets this one through
        def forward(self, x):
            return x.clone().add_(torch.ones(x.shape[-1]))

    x = torch.randn(2, 4)
    for module in (MakesOne(), AddsInPlace()):
        with pytest.raises(DeviceMixError, match="test_device_safety.py"), foreign_default_device():
            module(x)
    assert stray_tensor_attributes(HoldsOne()) == ["<root>.offset"]
    with pytest.raises(DeviceMixError, match="aten::add"):
        meta_forward(HoldsOne().to("meta"), x)
    meta_forward(torch.nn.Linear(4, 2).to("meta"), x)  # a clean module passes


@pytest.mark.parametrize("kind", ["shift", "crop_flip", "crop_flip_cutout", "trivial_crop_flip_cutout",
                                  "autoaugment_crop_flip"])
def test_augmentation_keeps_to_the_images_device(kind: str) -> None:
    """Every augmentation runs on the GPU beside its CPU generator (``BatchLoader``): each
    kind, its random numbers drawn on the CPU, makes no tensor on the default device."""
    from hwnas.supernet.data.augment import augment_batch
    from hwnas.supernet.train_options import AUGMENT_KINDS

    assert kind in AUGMENT_KINDS
    channels = 1 if kind == "shift" else 3
    images = torch.randint(0, 256, (6, channels, 12, 12), dtype=torch.uint8)
    with foreign_default_device():
        out = augment_batch(images, kind, torch.Generator(device="cpu").manual_seed(0),
                            fill=[128] * channels)
    assert out.device.type == "cpu" and out.shape == images.shape and out.dtype == torch.uint8


def test_the_export_reference_keeps_to_the_model_device() -> None:
    """The export's deployed reference (int32 biases, and its rounding hooks: requantization,
    squeeze-excitation gate, h-swish, residual adds made integer adds), which the parity check
    runs on the export's device: its forward makes no tensor on the default device."""
    from hwnas.export.qdq.build import build_qdq
    from hwnas.quant.policy import uniform
    from qdq_support import tiny_fbnet, tiny_mbv3_se

    for model, calib, test in (tiny_mbv3_se(8), tiny_fbnet("k3_e3-k3_e3-k3_e3-k3_e3", (1, 3), 8)):
        build = build_qdq(model, uniform(model, 8, 8), [calib])
        ref = build.reference()
        kinds = {p.kind for p in ref.rounding_points()}
        with ref as deployed, foreign_default_device(), torch.no_grad():
            deployed(test)
        assert kinds & {"se_gate", "residual"}


@pytest.mark.parametrize("training", [True, False])
def test_masked_subnets_keep_to_the_model_device(training: bool) -> None:
    """``forward_masked`` with ``arch_masks`` (``hwnas train --compile-scope subnets``: a
    supernet step's random subnets), in training and evaluation, forward and backward, with the
    default device foreign."""
    space = _small_space("vit")
    torch.manual_seed(0)
    net = space.build_supernet().train(training)
    x = torch.randn(2, *space.input_shape)
    with foreign_default_device():
        for arch in (space.smallest(), space.sample(np.random.default_rng(2))):
            out = net.forward_masked(x, net.arch_masks(arch, x.device))
            out.square().sum().backward()
    assert out.device == x.device and not stray_tensor_attributes(net)


@pytest.mark.parametrize("regularise", ["all", "largest"])
def test_training_from_an_external_teacher_keeps_to_the_model_device(setup, regularise) -> None:
    """A supernet step that learns from an external teacher (``hwnas train --teacher``), with
    the default device foreign: the teacher's logits (copied for CUDA graphs) stay on the
    model's device, with the smaller subnets regularised or not (``--regularise``)."""
    from hwnas.supernet.train import TrainConfig, TrainStage, train_supernet

    s = setup
    net = copy.deepcopy(s.supernet)
    teacher = copy.deepcopy(s.supernet).extract(s.space.smallest())
    with foreign_default_device():
        config = TrainConfig(stages=[TrainStage("s", 1, num_random=1)], batch_size=16,
                             warmup_epochs=0, teacher="smallest", teacher_weight=0.5,
                             regularise=regularise)
        train_supernet(net, s.space, s.data, config, progress=False, max_steps=1,
                       teacher=teacher)
    assert not stray_tensor_attributes(net.eval())
    meta_forward(copy.deepcopy(net).to("meta"), s.x)


@pytest.mark.parametrize("name", ["nb201", "mbv3"])
def test_the_fp32_float64_check_keeps_to_its_cpu_copy(name: str) -> None:
    """``float32_rounding`` (an FP32 file over ``atol``: the model's float64 answer from a CPU
    copy) makes no tensor on the default device, so it runs on a GPU export as here."""
    from hwnas.export.verify import float32_rounding

    space = _small_space(name)
    torch.manual_seed(0)
    model = space.build_supernet().extract(space.largest()).eval()
    x = torch.randn(4, *space.input_shape)
    with torch.no_grad():
        want = model(x).numpy()
    with foreign_default_device():
        rounding = float32_rounding(model, x, want, want, atol=0.0)
    assert rounding is not None and rounding[1] >= 0.0
