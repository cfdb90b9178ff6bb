"""Tests of device profiles (latency.profiles: measurements CSV, save and load) and the
adaptation API (latency.adapt.adapt_device), with a FLOPs predictor defined here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hwnas.latency import profiles
from hwnas.latency.adapt import adapt_device
from hwnas.latency.devices import AdaptedDevice, device_names, get_device
from hwnas.latency.profiles import (
    PROFILE_FILE,
    check_profile_name,
    list_profiles,
    load_profile,
    read_measurements,
    save_profile,
)
from hwnas.supernet.spaces import get_space

from latency_support import SPACE, sample_archs, write_measurements

from hwnas.core.errors import UserError
from hwnas.core.written import RECORD


@pytest.fixture(autouse=True)
def trusted_here(profile_dir, monkeypatch) -> None:
    """Profiles go to a temporary directory, and this module's predictor classes may load."""
    monkeypatch.setattr(profiles, "TRUSTED_PREDICTOR_PACKAGES",
                        profiles.TRUSTED_PREDICTOR_PACKAGES + [__name__])


# --------------------------------------------------------------------------------------------
# a FLOPs predictor (tests only): latency = a * MFLOPs + b, least squares on the samples
# --------------------------------------------------------------------------------------------


class FlopsPredictor:
    """Follows the LatencyPredictor interface (adapt, predict, predict_with_std, min_samples,
    save/load) with the simplest model that can rank: a linear function of FLOPs."""

    name = "test-flops"
    min_samples = 3

    def __init__(self, space_name: str = SPACE) -> None:
        self.space = get_space(space_name)
        self.coef = (1.0, 0.0)

    def _flops(self, archs) -> np.ndarray:
        return np.array([self.space.flops(self.space.parse(a)) for a in archs], dtype=float) / 1e6

    def adapt(self, archs, latency_ms, seed: int = 0) -> FlopsPredictor:
        a, b = np.polyfit(self._flops(archs), np.asarray(latency_ms, dtype=float), 1)
        self.coef = (float(a), float(b))
        return self

    def predict(self, archs) -> np.ndarray:
        a, b = self.coef
        return a * self._flops(archs) + b

    def predict_with_std(self, archs):
        mean = self.predict(archs)
        return mean, np.full_like(mean, 0.01)

    def save(self, path) -> None:
        Path(path).write_text(json.dumps({"space": self.space.name, "coef": self.coef}))

    @classmethod
    def load(cls, path) -> FlopsPredictor:
        d = json.loads(Path(path).read_text())
        out = cls(d["space"])
        out.coef = tuple(d["coef"])
        return out


class FailingSave(FlopsPredictor):
    def save(self, path) -> None:
        Path(path).write_text("partial")
        raise RuntimeError("disk full")


# --------------------------------------------------------------------------------------------
# measurements CSV
# --------------------------------------------------------------------------------------------


def test_read_measurements_canonicalises_and_hashes(tmp_path):
    path = tmp_path / "m.csv"
    archs, ms = write_measurements(path, 6)
    data = read_measurements(path, get_space(SPACE), min_rows=6)
    assert data.archs == archs and len(data) == 6
    np.testing.assert_allclose(data.latency_ms, ms)
    assert len(data.sha256) == 64


BAD_ROWS = [
    ("arch,latency\nX,1\n", r"lacks column\(s\) latency_ms"),
    ("latency_ms\n1\n", r"lacks column\(s\) arch"),
    ("", "is empty"),
    ("arch,latency_ms\n", "no rows"),
    ("arch,latency_ms\n{a},1.0\n{b},nan\n", "line 3: latency_ms is nan"),
    ("arch,latency_ms\n{a},1.0\n{b},\n", "line 3: latency_ms is empty"),
    ("arch,latency_ms\n{a},1.0\n{b},fast\n", "line 3: latency_ms 'fast' is not a number"),
    ("arch,latency_ms\n{a},0\n", "line 2: latency_ms is 0"),
    ("arch,latency_ms\n{a},-2.5\n", "line 2: latency_ms is -2.5"),
    ("arch,latency_ms\n{a},inf\n", "line 2: latency_ms is inf"),
    ("arch,latency_ms\n{a},1.0\n{b},2.0\n{a},3.0\n", "line 4: architecture .* repeats line 2"),
    ("arch,latency_ms\n{a},1.0\nk3e4_bogus,2.0\n", "line 3: architecture 'k3e4_bogus' is not in space mbv3-tiny"),
    ("arch,latency_ms\n{a},1.0,extra\n", "line 2: 3 fields"),
]


@pytest.mark.parametrize(("text", "message"), BAD_ROWS)
def test_read_measurements_rejects_bad_rows(tmp_path, text, message):
    a, b = sample_archs(2)
    path = tmp_path / "m.csv"
    path.write_text(text.format(a=a, b=b))
    with pytest.raises(UserError, match=message) as info:
        read_measurements(path, get_space(SPACE))
    assert "\n" not in str(info.value)


def test_read_measurements_too_few_rows_and_missing_file(tmp_path):
    path = tmp_path / "m.csv"
    write_measurements(path, 3)
    with pytest.raises(UserError, match="has 3 measurement.*at least 5"):
        read_measurements(path, get_space(SPACE), min_rows=5)
    with pytest.raises(UserError, match="does not exist"):
        read_measurements(tmp_path / "nope.csv", get_space(SPACE))


# --------------------------------------------------------------------------------------------
# profiles
# --------------------------------------------------------------------------------------------


def test_profile_round_trip_and_adapted_device(tmp_path, profile_dir):
    path = tmp_path / "m.csv"
    archs, ms = write_measurements(path, 8)
    space = get_space(SPACE)
    predictor = FlopsPredictor().adapt(archs, ms)
    data = read_measurements(path, space)
    profile = save_profile("my-board", space, predictor, data)
    assert profile.path == profile_dir / "my-board"
    assert sorted(p.name for p in profile.path.iterdir()) == sorted(
        [PROFILE_FILE, profiles.PREDICTOR_FILE, profiles.MEASUREMENTS_FILE, RECORD])
    meta = json.loads((profile.path / PROFILE_FILE).read_text())
    assert meta["n_measurements"] == 8 and meta["space"] == SPACE
    assert meta["predictor"] == "test-flops" and meta["source_csv_sha256"] == data.sha256
    assert load_profile("my-board") == profile
    assert [p.name for p in list_profiles()] == ["my-board"]
    saved = pd.read_csv(profile.path / profiles.MEASUREMENTS_FILE)
    assert list(saved["arch"]) == archs

    device = get_device("my-board", SPACE)
    assert isinstance(device, AdaptedDevice) and device.kind == "adapted"
    others = sample_archs(5, seed=3)
    np.testing.assert_allclose(device.latency(space, others), predictor.predict(others))
    mean, std = device.latency_with_std(space, others)
    assert std is not None and std.shape == (5,)
    assert "my-board" in device_names(SPACE) and "my-board" not in device_names("nb201")
    with pytest.raises(UserError, match="has no latency for space 'nb201'"):
        get_device("my-board", "nb201")
    with pytest.raises(UserError, match="adapted on mbv3-tiny with configuration"):
        device.latency(get_space(SPACE, image_size=16), others)


def test_profile_save_is_atomic(tmp_path, profile_dir):
    path = tmp_path / "m.csv"
    archs, ms = write_measurements(path, 5)
    space = get_space(SPACE)
    data = read_measurements(path, space)
    with pytest.raises(RuntimeError, match="disk full"):
        save_profile("broken", space, FailingSave().adapt(archs, ms), data)
    assert not list(profile_dir.iterdir()), "a failed save left files behind"

    # a failed overwrite keeps the previous profile intact
    good = save_profile("board", space, FlopsPredictor().adapt(archs, ms), data)
    before = (good.path / PROFILE_FILE).read_text()
    with pytest.raises(RuntimeError):
        save_profile("board", space, FailingSave().adapt(archs, ms), data, overwrite=True)
    assert (good.path / PROFILE_FILE).read_text() == before
    assert [p.name for p in profile_dir.iterdir()] == ["board"]
    with pytest.raises(UserError, match="already exists"):
        save_profile("board", space, FlopsPredictor().adapt(archs, ms), data)
    again = save_profile("board", space, FlopsPredictor().adapt(archs, ms * 2), data, overwrite=True)
    assert json.loads((again.path / PROFILE_FILE).read_text())["created"]
    assert [p.name for p in profile_dir.iterdir()] == ["board"]


def test_profile_names_are_checked():
    for bad in ("", "../x", "a b", ".hidden", "x" * 65):
        with pytest.raises(UserError, match="not a valid profile name"):
            check_profile_name(bad)
    with pytest.raises(UserError, match="is a built-in device"):
        check_profile_name("edgetpu-est")
    assert check_profile_name("jetson-orin-nano") == "jetson-orin-nano"


def test_untrusted_predictor_class_is_refused(tmp_path, profile_dir, monkeypatch):
    path = tmp_path / "m.csv"
    archs, ms = write_measurements(path, 5)
    space = get_space(SPACE)
    profile = save_profile("board", space, FlopsPredictor().adapt(archs, ms), read_measurements(path, space))
    monkeypatch.setattr(profiles, "TRUSTED_PREDICTOR_PACKAGES", ["hwnas.latency"])
    with pytest.raises(UserError, match="is not a hwnas latency predictor"):
        profiles.load_profile_predictor(profile)
    # a trusted module's attribute that is not a predictor class is refused before any call
    tampered = dataclasses.replace(profile, predictor_class="hwnas.latency.profiles:os.system")
    with pytest.raises(UserError, match="is not a hwnas latency predictor class"):
        profiles.load_profile_predictor(tampered)


def test_adapt_device_validates_then_saves(tmp_path, profile_dir):
    path = tmp_path / "m.csv"
    write_measurements(path, 8)
    profile, predictor, rho = adapt_device("edge-box", SPACE, path, predictor=FlopsPredictor())
    assert rho > 0.9 and profile.n_measurements == 8
    assert get_device("edge-box").kind == "adapted"
    # too few rows for the predictor: nothing written
    few = tmp_path / "few.csv"
    write_measurements(few, 2)
    with pytest.raises(UserError, match="needs at least 3"):
        adapt_device("other", SPACE, few, predictor=FlopsPredictor())
    with pytest.raises(UserError, match="already exists"):
        adapt_device("edge-box", SPACE, path, predictor=FlopsPredictor())
    with pytest.raises(UserError, match="unknown space"):
        adapt_device("other", "no-space", path, predictor=FlopsPredictor())
    assert [p.name for p in profile_dir.iterdir()] == ["edge-box"]


def test_adapt_with_the_package_predictors(tmp_path, profile_dir):
    """The real predictors (latency.predictors) through adapt_device and a saved profile."""
    predictors = pytest.importorskip("hwnas.latency.predictors", reason="hwnas.latency.predictors not present yet")
    from hwnas.latency.predictors import default_predictor

    path = tmp_path / "m.csv"
    archs, ms = write_measurements(path, 10)
    space = get_space(SPACE)
    for name in ("flops", "lut"):
        predictor = predictors.get_predictor(name, space)
        profile, fitted, rho = adapt_device(f"board-{name}", SPACE, path, predictor=predictor)
        assert profile.predictor == name and rho > 0.8
        device = get_device(f"board-{name}", SPACE)
        others = sample_archs(6, seed=5)
        np.testing.assert_allclose(device.latency(space, others), fitted.predict(others), rtol=1e-9)
        mean, std = device.latency_with_std(space, others)
        assert std is None or std.shape == (6,)
    default = default_predictor(space)
    assert default.min_samples >= 1
