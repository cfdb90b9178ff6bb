"""The Device interface: a name, a kind (:data:`KINDS`), the spaces it covers and one way to
give the latency of architectures of a search space; :class:`DeviceInfo` lists a device without
building it. Each kind lives in its own module of this package; the registry in ``registry``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hwnas.supernet.space import SearchSpace

from hwnas.core.errors import UserError

#: The kinds of device, in listing order.
KINDS = ("measured", "table", "estimated", "adapted")

ArchLike = Any  # an architecture of the space, or its canonical string


def resolve_space(space: SearchSpace | str) -> SearchSpace:
    """A space object from a space or a registered space name (default configuration)."""
    if isinstance(space, SearchSpace):
        return space
    if isinstance(space, str):
        from hwnas.supernet.spaces import get_space

        return get_space(space)
    raise UserError(f"expected a search space or a space name, got {type(space).__name__}")


def space_name(space: SearchSpace | str | None) -> str | None:
    if space is None or isinstance(space, str):
        return space
    return space.name


# --------------------------------------------------------------------------------------------
# the interface
# --------------------------------------------------------------------------------------------


class Device(ABC):
    """A device: ``name``, ``kind`` (one of :data:`KINDS`), the spaces it covers (``None``:
    any space) and :meth:`latency`.

    Examples:
        >>> from hwnas.latency import get_device
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> device = get_device("edgetpu-est")          # a Device
        >>> device.kind, device.supports(space)
        ('estimated', True)
        >>> ms = device.latency(space, [space.smallest(), space.largest()])
        >>> bool(ms[0] < ms[1])
        True
    """

    name: str
    kind: str
    description: str = ""
    #: Names of the spaces this device has latencies for; ``None`` means every space.
    spaces: tuple[str, ...] | None = None
    #: Name of the device's quantization rules (:data:`hwnas.quant.device_rules.DEVICE_RULES`):
    #: which precisions run on it, what falls back, how int8 changes the speed. The rules are
    #: data of ``quant``; a device only names them, so latency and quant stay side by side.
    quant_rules: str = "cpu-ort"
    #: Measured float-time / int8-time per layer shape on this device
    #: (:func:`hwnas.quant.device_rules.layer_key`), e.g. from an export's
    #: ``int8_speedup_<device>.json``; ``None`` when nothing was measured.
    int8_speedup: dict[str, float] | None = None

    def supports(self, space: SearchSpace | str) -> bool:
        """Whether this device gives latencies for ``space`` (an object or a name)."""
        return self.spaces is None or space_name(space) in self.spaces

    def check_space(self, space: SearchSpace | str) -> None:
        """Raise :class:`UserError` unless this device covers ``space``."""
        if not self.supports(space):
            raise UserError(
                f"device {self.name!r} ({self.kind}) has no latency for space "
                f"{space_name(space)!r}; it covers {', '.join(self.spaces or ())}"
            )

    @abstractmethod
    def latency(self, space: SearchSpace | str, archs: Sequence[ArchLike]) -> np.ndarray:
        """Latency in ms (batch 1) of each architecture (object or canonical string)."""

    def latency_with_std(
        self, space: SearchSpace | str, archs: Sequence[ArchLike]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Latency and, where the device knows it, its standard deviation (else ``None``)."""
        return self.latency(space, archs), None

    def info(self) -> DeviceInfo:
        return DeviceInfo(self.name, self.kind, self.spaces, self.description)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, kind={self.kind!r})"


@dataclass(frozen=True)
class DeviceInfo:
    """What :func:`available_devices` lists: a device without building it."""

    name: str
    kind: str
    spaces: tuple[str, ...] | None
    description: str

    @property
    def spaces_text(self) -> str:
        return "any" if self.spaces is None else ",".join(self.spaces)


def parse_archs(space: SearchSpace, archs: Sequence[ArchLike]) -> list:
    """Every architecture validated in ``space`` (strings parsed); the error names the index."""
    if isinstance(archs, (str, bytes)):
        raise UserError("archs must be a list of architectures, got a single string")
    out = []
    for i, arch in enumerate(archs):
        try:
            out.append(space.parse(arch))
        except UserError as exc:
            raise UserError(f"architecture #{i}: {exc}") from None
    return out

