"""Registry of search spaces, selectable by name (``--space``).

A space is created for a dataset's input shape and number of classes. Users add their own
space with :func:`register_space` (no registry file to edit).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from hwnas.supernet.space import SearchSpace
from hwnas.supernet.spaces.fbnet import FBNetArch, FBNetConfig, FBNetSpace
from hwnas.supernet.spaces.mbv3 import MBV3Arch, MBV3Config, MBV3Space
from hwnas.supernet.spaces.nb201 import NB201Arch, NB201Config, NB201Space
from hwnas.supernet.spaces.vit import CCT_CONFIG, CCTSpace, ViTArch, ViTConfig, ViTSpace

from hwnas.core.registry import Registry

#: name -> factory(in_channels, image_size, num_classes, config overrides) -> SearchSpace
SPACES: Registry[Callable[..., SearchSpace]] = Registry("space")


def register_space(name: str, factory: Callable[..., SearchSpace]) -> None:
    """Make a space available by name. ``factory(in_channels=, image_size=, num_classes=,
    config=None)`` returns the space; ``config`` is a dict from :meth:`SearchSpace.config`.
    A built-in name cannot be taken; ``tests/test_space_contract.py`` checks every entry.

    Examples:
        >>> from hwnas.supernet import available_spaces, get_space, register_space
        >>> def small_vit(in_channels=1, image_size=8, num_classes=10, config=None):
        ...     return get_space("vit", in_channels=in_channels, image_size=image_size,
        ...                      num_classes=num_classes, config=config)
        >>> register_space("vit-digits", small_vit)
        >>> "vit-digits" in available_spaces()
        True
    """
    SPACES.register(name, factory)


def available_spaces() -> list[str]:
    """The names of the registered search spaces, sorted.

    Examples:
        >>> from hwnas.supernet import available_spaces
        >>> available_spaces()
        ['cct', 'fbnet', 'mbv3', 'mbv3-tiny', 'nb201', 'vit']
    """
    return SPACES.names()


def get_space(
    name: str,
    *,
    in_channels: int | None = None,
    image_size: int | None = None,
    num_classes: int | None = None,
    config: dict | None = None,
) -> SearchSpace:
    """Create the space ``name`` for a dataset; ``config`` (from a checkpoint) wins over presets.

    Examples:
        >>> from hwnas.supernet import get_space
        >>> space = get_space("nb201", in_channels=3, image_size=32, num_classes=10)
        >>> space.name, space.num_classes
        ('nb201', 10)
    """
    return SPACES.get(name)(
        in_channels=in_channels, image_size=image_size, num_classes=num_classes, config=config
    )


def _overrides(in_channels, image_size, num_classes) -> dict:
    """The dataset's settings a factory was given (None: keep the configuration's)."""
    return {
        k: v
        for k, v in dict(in_channels=in_channels, image_size=image_size, num_classes=num_classes).items()
        if v is not None
    }


def _mbv3_tiny(*, in_channels=None, image_size=None, num_classes=None, config=None) -> MBV3Space:
    """The default: a small elastic MobileNetV3 for the 8×8 handwritten digits (trains on
    2 CPU cores in about two minutes)."""
    cfg = MBV3Config.from_dict(config) if config else MBV3Config()
    return MBV3Space(replace(cfg, **_overrides(in_channels, image_size, num_classes)),
                     name="mbv3-tiny")


SPACES.register("mbv3-tiny", _mbv3_tiny, builtin=True)


def _mbv3(*, in_channels=None, image_size=None, num_classes=None, config=None) -> MBV3Space:
    """Once-for-All's elastic MobileNetV3 for 32×32 images (CIFAR); see
    :func:`hwnas.supernet.spaces.mbv3.ofa_cifar_config`."""
    from hwnas.supernet.spaces.mbv3 import ofa_cifar_config

    cfg = MBV3Config.from_dict(config) if config else ofa_cifar_config()
    return MBV3Space(replace(cfg, **_overrides(in_channels, image_size, num_classes)), name="mbv3")


SPACES.register("mbv3", _mbv3, builtin=True)


def _nb201(*, in_channels=None, image_size=None, num_classes=None, config=None) -> NB201Space:
    """The NAS-Bench-201 cell space (CIFAR macro network; default 100 classes as in the
    HW-NAS-Bench/HELP latency tables)."""
    cfg = NB201Config.from_dict(config) if config else NB201Config()
    return NB201Space(replace(cfg, **_overrides(in_channels, image_size, num_classes)), name="nb201")


def _fbnet(*, in_channels=None, image_size=None, num_classes=None, config=None) -> FBNetSpace:
    """The FBNet space in HW-NAS-Bench's CIFAR-100 setting (default 100 classes)."""
    cfg = FBNetConfig.from_dict(config) if config else FBNetConfig()
    return FBNetSpace(replace(cfg, **_overrides(in_channels, image_size, num_classes)), name="fbnet")


SPACES.register("nb201", _nb201, builtin=True)
SPACES.register("fbnet", _fbnet, builtin=True)


def _vit(*, in_channels=None, image_size=None, num_classes=None, config=None) -> ViTSpace:
    """An elastic compact vision transformer for 32×32 images (AutoFormer-style weight
    entanglement, convolutional tokenizer); see :mod:`hwnas.supernet.spaces.vit`."""
    cfg = ViTConfig.from_dict(config) if config else ViTConfig()
    return ViTSpace(replace(cfg, **_overrides(in_channels, image_size, num_classes)), name="vit")


SPACES.register("vit", _vit, builtin=True)


def _cct(*, in_channels=None, image_size=None, num_classes=None, config=None) -> CCTSpace:
    """Compact Convolutional Transformers as a space (sequence pooling, positional embedding,
    stochastic depth): CCT-2/3x2 to CCT-7/3x2; see :class:`hwnas.supernet.spaces.vit.CCTSpace`."""
    cfg = ViTConfig.from_dict(config) if config else CCT_CONFIG
    return CCTSpace(replace(cfg, **_overrides(in_channels, image_size, num_classes)), name="cct")


SPACES.register("cct", _cct, builtin=True)

__all__ = [
    "MBV3Arch",
    "MBV3Config",
    "MBV3Space",
    "FBNetArch",
    "FBNetConfig",
    "FBNetSpace",
    "NB201Arch",
    "NB201Config",
    "NB201Space",
    "ViTArch",
    "ViTConfig",
    "ViTSpace",
    "CCTSpace",
    "available_spaces",
    "get_space",
    "register_space",
]
