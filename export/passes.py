"""One pass over the test images per exported file and per PyTorch model, and stage timings.

An export compares each file with several PyTorch models (the one it implements exactly, the
searched fake-quant model, the float model) and each device's recommendation verifies every
candidate again. :class:`ImagePasses` runs each ONNX file once with onnxruntime (one thread) and
each PyTorch model once, keeps the logits, and lets every comparison read them; the sessions it
made are reused for the onnxruntime timing at one thread. The PyTorch references may run on a
GPU (``device``) with TF32 off, so that they stay within the FP32 parity tolerance. With
PyTorch on a GPU, a file's pass runs beside the PyTorch pass it is compared with
(``together``); a file's pass runs over one one-thread session per core the process may use
(a parallel export's share per worker, :func:`hwnas.export.parallel.worker_cores`) where
PyTorch runs on a GPU or there are at least 4 such cores: the same logits bit for bit.

:class:`StageClock` adds up the seconds an export spends per stage (for the manifest and
``benchmarks/export_speed.py``).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch
from hwnas.latency.onnx_measure import Runner, make_runner
from torch import nn

from hwnas.core.affinity import free_cores
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
    :func:`hwnas.export.recommend.verify_candidates`'s key; ``onnx_sessions`` such sessions
    share the pass); ``torch(key, model)``: the model in eval mode under ``no_grad`` on
    ``device`` (falls back to the CPU, with a note, when the model cannot run there);
    ``together(path, data, key, model)``: both side by side. A key names one model: callers use
    distinct keys for distinct models (``"float"``, ``"searched"``, ``("deployed", path)``)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None = None, *,
                 device: str = "cpu", batch_size: int = 256, cpu_batch_size: int = 64,
                 onnx_batch_size: int = 64, cores: int | None = None,
                 onnx_sessions: int | None = None, side_by_side: bool | None = None) -> None:
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
        #: onnxruntime's chunks: between two chunks is a yield point, so a timing another
        #: worker waits for waits at most one chunk of this file (the exact QDQ file of the
        #: largest CIFAR-10 model takes ~15 s per 256 images on a busy 2-core machine); one
        #: thread computes each image alone, so the logits do not depend on the chunk size
        #: (bit-identical at 64 and 256 on every CIFAR-10 file checked, export_speed.md)
        self.onnx_batch_size = int(onnx_batch_size)
        # the cores the passes may use: a parallel export's share per worker, else those
        # other work leaves free now (on a busy machine a second thread only competes)
        cores = max(1, int(cores if cores is not None else free_cores()))
        gpu = self.device.type != "cpu"
        #: whether a file's pass runs beside the PyTorch pass it is compared with
        #: (:meth:`together`): by default with PyTorch on a GPU, whose thread leaves its core
        #: to onnxruntime; with PyTorch on the CPU it did not pay on a shared 2-core machine
        #: (export_speed.md, Session 34), so there the passes run one after the other
        self.side_by_side = bool(side_by_side if side_by_side is not None else gpu)
        #: one-thread onnxruntime sessions of a file that share its pass, chunk by chunk: one
        #: per core the passes may use when PyTorch runs on a GPU (its thread mostly waits) or
        #: when there are at least 4 of them (a many-core machine exporting fewer models than
        #: it has pairs of cores), else 1 (on a busy 2-core machine a second thread did not
        #: pay, Session 34). Each chunk is computed as one session alone computes it, so the
        #: logits are the same bit for bit (export_speed.md, Session 36)
        self.onnx_sessions = max(1, int(onnx_sessions if onnx_sessions is not None
                                        else cores if gpu or cores >= 4 else 1))
        self.logits: dict[Hashable, np.ndarray] = {}
        self.files: dict[str, np.ndarray] = {}
        self.sessions: dict[tuple, Runner] = {}
        self.notes: list[str] = []

    def onnx(self, path: str, data: bytes) -> np.ndarray:
        """The file's logits on every image (one onnxruntime pass); UserError when it fails."""
        if path not in self.files:
            self._onnx_pass(path, data, None)
        return self.files[path]

    def torch(self, key: Hashable, model: nn.Module) -> np.ndarray:
        """``model``'s logits on every image, computed the first time ``key`` is asked for."""
        if key not in self.logits:
            run = _TorchPass(self, key, model)
            while run.done < len(self.x):
                yield_point()  # a timing another worker waits for may run between chunks
                run.advance_to(run.done + run.step)
            self.logits[key] = run.result()
        return self.logits[key]

    def together(self, path: str, data: bytes, key: Hashable, model: nn.Module
                 ) -> tuple[np.ndarray, np.ndarray]:
        """The file's onnxruntime pass (:meth:`onnx`) and ``model``'s PyTorch pass
        (:meth:`torch`) side by side: onnxruntime on a second thread, in step with PyTorch
        chunk by chunk (both release the GIL while they compute). Each computes the same
        chunks as alone, so the logits are the same bit for bit; the two threads join before
        every yield point, so a worker that pauses there for another's timing leaves nothing
        running. One pass that was made before, or no core for a second thread
        (``side_by_side``): one after the other. Returns both logits."""
        if self.side_by_side and path not in self.files and key not in self.logits:
            run = _TorchPass(self, key, model)
            self._onnx_pass(path, data, run)
            self.logits[key] = run.result()
        return self.onnx(path, data), self.torch(key, model)

    def _onnx_pass(self, path: str, data: bytes, beside: _TorchPass | None) -> None:
        """One onnxruntime pass of the file in chunks of ``onnx_batch_size`` images. With several
        ``onnx_sessions`` or a PyTorch pass ``beside``, each step's chunks run on threads
        (one chunk per session) while ``beside`` advances over the same images on this one;
        everything joins before the next yield point."""
        runners = [make_runner(data, runtime="onnxruntime", threads=1)
                   for _ in range(self.onnx_sessions)]
        name = runners[0].get_inputs()[0].name

        def run(runner: Runner, chunk: np.ndarray) -> np.ndarray:
            try:
                return np.asarray(runner.run({name: chunk})[0])
            except Exception as exc:  # onnxruntime raises several unrelated types
                raise UserError(f"onnxruntime failed on inputs of shape {list(chunk.shape)}: "
                                f"{first_line(exc)}") from exc
        out = []
        size = self.onnx_batch_size
        step = size * len(runners)
        threaded = beside is not None or len(runners) > 1
        with contextlib.ExitStack() as stack:
            pool = stack.enter_context(ThreadPoolExecutor(
                len(runners), thread_name_prefix="hwnas-ort")) if threaded else None
            for i in range(0, len(self.np), step):
                yield_point()  # a timing another worker waits for may run between steps
                chunks = [self.np[j:j + size] for j in range(i, min(i + step, len(self.np)), size)]
                if pool is None:
                    out.append(run(runners[0], chunks[0]))
                    continue
                futures = [pool.submit(run, r, c) for r, c in zip(runners, chunks)]
                failed: BaseException | None = None
                try:
                    if beside is not None:
                        beside.advance_to(i + sum(len(c) for c in chunks))
                except BaseException as exc:  # noqa: BLE001 - re-raised once the chunks are joined
                    failed = exc
                wait(futures)
                out.extend(f.result() for f in futures)  # the file's own failure first
                if failed is not None:
                    raise failed
        self.sessions[("onnxruntime", path, 1, "f32")] = runners[0]
        self.files[path] = np.concatenate(out)

    def share(self, path: str, same_as: str, key: Hashable, same_key: Hashable) -> None:
        """``path`` is ``same_as``'s graph (byte for byte; the model's metadata may differ) and
        ``key`` names the same PyTorch model as ``same_key``: their passes are those made for
        ``same_as`` and ``same_key``, where made (the same computation gives the same logits)."""
        if same_as in self.files:
            self.files[path] = self.files[same_as]
        if same_key in self.logits:
            self.logits[key] = self.logits[same_key]

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


class _TorchPass:
    """One PyTorch model's pass over the images of an :class:`ImagePasses`, advanced chunk by
    chunk (``advance_to``) so that it can run in step with an onnxruntime pass. Chunks of
    ``cpu_batch_size`` images on the CPU, ``batch_size`` on a GPU, always from image 0, so the
    logits do not depend on how the pass was advanced. On ``passes.device`` (a copy, TF32 off)
    when that is not the CPU; a model that cannot run there runs on the CPU from the start,
    with a note."""

    def __init__(self, passes: ImagePasses, key: Hashable, model: nn.Module) -> None:
        self.passes, self.key, self.model = passes, key, model
        self.out: list[torch.Tensor] = []
        self.done = 0
        self.target = model
        if passes.device.type != "cpu":
            try:
                self.target = copy.deepcopy(model).to(passes.device)
            except (RuntimeError, NotImplementedError) as exc:
                self._to_cpu(exc)

    @property
    def device(self) -> torch.device:
        return next((p.device for p in self.target.parameters()), torch.device("cpu"))

    @property
    def step(self) -> int:
        cpu = self.device.type == "cpu"
        return self.passes.cpu_batch_size if cpu else self.passes.batch_size

    def _to_cpu(self, exc: BaseException) -> None:
        self.passes.notes.append(f"PyTorch reference {self.key!r} ran on the CPU: "
                                 f"{first_line(exc)}")
        self.target, self.out, self.done = self.model, [], 0

    def advance_to(self, stop: int) -> None:
        """Compute whole chunks until at least ``stop`` images are done."""
        while self.done < min(stop, len(self.passes.x)):
            try:
                self._chunk()
            except (RuntimeError, NotImplementedError) as exc:
                if self.device.type == "cpu":
                    raise
                self._to_cpu(exc)

    def _chunk(self) -> None:
        model, device = self.target, self.device
        x = self.passes.x[self.done:self.done + self.step].to(device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), (no_tf32() if device.type != "cpu" else contextlib.nullcontext()):
                self.out.append(model(x).float().cpu())
        finally:
            model.train(was_training)
        self.done += len(x)

    def result(self) -> np.ndarray:
        self.advance_to(len(self.passes.x))
        return torch.cat(self.out).numpy()
