"""Verification of each exported file before it is written.

``onnx.checker``; FP32: max |ONNX - PyTorch| <= ``atol`` (1e-4), or, where a network
amplifies float32 rounding past it, the file no farther from the float64 answer than twice
PyTorch's own float32 pass (:func:`float32_rounding`). QDQ: top-1 agreement >=
``min_agreement`` (99 %) with the PyTorch fake-quant model as onnxruntime computes the file -
Conv/Gemm biases rounded to int32 on ``input_scale * weight_scale`` (a MatMul's bias is added
in float, as onnxruntime does) and, for ``qdq-<device>`` files, the requantization points:
exact up to float rounding, so any export error shows. The deviation from the *searched*
fake-quant model (int32 biases, requantization, layers kept float) is reported, and a file
losing more than ``max_accuracy_drop`` points of test accuracy fails (unless the searched model
is no better than chance: :func:`at_chance`). After onnxruntime's
optimizations every integer layer of a ``qdq-<device>`` file, and every quantized attention
product of two activations (Q·Kᵀ, attention × V), must run as an integer kernel; float
islands are reported by name; a layer kept float must not run as one (onnxruntime would give it
weight scales of its own). A uint8-input file is checked against its parent.
Where a check ran: :func:`verified_here`, and the ISA condition of a QDQ file.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import onnx
import torch
from hwnas.export.code_trace import trace_codes
from hwnas.export.onnx_export import InputSpec, divergence_of, parity_of
from hwnas.export.ort_profile import LayerIndex, integer_kernel_check
from hwnas.export.passes import ImagePasses
from hwnas.export.qdq.build import QdqBuild
from hwnas.export.records import ExportSettings, FileReport
from hwnas.quant.adaround import learned_layers
from torch import nn

from hwnas.core.errors import UserError

__all__ = ["NEEDS_VNNI", "finite", "float32_rounding", "raw_images", "verified_here",
           "verify_fp32", "verify_qdq", "verify_uint8"]


def finite(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


#: the ISA condition of a QDQ file some integer layer of which can saturate a 16-bit pair sum
NEEDS_VNNI = ("x86 with VNNI or AMX (avx512_vnni, avx_vnni or amx_int8), or onnxruntime with "
              "session.x64quantprecision=1; AVX2 and AVX-512 without VNNI saturate its sums")


def verified_here(runtime: str = "onnxruntime") -> dict[str, Any]:
    """Where a check runs: this CPU, its ISA flags (:func:`hwnas.latency.ondevice.cpu_isa`),
    the runtime and its version."""
    from hwnas.latency.ondevice import cpu_isa

    if runtime == "openvino":
        import openvino as ov

        version = ov.__version__
    else:
        import onnxruntime as ort

        version = ort.__version__
    return {**cpu_isa(), "runtime": runtime, "version": version}


def isa_condition(proto: onnx.ModelProto, report: FileReport) -> None:
    """The file's 16-bit pair-sum bound and the CPUs on which it computes what was verified."""
    from hwnas.export.qdq.int16 import int16_report

    report.int16 = int16_report(proto)
    report.isa_condition = "any" if report.int16["int16_safe"] else NEEDS_VNNI


def verify_fp32(proto: onnx.ModelProto, model: nn.Module, passes: ImagePasses,
                 report: FileReport, s: ExportSettings) -> None:
    """``onnx.checker`` and max |ONNX - PyTorch| <= ``atol`` on the test images (one pass of
    each, kept in ``passes``); with labels, the file's test accuracy."""
    onnx.checker.check_model(proto)
    report.checker = True
    report.verified_on, report.isa_condition = verified_here(), "any"
    got, want = passes.together(report.path, proto.SerializeToString(), "float", model)
    parity = parity_of(got, want, atol=s.atol)
    report.max_abs_diff, report.top1_agreement, report.n_images = (
        finite(parity.max_abs_diff), parity.top1_agreement, parity.n)
    report.test_accuracy = passes.accuracy(got)
    if not parity.passed:
        rounding = float32_rounding(model, passes.x, got, want, s.atol)
        if rounding is None:
            raise UserError(f"FP32 parity failed: max |ONNX - PyTorch| = "
                            f"{parity.max_abs_diff:.3g} > {s.atol:g} on {parity.n} images")
        report.parity_note, report.float32_error = rounding


#: how far an FP32 file may be from the float64 answer, in multiples of PyTorch's float32 error
FLOAT32_SLACK = 2.0


def float32_rounding(model: nn.Module, images: torch.Tensor, got: np.ndarray, want: np.ndarray,
                     atol: float, batch_size: int = 256) -> tuple[str, float] | None:
    """Why an FP32 file whose logits (``got``) are farther than ``atol`` from PyTorch's float32
    ones (``want``) still computes the model: they are no farther from its float64 answer (a
    CPU copy, on ``images``) than ``FLOAT32_SLACK`` times PyTorch's own. Both then miss by float32
    rounding that the network amplifies (measured: a one-epoch NB-201 cell whose PyTorch pass
    was 1.8e-4 from the float64 answer, its file 1.4e-4, other cells of the run 1e-6). Returns
    the note and PyTorch's own float32 error; None where the file is farther (an export error)
    or the float64 pass fails."""
    try:
        exact_model = copy.deepcopy(model).to("cpu", torch.float64).eval()
        with torch.no_grad():
            exact = torch.cat([exact_model(images[i:i + batch_size].to(torch.float64))
                               for i in range(0, len(images), batch_size)]).numpy()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    own = float(np.abs(want - exact).max())
    off = float(np.abs(got - exact).max())
    if not np.isfinite(off) or off > max(atol, FLOAT32_SLACK * own):
        return None
    return (f"max |ONNX - PyTorch| {float(np.abs(got - want).max()):.3g} > {atol:g} is float32 "
            f"rounding: the file is {off:.3g} from the float64 answer, PyTorch's float32 pass "
            f"{own:.3g}"), own


def _integer_kernels(data: bytes, index: LayerIndex, build: QdqBuild, quantized: list[str],
                     products: list[str]) -> tuple[dict[str, str], list[str]]:
    """:func:`integer_kernel_check` of a QDQ file; UserError where a layer the file keeps float
    runs as an integer kernel (onnxruntime chose its weight scales; the reference runs it in
    float, so the file is not what it says)."""
    kept_float = [n for n in build.builder.node_of if n not in quantized]
    integer, islands = integer_kernel_check(data, index, quantized + products,
                                            kept_float=kept_float)
    requantized_by_ort = [f"{n} ({integer[n]})" for n in kept_float if n in integer]
    if requantized_by_ort:
        raise UserError(f"{len(requantized_by_ort)} layer(s) kept float run as integer kernels "
                        f"after onnxruntime's optimizations, with weight scales onnxruntime chose: "
                        f"{'; '.join(requantized_by_ort[:3])}"
                        + (" ..." if len(requantized_by_ort) > 3 else ""))
    return integer, islands


def verify_qdq(proto: onnx.ModelProto, build: QdqBuild, passes: ImagePasses, report: FileReport,
                s: ExportSettings, *, requantize: bool, require_integer: bool,
                searched: nn.Module | None = None) -> None:
    """Verify a QDQ file against what it implements and against what was searched.

    Pass/fail: ``onnx.checker``; top-1 agreement >= ``min_agreement`` with the fake-quant model
    as onnxruntime's integer kernels compute it (int32 biases, and the requantization points
    when ``requantize``, after checking that the file is the graph whose rounding points the
    reference mirrors) - any export error (a wrong scale, layer or grid) shows here; no float
    islands when ``require_integer``; with labels, test accuracy no more than
    ``max_accuracy_drop`` points below the searched fake-quant model's. Reported beside: the
    agreement and max difference with the searched fake-quant model (``searched``, default the
    build's own). One onnxruntime pass of the file and one PyTorch pass of each model
    (``passes``: the searched model's is shared by every file of the model)."""
    onnx.checker.check_model(proto)
    report.checker = True
    report.verified_on = verified_here()
    isa_condition(proto, report)
    data = proto.SerializeToString()
    reference = build.reference(requantize=requantize)
    if reference.rewrite is not None and reference.rewrite.proto.graph != proto.graph:
        # its hooks round where that graph does: a file with other element-wise roundings (a
        # layer kept float it does not know of) still agrees on top-1 (session 38)
        raise UserError("quantized parity not checked: the file is not the graph of its "
                        "reference (the element-wise rewrite the reference mirrors differs; "
                        "a file with layers kept float that its build does not keep float?)")
    with reference as deployed:  # the file and its exact reference
        got, expected = passes.together(report.path, data, ("deployed", report.path), deployed)
    parity = parity_of(got, expected, atol=float("inf"))
    report.reference = ("fake-quant model with int32 biases"
                        + (" and 8-bit requantization points" if requantize and build.requant_layers()
                           else ""))
    report.max_abs_diff, report.top1_agreement, report.n_images = (
        finite(parity.max_abs_diff), parity.top1_agreement, parity.n)
    searched = searched if searched is not None else build.qmodel
    searched_logits = passes.torch("searched", searched)
    plain = parity_of(got, searched_logits, atol=float("inf"))
    report.searched_agreement, report.searched_max_abs_diff = (plain.top1_agreement,
                                                               finite(plain.max_abs_diff))
    labels = passes.labels
    if labels is not None:
        report.test_accuracy = passes.accuracy(got)
        report.searched_test_accuracy = passes.accuracy(searched_logits)
    index = LayerIndex.from_source(proto, build.kernel_nodes())
    quantized, products = build.integer_layers(), build.integer_products()
    integer, islands = _integer_kernels(data, index, build, quantized, products)
    report.quantized_layers, report.integer_layers, report.float_islands = (
        len(quantized), sum(n in integer for n in quantized), islands)
    report.integer_products = sum(n in integer for n in products)
    report.adaround_layers = [n for n in learned_layers(build.qmodel) if n in build.layers]
    report.rounding = "adaround" if report.adaround_layers else "nearest"
    if parity.max_abs_diff != parity.max_abs_diff:  # NaN
        raise UserError("quantized parity failed: onnxruntime produced NaN")
    if parity.top1_agreement < s.min_agreement:
        # rounding flips on near-tied logits (see divergence_of) pass, said so; anything else fails
        why = divergence_of(got, expected, labels, min_agreement=s.min_agreement,
                            max_accuracy_drop=s.max_accuracy_drop)
        shown = (f"top-1 agreement with the {report.reference} "
                 f"{100 * parity.top1_agreement:.2f}% < {100 * s.min_agreement:.0f}% on "
                 f"{parity.n} images (max diff {parity.max_abs_diff:.3g}; {why.describe()})")
        if why.rounding:
            report.parity_note = (f"{shown}: float-rounding flips on near-tied logits, not an "
                                  f"export error")
        elif not why.predictions_kept:
            raise UserError(f"quantized parity failed: {shown}")
        else:  # every image moved a little: flips carried by float ops, or a real error?
            with reference as deployed:
                trace = trace_codes(data, deployed, passes.x, points=reference.rounding_points())
            if not trace.starts_as_flips:
                raise UserError(f"quantized parity failed: {shown}; {trace.describe()}")
            report.parity_note = (f"{shown}: {trace.describe()}, carried to near-tied logits, "
                                  f"not an export error")
    if require_integer and islands:
        raise UserError(f"{len(islands)} quantized layer(s) did not become integer kernels after "
                        f"onnxruntime's optimizations: {'; '.join(islands[:3])}"
                        + (" ..." if len(islands) > 3 else ""))
    if (labels is not None and s.max_accuracy_drop is not None
            and report.test_accuracy < report.searched_test_accuracy - s.max_accuracy_drop):
        if at_chance(report.searched_test_accuracy, len(labels), got.shape[1]):
            report.parity_note = ((report.parity_note + "; ") if report.parity_note else "") + (
                f"accuracy-drop rule not applied: the searched model's "
                f"{report.searched_test_accuracy:.2f}% is not above chance "
                f"({100 / got.shape[1]:.0f}%) on {len(labels)} images")
            return
        raise UserError(f"the ONNX model's test accuracy {report.test_accuracy:.2f}% is more than "
                        f"{s.max_accuracy_drop:g} points below the searched fake-quant model's "
                        f"{report.searched_test_accuracy:.2f}% (top-1 agreement "
                        f"{100 * plain.top1_agreement:.1f}%)")


def at_chance(accuracy_pct: float, n: int, classes: int, alpha: float = 0.01) -> bool:
    """Whether a top-1 accuracy (percent, on ``n`` images of ``classes`` classes) is not
    significantly above chance (one-sided binomial test at ``alpha``): such a model (an untrained
    smoke-test model) has no accuracy for a file to lose, and flips on its near-tied logits move
    its few correct predictions at random, so the accuracy-drop rule would fail on noise.

    Examples:
        >>> at_chance(11.7, 359, 10), at_chance(30.0, 359, 10)
        (True, False)
    """
    from scipy.stats import binomtest

    correct = int(round(accuracy_pct * n / 100))
    return binomtest(correct, n, 1.0 / classes, alternative="greater").pvalue > alpha


def raw_images(images: torch.Tensor, spec: InputSpec) -> np.ndarray:
    """The uint8 NHWC pixels that normalised NCHW ``images`` were made from (the inverse of
    ``(uint8 / 255 - mean) / std``, rounded: exact for images that came from uint8)."""
    mean = torch.tensor(spec.mean, dtype=torch.float64, device="cpu").view(1, -1, 1, 1)
    std = torch.tensor(spec.std, dtype=torch.float64, device="cpu").view(1, -1, 1, 1)
    pixels = ((images.detach().cpu().double() * std + mean) * 255.0).round().clamp(0, 255)
    return pixels.to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def verify_uint8(proto: onnx.ModelProto, want: np.ndarray, passes: ImagePasses,
                  spec: InputSpec, report: FileReport, s: ExportSettings, *, exact: bool,
                  parent_float32_error: float | None = None) -> None:
    """The uint8-input file on the raw pixels against its parent's logits ``want`` on the
    normalised images: max difference <= ``atol`` for a float parent (or ``FLOAT32_SLACK``
    times its PyTorch float32 error, ``parent_float32_error``, where that parent passed by
    :func:`float32_rounding`: the network amplifies the pixels' normalisation rounding as much),
    top-1 agreement >= ``min_agreement`` for a QDQ one (a pixel at a rounding boundary may land
    on the other side of an int8 step)."""
    from hwnas.latency.onnx_measure import make_session

    onnx.checker.check_model(proto)
    report.checker = True
    raw = raw_images(passes.x, spec)
    mine = make_session(proto.SerializeToString(), threads=1)
    got = np.concatenate([mine.run(None, {mine.get_inputs()[0].name: raw[i:i + 256]})[0]
                          for i in range(0, len(raw), 256)])
    report.max_abs_diff = finite(float(np.max(np.abs(got.astype(np.float64) - want))))
    report.top1_agreement = float(np.mean(got.argmax(1) == want.argmax(1)))
    report.n_images = len(raw)
    report.test_accuracy = passes.accuracy(got)
    bound = max(s.atol, FLOAT32_SLACK * (parent_float32_error or 0.0))
    if exact and not (report.max_abs_diff is not None and report.max_abs_diff <= bound):
        raise UserError(f"uint8-input parity failed: max difference {report.max_abs_diff} > "
                        f"{bound:g} against the float-input file")
    if report.top1_agreement < s.min_agreement:
        raise UserError(f"uint8-input parity failed: top-1 agreement "
                        f"{100 * report.top1_agreement:.2f}% with the float-input file")
