"""One pass over the test images per exported file and per PyTorch model, and stage timings.

An export compares each file with several PyTorch models (the one it implements exactly, the
searched fake-quant model, the float model) and each device's recommendation verifies every
candidate again. :class:`ImagePasses` runs each ONNX file once with onnxruntime (one thread) and
each PyTorch model once, keeps the logits, and lets every comparison read them; the sessions it
made are reused for the onnxruntime timing at one thread. The PyTorch references may run on a
GPU (``device``) with TF32 off, so that they stay within the FP32 parity tolerance.

:class:`StageClock` adds up the seconds an export spends per stage (for the manifest and
``benchmarks/export_speed.py``).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np
import torch
from hwnas.latency.onnx_measure import Runner, make_runner
from torch import nn

from hwnas.core.cooperate import yield_point
from hwnas.core.errors import UserError
from hwnas.core.io import first_line

__all__ = ["StageClock", "ImagePasses", "no_tf32"]


class StageClock:
    """Seconds per named stage, added up over repeated entries (``with clock("qdq"): ...``);
    ``before()`` is called as each stage starts (a stage boundary)."""

    def __init__(self, before: Callable[[], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.before = before

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        if self.before is not None:
            self.before()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """Full float32 matmuls and convolutions on CUDA (TF32 rounds to ~1e-3, beyond the
    parity tolerance); the previous settings come back on exit."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class ImagePasses:
    """The logits of each ONNX file and PyTorch model on ``images``, computed once.

    ``onnx(path, data)``: onnxruntime at one thread (the session is kept in ``sessions`` under
    :func:`hwnas.export.recommend.verify_candidates`'s key); ``torch(key, model)``: the model in
    eval mode under ``no_grad`` on ``device`` (falls back to the CPU, with a note, when the
    model cannot run there). A key names one model: callers use distinct keys for distinct
    models (``"float"``, ``"searched"``, ``("deployed", path)``)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None = None, *,
                 device: str = "cpu", batch_size: int = 256, cpu_batch_size: int = 64) -> None:
        self.x = images.detach().to("cpu", torch.float32)
        self.np = self.x.numpy()
        self.labels = None if labels is None else labels.detach().cpu().numpy()
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        #: PyTorch passes on the CPU go in smaller chunks: a CIFAR-size activation of 256
        #: images is ~100 MB, which the allocator maps and page-faults afresh for every op
        #: (a third of the CPU time as system time); 64 images stay cheap and, on the
        #: CIFAR-10 models measured, give the same logits bit for bit
        self.cpu_batch_size = int(cpu_batch_size)
        self.logits: dict[Hashable, np.ndarray] = {}
        self.files: dict[str, np.ndarray] = {}
        self.sessions: dict[tuple, Runner] = {}
        self.notes: list[str] = []

    def onnx(self, path: str, data: bytes) -> np.ndarray:
        """The file's logits on every image (one onnxruntime pass); UserError when it fails."""
        if path in self.files:
            return self.files[path]
        runner = make_runner(data, runtime="onnxruntime", threads=1)
        name = runner.get_inputs()[0].name
        out = []
        for i in range(0, len(self.np), self.batch_size):
            yield_point()  # a timing another worker waits for may run between chunks
            chunk = self.np[i:i + self.batch_size]
            try:
                out.append(np.asarray(runner.run({name: chunk})[0]))
            except Exception as exc:  # onnxruntime raises several unrelated types
                raise UserError(f"onnxruntime failed on inputs of shape {list(chunk.shape)}: "
                                f"{first_line(exc)}") from exc
        self.sessions[("onnxruntime", path, 1, "f32")] = runner
        self.files[path] = np.concatenate(out)
        return self.files[path]

    def torch(self, key: Hashable, model: nn.Module) -> np.ndarray:
        """``model``'s logits on every image, computed the first time ``key`` is asked for."""
        if key not in self.logits:
            if self.device.type != "cpu":
                try:
                    with no_tf32():
                        self.logits[key] = self._run(copy.deepcopy(model).to(self.device))
                    return self.logits[key]
                except (RuntimeError, NotImplementedError) as exc:
                    self.notes.append(f"PyTorch reference {key!r} ran on the CPU: "
                                      f"{first_line(exc)}")
            self.logits[key] = self._run(model)
        return self.logits[key]

    def _run(self, model: nn.Module) -> np.ndarray:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        step = self.cpu_batch_size if device.type == "cpu" else self.batch_size
        was_training = model.training
        model.eval()
        try:
            out = []
            with torch.no_grad():
                for i in range(0, len(self.x), step):
                    yield_point()  # a timing another worker waits for may run between chunks
                    out.append(model(self.x[i:i + step].to(device)).float().cpu())
            return torch.cat(out).numpy()
        finally:
            model.train(was_training)

    def accuracy(self, logits: np.ndarray) -> float | None:
        """Top-1 accuracy (%) of ``logits`` against the labels (None without labels)."""
        if self.labels is None:
            return None
        return float(100.0 * np.mean(np.asarray(logits).argmax(1) == self.labels))

    def agreement_cache(self, references: dict[str, np.ndarray], files: Any) -> dict:
        """:func:`hwnas.export.recommend.verify_candidates`'s cache for onnxruntime, from the
        passes already made: ``{("onnxruntime", path, "f32"): (top-1 agreement with the file's
        reference, test accuracy)}`` for each candidate file run here."""
        cache = {}
        for f in files:
            got = self.files.get(f.path)
            if got is None or f.reference not in references:
                continue
            agreement = float((got.argmax(1) == references[f.reference].argmax(1)).mean())
            cache[("onnxruntime", f.path, "f32")] = (agreement, self.accuracy(got))
        return cache
