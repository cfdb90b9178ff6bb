"""Tiny networks with spread-out BatchNorm statistics and random 8x8 images, for the QDQ tests
(and ``benchmarks/qdq_rounding_points.py``) that need a real block structure: fbnet's residual
adds and channel shuffles, mbv3's squeeze-excitation gates and h-swish."""

from __future__ import annotations


def _with_images(model, test_images: int):  # noqa: ANN001, ANN202 - torch is imported inside
    """``(model, 64 calibration images, test_images test images)``: the model in eval mode,
    its BatchNorm statistics drawn so that the layers' ranges differ; fixed seeds."""
    import torch

    model = model.eval()
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
    g = torch.Generator().manual_seed(1)
    calib = torch.randn(64, 3, 8, 8, generator=g)
    return model, calib, torch.randn(test_images, 3, 8, 8, generator=g)


def tiny_fbnet(arch: str, stage_layers: tuple[int, int], test_images: int):  # noqa: ANN201
    """The static network of ``arch`` in a two-stage fbnet (8 and 16 channels), with images."""
    import torch
    from hwnas.supernet.spaces.fbnet import FBNetConfig, FBNetSpace

    torch.manual_seed(0)
    space = FBNetSpace(FBNetConfig(image_size=8, num_classes=10, stem_channels=8,
                                   stage_channels=(8, 16), stage_layers=stage_layers,
                                   stage_strides=(1, 1), head_channels=16))
    supernet = space.build_supernet()
    supernet.set_active(arch)
    return _with_images(supernet.static_net(), test_images)


def tiny_mbv3_se(test_images: int):  # noqa: ANN201
    """A two-stage mbv3 (h-swish everywhere, squeeze-excitation in both stages), with images."""
    import torch
    from hwnas.supernet.spaces.mbv3 import MBV3Config, MBV3Space

    torch.manual_seed(0)
    space = MBV3Space(MBV3Config(in_channels=3, image_size=8, num_classes=10, stem_channels=8,
                                 stage_channels=(8, 16), stage_strides=(1, 1),
                                 stage_activations=("hswish", "hswish"), depth_choices=(2,),
                                 kernel_choices=(3,), expand_choices=(3,), head_channels=16,
                                 se_stages=(0, 1)))
    supernet = space.build_supernet()
    supernet.set_active(space.smallest())
    return _with_images(supernet.static_net(), test_images)
