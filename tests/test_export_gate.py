"""Yield points between chunks of long work, and the timing gate that pauses there: a timing
waits about one chunk of the other workers' work, not one stage."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch
from hwnas.export.parallel import TimingGate, install_gate, timing_slot
from hwnas.export.passes import ImagePasses
from hwnas.quant.policy import QuantPolicy
from hwnas.quant.ptq import PTQConfig, ptq
from torch import nn

from hwnas.core import cooperate

CHUNK_S = 0.02  # one chunk of a fake worker's work
CHUNKS = 60  # one "stage": 1.2 s


def _fork():  # noqa: ANN202 - a multiprocessing context
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method (fake workers share the test's functions)")
    return multiprocessing.get_context("fork")


def _computing_worker(gate: TimingGate, started, done) -> None:  # noqa: ANN001
    install_gate(gate)
    with gate.computing():
        started.set()
        for _ in range(CHUNKS):  # one long stage, a yield point between chunks
            time.sleep(CHUNK_S)
            cooperate.yield_point()
    done.set()


def _timing_worker(gate: TimingGate, ready, waits, busy) -> None:  # noqa: ANN001
    install_gate(gate)
    for event in ready:
        event.wait(10)
    with gate.computing():
        for _ in range(3):
            t0 = time.perf_counter()
            with timing_slot():
                waits.put(time.perf_counter() - t0)
                busy.put(gate.active.value)  # workers computing while this one times
                time.sleep(CHUNK_S)
            time.sleep(CHUNK_S)


def test_a_timing_waits_about_one_chunk_of_the_others_work() -> None:
    ctx = _fork()
    gate = TimingGate(ctx)
    started = [ctx.Event() for _ in range(3)]
    done = [ctx.Event() for _ in range(3)]
    waits, busy = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_computing_worker, args=(gate, s, d)) for s, d in zip(started, done)]
    procs.append(ctx.Process(target=_timing_worker, args=(gate, started, waits, busy)))
    for p in procs:
        p.start()
    try:
        got = [waits.get(timeout=20) for _ in range(3)]
        active = [busy.get(timeout=20) for _ in range(3)]
        stage_running = not all(d.is_set() for d in done)
    finally:
        for p in procs:
            p.join(timeout=20)
    assert all(p.exitcode == 0 for p in procs)
    assert stage_running, "the computing workers finished before the timings: nothing tested"
    assert active == [0, 0, 0]  # nothing computed during a timing
    # a stage is CHUNKS * CHUNK_S = 1.2 s; one chunk is 0.02 s (slack for a busy machine)
    assert max(got) < 0.4, got


def test_yield_points_only_pause_a_computing_worker() -> None:
    """Inside a timing (or outside any work) a yield point leaves the gate's counts alone."""
    gate = TimingGate(multiprocessing.get_context("spawn"))
    install_gate(gate)
    try:
        gate.waiting.value = 1  # as if another worker waited
        cooperate.yield_point()  # not computing: nothing to give up
        assert gate.active.value == 0
        gate.waiting.value = 0
        with gate.computing():
            assert gate.active.value == 1
            with timing_slot():
                gate.waiting.value = 1
                cooperate.yield_point()
                assert gate.active.value == 0 and gate.timing.value == 1
                gate.waiting.value = 0
            assert gate.active.value == 1
        assert gate.active.value == 0
    finally:
        install_gate(None)
    assert cooperate.install(None) is None  # uninstalling the gate removed its pause


def test_install_restores_the_previous_hook() -> None:
    calls: list[str] = []
    cooperate.yield_point()  # no hook: a no-op
    with cooperate.installed(lambda: calls.append("a")):
        with cooperate.installed(lambda: calls.append("b")):
            cooperate.yield_point()
        cooperate.yield_point()
    cooperate.yield_point()
    assert calls == ["b", "a"]


def test_long_passes_offer_a_yield_point_per_chunk() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                          nn.Flatten(), nn.Linear(4 * 8 * 8, 5)).eval()
    images = torch.randn(200, 3, 8, 8)
    calls = []
    with cooperate.installed(lambda: calls.append(1)):
        passes = ImagePasses(images, cpu_batch_size=64)
        passes.torch("float", model)
        torch_calls = len(calls)
        policy = QuantPolicy({"0": (8, 8), "2": (8, 8), "4": (8, 8)})
        del calls[:]
        ptq(model, policy, [(images[:64], None)], PTQConfig(bias_correction=True))
    assert torch_calls == 4  # 200 images in chunks of 64
    # weight scales, calibration (per batch and per layer), bias correction: per layer
    assert len(calls) >= 3 * 3
