"""hwnas PTQ against peer post-training quantizers, each file run on the integer runtimes of this CPU.

Issue 49. For CIFAR-10 mbv3 subnets of a supernet checkpoint (BatchNorm recalibrated as the
search does) one float model and one set of calibration images (stratified, seeded, from the
training split) are quantized by:

* ``hwnas_int8``: hwnas PTQ (per-channel min-max weights, min-max activations, bias correction)
  exported as the export writes it: portable, 7-bit weights where a 16-bit pair sum could
  saturate (:func:`hwnas.export.qdq.build_qdq`), the deployment form with requantization;
* ``hwnas_int8_full``: the same with full-range int8 weights (the file before issue 49);
* ``hwnas_int8_first7``: full range but the first layer at 7 bits (NNCF's overflow fix);
* ``hwnas_int8_adaround``: ``hwnas_int8`` with AdaRound (learned rounding, see below), forced
  (``PTQConfig(rounding="adaround-all")``: ``"adaround"`` leaves an int8 file as nearest
  rounding makes it, benchmarks/adaround_steps.md, Session 34);
* ``hwnas_w4a8``: W4A8, first and last layer W8A8, MSE weights and activations (the
  ``ptq_w4a8`` recipe of ``benchmarks/quant_recipes.py``), portable;
* ``hwnas_w4a8_adaround``: the same with AdaRound (``PTQConfig(rounding="adaround")``,
  :mod:`hwnas.quant.adaround`: learned rounding, layer by layer on the calibration images,
  ``--adaround-iterations`` Adam steps per layer, every layer, the W8 ones too), portable;
* ``hwnas_w6a8`` / ``hwnas_w6a8_adaround``: the same two with 6-bit weights (first and last
  layer W8A8), AdaRound forced (``"adaround-all"``: ``"adaround"`` leaves a file without
  weights below 6 bits to nearest rounding, benchmarks/quant_peers.md, Session 37);
* ``ort_minmax`` / ``ort_entropy`` / ``ort_percentile`` / ``ort_minmax_reduce_range``:
  onnxruntime ``quantize_static`` (QDQ, per channel, uint8 activations, int8 weights);
* ``nncf_int8``: ``nncf.quantize`` with its defaults (ONNX backend), when NNCF is installed;
* ``nncf_w4a8``: NNCF with 4-bit weights in every layer (``weights_quantization_params``
  ``num_bits=4``, NNCF has no first/last-layer exception), on its OpenVINO backend with the NPU
  target (its ONNX backend exports 8-bit Q/DQ pairs only): an OpenVINO IR, run on OpenVINO only;
* ``aimet_adaround_w4a8``: AIMET (``aimet-onnx``, when installed) AdaRound at W4A8, first and
  last layer W8A8 like ``hwnas_w4a8``: ``QuantizationSimModel`` (per-channel symmetric weights,
  ``tf_enhanced`` ranges), ``Adaround.apply_adaround`` with ``--aimet-iterations`` steps per
  layer, written by ``sim.to_onnx_qdq()`` (uint8 activations).

Each file's top-1 on the test images is measured with onnxruntime as it runs here, with
``session.x64quantprecision=1`` (U8U8 kernels: no saturation on any CPU), with OpenVINO, and
with OpenVINO restricted to AVX-512 without VNNI (``ONEDNN_MAX_CPU_ISA=AVX512_CORE``: oneDNN's
saturating ``vpmaddubsw`` kernels, a Skylake-SP-class CPU) where this CPU has AVX-512BW; OpenVINO
is optional. Beside it: each file's worst 16-bit pair sum read from the file
(:mod:`hwnas.export.qdq.int16`) and its onnxruntime time per batch (paired, interleaved rounds,
medians). The machine's CPU and ISA flags are recorded::

    python benchmarks/quant_peers.py [--subnets smallest,middle,largest] [--data PATH]
        [--subset N] [--calib 512] [--methods ...] [--merge] [--out benchmarks/quant_peers.json]

``--subset N``: a stratified seeded subset of N test images (default all 10,000). Needs torch,
onnx and onnxruntime; OpenVINO and NNCF are used when installed. Writes --out (JSON) and the
Markdown table beside it (.md). ``--merge`` updates the rows of ``--out`` with what is run now,
(subnet, method, runtime) by (subnet, method, runtime); with ``--keep-files DIR`` the quantized
files are kept and reused, so one subnet's methods and runtimes can be run in parts under the
10-minute limit of a command (drops: against FP32 on onnxruntime, from this run or ``--out``).
``--adaround-resume DIR``: hwnas AdaRound in parts (:mod:`adaround_resume`, the folders of
``adaround_steps.py --resume-dir``): learned layers kept there, a method paused after
``--budget`` wall seconds is left out of this run (exit status 3) and goes on when run again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import adaround_resume as resume
    import quant_recipes as recipes
except ModuleNotFoundError:
    from benchmarks import adaround_resume as resume
    from benchmarks import quant_recipes as recipes

from hwnas.core.errors import UserError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
METHODS = ("fp32", "hwnas_int8", "hwnas_int8_adaround", "hwnas_int8_full", "hwnas_int8_first7",
           "hwnas_w4a8", "hwnas_w4a8_adaround", "hwnas_w6a8", "hwnas_w6a8_adaround", "ort_minmax",
           "ort_entropy", "ort_percentile", "ort_minmax_reduce_range", "nncf_int8", "nncf_w4a8",
           "aimet_adaround_w4a8")
RUNTIMES = ("ort", "ort_u8u8", "ov", "ov_no_vnni")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=str(ROOT / "supernet/checkpoints/mbv3_cifar10.pt"))
    p.add_argument("--data", default="cifar10",
                   help="dataset name or path (default cifar10: the shared cifar10-jpeg.npz)")
    p.add_argument("--subnets", default="smallest", help="comma list of smallest,middle,largest")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--runtimes", default=",".join(RUNTIMES))
    p.add_argument("--subset", type=int, default=0, help="stratified test images (0: all)")
    p.add_argument("--calib", type=int, default=512, help="calibration images (default 512)")
    p.add_argument("--timing-batch", type=int, default=32)
    p.add_argument("--timing-rounds", type=int, default=5, help="0: no timing")
    p.add_argument("--adaround-iterations", type=int, default=200,
                   help="AdaRound's Adam steps per layer (hwnas_w4a8_adaround)")
    p.add_argument("--aimet-iterations", type=int, default=500,
                   help="AIMET AdaRound's steps per layer (aimet_adaround_w4a8)")
    p.add_argument("--adaround-resume", default="",
                   help="keep hwnas AdaRound's learned layers here; pause after --budget seconds")
    p.add_argument("--budget", type=float, default=360.0,
                   help="wall seconds of one hwnas AdaRound PTQ per command (--adaround-resume)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(HERE / "quant_peers.json"))
    p.add_argument("--merge", action="store_true",
                   help="update the rows of --out with the (subnet, method, runtime) results run now")
    p.add_argument("--keep-files", default="",
                   help="folder for the quantized files, reused when there (one subnet's runtimes "
                        "can then be run in parts without quantizing again)")
    return p.parse_args(argv)


# -- the quantizers ---------------------------------------------------------------------------------

def rounding_of(method: str) -> str:
    """The ``PTQConfig.rounding`` of an hwnas method: AdaRound of an int8 or W6A8 file has to
    be forced (``"adaround"`` learns only files with weights below 6 bits)."""
    if "adaround" not in method:
        return "nearest"
    return "adaround-all" if method.startswith(("hwnas_int8", "hwnas_w6a8")) else "adaround"


def hwnas_build(net: torch.nn.Module, calib: torch.Tensor, method: str,
                adaround_iterations: int = 200, rounding: str | None = None) -> Any:
    """The :class:`hwnas.export.qdq.QdqBuild` of an hwnas ``method`` (its PTQ model and file);
    ``rounding``: instead of the method's own (:func:`rounding_of`)."""
    from hwnas.export.qdq import build_qdq
    from hwnas.quant.policy import first_last_8bit, uniform
    from hwnas.quant.ptq import PTQConfig

    n = len(calib)
    rounding = rounding or rounding_of(method)
    if method.startswith(("hwnas_w4a8", "hwnas_w6a8")):
        policy = first_last_8bit(uniform(net, 4 if method.startswith("hwnas_w4") else 6, 8))
        config = PTQConfig(act_observer="mse", weight_observer="mse", max_images=n,
                           rounding=rounding, adaround_iterations=adaround_iterations)
        return build_qdq(net, policy, [calib], config=config)
    policy = uniform(net, 8, 8)
    config = PTQConfig(max_images=n, rounding=rounding, adaround_iterations=adaround_iterations)
    if method == "hwnas_int8_full":
        return build_qdq(net, policy, [calib], config=config, portable=False)
    if method == "hwnas_int8_first7":
        first = policy.layer_names[0]
        config = PTQConfig(max_images=n, int16_safe=(first,))
        return build_qdq(net, policy, [calib], config=config, portable=False)
    return build_qdq(net, policy, [calib], config=config)


def hwnas_file(net: torch.nn.Module, calib: torch.Tensor, method: str,
               adaround_iterations: int = 200) -> onnx.ModelProto:
    return hwnas_build(net, calib, method, adaround_iterations).proto()


def ort_file(fp32_path: Path, calib: np.ndarray, method: str, work: Path) -> onnx.ModelProto:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"input": calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):  # noqa: ANN201
            return next(self.items, None)

    calibrate = {"ort_minmax": CalibrationMethod.MinMax,
                 "ort_minmax_reduce_range": CalibrationMethod.MinMax,
                 "ort_entropy": CalibrationMethod.Entropy,
                 "ort_percentile": CalibrationMethod.Percentile}[method]
    out = work / f"{method}.onnx"
    quantize_static(str(fp32_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, calibrate_method=calibrate,
                    reduce_range=method.endswith("reduce_range"),
                    extra_options={"CalibTensorRangeSymmetric": False})
    return onnx.load(str(out))


def nncf_file(fp32_path: Path, calib: np.ndarray, weight_bits: int = 8,
              ir_path: Path | None = None) -> onnx.ModelProto | Path | None:
    """``nncf.quantize`` with its defaults (ONNX backend), or None without NNCF;
    ``weight_bits=4``: 4-bit weights in every layer on the OpenVINO backend (NPU target),
    saved as an OpenVINO IR at ``ir_path``, which is returned."""
    try:
        import nncf
        from nncf.quantization.advanced_parameters import (
            AdvancedQuantizationParameters,
            QuantizationParameters,
        )
    except ImportError:
        return None
    model = onnx.load(str(fp32_path))
    dataset = nncf.Dataset([calib[i:i + 1] for i in range(len(calib))],
                           lambda x: {"input": x})
    if weight_bits == 8:
        return nncf.quantize(model, dataset, subset_size=len(calib))
    import openvino as ov

    advanced = AdvancedQuantizationParameters(
        weights_quantization_params=QuantizationParameters(num_bits=weight_bits))
    quantized = nncf.quantize(ov.Core().read_model(str(fp32_path)), dataset,
                              subset_size=len(calib), target_device=nncf.TargetDevice.NPU,
                              advanced_parameters=advanced)
    ov.save_model(quantized, str(ir_path), compress_to_fp16=False)
    return ir_path


_AIMET_CONFIG = {
    "defaults": {"ops": {"is_output_quantized": "True"},
                 "params": {"is_quantized": "True", "is_symmetric": "True"},
                 "per_channel_quantization": "True", "strict_symmetric": "False",
                 "unsigned_symmetric": "False"},
    "params": {"bias": {"is_quantized": "False"}},
    "op_type": {},
    "supergroups": [{"op_list": ["Conv", "Relu"]}, {"op_list": ["Gemm", "Relu"]}],
    "model_input": {"is_input_quantized": "True"},
    "model_output": {},
}


def aimet_file(fp32_path: Path, calib: np.ndarray, iterations: int,
               work: Path) -> onnx.ModelProto | None:
    """AIMET's AdaRound at W4A8 (first and last Conv/Gemm at 8 bits), or None without AIMET."""
    try:
        from aimet_onnx.adaround.adaround_weight import Adaround
        from aimet_onnx.quantsim import QuantizationSimModel
    except ImportError:
        return None
    config = work / "aimet_config.json"
    config.write_text(json.dumps(_AIMET_CONFIG))
    sim = QuantizationSimModel(onnx.load(str(fp32_path)), param_type="int4",
                               activation_type="int8", quant_scheme="tf_enhanced",
                               config_file=str(config), providers=["CPUExecutionProvider"])
    layers = [n for n in sim.model.model.graph.node if n.op_type in ("Conv", "Gemm")]
    for node in (layers[0], layers[-1]):
        weight = node.input[1]
        op = sim.qc_quantize_op_dict.get(weight) or sim.qc_quantize_op_dict[
            weight.removesuffix("_qdq")]
        op.set_bitwidth(8)
    inputs = [{"input": calib[i:i + 32]} for i in range(0, len(calib), 32)]
    sim.compute_encodings(inputs)
    Adaround.apply_adaround(sim, inputs, num_iterations=iterations)
    return sim.to_onnx_qdq()


# -- running the files ------------------------------------------------------------------------------

def ort_top1(path: Path, x: np.ndarray, u8u8: bool = False) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    if u8u8:
        opts.add_session_config_entry("session.x64quantprecision", "1")
    s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {"input": x[i:i + 250]})[0].argmax(1)
                           for i in range(0, len(x), 250)])


_OV_CHILD = textwrap.dedent("""
    import sys, numpy as np, openvino as ov
    x = np.load(sys.argv[1])
    config = {"INFERENCE_NUM_THREADS": 1}
    if sys.argv[2]:
        config["INFERENCE_PRECISION_HINT"] = sys.argv[2]
    core = ov.Core()
    for path in sys.argv[3:]:
        try:
            m = core.compile_model(core.read_model(path), "CPU", config)
        except RuntimeError as exc:  # a file OpenVINO cannot compile: no top-1 for it
            why = [line for line in str(exc).splitlines() if line.strip()][-1:]
            print(f"  OpenVINO cannot compile {path}: {' '.join(why)}", flush=True)
            continue
        top1 = np.concatenate([m(x[i:i + 250])[0].argmax(1) for i in range(0, len(x), 250)])
        np.save(path + ".top1.npy", top1)
""")


def ov_top1(paths: list[Path], x: np.ndarray, work: Path, isa: str = "",
            precision: str = "") -> dict[str, np.ndarray]:
    """OpenVINO's top-1 per file, run in a child process (``ONEDNN_MAX_CPU_ISA=isa`` when
    given: the variable is read once, when oneDNN loads); a file it cannot compile is left out.
    ``precision``: OpenVINO's ``INFERENCE_PRECISION_HINT`` for the float parts (default its own:
    bf16 on a CPU with AVX-512 BF16 or AMX, which a CPU limited to an older ISA cannot run)."""
    np.save(work / "x.npy", x)
    for p in paths:
        Path(f"{p}.top1.npy").unlink(missing_ok=True)  # none left from an earlier run
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    subprocess.run([sys.executable, "-c", _OV_CHILD, str(work / "x.npy"), precision,
                    *map(str, paths)],
                   check=True, env=env)
    return {p.name: np.load(f"{p}.top1.npy") for p in paths if Path(f"{p}.top1.npy").is_file()}


def time_files(paths: list[Path], batch: int, rounds: int,
               u8u8: tuple[str, ...] = ()) -> dict[str, float]:
    """Median ms per onnxruntime call at ``batch`` (1 thread), files interleaved round by round
    so that a busy machine slows them alike; the files named in ``u8u8`` are also timed with
    ``session.x64quantprecision=1`` (keys ``<name>+u8u8``)."""
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    sessions = {}
    for p, precision in [(p, False) for p in paths] + [(p, True) for p in paths if p.name in u8u8]:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 3
        if precision:
            opts.add_session_config_entry("session.x64quantprecision", "1")
        key = p.name + ("+u8u8" if precision else "")
        sessions[key] = ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
        for _ in range(3):
            sessions[key].run(None, {"input": x})
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(rounds):
        for name, s in sessions.items():
            for _ in range(5):
                t = time.perf_counter()
                s.run(None, {"input": x})
                times[name].append((time.perf_counter() - t) * 1e3)
    return {k: float(np.median(v)) for k, v in times.items()}


# -- the table --------------------------------------------------------------------------------------

def float_subnet(role: str, supernet, space, data, seed: int, calib_images: int):
    """The ``role`` subnet with BatchNorm recalibrated as the search does, its calibration images
    (``calib_images``, stratified and seeded, from the training split) and a function that
    normalises uint8 images the same way: ``(arch, net, calib, normalise)``."""
    from hwnas.supernet.data.splits import _rng, _stratified_take
    from hwnas.supernet.evaluate import recalibrated_subnet

    arch = recipes.subnet_archs(space)[role]
    net = recalibrated_subnet(supernet, arch, data, seed=seed).eval()
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)

    def normalise(images: torch.Tensor) -> torch.Tensor:
        return (images.float() / 255 - mean) / std

    _, idx = _stratified_take(data.train.labels.numpy(), calib_images, _rng(seed, 99))
    return arch, net, normalise(data.train.images[idx]), normalise


def cifar10_subnet(checkpoint: str | Path, role: str, *, data: str = "cifar10", seed: int = 0,
                   calib_images: int = 512) -> tuple:
    """:func:`float_subnet` of a supernet checkpoint, the data set loaded with the checkpoint's
    training augmentation (what a benchmark's child process needs):
    ``(data, arch, net, calib, normalise)``."""
    from hwnas.supernet.data import load_dataset
    from hwnas.supernet.train import load_checkpoint, with_training_augment

    space, supernet, payload = load_checkpoint(str(checkpoint), device="cpu")
    data = with_training_augment(load_dataset(data, seed=seed), payload.get("train_config"))
    return (data, *float_subnet(role, supernet, space, data, seed, calib_images))


def subnet_rows(role: str, supernet, space, data, args, methods, runtimes, isa,
                paused: list[str] | None = None) -> list[dict]:
    """The rows of one subnet; a method whose AdaRound paused (``--adaround-resume``) is left
    out and said in ``paused``."""
    from hwnas.export.qdq import float_proto
    from hwnas.export.qdq.int16 import int16_report
    from hwnas.supernet.data.splits import _rng, _stratified_take

    arch, net, calib, normalise = float_subnet(role, supernet, space, data, args.seed, args.calib)
    test_y = data.test.labels.numpy()
    test_idx = np.arange(len(test_y))
    if 0 < args.subset < len(test_y):
        test_idx = _stratified_take(test_y, args.subset, _rng(args.seed, 98))[1]
    test_x = normalise(data.test.images[test_idx]).numpy()
    test_y = test_y[test_idx]
    rows = []
    with contextlib.ExitStack() as stack:
        if args.keep_files:
            work = Path(args.keep_files) / role
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        fp32_path = work / "fp32.onnx"
        onnx.save(float_proto(net, calib[:1]), fp32_path)
        # FP32 is run only when asked (a --merge run takes the drops from the file's FP32 row)
        files: dict[str, Path] = {"fp32": fp32_path} if "fp32" in methods else {}
        seconds: dict[str, float] = {}
        cpu_seconds: dict[str, float] = {}  # the process's CPU time: the cost on a loaded machine
        for method in methods:
            if method == "fp32":
                continue
            kept = work / f"{method}.seconds"
            suffix = ".xml" if method == "nncf_w4a8" else ".onnx"  # an OpenVINO IR
            if kept.is_file() and (work / f"{method}{suffix}").is_file():
                kept_seconds = [float(v) for v in kept.read_text().split()]
                seconds[method] = kept_seconds[0]
                if len(kept_seconds) > 1:
                    cpu_seconds[method] = kept_seconds[1]
                files[method] = work / f"{method}{suffix}"
                print(f"  {role}: {method} taken from {files[method]}", flush=True)
                continue
            t, cpu = time.perf_counter(), time.process_time()
            if method.startswith("hwnas"):
                folder = (resume.folder_of(args.adaround_resume, role, method,
                                           args.adaround_iterations)
                          if args.adaround_resume and "adaround" in method else None)
                try:
                    with resume.resumable(folder, args.budget) as part:
                        proto = hwnas_file(net, calib, method, args.adaround_iterations)
                except resume.Paused as exc:
                    note = f"{role}: {method} paused: {exc}; run the same command again"
                    print("  " + note, flush=True)
                    if paused is not None:
                        paused.append(note)
                    continue
                t, cpu = t - part.earlier_wall, cpu - part.earlier_cpu
            elif method.startswith("ort"):
                proto = ort_file(fp32_path, calib.numpy(), method, work)
            elif method.startswith("aimet"):
                proto = aimet_file(fp32_path, calib.numpy(), args.aimet_iterations, work)
                if proto is None:
                    print(f"  {role}: {method} skipped: aimet-onnx is not installed", flush=True)
                    continue
            else:
                proto = nncf_file(fp32_path, calib.numpy(), 4 if method == "nncf_w4a8" else 8,
                                  work / f"{method}{suffix}")
                if proto is None:
                    print(f"  {role}: {method} skipped: NNCF is not installed", flush=True)
                    continue
            seconds[method] = time.perf_counter() - t
            cpu_seconds[method] = time.process_time() - cpu
            path = work / f"{method}{suffix}"
            if suffix == ".onnx":
                onnx.save(proto, path)
            files[method] = path
            if args.keep_files:
                kept.write_text(f"{seconds[method]:.1f} {cpu_seconds[method]:.1f}")
            print(f"  {role}: {method} quantized in {seconds[method]:.0f} s", flush=True)
        top1: dict[tuple[str, str], float] = {}
        for method, path in files.items():
            if path.suffix != ".onnx":
                continue  # an OpenVINO IR
            if "ort" in runtimes:
                top1[method, "ort"] = 100 * float((ort_top1(path, test_x) == test_y).mean())
            if "ort_u8u8" in runtimes and method != "fp32":
                top1[method, "ort_u8u8"] = 100 * float(
                    (ort_top1(path, test_x, u8u8=True) == test_y).mean())
        ov_runs = [r for r in ("ov", "ov_no_vnni") if r in runtimes]
        if ov_runs and not _has_openvino():
            print("  OpenVINO is not installed: its columns are left out", flush=True)
            ov_runs = []
        if "ov_no_vnni" in ov_runs and "avx512bw" not in isa["isa"]:
            ov_runs.remove("ov_no_vnni")  # oneDNN cannot be limited to an ISA the CPU lacks
        for run in ov_runs:
            got = ov_top1(list(files.values()), test_x, work,
                          "AVX512_CORE" if run == "ov_no_vnni" else "")
            for method, path in files.items():
                if path.name in got:
                    top1[method, run] = 100 * float((got[path.name] == test_y).mean())
        ms = (time_files([p for p in files.values() if p.suffix == ".onnx"], args.timing_batch, args.timing_rounds,
                         u8u8=tuple(p.name for m, p in files.items() if m.startswith("hwnas_int8")))
              if args.timing_rounds else {})
        fp32 = top1.get(("fp32", "ort"))
        for method, path in files.items():
            report = (int16_report(onnx.load(str(path)))
                      if method != "fp32" and path.suffix == ".onnx" else {})
            if not report.get("integer_layers_bounded"):
                report = {}  # no int8 weights it could read (e.g. ONNX INT4): no verdict
            row = {"subnet": role, "arch": space.to_string(arch), "method": method,
                   "test_images": int(len(test_y)), "calib_images": int(len(calib)),
                   "int16_safe": report.get("int16_safe"),
                   "worst_pair_sum": report.get("worst_pair_sum"),
                   "ort_ms_b%d" % args.timing_batch: ms.get(path.name),
                   "ort_u8u8_ms_b%d" % args.timing_batch: ms.get(path.name + "+u8u8"),
                   "adaround_iterations": (args.adaround_iterations
                                           if method.startswith("hwnas") and "adaround" in method
                                           else args.aimet_iterations if "adaround" in method
                                           else None),
                   "rounding": rounding_of(method) if method.startswith("hwnas") else None,
                   "quantize_seconds": round(seconds.get(method, 0.0), 1),
                   "quantize_cpu_seconds": (round(cpu_seconds[method], 1)
                                            if method in cpu_seconds else None)}
            for run in RUNTIMES:
                if (method, run) in top1:
                    row[f"top1_{run}"] = round(top1[method, run], 2)
                    row[f"drop_{run}"] = (None if fp32 is None
                                          else round(top1[method, run] - fp32, 2))
            rows.append(row)
            print("  " + "  ".join(f"{k}={v}" for k, v in row.items() if k != "arch"), flush=True)
    return rows


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` rows updated by ``new`` ones of the same (subnet, method), value by value (a
    value not measured now stays), drops recomputed from each subnet's FP32 onnxruntime top-1."""
    rows = {(r["subnet"], r["method"]): dict(r) for r in old}
    for r in new:
        key = (r["subnet"], r["method"])
        rows[key] = {**rows.get(key, {}), **{k: v for k, v in r.items() if v is not None}}
    for (subnet, _), row in rows.items():
        fp32 = rows.get((subnet, "fp32"), {}).get("top1_ort")
        for run in RUNTIMES:
            if f"top1_{run}" in row:
                row[f"drop_{run}"] = (None if fp32 is None
                                      else round(row[f"top1_{run}"] - fp32, 2))
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(rows.values(), key=lambda r: (r["subnet"], order.get(r["method"], len(order))))


def _has_openvino() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def markdown(doc: dict) -> str:
    runs = [r for r in RUNTIMES if any(f"top1_{r}" in row for row in doc["results"])]
    ms_key = next((k for row in doc["results"] for k in row if k.startswith("ort_ms_b")), None)
    head = {"ort": "onnxruntime here", "ort_u8u8": "onnxruntime x64quantprecision=1",
            "ov": "OpenVINO here", "ov_no_vnni": "OpenVINO, AVX-512 without VNNI"}
    lines = [f"# hwnas PTQ vs peer quantizers ({doc['date']})", "",
             f"`{doc['command']}`", "", f"Machine: {doc['machine']}; ISA: {' '.join(doc['isa']['isa'])}"
             f" (int8 without saturation: {doc['isa']['int8_without_saturation']}); "
             f"{doc['runtimes']}", "",
             "| subnet | method | " + " | ".join(f"{head[r]} top-1 (drop)" for r in runs)
             + " | int16-safe (worst pair sum) | quantize s | "
             + ("onnxruntime ms/batch (x64quantprecision=1) |" if ms_key else ""),
             "|---|---|" + "---|" * len(runs) + "---|---|" + ("---|" if ms_key else "")]
    for row in doc["results"]:
        cells = []
        for r in runs:
            v, d = row.get(f"top1_{r}"), row.get(f"drop_{r}")
            cells.append("" if v is None else f"{v:.2f}" + ("" if d is None or row["method"] == "fp32"
                                                           else f" ({d:+.2f})"))
        safe = "" if row.get("int16_safe") is None else f"{'yes' if row['int16_safe'] else 'no'} ({row['worst_pair_sum']})"
        ms = "" if not ms_key or row.get(ms_key) is None else f"{row[ms_key]:.2f}"
        u8 = row.get(ms_key.replace("ort_ms", "ort_u8u8_ms")) if ms_key else None
        ms += "" if u8 is None else f" ({u8:.2f})"
        sec = "" if row["method"] == "fp32" else f"{row.get('quantize_seconds', 0):.0f}"
        steps = row.get("adaround_iterations")
        name = row["method"] + (f" ({steps} steps)" if steps else "")
        lines.append(f"| {row['subnet']} | {name} | " + " | ".join(cells)
                     + f" | {safe} | {sec} |" + (f" {ms} |" if ms_key else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from hwnas.latency.machine import describe_machine
    from hwnas.latency.ondevice import cpu_isa
    from hwnas.supernet.data import load_dataset
    from hwnas.supernet.train import load_checkpoint, with_training_augment

    torch.set_num_threads(1)
    roles = [r for r in args.subnets.split(",") if r]
    methods = [m for m in args.methods.split(",") if m]
    runtimes = [r for r in args.runtimes.split(",") if r]
    for bad, known, what in ((roles, recipes.ROLES, "subnet"), (methods, METHODS, "method"),
                             (runtimes, RUNTIMES, "runtime")):
        unknown = [x for x in bad if x not in known]
        if unknown:
            raise UserError(f"unknown {what} {unknown[0]!r}; expected one of {', '.join(known)}")
    if args.calib < 1 or args.subset < 0:
        raise UserError("--calib must be positive and --subset non-negative")
    isa = cpu_isa()
    space, supernet, payload = load_checkpoint(args.checkpoint, device="cpu")
    data = with_training_augment(load_dataset(args.data, seed=args.seed),
                                 payload.get("train_config"))
    rows: list[dict[str, Any]] = []
    paused: list[str] = []
    start = time.perf_counter()
    for role in roles:
        print(f"{role}:", flush=True)
        rows.extend(subnet_rows(role, supernet, space, data, args, methods, runtimes, isa,
                                paused))
    import onnxruntime as ort

    versions = f"torch {torch.__version__}, onnx {onnx.__version__}, onnxruntime {ort.__version__}"
    for name in ("openvino", "nncf", "aimet_onnx"):
        try:
            versions += f", {name} {__import__(name).__version__}"
        except ImportError:
            versions += f", no {name}"
    out = Path(args.out)
    commands = [recipes.command_line(argv)]
    if args.merge and out.is_file():
        old = json.loads(out.read_text())
        rows = merge_rows(old["results"], rows)
        before = old.get("runtimes", "").split(" (earlier rows: ")[0]
        if before and before != versions:
            versions += f" (earlier rows: {before})"
        commands = old.get("commands", []) + commands
    doc = {"command": " && ".join(commands), "commands": commands,
           "machine": describe_machine(), "date": recipes.now_iso(), "isa": isa,
           "runtimes": versions, "checkpoint": args.checkpoint, "data": args.data,
           "total_seconds": round(time.perf_counter() - start, 1), "results": rows}
    recipes.write_json(out, doc)
    md = out.with_suffix(".md")
    notes = md.read_text().partition("\n## Notes")[1:] if md.is_file() else ("", "")
    md.write_text(markdown(doc) + "".join(notes))  # the hand-written notes stay
    print(markdown(doc))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    if paused:
        print("\n".join(paused))
        return 3
    return 0


if __name__ == "__main__":
    recipes.run_script(main, "quant_peers")
