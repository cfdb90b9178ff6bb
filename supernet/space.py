"""The SearchSpace interface: the one place where a space's choices are declared.

Every other package (latency predictors, quantization cost models, the search, export) talks
to a space through this interface and never hard-codes a space's choices. Implementations must
import without torch; only :meth:`SearchSpace.build_supernet` imports the torch modules.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any, Generic, TypeVar

import numpy as np
from hwnas.supernet.layers import Layer, total_flops, total_macs, total_params

from hwnas.core.errors import UserError

Arch = TypeVar("Arch")


class SearchSpace(ABC, Generic[Arch]):
    """A space of architectures that share one weight-sharing supernet.

    Architectures are immutable, hashable values of a space-specific type. Their canonical
    string (:meth:`to_string`) is how they are written to files and joined with tables.

    Examples:
        >>> import numpy as np
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")            # a SearchSpace
        >>> arch = space.sample(np.random.default_rng(0))
        >>> space.from_string(space.to_string(arch)) == arch
        True
        >>> space.to_string(space.smallest()), space.input_shape, space.num_classes
        ('k3e2_k3e2_k3e2', (1, 8, 8), 10)
    """

    #: Registry name of the space, e.g. ``"mbv3-tiny"``.
    name: str
    #: Input shape of one image as (channels, height, width).
    input_shape: tuple[int, int, int]
    #: Number of output classes.
    num_classes: int

    @property
    def family(self) -> str:
        """The registered space this one is a variant of (default: its own name; ``cct``:
        ``vit``): a search of the family may run on the variant's shipped supernet
        (:mod:`hwnas.supernet.checkpoints`), recording the variant's name."""
        return self.name

    # -- sampling ---------------------------------------------------------------------------
    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Arch:
        """A uniformly random architecture (each choice drawn independently)."""

    @abstractmethod
    def smallest(self) -> Arch:
        """The architecture with every choice at its smallest value."""

    @abstractmethod
    def largest(self) -> Arch:
        """The architecture with every choice at its largest value."""

    # -- string form ----------------------------------------------------------------------------
    @abstractmethod
    def to_string(self, arch: Arch) -> str:
        """Canonical string; ``from_string(to_string(a)) == a`` for every member ``a``."""

    @abstractmethod
    def from_string(self, text: str) -> Arch:
        """Parse a canonical string; raises :class:`UserError` for strings outside the space."""

    # -- features for predictors -----------------------------------------------------------------
    @abstractmethod
    def encode(self, arch: Arch) -> np.ndarray:
        """A fixed-length float32 feature vector (length :attr:`feature_dim`)."""

    @property
    @abstractmethod
    def feature_names(self) -> list[str]:
        """One name per entry of :meth:`encode`'s vector."""

    @property
    def feature_dim(self) -> int:
        return len(self.feature_names)

    # -- description as layers --------------------------------------------------------------------
    @abstractmethod
    def layers(self, arch: Arch) -> list[Layer]:
        """The architecture as a layer list (see :mod:`hwnas.supernet.layers`)."""

    def flops(self, arch: Arch) -> int:
        return total_flops(self.layers(arch))

    def macs(self, arch: Arch) -> int:
        return total_macs(self.layers(arch))

    def params(self, arch: Arch) -> int:
        return total_params(self.layers(arch))

    # -- Optuna ----------------------------------------------------------------------------------
    @abstractmethod
    def suggest(self, trial: Any) -> Arch:
        """Suggest an architecture from an Optuna trial (a fixed set of parameters)."""

    @abstractmethod
    def to_params(self, arch: Arch) -> dict[str, Any]:
        """The Optuna parameters that make :meth:`suggest` return ``arch`` (for enqueueing)."""

    # -- what a device runs ---------------------------------------------------------------------
    def execution_variants(self) -> tuple[str, ...]:
        """Names of the networks a deployment toolchain may run for an architecture: ``raw``
        (as written) and, for a space whose architectures can contain dead code, variants
        without it (a runtime that eliminates dead code runs a smaller network). Latency
        predictors let the measurements decide which one a device runs."""
        return ("raw",)

    def executed(self, arch: Arch, variant: str) -> tuple[Arch, bool]:
        """The architecture a device runs under ``variant``, and whether its output is then a
        constant (a runtime may fold the whole network away)."""
        if variant != "raw":
            raise UserError(f"execution variant {variant!r} does not exist for space "
                            f"{self.name}; expected one of {list(self.execution_variants())}")
        return arch, False

    # -- training --------------------------------------------------------------------------------
    def training_defaults(self) -> dict[str, Any]:
        """How this space's supernet should be trained where it differs from the toolkit's
        defaults: ``"schedule"`` (a preset name of :func:`hwnas.supernet.recipes.schedule_config`)
        and :class:`hwnas.supernet.recipes.TrainConfig` settings (e.g. a transformer's lower
        learning rate). Settings a caller passes explicitly win
        (:func:`hwnas.supernet.recipes.default_config`). Empty for the convolutional spaces."""
        return {}

    def finetune_defaults(self) -> dict[str, Any]:
        """Settings of :class:`hwnas.export.finetune.FinetuneSettings` (``hwnas finetune``: QAT
        or distillation of a searched subnet) where this space needs other values than the
        toolkit's, e.g. a transformer's lower ``lr``. Settings a caller passes win. Empty for
        the convolutional spaces."""
        return {}

    # -- torch -----------------------------------------------------------------------------------
    @abstractmethod
    def build_supernet(self) -> Any:
        """A freshly initialised weight-sharing supernet (a torch ``nn.Module``)."""

    # -- helpers ---------------------------------------------------------------------------------
    def _set_config(self, cfg: Any, name: str) -> None:
        """Adopt a config record with ``in_channels``, ``image_size``, ``num_classes`` and
        ``to_dict()`` (what every space here has): sets ``cfg``, ``name``, ``input_shape`` and
        ``num_classes`` so :meth:`config` can rebuild the space."""
        self.cfg, self.name = cfg, name
        self.input_shape = (cfg.in_channels, cfg.image_size, cfg.image_size)
        self.num_classes = cfg.num_classes

    def config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this space (stored with checkpoints and runs)."""
        cfg = getattr(self, "cfg", None)
        return cfg.to_dict() if cfg is not None else {}

    def parse(self, arch: Arch | str) -> Arch:
        """Accept an architecture or its string and return a validated architecture."""
        if isinstance(arch, str):
            return self.from_string(arch)
        return self.from_string(self.to_string(arch))

    def describe(self) -> str:
        return f"{self.name}: input {self.input_shape}, {self.num_classes} classes"


class SpaceConfig:
    """Base of a space's frozen configuration dataclass: a plain-JSON round trip (tuples as
    lists, as stored in checkpoints and run directories) that refuses unknown keys and bad
    values in one line. ``LABEL`` names the space in messages."""

    LABEL = "space"

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        if not isinstance(d, dict):
            raise UserError(f"{cls.LABEL} space configuration must be a mapping, got "
                            f"{type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"unknown {cls.LABEL} space setting(s) {unknown}; expected some of "
                            f"{sorted(known)}")
        try:
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
        except (TypeError, ValueError) as exc:
            raise UserError(f"invalid {cls.LABEL} space configuration: {exc}") from None


def check_choice(value: Any, choices: tuple, what: str) -> None:
    """Raise a :class:`UserError` naming ``what`` if ``value`` is not one of ``choices``."""
    if value not in choices:
        raise UserError(f"{what} = {value!r} is outside the space; expected one of {list(choices)}")


def restrict_choices(space: SearchSpace, choices: dict[str, Any], *,
                     number: Callable[[str, Any], float] = lambda _dim, v: int(v),
                     kind: str = "integers") -> dict[str, tuple]:
    """``{"<dim>_choices": values}`` for ``dataclasses.replace`` on a space's config: each
    dimension named in ``choices`` keeps only the given values (sorted, converted by
    ``number(dim, value)``), so that every member of the sub-space is a member of ``space``.
    :class:`UserError` for an unknown dimension, a value that is not one of ``kind`` or is
    outside the space. A space's ``restrict`` (training schedules) is built on it."""
    full = space.elastic_choices()
    changes = {}
    for dim, values in choices.items():
        if dim not in full:
            raise UserError(f"cannot restrict unknown dimension {dim!r} of space {space.name}; "
                            f"expected some of {list(full)}")
        try:
            vals = tuple(sorted({number(dim, v) for v in values}))
        except (TypeError, ValueError):
            raise UserError(f"choices for {dim!r} must be a list of {kind}, got {values!r}") from None
        if not vals or any(v not in full[dim] for v in vals):
            raise UserError(f"choices {list(values)} for {dim!r} are not a non-empty subset of "
                            f"{list(full[dim])} (space {space.name})")
        changes[f"{dim}_choices"] = vals
    return changes
