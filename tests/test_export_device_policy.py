"""Tests for export.ort_profile and export.device_policy: per-layer time attributed to policy
layers, the per-device choice of float layers and the never-slower rule."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.export.device_policy import DevicePolicy, LayerSpeed, ProfiledLayerTimer
from hwnas.export.ort_profile import LayerIndex, profile_model
from hwnas.export.qdq import build_qdq, float_proto, map_layer_nodes
from hwnas.quant.policy import uniform


def test_profile_attributes_time_to_layers(qdq_net, qdq_images) -> None:
    build = build_qdq(qdq_net, uniform(qdq_net, 8, 8), [qdq_images[0]])
    proto = build.proto()
    index = LayerIndex.from_source(proto, build.builder.node_of)
    prof = profile_model(proto.SerializeToString(), batch=4, runs=3, warmup=1)
    per_layer = index.attribute(prof.optimized.graph, prof.node_ms)
    assert all(per_layer.get(n, 0.0) > 0 for n in build.integer_layers())
    assert sum(per_layer.values()) == pytest.approx(prof.total_ms)
    fp32 = float_proto(qdq_net, qdq_images[0][:1])
    findex = LayerIndex.from_source(fp32, map_layer_nodes(fp32, build.policy.layer_names))
    fprof = profile_model(fp32.SerializeToString(), batch=4, runs=3, warmup=1)
    assert set(findex.anchors(fprof.optimized.graph).values()) == set(build.policy.layer_names)


def test_device_policy_properties_and_speedup_table() -> None:
    speeds = [LayerSpeed("a", "pointwise", 2.0, 1.0), LayerSpeed("b", "depthwise", 1.0, 2.0)]
    slower = DevicePolicy("cpu-ort-1t", 1, 1, ["b"], fp32_ms=1.0, fp32_p95_ms=1.1,
                          uniform_ms=1.5, chosen_ms=1.2, chosen_p95_ms=1.3,
                          chosen_label="profile", layers=speeds)
    assert not slower.quantized_faster and slower.speedup == pytest.approx(1 / 1.2)
    assert slower.speedup_table() == {"a": 2.0, "b": 0.5}
    from hwnas.supernet.layers import Layer

    layers = [Layer("a", "conv", 8, 8, 1, 1, 1, 4, 4), Layer("b", "conv", 8, 8, 3, 1, 8, 4, 4)]
    assert slower.speedup_table(layers) == {"a": 2.0, "b": 0.5}
    assert ProfiledLayerTimer({s.layer: s for s in speeds})(layers[0], True) == 1.0
    assert slower.as_dict()["quantized_faster"] is False
    lucky = DevicePolicy("cpu-ort-1t", 1, 1, [], fp32_ms=1.0, fp32_p95_ms=1.1, uniform_ms=0.9,
                         chosen_ms=0.9, chosen_p95_ms=1.0, chosen_label="all-int8",
                         faster_twice=False)
    assert not lucky.quantized_faster  # faster in one timing only


def test_choice_survives_a_rejected_refinement_among_the_finalists(monkeypatch) -> None:
    """A greedy step that lost its own timing can still rank among the two fastest candidates
    when the machine's speed drifts between timings; the final timing must still be able to
    run it (it once raised KeyError), and the truly fastest model wins there."""
    import hwnas.export.device_policy as dp

    def build(float_layers):  # noqa: ANN001, ANN202 - fake model bytes naming the float layers
        return ("q:" + ",".join(sorted(float_layers))).encode()

    def base_ms(blob: bytes) -> float:  # FP32 10 ms; int8 8 ms + 1 ms per float layer
        text = blob.decode()
        return 10.0 if text == "fp32" else 8.0 + len([x for x in text[2:].split(",") if x])

    calls: list[int] = []

    def fake_time(models, **kw):  # noqa: ANN001, ANN202 - the 2nd timing runs at twice the speed
        calls.append(len(models))
        factor = 0.5 if len(calls) == 2 else 1.0
        return {label: np.full((2, 3), base_ms(b) * factor) for label, b in models.items()}

    def fake_per_layer(index, model, **kw):  # noqa: ANN001, ANN202 - layer c loses in int8
        return ({"a": 1.0, "b": 1.0, "c": 1.0} if model == b"fp32"
                else {"a": 0.5, "b": 0.5, "c": 2.0})

    monkeypatch.setattr(dp, "time_rounds", fake_time)
    monkeypatch.setattr(dp, "_per_layer", fake_per_layer)
    choice = dp.choose_float_layers(build, b"fp32", ["a", "b", "c"], {}, fp32_index=None,
                                    qdq_index=None, refine=1)
    labels = {c.label: c for c in choice.candidates}
    assert labels["profile"].float_layers == ["c"] and labels["refine-0"].float_layers == ["a"]
    assert labels["refine-0"].median_ms == 4.5  # rejected (4.5 > all-int8's 4.0 beside it)
    assert len(calls) == 3 and calls[-1] == 3  # final: fp32, refine-0, all-int8
    assert choice.chosen_label == "all-int8" and choice.float_layers == []
    assert choice.chosen_ms == 8.0 and choice.fp32_ms == 10.0 and choice.quantized_faster


def test_one_session_per_model_across_the_timings_of_a_choice(monkeypatch) -> None:
    """time_rounds takes the runners it is given by label and keeps the ones it makes; a choice
    passes one such dict to all its timings, starting from the FP32 session it was given."""
    import hwnas.export.device_policy as dp
    import hwnas.latency.onnx_measure as om

    made: list[bytes] = []
    monkeypatch.setattr(om, "make_runner", lambda blob, threads: made.append(blob) or blob)
    monkeypatch.setattr(om, "time_interleaved",
                        lambda runners, **kw: {k: np.full((1, 2), 1.0) for k in runners})
    cache: dict = {}
    dp.time_rounds({"fp32": b"f", "a": b"a"}, runners=cache)
    got = dp.time_rounds({"fp32": b"f", "b": b"b"}, runners=cache)
    assert made == [b"f", b"a", b"b"] and set(got) == {"fp32", "b"}

    seen: list[dict] = []

    def fake_time(models, **kw):  # noqa: ANN001, ANN202
        seen.append(kw["runners"])
        for label, blob in models.items():
            kw["runners"].setdefault(label, blob)
        return {label: np.full((2, 3), 8.0 if label == "fp32" else 4.0) for label in models}
    monkeypatch.setattr(dp, "time_rounds", fake_time)
    monkeypatch.setattr(dp, "_per_layer", lambda index, model, **kw: {"a": 1.0, "b": 1.0})
    fp32_session = object()
    dp.choose_float_layers(lambda fl: ("q:" + ",".join(fl)).encode(), b"fp32", ["a", "b"], {},
                           fp32_index=None, qdq_index=None, runners={"fp32": fp32_session})
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0]["fp32"] is fp32_session
