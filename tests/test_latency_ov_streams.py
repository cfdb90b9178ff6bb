"""OpenVINO streams: a runner that splits one call's batch into S sub-batches run on S parallel
infer requests (``make_runner(..., streams=S)``, ``latency/ondevice.py --streams S``) returns
what the single-request runner returns, in order, and refuses what it cannot split. The OpenVINO cases skip when the ``openvino`` extra
is not installed; nothing here needs torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hwnas.latency.onnx_measure import make_runner, random_input
from latency_support import ONDEVICE, needs_ov, run_ondevice_without
from test_latency_runtimes import conv_model

from hwnas.core.errors import UserError


@needs_ov
def test_streams_runner_returns_the_single_request_outputs_in_order() -> None:
    data = conv_model()
    single = make_runner(data, runtime="openvino", threads=2, batch=6)
    split = make_runner(data, runtime="openvino", threads=2, batch=6, streams=2)
    assert (single.streams, split.streams) == (1, 2)
    assert (split.runtime, split.threads, split.precision) == ("openvino", 2, "f32")
    # the runner takes the whole batch; OpenVINO compiled the sub-batch of 3
    assert split.get_inputs()[0].shape == [6, 3, 8, 8]
    assert [p.get_partial_shape()[0].get_length() for p in split.compiled.inputs] == [3]
    feeds = random_input(split, batch=6, seed=3)
    feeds["x"] += np.arange(6, dtype=np.float32)[:, None, None, None]  # every image differs
    want, got = single.run(feeds)[0], split.run(feeds)[0]
    assert got.shape == want.shape == (6, 4, 8, 8)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # swapping the halves swaps the outputs: the order is the input's, not the finishing order
    swapped = {"x": np.concatenate([feeds["x"][3:], feeds["x"][:3]])}
    np.testing.assert_allclose(split.run(swapped)[0], np.concatenate([want[3:], want[:3]]),
                               rtol=1e-5, atol=1e-5)


@needs_ov
def test_streams_runner_recompiles_per_batch_and_splits_a_dynamic_batch() -> None:
    data = conv_model()
    dynamic = make_runner(data, runtime="openvino", threads=2, streams=2)
    assert dynamic.get_inputs()[0].shape[0] == "?"
    ref = make_runner(data, runtime="openvino", threads=1)
    for batch in (1, 5):  # fewer images than streams, and an uneven split
        feeds = random_input(dynamic, batch=batch, seed=batch)
        np.testing.assert_allclose(dynamic.run(feeds)[0], ref.run(feeds)[0], rtol=1e-5, atol=1e-5)
    static = dynamic.at_batch(4)
    assert static is not dynamic and static.streams == 2 and static.get_inputs()[0].shape[0] == 4
    assert static.at_batch(4) is static


@needs_ov
def test_streams_refuse_what_they_cannot_split() -> None:
    data = conv_model()
    with pytest.raises(UserError, match="batch 7 does not split into 2 equal sub-batches"):
        make_runner(data, runtime="openvino", threads=2, batch=7, streams=2)
    with pytest.raises(UserError, match="batch 9 does not split into 2 equal sub-batches"):
        make_runner(data, runtime="openvino", threads=2, batch=8, streams=2).at_batch(9)
    with pytest.raises(UserError, match="streams=4 > threads=2"):
        make_runner(data, runtime="openvino", threads=2, streams=4)


def test_streams_are_openvino_only() -> None:
    assert make_runner(conv_model()).streams == 1
    with pytest.raises(UserError, match="streams=2 needs runtime 'openvino'"):
        make_runner(conv_model(), threads=2, streams=2)
    with pytest.raises(UserError, match="streams must be >= 1, got 0"):
        make_runner(conv_model(), runtime="openvino", streams=0)


def _ondevice_module():
    """The standalone script, imported as a module (it imports no hwnas)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ondevice_streams", ONDEVICE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_ov
def test_ondevice_streams_session_matches_one_request(tmp_path) -> None:
    od = _ondevice_module()
    path = tmp_path / "m.onnx"
    path.write_bytes(conv_model())
    feeds = {"x": np.random.default_rng(4).standard_normal((4, 3, 8, 8)).astype(np.float32)}
    one = od.OpenVinoSession(path, 2, batch=4)
    two = od.OpenVinoSession(path, 2, batch=4, streams=2)
    assert [p.get_partial_shape()[0].get_length() for p in two.compiled.inputs] == [2]
    np.testing.assert_allclose(two.run(None, feeds)[0], one.run(None, feeds)[0],
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(od.MeasureError, match="--batch 3 does not split into 2 equal"):
        od.OpenVinoSession(path, 2, batch=3, streams=2)


@needs_ov
def test_ondevice_script_times_streams_without_hwnas(tmp_path) -> None:
    d = tmp_path / "models"
    d.mkdir()
    (d / "trial_0.onnx").write_bytes(conv_model("arch-0"))
    out = tmp_path / "m.csv"
    proc = run_ondevice_without(
        {"hwnas", "torch", "pandas"},
        [d, "--out", out, "--repeats", "3", "--warmup", "1", "--max-cv", "100", "--runtime",
         "openvino", "--threads", "2", "--batch", "4", "--streams", "2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "2 stream(s)" in proc.stderr and "batch 4" in proc.stderr
    assert out.read_text().splitlines()[1].startswith("arch-0,")


@pytest.mark.parametrize("args, message", [
    (["--streams", "2", "--batch", "4", "--threads", "2"], "add --runtime openvino"),
    (["--runtime", "openvino", "--streams", "2", "--batch", "3", "--threads", "2"],
     "--batch 3 does not split into 2 equal sub-batches"),
    (["--runtime", "openvino", "--streams", "2", "--batch", "4"], "--streams 2 > --threads 1"),
])
def test_ondevice_refuses_streams_it_cannot_run(tmp_path, args, message) -> None:
    d = tmp_path / "models"
    d.mkdir()
    (d / "a.onnx").write_bytes(conv_model())
    proc = subprocess.run([sys.executable, "-I", str(ONDEVICE), str(d), "--out",
                           str(tmp_path / "m.csv"), *args], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr and not (tmp_path / "m.csv").exists()
