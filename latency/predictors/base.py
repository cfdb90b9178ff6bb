"""The interface every latency predictor implements, and what they share.

:class:`LatencyPredictor` is the one contract of the predictor families (its docstring gives a
predictor's life: ``meta_fit``, ``adapt``, ``predict``), :data:`PREDICTORS` their one registry
and :meth:`LatencyPredictor.save` / :meth:`LatencyPredictor.load` their one file format (a small
``.npz``, no pickles). Architectures may be given as architecture objects of the space or as
strings; strings are parsed (a string outside the space raises :class:`UserError`). Nothing here
imports torch.
"""

from __future__ import annotations

import io
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from hwnas.latency.predictors.features import arch_strings

from hwnas.core.errors import UserError
from hwnas.core.io import write_atomic
from hwnas.core.registry import Registry

__all__ = ["FORMAT", "PREDICTORS", "LatencyPredictor", "predictor_classes",
           "register_predictor_class"]

#: Format tag of saved predictor files.
FORMAT = "hwnas-latency-predictor-1"

#: The one registry of predictors: name -> class (``cls(space)`` constructs it). ``get_predictor``
#: creates by name, :meth:`LatencyPredictor.load` finds a file's class here (only registered
#: classes load).
PREDICTORS: Registry[type[LatencyPredictor]] = Registry("latency predictor")


def register_predictor_class(cls: type[LatencyPredictor]) -> type[LatencyPredictor]:
    """Class decorator: register a predictor class under its ``name`` (so that
    :func:`~hwnas.latency.predictors.get_predictor` creates it and :meth:`LatencyPredictor.load`
    reads its files)."""
    PREDICTORS.register(cls.name, cls)
    return cls


def predictor_classes() -> dict[str, type[LatencyPredictor]]:
    """Class name -> class of the registered predictors."""
    return {cls.__name__: cls for cls in map(PREDICTORS.get, PREDICTORS)}


class LatencyPredictor(ABC):
    """Predicts the latency (ms) of architectures of one space on one device.

    A predictor belongs to one search space. Its life has up to three steps:

    1. ``meta_fit(space, archs, table, seed=)`` - learn from many devices' full latency tables
       (``table[device]`` aligned with ``archs``). A no-op for predictors without meta-training.
    2. ``adapt(archs, latency_ms, seed=)`` - a few measurements on a *new* device give a
       predictor for that device. ``min_samples`` is the fewest measurements it accepts;
       ``reference_archs`` (when not ``None``) are the architectures it wants measured first,
       in order: with ``n`` measurements, measure the first ``n``.
    3. ``predict(archs)`` / ``predict_with_std(archs)`` - latency in ms (and a standard
       deviation where the predictor has an uncertainty estimate, else ``None``).
    """

    #: Registry name (``flops``, ``lut``, ``mlp``, ``meta``).
    name: ClassVar[str] = "base"
    #: Fewest measurements :meth:`adapt` accepts.
    min_samples: int = 2

    def __init__(self, space: Any) -> None:
        self.space = space
        self._keys: list[str] | None = None
        self._latency: np.ndarray | None = None
        self._seed = 0

    # -- what callers use --------------------------------------------------------------------------
    @property
    def reference_archs(self) -> list[str] | None:
        """Architectures (canonical strings) to measure first on a new device, or ``None``."""
        return None

    @property
    def is_adapted(self) -> bool:
        return self._keys is not None

    @property
    def measurements(self) -> tuple[list[str], np.ndarray] | None:
        """The ``(archs, latency_ms)`` the predictor was adapted to, if any."""
        if self._keys is None:
            return None
        return list(self._keys), self._latency.copy()

    def meta_fit(self, space: Any, archs: Sequence[Any], table: Mapping[str, np.ndarray], *,
                 seed: int) -> LatencyPredictor:
        """Learn from many devices' tables; this base version only checks the input and binds
        the space (predictors without meta-training)."""
        self.space = space
        check_table(archs, table)
        return self

    def adapt(self, archs: Sequence[Any], latency_ms: Sequence[float] | np.ndarray, *,
              seed: int) -> LatencyPredictor:
        """Fit to measurements on a new device (in place); returns ``self``."""
        keys, y = self._check_samples(archs, latency_ms)
        self._adapt(keys, y, int(seed))
        self._keys, self._latency, self._seed = keys, y, int(seed)
        return self

    def predict(self, archs: Sequence[Any]) -> np.ndarray:
        """Predicted latency (ms) of each architecture."""
        return self.predict_with_std(archs)[0]

    def _require_adapted(self) -> None:
        """:class:`UserError` unless :meth:`adapt` has been called."""
        if not self.is_adapted:
            raise UserError(
                f"the {self.name} latency predictor has not been adapted to a device; call "
                f"adapt() with measurements first"
            )

    def predict_with_std(self, archs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray | None]:
        """Predicted latency (ms) and its standard deviation (ms), or ``None`` where the
        predictor has no uncertainty estimate."""
        self._require_adapted()
        keys = arch_strings(self.space, archs)
        mean, std = self._predict(keys)
        return np.asarray(mean, dtype=np.float64), (None if std is None else
                                                    np.asarray(std, dtype=np.float64))

    # -- what subclasses implement -----------------------------------------------------------------
    @abstractmethod
    def _adapt(self, keys: list[str], latency_ms: np.ndarray, seed: int) -> None:
        """Fit to validated measurements (canonical strings, finite latencies > 0)."""

    @abstractmethod
    def _predict(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        """Mean and std (or ``None``) in ms for canonical strings."""

    def _state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """JSON-able hyper-parameters / meta-trained state, and arrays (without adaptation)."""
        return {}, {}

    @classmethod
    def _from_state(cls, space: Any, meta: dict[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> LatencyPredictor:
        """A predictor rebuilt from :meth:`_state` (not adapted)."""
        return cls(space)

    def _adapted_arrays(self) -> dict[str, np.ndarray]:
        """Fitted parameters to save with the measurements (none: :meth:`load` re-adapts)."""
        return {}

    def _restore_adapted(self, keys: list[str], latency_ms: np.ndarray, seed: int,
                         arrays: Mapping[str, np.ndarray]) -> None:
        """Restore the adapted state saved by :meth:`_adapted_arrays` (default: re-adapt,
        which is deterministic for a given seed)."""
        self._adapt(keys, latency_ms, seed)

    # -- checks ------------------------------------------------------------------------------------
    def _check_samples(self, archs: Sequence[Any],
                       latency_ms: Sequence[float] | np.ndarray) -> tuple[list[str], np.ndarray]:
        keys = arch_strings(self.space, archs)
        y = np.asarray(latency_ms, dtype=np.float64).reshape(-1)
        if len(keys) != len(y):
            raise UserError(f"{len(keys)} architectures but {len(y)} latencies; expected one "
                            f"latency per architecture")
        if len(keys) < self.min_samples:
            raise UserError(
                f"the {self.name} latency predictor needs at least {self.min_samples} "
                f"measurements, got {len(keys)}"
            )
        bad = np.flatnonzero(~np.isfinite(y) | (y <= 0))
        if len(bad):
            i = int(bad[0])
            raise UserError(f"latency of {keys[i]!r} is {y[i]}; expected a finite latency in "
                            f"ms > 0")
        seen: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k in seen:
                raise UserError(f"architecture {k!r} is measured twice (items {seen[k]} and "
                                f"{i}); expected one measurement per architecture")
            seen[k] = i
        return keys, y

    # -- files -------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the predictor to one small ``.npz`` file (atomically: temporary file +
        rename): JSON metadata plus arrays, no pickles; the meta-trained state, the
        hyper-parameters and the measurements it was adapted to (with whatever fitted
        parameters the predictor keeps)."""
        path = Path(path)
        meta, arrays = self._state()
        doc: dict[str, Any] = {
            "format": FORMAT,
            "class": type(self).__name__,
            "name": self.name,
            "space": self.space.name,
            "space_config": self.space.config(),
            "state": meta,
            "measurements": None,
        }
        arrays = {f"state.{k}": np.asarray(v) for k, v in arrays.items()}
        if self.is_adapted:
            doc["measurements"] = {"archs": list(self._keys), "seed": self._seed}
            arrays["adapt.latency_ms"] = self._latency
            arrays.update({f"adapt.{k}": np.asarray(v) for k, v in self._adapted_arrays().items()})
        arrays["__meta__"] = np.frombuffer(json.dumps(doc).encode("utf-8"), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        return write_atomic(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> LatencyPredictor:
        """Read a file written by :meth:`save` (any registered predictor class when called on
        :class:`LatencyPredictor`; that class or a subclass when called on a subclass); the
        space is rebuilt from its registry name and configuration."""
        path = Path(path)
        if not path.is_file():
            raise UserError(f"latency predictor file {path} does not exist")
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            doc = json.loads(arrays.pop("__meta__").tobytes().decode("utf-8"))
        except (OSError, ValueError, KeyError, UnicodeDecodeError) as exc:
            raise UserError(f"{path} is not a hwnas latency predictor file: {exc}") from None
        if doc.get("format") != FORMAT:
            raise UserError(f"{path} has format {doc.get('format')!r}; expected {FORMAT!r}")
        klass = predictor_classes().get(doc.get("class", ""))
        if klass is None or not issubclass(klass, cls):
            raise UserError(f"{path} holds a {doc.get('class')!r} predictor; expected "
                            f"{cls.__name__} or one of its subclasses")
        from hwnas.supernet.spaces import get_space

        space = get_space(doc["space"], config=doc.get("space_config") or None)
        state = {k[6:]: v for k, v in arrays.items() if k.startswith("state.")}
        obj = klass._from_state(space, doc.get("state") or {}, state)
        m = doc.get("measurements")
        if m:
            keys = list(m["archs"])
            y = np.asarray(arrays["adapt.latency_ms"], dtype=np.float64)
            adapted = {k[6:]: v for k, v in arrays.items()
                       if k.startswith("adapt.") and k != "adapt.latency_ms"}
            obj._restore_adapted(keys, y, int(m.get("seed", 0)), adapted)
            obj._keys, obj._latency, obj._seed = keys, y, int(m.get("seed", 0))
        return obj

    def __repr__(self) -> str:
        what = f"adapted to {len(self._keys)} measurements" if self.is_adapted else "not adapted"
        return f"<{type(self).__name__} {self.name!r} space={self.space.name} {what}>"


def check_table(archs: Sequence[Any], table: Mapping[str, np.ndarray], *,
                allow_missing: bool = False) -> dict[str, np.ndarray]:
    """Validate a meta-training table (device -> latencies aligned with ``archs``).
    ``allow_missing``: NaN marks an architecture a device was not measured on (devices measured
    on different samples of a space); each device still needs 10 measured ones."""
    if not table:
        raise UserError("meta-training needs latency tables of at least one device")
    out: dict[str, np.ndarray] = {}
    for device, values in table.items():
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if len(v) != len(archs):
            raise UserError(f"device {device!r} has {len(v)} latencies for {len(archs)} "
                            f"architectures; expected one per architecture")
        measured = ~np.isnan(v) if allow_missing else np.ones(len(v), dtype=bool)
        if not np.all(np.isfinite(v[measured]) & (v[measured] > 0)):
            raise UserError(f"device {device!r} has a latency that is not a finite number > 0")
        if allow_missing and measured.sum() < 10:
            raise UserError(f"device {device!r} has {int(measured.sum())} measured "
                            f"architectures; expected at least 10")
        out[str(device)] = v
    return out
