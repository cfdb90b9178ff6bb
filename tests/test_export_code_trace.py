"""The code-level parity diagnosis (export.code_trace): a QDQ file whose codes differ only by
rounding flips (values on a rounding boundary) is told from one with a wrong scale, and the
QDQ check lets the first pass and fails the second, naming the layer."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hwnas.export.code_trace import trace_codes
from hwnas.export.qdq.build import build_qdq
from hwnas.quant.policy import uniform
from onnx import numpy_helper
from qdq_support import tiny_fbnet, tiny_mbv3_se


def _scaled(proto: onnx.ModelProto, node_name: str, factor: float) -> bytes:
    """``proto`` with the y_scale of QuantizeLinear ``node_name`` multiplied by ``factor``
    (its own initializer, so the DequantizeLinear after it keeps the original)."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    node = next(n for n in proto.graph.node if n.name == node_name)
    old = next(t for t in proto.graph.initializer if t.name == node.input[1])
    new = numpy_helper.from_array(numpy_helper.to_array(old) * np.float32(factor),
                                  f"{old.name}_traced_{factor}")
    proto.graph.initializer.append(new)
    node.input[1] = new.name
    return proto.SerializeToString()


@pytest.fixture()
def built(qdq_net, qdq_images):
    calib, test = qdq_images
    build = build_qdq(qdq_net, uniform(qdq_net, 8, 8), [calib])
    return build, build.proto(requantize=False), test


def _trace(build, data, test):
    ref = build.reference(requantize=False)
    with ref as deployed:
        return trace_codes(data, deployed, test, points=ref.rounding_points(), batch_size=16)


def test_the_exported_file_reproduces_every_code(built) -> None:
    build, proto, test = built
    trace = _trace(build, proto.SerializeToString(), test)
    assert trace.layers and not trace.differs and not trace.starts_as_flips
    assert "no activation code differs" in trace.describe()
    assert np.abs(trace.logits - trace.reference).max() < 1e-4


def test_flips_on_rounding_boundaries_are_told_from_a_wrong_scale(built) -> None:
    build, proto, test = built
    names = [n.name for n in proto.graph.node if n.op_type == "QuantizeLinear"
             and n.name.endswith("/input_q")]
    second = names[1]
    # a scale off by 1e-5: only values within ~1e-3 of a boundary change code: flips
    flips = _trace(build, _scaled(proto, second, 1.0 + 1e-5), test)
    assert flips.differs and flips.starts_as_flips and flips.unexplained is None
    assert flips.first_distance_to_half <= 1e-2
    # a scale off by 10%: codes move by whole levels where nothing upstream differed
    wrong = _trace(build, _scaled(proto, second, 1.1), test)
    assert wrong.differs and not wrong.starts_as_flips
    assert wrong.unexplained == second[1:-len("/input_q")] + ".input_quant"
    assert "nothing upstream" in wrong.describe()


def _ambiguous_values(scale: float, zero_point: int) -> np.ndarray:
    """float32 values that PyTorch's fake quantizer (``x * (1/s)``) and onnxruntime's
    QuantizeLinear (``x / s``) round to neighbouring codes: within an ulp of ``k + 1/2``."""
    s = np.float32(scale)
    inv = np.float32(1.0) / s
    found = []
    for k in range(-zero_point, 255 - zero_point):
        v = np.float32((k + 0.5) * s)
        for _ in range(3):
            v = np.nextafter(v, np.float32(-np.inf))
        for _ in range(7):
            if np.round(v / s) != np.round(v * inv):
                found.append(v)
            v = np.nextafter(v, np.float32(np.inf))
    return np.array(found, np.float32)


def test_a_flip_between_division_and_reciprocal_shows_where_it_happens(qdq_net, qdq_images) -> None:
    """Every pixel on a value that the reference's first quantizer and the file round to
    neighbouring codes: the trace must see the flips there, at the first quantizer, not as
    unexplained differences in the next layer (vit on digits, benchmarks/qdq_divergence.md).
    Whether a scale has such values depends on how exact its float32 reciprocal is: the
    calibration images are scaled until the first quantizer's does."""
    import torch

    calib, test = qdq_images
    for factor in (1.0, 1.25, 1.5, 1.75):
        build = build_qdq(qdq_net, uniform(qdq_net, 8, 8), [calib * factor])
        proto = build.proto(requantize=False)
        first = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear")
        inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        values = _ambiguous_values(float(inits[first.input[1]]), int(inits[first.input[2]]))
        if len(values) >= 20:
            break
    assert len(values) >= 20
    nearest = np.abs((test * factor).numpy()[..., None] - values).argmin(-1)
    trace = _trace(build, proto.SerializeToString(), torch.from_numpy(values[nearest]))
    assert trace.first_layer == first.name[1:-len("/input_q")] + ".input_quant"
    assert trace.first_distance_to_half < 1e-4
    assert trace.starts_as_flips, trace.describe()


def _tally_whole_tensors(names, chunks) -> dict:
    """The tally as computed before Session 36 (whole-tensor differences and distances): what
    :class:`hwnas.export.code_trace._Tally` must still give."""
    stats = {n: {"differ": 0, "count": 0, "max": 0, "touched": 0} for n in names}
    firsts, worst = {}, {}
    for ort_codes, codes, values, n_images in chunks:
        upstream = np.zeros(n_images, bool)
        for n in names:
            got, want, value = ort_codes[n].astype(np.int64), codes[n], values[n]
            if want.shape != got.shape and want.swapaxes(-1, -2).shape == got.shape:
                want, value = want.swapaxes(-1, -2), value.swapaxes(-1, -2)
            dif = got != want
            per_image = dif.reshape(n_images, -1).any(1)
            s = stats[n]
            s["differ"] += int(dif.sum())
            s["count"] += dif.size
            s["max"] = max(s["max"], int(np.abs(got - want).max()) if dif.size else 0)
            s["touched"] += int(per_image.sum())
            if dif.any():
                dist = np.abs(value - np.floor(value) - 0.5)
                firsts[n] = max(firsts.get(n, 0.0), float(dist[dif].max()))
                fresh = dif & ~upstream.reshape((-1,) + (1,) * (dif.ndim - 1))
                if fresh.any():
                    worst[n] = max(worst.get(n, 0.0), float(dist[fresh].max()))
            upstream |= per_image
    return {"stats": stats, "firsts": firsts, "worst": worst}


def test_tally_at_the_differing_codes_gives_the_whole_tensor_figures() -> None:
    from hwnas.export.code_trace import _Tally

    rng = np.random.default_rng(0)
    names = ["a.input_quant", "b.input_quant", "c.a_quant", "d.input_quant"]
    chunks = []
    for n_images, p in ((5, 0.02), (3, 0.0), (4, 0.3)):
        shapes = {"a.input_quant": (n_images, 3, 4, 4), "b.input_quant": (n_images, 6, 2, 2),
                  "c.a_quant": (n_images, 5, 3), "d.input_quant": (n_images, 7)}
        ort_codes, codes, values = {}, {}, {}
        for n, shape in shapes.items():
            value = rng.uniform(-20, 200, shape).astype(np.float32)
            want = np.clip(np.round(value), 0, 255).astype(np.int64)
            flip = rng.random(shape) < p
            got = np.clip(want + flip * rng.choice([-2, -1, 1], shape), 0, 255).astype(np.uint8)
            if n == "c.a_quant":  # traced transposed (Kᵀ): the file's codes are the swapped ones
                got, want, value = got.swapaxes(-1, -2), want, value
            ort_codes[n], codes[n], values[n] = got, want, value
        chunks.append((ort_codes, codes, values, n_images))
    tally = _Tally(names)
    for chunk in chunks:
        tally.add(*chunk)
    want = _tally_whole_tensors(names, chunks)
    assert tally.stats == want["stats"]
    assert tally.firsts == want["firsts"] and tally.worst == want["worst"]
    assert any(s["differ"] for s in tally.stats.values()) and tally.worst


def test_a_flip_at_a_residual_add_shows_where_it_happens() -> None:
    """The device file's residual add (integer_ops: a QLinearAdd whose output is quantized once
    with the next block's input parameters) rounds in a forward hook of the reference, before
    the next layer's input quantizer sees it: that quantizer's values are on its grid already,
    0.5 level from any boundary. A flip at the add must show at the add, not as a difference
    "nothing upstream touched" in the next layer (fbnet k5_e6 on CIFAR-10, session 37,
    benchmarks/qdq_divergence.md). The add's quantizer scaled by 1 + 5e-5 flips only values
    within ~6e-3 levels of a boundary; scaled by 1.1 it is a real error, named at the add."""
    model, calib, test = tiny_fbnet("k3_e3-k3_e3-k3_e3-k3_e3", (1, 3), 128)
    build = build_qdq(model, uniform(model, 8, 8), [calib])
    proto = build.proto()
    ref = build.reference()
    assert [p.module for p in ref.rounding_points() if p.kind == "residual"] == ["blocks.2"]
    add = next(n for n in proto.graph.node if n.op_type == "Add" and "blocks.2/" in n.name)
    q = next(n for n in proto.graph.node
             if n.op_type == "QuantizeLinear" and add.output[0] in n.input)

    def trace(factor: float, residual: bool = True):
        with ref as deployed:
            return trace_codes(_scaled(proto, q.name, factor), deployed, test,
                               points=[p for p in ref.rounding_points()
                                       if residual or p.kind != "residual"])

    def at_add(t) -> float:
        return next(r["codes_differ_pct"] for r in t.layers if r["layer"] == "blocks.2.residual")

    flips = trace(1.0 + 5e-5)
    assert at_add(flips) > at_add(trace(1.0)), flips.layers
    assert flips.starts_as_flips, flips.describe()
    # untraced, the add's flips looked like a real error in the next layer (the session 37 failure)
    blind = trace(1.0 + 5e-5, residual=False)
    assert blind.unexplained == "blocks.3.expand_conv.input_quant", blind.describe()
    assert blind.unexplained_distance_to_half > 0.49
    wrong = trace(1.1)
    assert wrong.unexplained == "blocks.2.residual", wrong.describe()


def test_flips_at_the_se_gate_and_h_swish_roundings_show_where_they_happen() -> None:
    """The other rounding hooks of the reference (DeployedReference.rounding_points): the
    squeeze-excitation gate on its 1/255 grid and h-swish's ``relu6(x + 3)`` on 6/255 (and
    its output, where its consumers differ) round in forward hooks too, so the next quantizer
    never sees a near-tie there: untraced, a flip at the gate showed as a difference "nothing
    upstream touched" in the project conv's input, one at h-swish in the depthwise conv's.
    Scaled by 1 + 2e-5 (values within ~5e-3 levels of a boundary flip) the file is correct;
    scaled by 1.1 it is a real error, named at the rounding point."""
    model, calib, test = tiny_mbv3_se(512)
    build = build_qdq(model, uniform(model, 8, 8), [calib])
    proto = build.proto()
    ref = build.reference()
    points = {p.name: p for p in ref.rounding_points()}
    assert {p.kind for p in points.values()} == {"requant", "residual", "se_gate", "hsigmoid",
                                                 "hswish"}
    nodes = {n.name for n in proto.graph.node if n.op_type == "QuantizeLinear"}
    assert all(p.node in nodes for p in points.values()), points

    def trace(point: str, factor: float, blind: bool = False):
        with ref as deployed:
            return trace_codes(_scaled(proto, points[point].node, factor), deployed, test,
                               points=[p for p in points.values()
                                       if not (blind and p.name == point)])

    exact = {r["layer"]: r["codes_differ_pct"] for r in trace("stem_conv.requant", 1.0).layers}
    for point, next_quantizer in (
            ("blocks.1.se.gate.se_gate", "blocks.1.project_conv.input_quant"),
            ("blocks.0.act1.hsigmoid", "blocks.0.dw_conv.input_quant")):
        flips = trace(point, 1.0 + 2e-5)
        at = {r["layer"]: r["codes_differ_pct"] for r in flips.layers}
        assert at[point] > exact[point], flips.layers
        assert flips.starts_as_flips, flips.describe()
        # untraced, the flips looked like a real error in the next quantizer
        blind = trace(point, 1.0 + 2e-5, blind=True)
        assert blind.unexplained == next_quantizer, blind.describe()
        wrong = trace(point, 1.1)
        assert wrong.unexplained == point, wrong.describe()
