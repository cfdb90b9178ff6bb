"""Tests for latency.onnx_measure. No torch here: the module must work without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hwnas.latency import LatencyStats, measure_onnx
from hwnas.latency.onnx_measure import make_session, random_input
from onnx import TensorProto, helper, numpy_helper

from hwnas.core.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def _conv_relu(batch_dim: str | int = "N", extra_dim: str | int = 8) -> bytes:
    """Conv(3->4, 3x3, pad 1) + Relu on [batch, 3, extra_dim, 8] float32 input."""
    weight = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), name="W"
    )
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 3, extra_dim, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 4, extra_dim, 8])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return _conv_relu()


@pytest.fixture
def model_file(tmp_path: Path, model_bytes: bytes) -> Path:
    path = tmp_path / "conv_relu.onnx"
    path.write_bytes(model_bytes)
    return path


def test_measure_from_file(model_file: Path) -> None:
    stats = measure_onnx(model_file, warmup=2, repeats=7, threads=1)
    assert isinstance(stats, LatencyStats)
    assert stats.median_ms > 0 and stats.p95_ms > 0 and stats.mean_ms > 0
    assert stats.median_ms <= stats.p95_ms
    assert stats.cv >= 0
    assert (stats.repeats, stats.warmup, stats.threads, stats.batch) == (7, 2, 1, 1)
    d = stats.as_dict()
    assert set(d) == {"median_ms", "p95_ms", "mean_ms", "cv", "repeats", "warmup", "threads", "batch",
                      "runtime", "precision"}
    assert (d["runtime"], d["precision"]) == ("onnxruntime", "f32")
    assert d["repeats"] == 7


def test_measure_from_bytes_and_str_path(model_bytes: bytes, model_file: Path) -> None:
    assert measure_onnx(model_bytes, warmup=0, repeats=1).repeats == 1
    assert measure_onnx(str(model_file), warmup=0, repeats=2, threads=2).threads == 2


def test_batch_is_respected(model_bytes: bytes) -> None:
    session = make_session(model_bytes)
    feeds = random_input(session, batch=5, seed=3)
    assert list(feeds) == ["x"]
    assert feeds["x"].shape == (5, 3, 8, 8)
    assert feeds["x"].dtype == np.float32
    assert session.run(None, feeds)[0].shape == (5, 4, 8, 8)
    np.testing.assert_array_equal(feeds["x"], random_input(session, batch=5, seed=3)["x"])
    assert measure_onnx(model_bytes, batch=5, warmup=1, repeats=3).batch == 5


def test_session_settings(model_bytes: bytes) -> None:
    session = make_session(model_bytes, threads=3)
    assert session.get_providers() == ["CPUExecutionProvider"]
    opts = session.get_session_options()
    assert opts.intra_op_num_threads == 3
    assert opts.inter_op_num_threads == 1
    # no residual spinning after a run to slow the next model timed in the process
    assert opts.get_session_config_entry("session.force_spinning_stop") == "1"


def test_profiling_and_ondevice_sessions_do_not_spin_between_runs(model_file: Path) -> None:
    from hwnas.export.ort_profile import session_options
    from hwnas.latency.ondevice import session_for

    assert session_options(2).get_session_config_entry("session.force_spinning_stop") == "1"
    opts = session_for(model_file, 2).get_session_options()
    assert opts.get_session_config_entry("session.force_spinning_stop") == "1"


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(UserError, match=r"nope\.onnx.*does not exist"):
        measure_onnx(missing)
    with pytest.raises(UserError, match="is a directory"):
        make_session(tmp_path)


def test_unloadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(UserError, match=r"onnxruntime cannot load .*garbage\.onnx") as info:
        make_session(bad)
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="cannot load the ONNX model bytes"):
        make_session(b"\x00\x01garbage")


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"repeats": 0}, r"repeats must be >= 1, got 0"),
        ({"repeats": -3}, r"repeats must be >= 1"),
        ({"warmup": -1}, r"warmup must be >= 0, got -1"),
        ({"threads": 0}, r"threads must be >= 1"),
        ({"batch": 0}, r"batch must be >= 1"),
        ({"repeats": 2.5}, r"repeats must be an integer"),
        ({"batch": True}, r"batch must be an integer"),
    ],
)
def test_bad_arguments(model_bytes: bytes, kwargs: dict, pattern: str) -> None:
    with pytest.raises(UserError, match=pattern):
        measure_onnx(model_bytes, **kwargs)


def test_bad_model_argument_type() -> None:
    with pytest.raises(UserError, match="model must be a path"):
        make_session(123)  # type: ignore[arg-type]


def test_symbolic_non_batch_dim_names_input() -> None:
    session = make_session(_conv_relu(extra_dim="H"))
    with pytest.raises(UserError, match=r"input 'x' has a symbolic dimension 'H' at axis 2"):
        random_input(session)


def test_fixed_batch_dim_mismatch() -> None:
    session = make_session(_conv_relu(batch_dim=1))
    assert random_input(session, batch=1)["x"].shape == (1, 3, 8, 8)
    with pytest.raises(UserError, match=r"fixed batch dimension 1, but batch=4"):
        random_input(session, batch=4)


def test_import_does_not_pull_in_torch() -> None:
    code = "import hwnas.latency, hwnas.latency.onnx_measure, sys; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_busy_machine_flags_more_runnable_threads_than_cores(monkeypatch) -> None:
    """A load average above the cores (plus the slack a full-machine timing reads) is a busy
    machine; at or below it, or where the platform has no load average, nothing is said."""
    import os

    from hwnas.latency.onnx_measure import BUSY_SLACK, busy_machine

    assert busy_machine(1, load=1.0, cores=2) == ""
    assert busy_machine(16, load=16.0 + BUSY_SLACK, cores=16) == ""  # a timing filling every core
    note = busy_machine(1, load=3.3, cores=2)
    assert "busy machine (1-minute load 3.3 on 2 cores, this timing 1 thread(s))" in note
    assert "may not hold on a quiet machine" in note
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 4.0, 3.0))
    assert "load 5.0 on 2 cores" in busy_machine(1)

    def no_load_average():
        raise OSError("not available")
    monkeypatch.setattr(os, "getloadavg", no_load_average)
    assert busy_machine(1) == ""
