"""Measured devices: latency timed here, on this CPU or a CUDA GPU.

The name says runtime, threads and batch: ``cpu-ort-1t`` (onnxruntime, one thread),
``cpu-ort-all`` (every core), with OpenVINO installed ``cpu-ov-1t`` and ``cpu-ov-<cores>t``; any
``cpu-ort-<N>t`` / ``cpu-ov-<N>t``, with ``-b<B>`` for batch B (``cpu-ov-8t-b32``), is built on
request (:func:`parse_cpu_device`, the one place a CPU device's name is read). ``cuda-ort`` /
``cuda-torch`` / ``cuda-graph`` only when a GPU is present. The model of an architecture comes
from ``model_fn(arch)`` (ONNX bytes or a torch module) or, by default, from a freshly built
supernet of the space (latency does not depend on weights).
"""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from hwnas.latency.devices.base import Device, parse_archs, resolve_space
from hwnas.supernet.space import SearchSpace

from hwnas.core.errors import UserError


class MeasuredDevice(Device):
    """Latency measured here: on the CPU (``provider="cpu"``) with ``runtime`` onnxruntime or
    openvino (FP32: OpenVINO's ``f32`` precision hint), onnxruntime CUDA (``"cuda-ort"``) or
    PyTorch CUDA (``"cuda-torch"``).

    ``model_fn(arch)`` returns the model of an architecture as ONNX bytes or a torch module;
    without it, the subnet is extracted from a fresh supernet of the space (built once per
    space; random weights time the same as trained ones). Each architecture is timed
    ``repeats`` times after ``warmup`` runs on a batch of ``batch`` inputs; the median is the
    latency, ``cv × mean`` its std. ``cuda_graph`` (PyTorch CUDA only): time replays of a
    captured CUDA graph of the forward pass, i.e. the GPU's own time without the Python/launch
    overhead of eager PyTorch (what a compiled deployment approaches). ``fixed_batch``: the
    batch is part of the device (``-b<B>`` in a CPU device's name), so a workload timed at a
    batch of its own (the export's ``policy_batch``) keeps this one (:meth:`at_batch`).

    The export asks the device how to run there: :attr:`precision_hints` (the runtime's
    precisions to try) and :attr:`stream_counts` (OpenVINO's parallel infer requests).
    """

    kind = "measured"

    def __init__(self, name: str, *, threads: int, provider: str = "cpu",
                 model_fn: Callable[[Any], Any] | None = None, repeats: int = 30,
                 warmup: int = 5, batch: int = 1, cuda_graph: bool = False,
                 runtime: str = "onnxruntime", description: str = "",
                 fixed_batch: bool = False) -> None:
        from hwnas.latency.onnx_measure import RUNTIMES

        if runtime not in RUNTIMES:
            raise UserError(f"device {name!r}: runtime {runtime!r}; expected one of "
                            f"{', '.join(RUNTIMES)}")
        if runtime != "onnxruntime" and provider != "cpu":
            raise UserError(f"device {name!r}: runtime {runtime!r} runs on provider 'cpu', got "
                            f"{provider!r}")
        self.runtime = runtime
        if int(batch) < 1:
            raise UserError(f"device {name!r}: batch must be >= 1, got {batch}")
        if cuda_graph and provider != "cuda-torch":
            raise UserError(f"device {name!r}: cuda_graph needs provider 'cuda-torch', got "
                            f"{provider!r}")
        self.cuda_graph = bool(cuda_graph)
        self.name = name
        self.threads = threads
        self.batch = int(batch)
        self.fixed_batch = bool(fixed_batch)
        self.provider = provider
        self.model_fn = model_fn
        self.repeats = repeats
        self.warmup = warmup
        self.description = description
        self._supernets: dict[tuple, Any] = {}

    def at_batch(self, batch: int) -> MeasuredDevice:
        """This device timing a workload of ``batch`` images, unless its batch is fixed."""
        if self.fixed_batch or int(batch) == self.batch:
            return self
        if int(batch) < 1:
            raise UserError(f"device {self.name!r}: batch must be >= 1, got {batch}")
        other = copy.copy(self)
        other.batch, other._supernets = int(batch), {}
        return other

    @property
    def precision_hints(self) -> tuple[str, ...]:
        """The precisions a file is tried under here: ``f32`` (as written) and the reduced ones
        the runtime can be asked for (:func:`reduced_precisions`)."""
        return ("f32", *reduced_precisions(self.runtime))

    @property
    def stream_counts(self) -> tuple[int, ...]:
        """The stream counts beyond one tried at this device's threads and batch
        (:func:`stream_counts`)."""
        return stream_counts(self.runtime, self.threads, self.batch)

    def _model(self, space: SearchSpace, arch: Any) -> Any:
        if self.model_fn is not None:
            return self.model_fn(arch)
        key = (space.name, repr(sorted(space.config().items())))
        if key not in self._supernets:
            self._supernets[key] = space.build_supernet().eval()
        return self._supernets[key].extract(arch)

    def _onnx(self, space: SearchSpace, model: Any) -> bytes:
        if isinstance(model, (bytes, bytearray, memoryview)):
            return bytes(model)
        import torch
        from hwnas.supernet.onnx import onnx_bytes

        if not isinstance(model, torch.nn.Module):
            raise UserError(
                f"model_fn must return ONNX bytes or a torch.nn.Module, got {type(model).__name__}"
            )
        return onnx_bytes(model, torch.zeros(1, *space.input_shape))

    def latency_with_std(self, space, archs):
        space = resolve_space(space)
        parsed = parse_archs(space, archs)
        med = np.empty(len(parsed))
        std = np.empty(len(parsed))
        for i, arch in enumerate(parsed):
            model = self._model(space, arch)
            if self.provider == "cuda-torch":
                med[i], std[i] = self._time_torch_cuda(space, model)
                continue
            stats = self._time_ort(self._onnx(space, model))
            med[i], std[i] = stats.median_ms, stats.cv * stats.mean_ms
        return med, std

    def latency(self, space, archs):
        return self.latency_with_std(space, archs)[0]

    def _time_ort(self, model: bytes):
        from hwnas.latency.onnx_measure import measure_onnx

        if self.provider == "cpu":
            return measure_onnx(model, threads=self.threads, repeats=self.repeats,
                                warmup=self.warmup, batch=self.batch, runtime=self.runtime)
        return _measure_ort_cuda(model, repeats=self.repeats, warmup=self.warmup,
                                 batch=self.batch)

    def _time_torch_cuda(self, space: SearchSpace, model: Any) -> tuple[float, float]:
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"device {self.name!r} needs a CUDA GPU, and torch sees none")
        if not isinstance(model, torch.nn.Module):
            raise UserError(f"device {self.name!r} times torch modules; model_fn returned bytes")
        model = model.cuda().eval()
        x = torch.zeros(self.batch, *space.input_shape, device="cuda")
        times = []
        with torch.no_grad():
            run = lambda: model(x)  # noqa: E731
            if self.cuda_graph:  # warm up on a side stream, then capture (PyTorch's recipe)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        model(x)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model(x)
                run = graph.replay
            for _ in range(self.warmup):
                run()
            torch.cuda.synchronize()
            for _ in range(self.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
        t = np.asarray(times)
        return float(np.median(t)), float(t.std())


def _measure_ort_cuda(model: bytes, *, repeats: int, warmup: int, batch: int = 1):
    """Median/cv timing of ONNX bytes on onnxruntime's CUDA provider (the timing loop of
    :func:`hwnas.latency.ondevice.time_session`, the statistics of
    :func:`hwnas.latency.onnx_measure.measure_onnx`)."""
    import onnxruntime as ort
    from hwnas.latency.ondevice import time_session
    from hwnas.latency.onnx_measure import LatencyStats, random_input

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model, sess_options=opts, providers=["CUDAExecutionProvider"])
    t = time_session(session, random_input(session, batch=batch), warmup, repeats)
    return LatencyStats(t["latency_ms"], t["p95_ms"], t["mean_ms"], t["cv"], repeats, warmup, 1,
                        batch)


def _gpu_present() -> bool:
    """An NVIDIA driver is loaded (checked without importing torch)."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists()


def _ort_cuda_available() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


#: Reduced inference precisions a runtime can be asked for (beyond running the file as written).
_REDUCED = {"onnxruntime": (), "openvino": ("bf16", "f16")}
#: OpenVINO stream counts tried beside one stream. 8 because on a 16-core Xeon at 8 threads the
#: smallest CIFAR net still gained from 2 to 4 streams.
STREAM_COUNTS = (2, 4, 8)


def stream_counts(runtime: str, threads: int, batch: int | None) -> tuple[int, ...]:
    """The stream counts beyond one tried on ``runtime`` at ``threads`` and ``batch``: on
    OpenVINO those of :data:`STREAM_COUNTS` that divide the batch into equal sub-batches and
    leave every stream at least one thread; none on onnxruntime, at one thread or at batch 1."""
    if runtime != "openvino" or batch is None or threads < 2 or batch < 2:
        return ()
    return tuple(s for s in STREAM_COUNTS if s <= threads and batch % s == 0)


def reduced_precisions(runtime: str) -> tuple[str, ...]:
    """The precision hints tried on ``runtime`` beyond f32 (onnxruntime's CPU provider has no
    BF16/FP16 mode: none)."""
    return _REDUCED.get(runtime, ())


#: Short names of the CPU runtimes in device names.
RUNTIME_TAGS = {"ort": "onnxruntime", "ov": "openvino"}
_CPU_NAME = re.compile(r"^cpu-(?P<rt>ort|ov)-(?P<threads>[1-9][0-9]*)t(?:-b(?P<batch>[1-9][0-9]*))?$")


def _cpu_device(name: str, tag: str, threads: int, batch: int | None = None
                ) -> tuple[Callable[..., Device], str]:
    """The factory and description of a CPU device; ``batch`` given: fixed by its name."""
    runtime = RUNTIME_TAGS[tag]
    text = f"{runtime} on this CPU, {threads} thread{'s' if threads > 1 else ''}" + (
        f", batch {batch}" if (batch or 1) > 1 else "")
    return (functools.partial(MeasuredDevice, name, threads=threads, batch=batch or 1,
                              runtime=runtime, description=text, fixed_batch=batch is not None),
            text)


def parse_cpu_device(name: str) -> tuple[str, int, int] | None:
    """``(runtime, threads, batch)`` of a CPU device name ``cpu-<ort|ov>-<N>t[-b<B>]``
    (``cpu-ort-all``: onnxruntime on every core), else ``None``."""
    if name == "cpu-ort-all":
        return "onnxruntime", os.cpu_count() or 1, 1
    m = _CPU_NAME.match(name)
    if m is None:
        return None
    return RUNTIME_TAGS[m["rt"]], int(m["threads"]), int(m["batch"] or 1)


def _measured_factories() -> dict[str, tuple[Callable[..., Device], str]]:
    from hwnas.latency.onnx_measure import openvino_available

    cores = os.cpu_count() or 1
    out: dict[str, tuple[Callable[..., Device], str]] = {
        "cpu-ort-1t": _cpu_device("cpu-ort-1t", "ort", 1),
        "cpu-ort-all": (functools.partial(MeasuredDevice, "cpu-ort-all", threads=cores,
                                          description=f"onnxruntime on this CPU, {cores} threads"),
                        f"onnxruntime on this CPU, all {cores} threads"),
    }
    if openvino_available():
        for threads in dict.fromkeys((1, cores)):
            out[f"cpu-ov-{threads}t"] = _cpu_device(f"cpu-ov-{threads}t", "ov", threads)
    if _gpu_present():
        out["cuda-torch"] = (functools.partial(MeasuredDevice, "cuda-torch", threads=1,
                                               provider="cuda-torch",
                                               description="PyTorch on the CUDA GPU, batch 1"),
                             "PyTorch on the CUDA GPU, batch 1")
        out["cuda-graph"] = (functools.partial(MeasuredDevice, "cuda-graph", threads=1,
                                               provider="cuda-torch", cuda_graph=True,
                                               description="PyTorch CUDA graph replay, batch 1"),
                             "PyTorch on the CUDA GPU as a replayed CUDA graph (the GPU's own "
                             "time, no launch overhead), batch 1")
    if _ort_cuda_available():
        out["cuda-ort"] = (functools.partial(MeasuredDevice, "cuda-ort", threads=1,
                                             provider="cuda-ort",
                                             description="onnxruntime CUDA provider, batch 1"),
                           "onnxruntime CUDA provider, batch 1")
    return out



def cpu_device_factory(name: str) -> Callable[..., Device] | None:
    """The factory of any CPU device name ``cpu-<ort|ov>-<N>t[-b<B>]`` (built on request, so
    any thread count and batch works), ``None`` for another name; OpenVINO must be installed
    for ``cpu-ov-*``."""
    m = _CPU_NAME.match(name)
    if m is None:
        return None
    if m["rt"] == "ov":
        from hwnas.latency.onnx_measure import openvino_available

        if not openvino_available():
            raise UserError(f"device {name!r} needs OpenVINO: pip install 'hwnas[openvino]'")
    batch = int(m["batch"]) if m["batch"] else None
    return _cpu_device(name, m["rt"], int(m["threads"]), batch)[0]
