"""Adapted devices: a device profile (:mod:`hwnas.latency.profiles`), i.e. a predictor adapted
to a user's own measurements (``hwnas latency adapt``), for the space it was adapted on."""

from __future__ import annotations

from typing import Any

import numpy as np
from hwnas.latency.devices.base import Device, parse_archs, resolve_space

from hwnas.core.errors import UserError


class AdaptedDevice(Device):
    """A device profile (:mod:`hwnas.latency.profiles`): a predictor adapted to the user's
    measurements, for the space it was adapted on (its configuration included)."""

    kind = "adapted"

    def __init__(self, profile: Any) -> None:
        self.profile = profile
        self.name = profile.name
        self.spaces = (profile.space,)
        self.description = (f"{profile.predictor} predictor adapted to {profile.n_measurements} "
                            f"measurements ({profile.created[:10]})")
        self._predictor = None

    @property
    def predictor(self):
        if self._predictor is None:
            from hwnas.latency.profiles import load_profile_predictor

            self._predictor = load_profile_predictor(self.profile)
        return self._predictor

    def _space_and_archs(self, space, archs):
        space = resolve_space(space)
        self.check_space(space)
        if space.config() != self.profile.space_config:
            raise UserError(
                f"device {self.name!r} was adapted on {self.profile.space} with configuration "
                f"{self.profile.space_config}; this space has {space.config()}"
            )
        return space, parse_archs(space, archs)

    def latency(self, space, archs):
        _, parsed = self._space_and_archs(space, archs)
        return np.asarray(self.predictor.predict(parsed), dtype=np.float64)

    def latency_with_std(self, space, archs):
        _, parsed = self._space_and_archs(space, archs)
        mean, std = self.predictor.predict_with_std(parsed)
        return (np.asarray(mean, dtype=np.float64),
                None if std is None else np.asarray(std, dtype=np.float64))

