"""Pinning a timing's threads to fixed cores, and giving every thread its affinity back."""

from __future__ import annotations

import os
import threading

import pytest
from hwnas.export.model_export import ExportSettings, _pin
from hwnas.export.parallel import timing_slot

from hwnas.core import affinity
from hwnas.core.errors import UserError

linux_only = pytest.mark.skipif(not affinity.supported() or not os.path.isdir("/proc/self/task"),
                                reason="needs sched_setaffinity and /proc/self/task (Linux)")


def _idle_thread() -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    return t, stop


@linux_only
def test_pinned_pins_every_thread_and_restores_each() -> None:
    own = os.sched_getaffinity(0)
    before, stop_before = _idle_thread()
    stop_during = threading.Event()
    try:
        with affinity.pinned(1) as cores:
            assert cores == frozenset({max(own)})  # the last allowed core
            assert os.sched_getaffinity(0) == cores
            # a thread that existed before (an onnxruntime pool's, say) is pinned too
            assert os.sched_getaffinity(before.native_id) == cores
            during, stop_during = _idle_thread()  # inherits the pinned mask
            assert os.sched_getaffinity(during.native_id) == cores
        assert os.sched_getaffinity(0) == own
        assert os.sched_getaffinity(before.native_id) == own
        assert os.sched_getaffinity(during.native_id) == own  # the caller's mask
    finally:
        stop_before.set()
        stop_during.set()


@linux_only
def test_pinned_restores_after_an_error_and_caps_at_the_allowed_cores() -> None:
    own = os.sched_getaffinity(0)
    with pytest.raises(RuntimeError), affinity.pinned(len(own) + 5) as cores:
        assert cores == frozenset(own)  # more than allowed: all of them
        raise RuntimeError("timing failed")
    assert os.sched_getaffinity(0) == own
    if len(own) > 1:
        narrow = {min(own)}
        os.sched_setaffinity(0, narrow)  # a caller's own pinning comes back as it was
        try:
            with affinity.pinned(1) as cores:
                assert cores == frozenset(narrow)
            assert os.sched_getaffinity(0) == narrow
        finally:
            os.sched_setaffinity(0, own)


def test_pinned_is_a_no_op_when_off_or_unsupported(monkeypatch) -> None:
    with affinity.pinned(None) as cores:
        assert cores is None
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    assert not affinity.supported()
    with affinity.pinned(2) as cores:
        assert cores is None
    with timing_slot(1):  # the export's timing slot runs unpinned there
        pass


def test_pinned_refuses_a_bad_core_count() -> None:
    if not affinity.supported():
        pytest.skip("no sched_setaffinity here")
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError), affinity.pinned(bad):
            pass


@linux_only
def test_timing_slot_pins_as_many_cores_as_the_timing_has_threads() -> None:
    own = os.sched_getaffinity(0)
    s = ExportSettings()
    assert _pin(s, [1, 4]) == 4 and _pin(s, []) is None
    assert _pin(ExportSettings(pin_timings=False), [1]) is None
    with timing_slot(_pin(s, [1])):
        assert len(os.sched_getaffinity(0)) == 1
    assert os.sched_getaffinity(0) == own
    with pytest.raises(UserError):
        ExportSettings(pin_timings="yes").validate()


@linux_only
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if affinity.supported() else True,
                    reason="needs two allowed cores")
def test_openvino_first_used_in_a_pinned_timing_still_sees_every_core() -> None:
    """OpenVINO's CPU plugin keeps the affinity of its first use: first used inside a timing
    slot pinned to one core, a later 2-thread, 2-stream model would get one of each. The slot
    primes it before pinning. A fresh process, since the plugin's view lasts the process."""
    import subprocess
    import sys

    from hwnas.latency.onnx_measure import openvino_available

    if not openvino_available():
        pytest.skip("OpenVINO is not installed")
    code = """
import numpy as np
from hwnas.export.parallel import timing_slot
from hwnas.latency.onnx_measure import make_runner
from latency_support import linear_onnx
model = linear_onnx(np.eye(4))
with timing_slot(1):
    make_runner(model, runtime="openvino", threads=1, batch=2)
runner = make_runner(model, runtime="openvino", threads=2, batch=2, streams=2)
print(runner.threads, runner.compiled.get_property("INFERENCE_NUM_THREADS"))
"""
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": tests})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "2"]


def test_torch_thread_defaults_use_the_free_cores_and_passive_waiting(monkeypatch):
    """Issue 50, a busy machine: one spinning thread per core made training ~10x slower."""
    from hwnas.core import affinity

    monkeypatch.setattr(affinity.os, "getloadavg", lambda: (1.6, 0.0, 0.0))
    monkeypatch.setattr(affinity.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(affinity, "supported", lambda: False)
    env: dict[str, str] = {}
    assert affinity.torch_thread_defaults(env) == {"OMP_NUM_THREADS": "2",
                                                   "OMP_WAIT_POLICY": "PASSIVE",
                                                   "GOMP_SPINCOUNT": "10000"}
    spin = {"GOMP_SPINCOUNT": "0"}  # a wait setting of the user's: neither is touched
    assert "OMP_WAIT_POLICY" not in affinity.torch_thread_defaults(spin)
    monkeypatch.setattr(affinity.os, "getloadavg", lambda: (40.0, 0.0, 0.0))
    assert affinity.free_cores() == 1  # never none
    mine = {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}
    assert affinity.torch_thread_defaults(mine) == {} and mine["OMP_NUM_THREADS"] == "3"
