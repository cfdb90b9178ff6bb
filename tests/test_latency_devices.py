"""Tests of the device registry (latency.devices), device profiles (latency.profiles) and the
adaptation API (latency.cli.adapt_device), with a FLOPs predictor defined here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from hwnas.latency import profiles
from hwnas.latency.cli import adapt_device
from hwnas.latency.devices import (
    KINDS,
    AdaptedDevice,
    EstimatedDevice,
    MeasuredDevice,
    available_devices,
    device_names,
    get_device,
    latency_tables,
)
from hwnas.latency.estimators import get_estimator
from hwnas.latency.profiles import (
    PROFILE_FILE,
    check_profile_name,
    list_profiles,
    load_profile,
    read_measurements,
    save_profile,
)
from hwnas.supernet.data import shared_data_dir
from hwnas.supernet.spaces import get_space
from onnx import TensorProto, helper

from hwnas.core.errors import UserError

SPACE = "mbv3-tiny"


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


@pytest.fixture(autouse=True)
def profile_dir(tmp_path, monkeypatch) -> Path:
    """Profiles go to a temporary directory, and this module's predictor classes may load."""
    root = tmp_path / "devices"
    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(root))
    monkeypatch.setattr(profiles, "TRUSTED_PREDICTOR_PACKAGES",
                        profiles.TRUSTED_PREDICTOR_PACKAGES + [__name__])
    return root


def sample_archs(n: int, seed: int = 0, space_name: str = SPACE) -> list[str]:
    space = get_space(space_name)
    rng = np.random.default_rng(seed)
    out: list[str] = []
    while len(out) < n:
        s = space.to_string(space.sample(rng))
        if s not in out:
            out.append(s)
    return out


def write_measurements(path: Path, n: int = 8) -> tuple[list[str], np.ndarray]:
    space = get_space(SPACE)
    archs = sample_archs(n)
    ms = np.array([space.flops(space.parse(a)) for a in archs]) / 1e6 * 0.3 + 0.05
    pd.DataFrame({"arch": archs, "latency_ms": ms}).to_csv(path, index=False)
    return archs, ms


def tiny_onnx(arch: str | None = None, width: int = 8) -> bytes:
    """A float model ``relu(x @ W)`` with a dynamic batch, optionally with ``arch`` metadata."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, width], np.ones(4 * width, dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "W"], ["h"]), helper.make_node("Relu", ["h"], ["logits"])],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", width])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if arch is not None:
        helper.set_model_props(model, {"arch": arch})
    onnx.checker.check_model(model)
    return model.SerializeToString()


def needs_tables() -> Path:
    data = shared_data_dir()
    if data is None or not latency_tables():
        pytest.skip("shared latency tables absent (set HWNAS_SHARED_DATA)")
    return data / "latency"


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------


def test_registry_lists_every_kind_once():
    infos = available_devices()
    names = [i.name for i in infos]
    assert len(names) == len(set(names))
    assert all(i.kind in KINDS for i in infos)
    for name in ("cpu-ort-1t", "cpu-ort-all", "fpga-zcu102-est", "edgetpu-est", "raspi4-est"):
        assert name in names
    assert {i.kind for i in infos} >= {"measured", "estimated"}
    # sorted by kind, then name
    assert [KINDS.index(i.kind) for i in infos] == sorted(KINDS.index(i.kind) for i in infos)


def test_unknown_device_is_a_user_error_with_close_names():
    with pytest.raises(UserError, match=r"unknown device 'raspi4-ets'.*did you mean 'raspi4-est'"):
        get_device("raspi4-ets")
    with pytest.raises(UserError, match="unknown device"):
        get_device("no-such-device-at-all")


def test_space_coverage_is_checked():
    device = get_device("fpga-zcu102-est", SPACE)
    assert isinstance(device, EstimatedDevice) and device.supports(SPACE)
    needs_tables()
    with pytest.raises(UserError, match="has no latency for space 'mbv3-tiny'"):
        get_device("pixel3", SPACE)
    assert "pixel3" in device_names("nb201") and "pixel3" not in device_names(SPACE)
    assert "1080ti_64" in device_names("fbnet") and "1080ti_64" not in device_names("nb201")


@pytest.mark.parametrize("space_name", ["nb201", "fbnet"])
def test_table_devices_return_the_csv_values(space_name):
    path = needs_tables() / f"{space_name}_latency_ms.csv"
    frame = pd.read_csv(path).sample(25, random_state=1)
    space = get_space(space_name)
    for column in ("fpga", "pixel3", "1080ti_1"):
        device = get_device(column, space_name)
        assert device.kind == "table"
        got = device.latency(space, list(frame["arch"]))
        np.testing.assert_array_equal(got, frame[column].to_numpy())
    # architecture objects work as well as strings
    archs = [space.from_string(a) for a in frame["arch"][:3]]
    np.testing.assert_array_equal(get_device("fpga").latency(space_name, archs), frame["fpga"][:3])


def test_table_device_refuses_unmeasured_archs_and_other_configs():
    needs_tables()
    fbnet = get_space("fbnet")
    known = set(pd.read_csv(needs_tables() / "fbnet_latency_ms.csv", usecols=["arch"])["arch"])
    rng = np.random.default_rng(0)
    missing = next(s for s in (fbnet.to_string(fbnet.sample(rng)) for _ in range(100)) if s not in known)
    with pytest.raises(UserError, match="not in the fbnet latency table"):
        get_device("fpga").latency(fbnet, [missing])
    other = get_space("nb201", image_size=16)
    with pytest.raises(UserError, match="another configuration"):
        get_device("fpga").latency(other, [other.to_string(other.largest())])


def test_estimated_device_is_the_estimator_on_the_layer_list():
    space = get_space(SPACE)
    archs = sample_archs(5)
    device = get_device("edgetpu-est", space)
    want = [get_estimator("edgetpu-est").estimate(space.layers(space.parse(a))) for a in archs]
    np.testing.assert_allclose(device.latency(space, archs), want)
    with pytest.raises(UserError, match="architecture #1"):
        device.latency(space, [archs[0], "k9e9"])
    with pytest.raises(UserError, match="takes no options"):
        get_device("edgetpu-est", model_fn=lambda a: None)


def test_measured_device_with_a_model_fn():
    sizes = {}

    def model_fn(arch):
        sizes[arch] = 8 if arch.stages[0][0][0] == 3 else 64
        return tiny_onnx(width=sizes[arch])

    space = get_space(SPACE)
    device = get_device("cpu-ort-1t", SPACE, model_fn=model_fn, repeats=5, warmup=1)
    assert isinstance(device, MeasuredDevice) and device.kind == "measured"
    med, std = device.latency_with_std(space, sample_archs(2))
    assert med.shape == (2,) and np.all(med > 0) and np.all(std >= 0)
    bad = get_device("cpu-ort-1t", SPACE, model_fn=lambda arch: "not a model", repeats=1, warmup=0)
    with pytest.raises(UserError, match="model_fn must return"):
        bad.latency(space, sample_archs(1))


def test_measured_device_batch_and_cuda_graph_options(monkeypatch):
    import hwnas.latency.onnx_measure as onnx_measure

    seen = {}
    real = onnx_measure.measure_onnx

    def spy(model, **kw):
        seen.update(kw)
        return real(model, **kw)

    monkeypatch.setattr(onnx_measure, "measure_onnx", spy)
    space = get_space(SPACE)
    device = MeasuredDevice("cpu-b4", threads=1, model_fn=lambda a: tiny_onnx(width=8),
                            repeats=2, warmup=0, batch=4)
    assert device.latency(space, sample_archs(1))[0] > 0 and seen["batch"] == 4
    with pytest.raises(UserError, match="batch must be >= 1"):
        MeasuredDevice("x", threads=1, batch=0)
    with pytest.raises(UserError, match="cuda_graph needs provider 'cuda-torch'"):
        MeasuredDevice("x", threads=1, provider="cpu", cuda_graph=True)


def test_measured_device_builds_the_subnet_itself():
    pytest.importorskip("torch")
    device = get_device("cpu-ort-1t", SPACE, repeats=3, warmup=1)
    space = get_space(SPACE)
    t = device.latency(space, [space.to_string(space.smallest())])
    assert t.shape == (1,) and t[0] > 0


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
        [PROFILE_FILE, profiles.PREDICTOR_FILE, profiles.MEASUREMENTS_FILE])
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
    from hwnas.latency.cli import default_predictor

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


def test_gpu_devices_are_listed_only_with_a_gpu(monkeypatch):
    import hwnas.latency.devices as devices

    monkeypatch.setattr(devices, "_gpu_present", lambda: True)
    listed = devices._measured_factories()
    assert {"cuda-torch", "cuda-graph"} <= set(listed)
    graph = listed["cuda-graph"][0]()
    assert graph.provider == "cuda-torch" and graph.cuda_graph and graph.batch == 1
    monkeypatch.setattr(devices, "_gpu_present", lambda: False)
    assert not {"cuda-torch", "cuda-graph"} & set(devices._measured_factories())
