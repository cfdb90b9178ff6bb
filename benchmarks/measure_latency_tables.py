"""Measure latency tables of the nb201, fbnet, mbv3 and vit spaces on every runtime this machine has.

One command, one time budget (issue 23.1). The architectures come from committed sample files
(``benchmarks/results/latency_tables/archs_<space>.txt.gz``, written by ``--write-samples``
from HELP's tables): nb201 2,000 (HELP's 10 reference architectures and the shipped meta
predictor's 20 first), fbnet 1,000 drawn from HELP's 5,000 (so new columns join HELP's table),
mbv3 the 150 of ``benchmarks/results/latency_mbv3/mbv3.csv`` and more, vit 300 with its
extremes (the smallest, the largest and every corner of embedding x depth x heads x MLP ratio),
each list in a seeded random order. ``--spaces`` picks the spaces (default nb201, fbnet, mbv3;
``--spaces vit`` measures the transformer, whose table
``benchmarks/latency_metatrain_mbv3.py --spaces vit --tables ...`` meta-trains on). Devices (``<tag>-<runtime>-<threads>t`` / ``<gpu>-<runtime>-b<batch>``):

* CPU (``--runtimes cpu``), at each of ``--threads``: onnxruntime (``ort``, intra-op threads),
  PyTorch eager (``torch``) and frozen TorchScript (``ts``) with ``torch.set_num_threads``, and
  OpenVINO (``ov``, ``INFERENCE_NUM_THREADS``, f32) when it imports (``--cpu-runtimes``
  picks some of them); on request three execution settings of those: onnxruntime with every
  graph optimisation off (``ortnoopt``), OpenVINO at bf16 precision (``ovbf16``) and
  onnxruntime running the architecture's int8 QDQ file (``ortint8``: static quantization,
  :func:`hwnas.export.layer_timer.quantize_qdq`, made once per architecture);
* GPU (``--runtimes gpu``, when CUDA is present): PyTorch eager (``torch``) and a replayed
  CUDA graph (``cudagraph``) at batch 1 and 64 (``hwnas.latency.devices.MeasuredDevice``).

Method, as ``hwnas latency measure``: untimed warm-up, median of ``--repeats`` timed calls,
coefficient of variation; above ``--max-cv`` measured once more (the cv of every cell is kept
in ``<space>_<tag>_cv.csv.gz`` and summarised in the JSON). Each architecture is exported to
ONNX once (and traced to TorchScript once); its runtimes run in a seeded random order, and the
spaces and thread counts alternate round by round, so drift does not sort the table. With
``--workers N`` a thread count ``t`` runs in ``min(N, cores // t)`` processes, each pinned
(``os.sched_setaffinity``) to its own ``t`` cores (distinct physical cores first); thread
counts never run at the same time. ``--max-minutes`` stops before a round that would not fit
and writes what it has (tables hold only architectures measured on every device);
``--resume DIR`` continues DIR's tables (same machine and libraries) with what they lack.

Anchors (``--anchors K``, default 8; ``--no-anchors`` turns them off): the speed of a device
changes between device sessions (another host of the same model) and within one (drift), which
a single pass cannot tell from the architectures' own differences. So K architectures per space
(:func:`choose_anchors`: spread over the FLOPs range of the committed sample, the same in every
session) are measured on every device in every round, shuffled among that round's
architectures. A round's speed factor on a device is the median over the anchors of (the
anchor's time in that round / its median over every round so far, earlier sessions' included
with ``--resume``); each cell is divided by its round's factor (:func:`speed_factors`). The
automatic round size keeps the anchors near ``ANCHOR_SHARE`` of a round's cells.

Writes under ``--out``: ``<space>_<tag>.csv.gz`` (arch + one column per device, ms; normalised
by the round's speed factor when anchored, an anchor's row the median over its rounds),
``<space>_<tag>_cv.csv.gz``, with anchors ``<space>_<tag>_raw.csv.gz`` (arch, round, raw ms)
and ``<space>_<tag>_anchors.csv.gz`` (arch, round, raw ms of every anchor measurement), and
``machine_<tag>.json`` (CPU model and flags, cores, library versions, settings, coverage, the
anchors, every round's factors and their spread per device as the drift). Tables without the
raw file (measured before anchors) read as before. ``<tag>`` is the CPU's family (``xeon``,
``epyc`` ...) for CPU runtimes and the GPU's name (``h200``) for GPU ones. See
results/latency_tables/DEVICE_COMMAND.md.

    python benchmarks/measure_latency_tables.py --out OUT --runtimes cpu --threads 1 4 16 \\
        --workers 16 --max-minutes 8.5
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import functools
import gzip
import io
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hwnas.core.io import write_atomic, write_json

REPO = Path(__file__).resolve().parent.parent
TABLES_DIR = REPO / "benchmarks" / "results" / "latency_tables"
MBV3_CSV = REPO / "benchmarks" / "results" / "latency_mbv3" / "mbv3.csv"
#: space -> default number of architectures
DEFAULT_N = {"nb201": 2000, "fbnet": 1000, "mbv3": 400, "vit": 300}
#: spaces measured when --spaces is not given (vit on request: its table is new)
DEFAULT_SPACES = ("nb201", "fbnet", "mbv3")
CPU_RUNTIMES = ("ort", "torch", "ts", "ov", "ortnoopt", "ovbf16", "ortint8")
#: runtimes measured when --cpu-runtimes is not given (the last three are execution settings
#: of the first and the fourth, measured on request: ``ortnoopt`` onnxruntime with every graph
#: optimisation off, each ONNX node run as written, no fusion; ``ovbf16`` OpenVINO with bf16
#: inference precision, on CPUs with avx512_bf16 or AMX; ``ortint8`` onnxruntime on the int8
#: QDQ file)
DEFAULT_CPU_RUNTIMES = ("ort", "torch", "ts", "ov")
GPU_RUNTIMES = ("torch", "cudagraph")
GPU_BATCHES = (1, 64)
#: anchor architectures per space, measured on every device in every round
DEFAULT_ANCHORS = 8
#: with anchors and an automatic round size, the share of a round's cells the anchors take
ANCHOR_SHARE = 0.15
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni",
             "amx_tile", "amx_bf16", "amx_int8", "neon", "asimd")


# --------------------------------------------------------------------------------------------
# samples
# --------------------------------------------------------------------------------------------


def corner_archs(space: Any) -> list[str]:
    """The extremes of a ``vit`` space: every combination of the smallest and largest embedding,
    depth, heads and MLP ratio (the same in every block), so a table spans the space's whole
    latency range; the smallest and largest subnets are two of them."""
    from itertools import product

    from hwnas.supernet.spaces.vit import ViTArch

    c = space.cfg
    out = []
    for e, d, h, r in product(*[(ch[0], ch[-1]) for ch in (
            c.embed_choices, c.depth_choices, c.heads_choices, c.mlp_ratio_choices)]):
        out.append(space.to_string(ViTArch(e, ((h, float(r)),) * d)))
    return list(dict.fromkeys(out))


def required_archs(space_name: str, help_table: Any | None) -> list[str]:
    """Architectures every sample of the space holds: HELP's 10 reference ones (from the shared
    table's ``arch_idx``), the shipped meta predictor's reference ones, for mbv3 the
    architectures of the existing mbv3 table (so its new columns extend that table), and for
    vit its extremes (:func:`corner_archs`)."""
    from hwnas.latency.predictors import load_pretrained
    from hwnas.latency.tables import HELP_PROTOCOLS

    out: list[str] = []
    if space_name in HELP_PROTOCOLS and help_table is not None:
        rows = HELP_PROTOCOLS[space_name].reference_rows(help_table)
        out += [help_table.archs[r] for r in rows]
    try:
        out += list(load_pretrained(space_name).reference_archs)
    except Exception:  # noqa: BLE001 - a space without a shipped predictor has none
        pass
    if space_name == "mbv3" and MBV3_CSV.is_file():
        with open(MBV3_CSV, newline="") as fh:
            out += [r["arch"] for r in csv.DictReader(fh)]
    if space_name == "vit":
        from hwnas.supernet.spaces import get_space

        out += corner_archs(get_space("vit"))
    return list(dict.fromkeys(out))


def make_sample(space: Any, n: int, seed: int, required: list[str],
                pool: list[str] | None = None) -> list[str]:
    """``n`` distinct canonical strings (at least the required ones), drawn from ``pool`` (a
    table's architectures) or from the space's sampler, returned in a seeded random order."""
    rng = np.random.default_rng(seed)
    chosen = list(dict.fromkeys(space.to_string(space.parse(a)) for a in required))
    seen = set(chosen)
    if pool is not None:
        for i in rng.permutation(len(pool)):
            if len(chosen) >= n:
                break
            if pool[i] not in seen:
                seen.add(pool[i])
                chosen.append(pool[i])
    else:
        tries = 0
        while len(chosen) < n and tries < 100 * n:
            tries += 1
            s = space.to_string(space.sample(rng))
            if s not in seen:
                seen.add(s)
                chosen.append(s)
    return [chosen[i] for i in rng.permutation(len(chosen))]


def sample_path(space_name: str) -> Path:
    return TABLES_DIR / f"archs_{space_name}.txt.gz"


def write_samples(seed: int, sizes: dict[str, int]) -> None:
    """Write the committed sample files (nb201 and fbnet need HELP's tables, the shared data)."""
    from hwnas.latency.tables import load_shared_table
    from hwnas.supernet.spaces import get_space

    for name, n in sizes.items():
        space = get_space(name)
        table = load_shared_table(name, space=space) if name in ("nb201", "fbnet") else None
        pool = list(table.archs) if name == "fbnet" else None
        archs = make_sample(space, n, seed, required_archs(name, table), pool)
        write_atomic(sample_path(name), gzip.compress(("\n".join(archs) + "\n").encode(), mtime=0))
        path = sample_path(name)
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"{name}: {len(archs)} architectures -> {shown}")


def choose_anchors(space: Any, archs: list[str], k: int) -> list[str]:
    """``k`` architectures of ``archs`` spread over their FLOPs range (the ones at the
    quantiles ``(i + 0.5) / k``, ties broken by the string): deterministic for a given sample,
    so every session of a table measures the same anchors; FLOPs stands in for latency, which
    is unknown before measuring."""
    ranked = sorted(dict.fromkeys(archs), key=lambda a: (space.flops(space.from_string(a)), a))
    return spread(ranked, k)


def spread(ranked: list[str] | tuple[str, ...], k: int) -> list[str]:
    """The ``k`` items of ``ranked`` at the quantiles ``(i + 0.5) / k`` (all when fewer)."""
    k = min(max(k, 0), len(ranked))
    return [ranked[int((i + 0.5) * len(ranked) / k)] for i in range(k)]


def anchor_ratios(anchor_times: dict[tuple[str, str], dict[int, dict[str, float]]],
                  devices: list[str]) -> dict[int, dict[str, list[float]]]:
    """Per round and device, each anchor's time in that round / its median over every round.
    ``anchor_times``: ``(space, arch) -> round -> device -> ms``."""
    ref: dict[tuple[tuple[str, str], str], float] = {}
    for key, per_round in anchor_times.items():
        for d in devices:
            v = [t[d] for t in per_round.values() if d in t and t[d] > 0]
            if v:
                ref[(key, d)] = float(np.median(v))
    rounds_seen = sorted({r for per_round in anchor_times.values() for r in per_round})
    return {r: {d: [per_round[r][d] / ref[(key, d)] for key, per_round in anchor_times.items()
                    if r in per_round and per_round[r].get(d, 0) > 0 and (key, d) in ref]
                for d in devices} for r in rounds_seen}


def speed_factors(anchor_times: dict[tuple[str, str], dict[int, dict[str, float]]],
                  devices: list[str]) -> dict[int, dict[str, float]]:
    """Per round and device, the median of :func:`anchor_ratios` (the round's speed relative
    to the anchors' typical one); a device without an anchor time in a round gets factor 1."""
    return {r: {d: float(np.median(v)) if v else 1.0 for d, v in per.items()}
            for r, per in anchor_ratios(anchor_times, devices).items()}


def factor_errors(anchor_times: dict[tuple[str, str], dict[int, dict[str, float]]],
                  devices: list[str]) -> dict[int, dict[str, float]]:
    """Per round and device, the standard error of the log speed factor from the anchors'
    disagreement (robust: 1.4826 MAD of the log ratios, times 1.2533 / sqrt(n) for a median):
    a drift no larger than this is the anchors' own noise. NaN with fewer than 2 anchors."""
    out: dict[int, dict[str, float]] = {}
    for r, per in anchor_ratios(anchor_times, devices).items():
        out[r] = {}
        for d, v in per.items():
            lg = np.log(np.array(v))
            out[r][d] = (float(1.2533 * 1.4826 * np.median(np.abs(lg - np.median(lg)))
                               / np.sqrt(len(lg))) if len(lg) >= 2 else float("nan"))
    return out


def read_sample(space_name: str, n: int) -> list[str]:
    """The first ``n`` architectures of the committed sample (its order is the random one)."""
    path = sample_path(space_name)
    if not path.is_file():
        raise SystemExit(f"{path} is missing; run --write-samples where the shared data is")
    archs = [a for a in gzip.decompress(path.read_bytes()).decode().splitlines() if a]
    return archs[:n]


# --------------------------------------------------------------------------------------------
# cores and machine
# --------------------------------------------------------------------------------------------


def physical_order(cpus: list[int]) -> list[int]:
    """``cpus`` ordered so that one logical CPU of every physical core comes first (SMT
    siblings after), from ``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list``."""
    first, second, seen = [], [], set()
    for c in sorted(cpus):
        try:
            sib = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text()
            key = sib.strip()
        except OSError:
            key = str(c)
        (second if key in seen else first).append(c)
        seen.add(key)
    return first + second


def core_sets(cpus: list[int], threads: int, workers: int) -> list[list[int]]:
    """Disjoint sets of ``threads`` CPUs, at most ``workers`` of them (at least one: with
    fewer CPUs than ``threads`` the one set is every CPU)."""
    order = physical_order(cpus)
    n = max(1, min(workers, len(order) // threads))
    if len(order) < threads:
        return [order]
    # one set per worker, taken across physical cores first, sorted for readability
    return [sorted(order[i * threads:(i + 1) * threads]) for i in range(n)]


def cpu_info() -> dict:
    """CPU model, the flags that matter for inference, logical/physical cores."""
    from hwnas.latency.machine import cpu_flags, cpu_model

    flags = cpu_flags()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    physical = len({Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
                    .read_text().strip() for c in cpus
                    if Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
                    .exists()}) or None
    return {"cpu_model": cpu_model(), "logical_cpus": os.cpu_count(), "usable_cpus": len(cpus),
            "physical_cores": physical, "flags": {f: f in flags for f in CPU_FLAGS},
            "machine": platform.machine(), "python": platform.python_version()}


def cpu_tag(model: str) -> str:
    """Short CPU family name for device columns: ``xeon``, ``epyc``, ``core``, ``ryzen`` ...
    or the first word of the model."""
    low = model.lower()
    for fam in ("xeon", "epyc", "ryzen", "threadripper", "core", "graviton", "neoverse",
                "cortex", "apple"):
        if fam in low:
            return fam
    word = "".join(ch for ch in (low.split() or ["cpu"])[0] if ch.isalnum())
    return word or "cpu"


def gpu_tag(name: str) -> str:
    """Short GPU name for device columns: ``NVIDIA H200`` -> ``h200``, ``NVIDIA GeForce RTX
    4090`` -> ``4090`` (the first word with a digit, else the last word)."""
    words = [w for w in name.lower().split() if w not in ("nvidia", "geforce", "tesla", "rtx")]
    digit = [w for w in words if any(ch.isdigit() for ch in w)]
    word = (digit or words or ["gpu"])[0]
    return "".join(ch for ch in word if ch.isalnum() or ch == "-") or "gpu"


def versions() -> dict:
    out = {"numpy": np.__version__}
    for mod in ("torch", "onnx", "onnxruntime", "openvino"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - an absent runtime is recorded as absent
            out[mod] = None
    return out


def openvino_available() -> bool:
    try:
        import openvino  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


# --------------------------------------------------------------------------------------------
# timing (one process)
# --------------------------------------------------------------------------------------------


def time_calls(fn: Any, warmup: int, repeats: int) -> tuple[float, float]:
    """Median (ms) and coefficient of variation of ``repeats`` timed calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    t = np.empty(repeats)
    for i in range(repeats):
        s = time.perf_counter()
        fn()
        t[i] = time.perf_counter() - s
    t *= 1e3
    mean = float(t.mean())
    return float(np.median(t)), float(t.std() / mean) if mean > 0 else 0.0


def forget_torchscript_types() -> None:
    """Drop the TorchScript types that tracing registered process-wide (ONNX export traces too).

    Why: every traced architecture leaves its compiled types, graphs and frozen constants in
    TorchScript's global registry, about 35 MB per NB-201 network, so a worker that exports
    hundreds of them ran out of memory (23 GB after 650). Nothing traced is alive when this runs
    (the files are written; measurement loads them anew). These are the calls PyTorch's own JIT
    tests make between tests; without them (another PyTorch) the leak stays, nothing breaks."""
    import torch

    state = getattr(torch.jit, "_state", None)
    for clear in (getattr(state, "_clear_class_state", None),
                  getattr(torch._C, "_jit_clear_class_registry", None)):
        if clear is not None:
            clear()
    recursive = getattr(torch.jit, "_recursive", None)
    if recursive is not None and hasattr(recursive, "ConcreteTypeStore"):
        recursive.concrete_type_store = recursive.ConcreteTypeStore()


class CpuRunner:
    """Times one architecture's runtimes in this process (models cached per architecture)."""

    def __init__(self, warmup: int, repeats: int, max_cv: float) -> None:
        self.warmup, self.repeats, self.max_cv = warmup, repeats, max_cv
        self.supernets: dict[str, Any] = {}

    def module(self, space_name: str, arch: str) -> Any:
        from hwnas.supernet.spaces import get_space

        if space_name not in self.supernets:
            import torch

            torch.manual_seed(0)
            self.supernets[space_name] = get_space(space_name).build_supernet().eval()
        space = get_space(space_name)
        return self.supernets[space_name].extract(space.from_string(arch)).eval()

    def prepare(self, space_name: str, arch: str, onnx_path: Path, ts_path: Path | None) -> None:
        """Export the architecture once: ONNX file and (unless ``ts_path`` is None: no
        TorchScript device) frozen TorchScript file."""
        import torch
        from hwnas.supernet.onnx import onnx_bytes
        from hwnas.supernet.spaces import get_space

        model = self.module(space_name, arch)
        x = torch.zeros(1, *get_space(space_name).input_shape)
        write_atomic(onnx_path, onnx_bytes(model, x))
        if ts_path is not None:
            with torch.inference_mode():
                ts = torch.jit.freeze(torch.jit.trace(model, x))
            buf = io.BytesIO()
            torch.jit.save(ts, buf)
            del ts
            write_atomic(ts_path, buf.getvalue())
        forget_torchscript_types()

    def measure(self, runtime: str, threads: int, space_name: str, arch: str, onnx_path: Path,
                ts_path: Path) -> tuple[float, float]:
        """(median ms, cv) of one runtime at ``threads``; re-measured once above ``max_cv``."""
        med, cv = self._once(runtime, threads, space_name, arch, onnx_path, ts_path)
        if cv > self.max_cv:
            med, cv = self._once(runtime, threads, space_name, arch, onnx_path, ts_path)
        return med, cv

    def _once(self, runtime, threads, space_name, arch, onnx_path, ts_path):
        import torch
        from hwnas.supernet.spaces import get_space

        shape = (1, *get_space(space_name).input_shape)
        if runtime == "ort":
            from hwnas.latency.onnx_measure import measure_onnx

            s = measure_onnx(onnx_path, threads=threads, warmup=self.warmup,
                             repeats=self.repeats)
            return s.median_ms, s.cv
        if runtime == "ortint8":
            from hwnas.export.layer_timer import quantize_qdq
            from hwnas.latency.onnx_measure import measure_onnx

            int8_path = onnx_path.with_suffix(".int8.onnx")
            if not int8_path.exists():  # once per architecture, before any timed call
                write_atomic(int8_path, quantize_qdq(onnx_path.read_bytes()))
            s = measure_onnx(int8_path, threads=threads, warmup=self.warmup,
                             repeats=self.repeats)
            return s.median_ms, s.cv
        if runtime == "ortnoopt":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
            name = sess.get_inputs()[0].name
            x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
            return time_calls(lambda: sess.run(None, {name: x}), self.warmup, self.repeats)
        if runtime in ("ov", "ovbf16"):
            import openvino as ov

            core = ov.Core()
            compiled = core.compile_model(core.read_model(str(onnx_path)), "CPU", {
                "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_PRECISION_HINT": "bf16" if runtime == "ovbf16" else "f32"})
            req = compiled.create_infer_request()
            x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
            return time_calls(lambda: req.infer({0: x}), self.warmup, self.repeats)
        torch.set_num_threads(threads)
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        if runtime == "torch":
            model = self.module(space_name, arch)
        elif runtime == "ts":
            model = torch.jit.load(str(ts_path))
        else:
            raise ValueError(f"unknown CPU runtime {runtime!r}")
        # TorchScript's profiling executor optimises the graph during its first calls
        warmup = max(self.warmup, 3) if runtime == "ts" else self.warmup
        with torch.inference_mode():
            return time_calls(lambda: model(x), warmup, self.repeats)


_RUNNER: CpuRunner | None = None


def _init_worker(cores_q: Any, warmup: int, repeats: int, max_cv: float) -> None:
    """Pool initializer: pin this process to its own core set, one runner per process."""
    global _RUNNER
    cores = cores_q.get()
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    _RUNNER = CpuRunner(warmup, repeats, max_cv)


def run_job(job: tuple) -> tuple:
    """One architecture in one worker: export if asked, then each (runtime, threads) in the
    job's (shuffled) order. Returns ``(key, {device: (median, cv)}, seconds)``."""
    key, space_name, arch, onnx_path, ts_path, export, measures = job
    t0 = time.perf_counter()
    runner = _RUNNER if _RUNNER is not None else CpuRunner(3, 10, 0.1)
    if export:
        with_ts = any(runtime == "ts" for _, runtime, _ in measures)
        runner.prepare(space_name, arch, Path(onnx_path), Path(ts_path) if with_ts else None)
    out = {}
    for device, runtime, threads in measures:
        if runtime.startswith("ov") and not Path(onnx_path).exists():
            continue
        out[device] = runner.measure(runtime, threads, space_name, arch, Path(onnx_path),
                                     Path(ts_path))
    return key, out, time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# the measurement loop
# --------------------------------------------------------------------------------------------


def cpu_devices(tag: str, threads: list[int], with_ov: bool,
                runtimes: tuple[str, ...] = DEFAULT_CPU_RUNTIMES) -> list[tuple[str, str, int]]:
    """(device name, runtime, threads) of every CPU device, threads ascending."""
    runtimes = [r for r in CPU_RUNTIMES if r in runtimes and (not r.startswith("ov") or with_ov)]
    return [(f"{tag}-{r}-{t}t", r, t) for t in sorted(set(threads)) for r in runtimes]



def no_time_for_a_round(durations: list[float], deadline: float) -> bool:
    """Whether another round (as long as the longest of the last three) would end after
    ``deadline`` (a ``time.monotonic()`` value)."""
    est = max(durations[-3:]) if durations else 0.0
    return time.monotonic() + est > deadline

def rounds(sizes: dict[str, int], per_round: int) -> list[list[tuple[str, int]]]:
    """Round-robin schedule: each round takes from every space a share proportional to its
    size, so a budget that stops early leaves every space covered in proportion."""
    total = sum(sizes.values())
    step = {s: max(1, round(per_round * n / total)) for s, n in sizes.items() if n > 0}
    pos = {s: 0 for s in step}
    out = []
    while any(pos[s] < sizes[s] for s in step):
        rnd = []
        for s in step:
            hi = min(sizes[s], pos[s] + step[s])
            rnd += [(s, i) for i in range(pos[s], hi)]
            pos[s] = hi
        out.append(rnd)
    return out


def read_csv_gz(path: Path) -> list[list[str]]:
    """The rows of a gzip-compressed CSV file."""
    return list(csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))


def write_csv_gz(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    """Write a gzip-compressed CSV file atomically (no timestamp: same rows, same bytes)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    write_atomic(path, gzip.compress(buf.getvalue().encode(), mtime=0))


class Tables:
    """Per-space results: ``arch -> {device: (median, cv)}``, written as complete rows only.

    With ``anchors`` (space -> anchor architectures) every row also knows its round, the
    anchors' cells are kept per round, and the written table is divided by the rounds' speed
    factors (:func:`speed_factors`); round numbers continue across resumed sessions."""

    def __init__(self, archs: dict[str, list[str]], devices: list[str],
                 anchors: dict[str, list[str]] | None = None) -> None:
        self.archs, self.devices, self.anchors = archs, devices, anchors
        self.cells: dict[str, dict[str, dict[str, tuple[float, float]]]] = {s: {} for s in archs}
        self.round_of: dict[str, dict[str, int]] = {s: {} for s in archs}
        #: space -> anchor -> round -> {device: (median, cv)}
        self.anchor_cells: dict[str, dict[str, dict[int, dict[str, tuple[float, float]]]]] = {
            s: {} for s in archs}
        self.next_round = 0  # the first round number of this session
        self.earlier_sessions: list[dict] = []  # command and date of resumed sessions

    @property
    def anchored(self) -> bool:
        return self.anchors is not None

    def add(self, space: str, arch: str, cells: dict[str, tuple[float, float]],
            round_id: int | None = None) -> None:
        self.cells[space].setdefault(arch, {}).update(cells)
        if round_id is not None:
            self.round_of[space][arch] = round_id

    def add_anchor(self, space: str, arch: str, round_id: int,
                   cells: dict[str, tuple[float, float]]) -> None:
        self.anchor_cells[space].setdefault(arch, {}).setdefault(round_id, {}).update(cells)

    def preload(self, folder: Path, tag: str) -> int:
        """Cells of an earlier run's ``<space>_<tag>.csv.gz`` (and ``_cv``; with anchors the
        ``_raw`` and ``_anchors`` files, whose rounds this session's follow) in ``folder`` with
        the same devices and anchors; returns how many architectures were loaded."""
        n = 0
        for space in self.archs:
            paths = [folder / f"{space}_{tag}{x}.csv.gz" for x in ("", "_cv")]
            if not all(p.is_file() for p in paths):
                continue
            med, cv = (read_csv_gz(p) for p in paths)
            if med[0] != ["arch", *self.devices] or cv[0] != med[0]:
                raise SystemExit(f"{paths[0]} has devices {med[0][1:]}, this run {self.devices}; "
                                 f"resume with the same runtimes and threads")
            raw_path = folder / f"{space}_{tag}_raw.csv.gz"
            if raw_path.is_file() != self.anchored:
                raise SystemExit(
                    f"{paths[0]} was measured {'with' if raw_path.is_file() else 'without'} "
                    f"anchors, this run {'with' if self.anchored else 'without'}; resume "
                    + ("with --no-anchors" if self.anchored else "without --no-anchors")
                    + " or measure into a new table")
            if not self.anchored:
                for m, c in zip(med[1:], cv[1:]):
                    self.add(space, m[0], {d: (float(a), float(b))
                                           for d, a, b in zip(self.devices, m[1:], c[1:])})
                    n += 1
                continue
            cvs = {row[0]: [float(v) for v in row[1:]] for row in cv[1:]}
            anc_path = folder / f"{space}_{tag}_anchors.csv.gz"
            if not anc_path.is_file():
                raise SystemExit(f"{anc_path} is missing: copy it with {raw_path.name}, or "
                                 f"measure into a new table")
            raw = read_csv_gz(raw_path)
            anc = read_csv_gz(anc_path)
            if raw[0] != ["arch", "round", *self.devices] or anc[0] != raw[0]:
                raise SystemExit(f"{raw_path}: unexpected columns {raw[0]}")
            prev = sorted({row[0] for row in anc[1:]})
            if prev != sorted(self.anchors[space]):
                raise SystemExit(f"{raw_path}: measured with the anchors {prev}, this run "
                                 f"{sorted(self.anchors[space])}; resume with the same "
                                 f"--anchors and sample")
            for row in raw[1:]:
                if row[1] == "anchor":
                    continue
                self.add(space, row[0], {d: (float(v), cvs[row[0]][i])
                                         for i, (d, v) in enumerate(zip(self.devices, row[2:]))},
                         int(row[1]))
                n += 1
            for row in anc[1:]:
                r = int(row[1])
                c = cvs.get(row[0], [0.0] * len(self.devices))
                self.add_anchor(space, row[0], r, {d: (float(v), c[i]) for i, (d, v) in
                                                   enumerate(zip(self.devices, row[2:])) if v})
                self.next_round = max(self.next_round, r + 1)
        return n

    def pending(self) -> dict[str, list[str]]:
        """Per space, the architectures not yet measured on every device (sample order; the
        anchors are measured every round, never as ordinary rows)."""
        out = {}
        for s in self.archs:
            done = set(self.complete(s)) | set((self.anchors or {}).get(s, []))
            out[s] = [a for a in self.archs[s] if a not in done]
        return out

    def complete(self, space: str) -> list[str]:
        return [a for a in self.archs[space]
                if all(d in self.cells[space].get(a, {}) for d in self.devices)]

    def anchor_times(self) -> dict[tuple[str, str], dict[int, dict[str, float]]]:
        """``(space, anchor) -> round -> device -> ms`` of every anchor cell so far."""
        return {(s, a): {r: {d: c[0] for d, c in cells.items()} for r, cells in per.items()}
                for s, by_arch in self.anchor_cells.items() for a, per in by_arch.items()}

    def factors(self) -> dict[int, dict[str, float]]:
        """Round -> device -> speed factor, from every anchor cell so far (empty unanchored)."""
        return speed_factors(self.anchor_times(), self.devices) if self.anchored else {}

    def anchor_summary(self) -> dict | None:
        """The anchors, every round's factors and their spread per device (the drift: the
        largest factor over the smallest, the standard deviation of log factors, and beside it
        the typical standard error of one round's log factor, :func:`factor_errors`)."""
        if not self.anchored:
            return None
        f = self.factors()
        se = factor_errors(self.anchor_times(), self.devices)
        drift = {}
        for d in self.devices:
            v = np.array([f[r][d] for r in f])
            e = np.array([se[r][d] for r in se])
            if len(v):
                drift[d] = {"factor_min": round(float(v.min()), 4),
                            "factor_max": round(float(v.max()), 4),
                            "max_over_min": round(float(v.max() / v.min()), 4),
                            "log_sd": round(float(np.log(v).std()), 4),
                            "log_se_median": round(float(np.nanmedian(e)), 4)
                            if np.isfinite(e).any() else None}
        return {"k": max((len(v) for v in self.anchors.values()), default=0),
                "archs": self.anchors, "rounds_this_session_from": self.next_round,
                "factors": {str(r): {d: round(x, 5) for d, x in v.items()} for r, v in f.items()},
                "drift": drift}

    def write(self, out: Path, tag: str) -> dict:
        summary = {}
        f = self.factors()
        for space in self.archs:
            cells = self.cells[space]
            done = self.complete(space)
            listed = set(self.archs[space])
            extra = [a for a in cells
                     if a not in listed and all(d in cells[a] for d in self.devices)]
            done += extra  # resumed cells of architectures beyond this run's --n
            # an anchor's rounds measured on every device
            anchors = {a: {r: c for r, c in per.items() if all(d in c for d in self.devices)}
                       for a, per in self.anchor_cells[space].items()}
            anchors = {a: per for a, per in anchors.items() if per}
            if not done and not anchors:
                continue
            rows: dict[str, tuple[list[float], list[float], list[float]]] = {}  # norm, cv, raw
            for a in done:
                raw = [cells[a][d][0] for d in self.devices]
                fr = f.get(self.round_of[space].get(a, -1), {})
                rows[a] = ([x / fr.get(d, 1.0) for x, d in zip(raw, self.devices)],
                           [cells[a][d][1] for d in self.devices], raw)
            for a, per in anchors.items():
                rows[a] = tuple([float(np.median([fn(r, c, d) for r, c in per.items()]))
                                 for d in self.devices] for fn in (
                    lambda r, c, d: c[d][0] / f.get(r, {}).get(d, 1.0),
                    lambda r, c, d: c[d][1], lambda r, c, d: c[d][0]))
            fmt = lambda v: f"{v:.6g}"  # noqa: E731
            write_csv_gz(out / f"{space}_{tag}.csv.gz", ["arch", *self.devices],
                         [[a, *map(fmt, v[0])] for a, v in rows.items()])
            write_csv_gz(out / f"{space}_{tag}_cv.csv.gz", ["arch", *self.devices],
                         [[a, *map(fmt, v[1])] for a, v in rows.items()])
            if self.anchored:
                write_csv_gz(out / f"{space}_{tag}_raw.csv.gz", ["arch", "round", *self.devices],
                             [[a, "anchor" if a in anchors else self.round_of[space].get(a, ""),
                               *map(fmt, v[2])] for a, v in rows.items()])
                write_csv_gz(out / f"{space}_{tag}_anchors.csv.gz",
                             ["arch", "round", *self.devices],
                             [[a, r, *(fmt(c[d][0]) if d in c else "" for d in self.devices)]
                              for a, per in self.anchor_cells[space].items()
                              for r, c in sorted(per.items())])
            med = {d: np.array([v[0][i] for v in rows.values()])
                   for i, d in enumerate(self.devices)}
            cv = {d: np.array([v[1][i] for v in rows.values()])
                  for i, d in enumerate(self.devices)}
            summary[space] = {
                "architectures": len(rows), "target": len(self.archs[space]),
                **({"anchors_measured": len(anchors)} if self.anchored else {}),
                "median_ms": {d: round(float(np.median(v)), 5) for d, v in med.items()},
                "median_cv": {d: round(float(np.median(v)), 4) for d, v in cv.items()},
                "cells_above_max_cv": {d: int((v > MAX_CV[0]).sum()) for d, v in cv.items()},
            }
        return summary


MAX_CV = [0.1]  # set from --max-cv (read by Tables.write)


def run_anchors(args: argparse.Namespace,
                archs: dict[str, list[str]]) -> dict[str, list[str]] | None:
    """The anchors of each space (:func:`choose_anchors` over the whole committed sample, so
    they do not depend on ``--n``), or None with ``--no-anchors``."""
    if args.no_anchors or args.anchors <= 0:
        return None
    return {s: list(sample_anchors(s, args.anchors)) for s in archs}


def sample_anchors(space_name: str, k: int) -> list[str]:
    """:func:`choose_anchors` of the space's committed sample."""
    path = sample_path(space_name)
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else (0, 0)
    return spread(_flops_ranked_sample(space_name, str(path), stamp), k)


@functools.lru_cache(maxsize=8)
def _flops_ranked_sample(space_name: str, path: str, stamp: tuple[int, int]) -> tuple[str, ...]:
    """The committed sample (``path``, as of ``stamp``) ordered as :func:`choose_anchors`
    orders it; cached, as it computes the FLOPs of every architecture of the sample."""
    from hwnas.supernet.spaces import get_space

    everything = read_sample(space_name, 10**9)
    return tuple(choose_anchors(get_space(space_name), everything, len(everything)))


def round_size(args: argparse.Namespace, unanchored: int,
               anchors: dict[str, list[str]] | None) -> int:
    """``--round``, else ``unanchored``, raised with anchors so that they take about
    ``ANCHOR_SHARE`` of a round's cells."""
    if args.round:
        return args.round
    n_anchors = sum(len(v) for v in (anchors or {}).values())
    return max(unanchored, int(np.ceil(n_anchors * (1 - ANCHOR_SHARE) / ANCHOR_SHARE)))


def round_jobs(rnd: list[tuple[str, int]], anchors: dict[str, list[str]] | None,
               rng: np.random.Generator) -> list[tuple[str, str, int]]:
    """A round's items, ``(kind, space, index)`` with kind ``arch`` or ``anchor`` (every anchor
    of the run, also of spaces with nothing left to measure: each round's factor then rests on
    the same anchors), shuffled together with ``rng``; unanchored, the round as is (no shuffle:
    the order and random stream of runs before anchors)."""
    items = [("arch", s, i) for s, i in rnd]
    if anchors is None:
        return items
    for s, names in anchors.items():
        items += [("anchor", s, j) for j in range(len(names))]
    return [items[k] for k in rng.permutation(len(items))]


def measure_cpu(args: argparse.Namespace, archs: dict[str, list[str]], tag: str,
                deadline: float, log: Any, save: Any) -> tuple[Tables, dict]:
    """All CPU devices on ``archs`` until ``deadline`` (``time.monotonic``)."""
    with_ov = openvino_available() and not args.no_openvino
    devices = cpu_devices(tag, args.threads, with_ov, tuple(args.cpu_runtimes))
    anchors = run_anchors(args, archs)
    tables = Tables(archs, [d for d, _, _ in devices], anchors)
    todo = resume(args, tables, tag, log)
    by_threads: dict[int, list[tuple[str, str, int]]] = {}
    for d in devices:
        by_threads.setdefault(d[2], []).append(d)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pools: dict[int, Any] = {}
    layout: dict[int, list[list[int]]] = {}
    ctx = mp.get_context("spawn")
    if args.workers:
        for t in by_threads:
            sets = core_sets(cpus, t, args.workers)
            layout[t] = sets
            q = ctx.Queue()
            for s in sets:
                q.put(s)
            pools[t] = ctx.Pool(len(sets), _init_worker, (q, args.warmup, args.repeats,
                                                          args.max_cv))
    else:
        _init_worker(_EmptyQueue(), args.warmup, args.repeats, args.max_cv)
    rng = np.random.default_rng(args.seed)
    cache = Path(tempfile.mkdtemp(prefix="hwnas_tables_"))
    per_round = round_size(args, max(8, 4 * max(len(v) for v in layout.values()))
                           if layout else 8, anchors)
    schedule = rounds({s: len(a) for s, a in todo.items()}, per_round)
    durations: list[float] = []
    phase_s: dict[int, float] = {}  # seconds spent per thread count (export in the first)
    job_s = {"arch": 0.0, "anchor": 0.0}  # worker seconds per kind of item
    stopped = False
    try:
        for r, rnd in enumerate(schedule):
            if no_time_for_a_round(durations, deadline):
                stopped = True
                break
            t0 = time.monotonic()
            round_id = tables.next_round + r
            items = round_jobs(rnd, anchors, rng)
            # anchors keep their exported files for the whole session (exported once)
            paths = {it: (str(cache / f"{it[0]}_{it[1]}_{it[2]}.onnx"),
                          str(cache / f"{it[0]}_{it[1]}_{it[2]}.pt")) for it in items}
            first = True
            for t in sorted(by_threads):
                t_phase = time.monotonic()
                jobs = []
                for it in items:
                    kind, s, i = it
                    arch = todo[s][i] if kind == "arch" else anchors[s][i]
                    export = first and (kind == "arch" or not Path(paths[it][0]).exists())
                    order = rng.permutation(len(by_threads[t]))
                    jobs.append((it, s, arch, *paths[it], export,
                                 [by_threads[t][k] for k in order]))
                results = (pools[t].imap_unordered(run_job, jobs) if t in pools
                           else map(run_job, jobs))
                for (kind, s, i), cells, sec in results:
                    job_s[kind] += sec
                    if kind == "arch":
                        tables.add(s, todo[s][i], cells, round_id)
                    else:
                        tables.add_anchor(s, anchors[s][i], round_id, cells)
                first = False
                phase_s[t] = phase_s.get(t, 0.0) + time.monotonic() - t_phase
            for it, (on, tp) in paths.items():
                if it[0] == "arch":
                    for p in (on, tp):
                        Path(p).unlink(missing_ok=True)
            durations.append(time.monotonic() - t0)
            summary = save(tag, tables, {"devices": devices, "rounds_done": len(durations),
                                         "anchors": tables.anchor_summary()})
            log(f"round {r + 1}/{len(schedule)} {durations[-1]:.1f} s ("
                + ", ".join(f"{t}t {v:.0f} s" for t, v in phase_s.items()) + " so far): "
                + ", ".join(f"{s} {v['architectures']}" for s, v in summary.items()))
    finally:
        for p in pools.values():
            p.terminate()
        for p in cache.iterdir():
            p.unlink(missing_ok=True)
        cache.rmdir()
    busy = sum(job_s.values())
    return tables, {"devices": devices, "openvino": with_ov, "stopped_by_budget": stopped,
                    "core_sets": {str(t): v for t, v in layout.items()},
                    "rounds_done": len(durations), "rounds_planned": len(schedule),
                    "round_size": per_round,
                    "seconds_per_thread_count": {str(t): round(v, 1) for t, v in phase_s.items()},
                    "round_seconds_median": round(float(np.median(durations)), 2)
                    if durations else None,
                    "anchors": tables.anchor_summary(),
                    "anchor_share_of_worker_seconds": round(job_s["anchor"] / busy, 4)
                    if busy and anchors is not None else None}


def resume(args: argparse.Namespace, tables: Tables, tag: str, log: Any) -> dict[str, list[str]]:
    """With ``--resume DIR``: load DIR's tables of ``tag`` (after checking that DIR's machine
    JSON describes this CPU and these library versions) and return what is left to measure."""
    if args.resume is None:
        return tables.pending()
    prev_path = args.resume / f"machine_{tag}.json"
    if prev_path.is_file():
        prev = json.loads(prev_path.read_text())
        now = {"cpu": cpu_info(), "versions": versions()}
        keys = [("cpu", "cpu_model"), ("cpu", "flags"), ("cpu", "usable_cpus"),
                ("versions", "torch"), ("versions", "onnxruntime"), ("versions", "openvino")]
        diff = [f"{a}.{b}: {prev.get(a, {}).get(b)!r} -> {now[a].get(b)!r}" for a, b in keys
                if prev.get(a, {}).get(b) != now[a].get(b)]
        if diff:
            raise SystemExit(f"--resume {args.resume}: another machine or software measured "
                             f"those tables ({'; '.join(diff)}); measure into a new table")
        tables.earlier_sessions = prev.get("sessions") or [
            {k: prev.get(k) for k in ("command", "date")}]
    n = tables.preload(args.resume, tag)
    log(f"resumed {n} architectures of {tag} from {args.resume}")
    return tables.pending()


class _EmptyQueue:
    def get(self) -> list:
        return []


def measure_gpu(args: argparse.Namespace, archs: dict[str, list[str]], deadline: float,
                log: Any, save: Any) -> tuple[Tables, dict, str]:
    """PyTorch eager and CUDA-graph latency at batch 1 and 64, runtimes in random order."""
    import torch
    from hwnas.latency.devices import MeasuredDevice
    from hwnas.supernet.spaces import get_space

    name = torch.cuda.get_device_name(0)
    tag = gpu_tag(name)
    current: dict[str, Any] = {}
    devices = [MeasuredDevice(f"{tag}-{kind}-b{b}", threads=1, provider="cuda-torch", batch=b,
                              cuda_graph=kind == "cudagraph", repeats=args.gpu_repeats,
                              warmup=args.warmup, model_fn=lambda a: current["m"])
               for kind in GPU_RUNTIMES for b in GPU_BATCHES]
    anchors = run_anchors(args, archs)
    tables = Tables(archs, [d.name for d in devices], anchors)
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(0)
    supernets = {s: get_space(s).build_supernet().eval() for s in archs}
    todo = resume(args, tables, tag, log)
    per_round = round_size(args, 32, anchors)
    schedule = rounds({s: len(a) for s, a in todo.items()}, per_round)
    durations: list[float] = []
    stopped = False
    for r, rnd in enumerate(schedule):
        if no_time_for_a_round(durations, deadline):
            stopped = True
            break
        t0 = time.monotonic()
        round_id = tables.next_round + r
        for kind, s, i in round_jobs(rnd, anchors, rng):
            space = get_space(s)
            arch = todo[s][i] if kind == "arch" else anchors[s][i]
            current["m"] = supernets[s].extract(space.from_string(arch)).eval().cuda()
            cells = {}
            for k in rng.permutation(len(devices)):
                d = devices[k]
                med, std = d.latency_with_std(space, [arch])
                cv = float(std[0] / med[0]) if med[0] > 0 else 0.0
                if cv > args.max_cv:
                    med, std = d.latency_with_std(space, [arch])
                    cv = float(std[0] / med[0]) if med[0] > 0 else 0.0
                cells[d.name] = (float(med[0]), cv)
            if kind == "arch":
                tables.add(s, arch, cells, round_id)
            else:
                tables.add_anchor(s, arch, round_id, cells)
        durations.append(time.monotonic() - t0)
        summary = save(tag, tables, {"gpu": name, "rounds_done": len(durations),
                                     "anchors": tables.anchor_summary()})
        log(f"gpu round {r + 1}/{len(schedule)} {durations[-1]:.1f} s: "
            + ", ".join(f"{s} {v['architectures']}" for s, v in summary.items()))
    return tables, {"gpu": name, "cuda": torch.version.cuda, "stopped_by_budget": stopped,
                    "devices": [d.name for d in devices], "repeats": args.gpu_repeats,
                    "rounds_done": len(durations), "rounds_planned": len(schedule),
                    "round_size": per_round, "anchors": tables.anchor_summary()}, tag


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output directory")
    ap.add_argument("--spaces", nargs="+", default=list(DEFAULT_SPACES), choices=list(DEFAULT_N),
                    help="spaces to measure (default: " + " ".join(DEFAULT_SPACES) + ")")
    ap.add_argument("--n", nargs="+", type=int, default=None,
                    help="architectures per space, in --spaces order (default "
                    + ", ".join(f"{k} {v}" for k, v in DEFAULT_N.items()) + ")")
    ap.add_argument("--runtimes", nargs="+", default=["cpu", "gpu"], choices=["cpu", "gpu"],
                    help="cpu: ort/torch/ts/ov at --threads; gpu: torch/cudagraph b1/b64 "
                         "(skipped without CUDA)")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--workers", type=int, default=0,
                    help="parallel pinned processes per thread count (0: one process, no pinning)")
    ap.add_argument("--max-minutes", type=float, default=8.5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per CPU cell")
    ap.add_argument("--gpu-repeats", type=int, default=15, help="timed calls per GPU cell")
    ap.add_argument("--max-cv", type=float, default=0.1)
    ap.add_argument("--round", type=int, default=0, help="architectures per round (0: auto)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default=None, help="CPU tag of device names (default: CPU family)")
    ap.add_argument("--no-openvino", action="store_true")
    ap.add_argument("--cpu-runtimes", nargs="+", default=list(DEFAULT_CPU_RUNTIMES),
                    choices=CPU_RUNTIMES,
                    help="CPU runtimes to measure (default: ort torch ts ov; ov and ovbf16 only "
                         "where OpenVINO imports)")
    ap.add_argument("--anchors", type=int, default=DEFAULT_ANCHORS,
                    help="anchor architectures per space, measured every round to normalise "
                         f"the rounds' speed (default {DEFAULT_ANCHORS})")
    ap.add_argument("--no-anchors", action="store_true",
                    help="no anchors: raw medians only, as tables measured before anchors")
    ap.add_argument("--resume", type=Path, default=None,
                    help="continue the tables of an earlier run in this folder (same machine, "
                         "libraries, runtimes and threads): measure only what they lack, write "
                         "old and new rows to --out")
    ap.add_argument("--write-samples", action="store_true",
                    help="write the committed sample files of --spaces (nb201 and fbnet from "
                         "HELP's tables) and exit")
    args = ap.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.max_minutes * 60
    sizes = dict(zip(args.spaces, args.n or [DEFAULT_N[s] for s in args.spaces]))
    if args.write_samples:
        write_samples(args.seed, sizes)
        return 0
    if args.out is None:
        ap.error("--out is required")
    MAX_CV[0] = args.max_cv
    args.out.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(f"[{time.monotonic() - start:6.1f} s] {msg}", flush=True)  # noqa: E731
    archs = {s: read_sample(s, n) for s, n in sizes.items()}
    info = cpu_info()
    base = {"command": "python benchmarks/measure_latency_tables.py "
                       + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "cpu": info, "versions": versions(),
            "settings": {"warmup": args.warmup, "repeats": args.repeats,
                         "gpu_repeats": args.gpu_repeats, "max_cv": args.max_cv,
                         "threads": sorted(set(args.threads)), "workers": args.workers,
                         "max_minutes": args.max_minutes, "seed": args.seed,
                         "anchors": 0 if args.no_anchors else args.anchors,
                         "anchor_share": ANCHOR_SHARE,
                         "statistic": "median of repeats after warm-up, ms per batch"}}
    do_gpu = "gpu" in args.runtimes
    if do_gpu:
        try:
            import torch

            do_gpu = torch.cuda.is_available()
        except Exception:  # noqa: BLE001
            do_gpu = False
        if not do_gpu:
            log("no CUDA GPU: GPU runtimes skipped")
    def save(tag: str, tables: Tables, meta: dict) -> dict:
        """Tables and machine JSON as they stand (after every round: a killed run keeps them)."""
        spaces = tables.write(args.out, tag)
        this = {k: base[k] for k in ("command", "date")}
        write_json(args.out / f"machine_{tag}.json",
                   {**base, "machine_tag": tag, **meta, "spaces": spaces,
                    "sessions": [*tables.earlier_sessions, this],
                    "seconds": round(time.monotonic() - start, 1)})
        return spaces

    if "cpu" in args.runtimes:
        tag = args.tag or cpu_tag(info["cpu_model"])
        part_deadline = start + (deadline - start) / 2 if do_gpu else deadline
        tables, meta = measure_cpu(args, archs, tag, part_deadline, log, save)
        save(tag, tables, meta)
        log(f"wrote {args.out}/machine_{tag}.json")
    if do_gpu:
        tables, meta, tag = measure_gpu(args, archs, deadline, log, save)
        save(tag, tables, meta)
        log(f"wrote {args.out}/machine_{tag}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
