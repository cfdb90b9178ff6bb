"""Stream candidates of the per-device recommendation (export.recommend): on OpenVINO devices
with two threads or more at a batch of two or more, each verified f32/bf16 candidate also runs
split over 2 and 4 streams; such a candidate takes its one-stream twin's verification (nothing
is verified twice), is timed with the others and, when chosen, its settings name the streams.
The OpenVINO cases skip when the ``openvino`` extra is not installed; nothing here needs torch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hwnas.export import recommend as rec
from hwnas.export.recommend import (
    CandidateFile,
    recommend_file,
    stream_counts,
    verify_candidates,
)
from hwnas.latency.devices import MeasuredDevice
from latency_support import linear_onnx, needs_ov
from onnx import numpy_helper


def _linear_model() -> bytes:
    return linear_onnx(np.random.default_rng(0).standard_normal((4, 4)))


def _problem() -> tuple[list[CandidateFile], dict, np.ndarray, np.ndarray]:
    data = _linear_model()
    x = np.random.default_rng(1).standard_normal((64, 4)).astype(np.float32)
    w = numpy_helper.to_array(onnx.load_from_string(data).graph.initializer[0])
    logits = x @ w
    return [CandidateFile("m.onnx", data, "fp32", "float")], {"float": logits}, x, logits.argmax(1)


def test_stream_counts_need_openvino_two_threads_and_a_batch_to_split() -> None:
    assert stream_counts("openvino", 8, 32) == (2, 4, 8)
    assert stream_counts("openvino", 4, 32) == (2, 4)  # 8 streams would leave some without a thread
    assert stream_counts("openvino", 16, 12) == (2, 4)  # 12 images do not split into 8 equal parts
    assert stream_counts("openvino", 2, 32) == (2,)  # 4 streams would leave some without a thread
    assert stream_counts("openvino", 8, 6) == (2,)  # 6 images do not split into 4 equal parts
    assert stream_counts("openvino", 1, 32) == stream_counts("openvino", 8, 1) == ()
    assert stream_counts("openvino", 8, None) == stream_counts("onnxruntime", 8, 32) == ()


@needs_ov
def test_stream_candidates_take_the_verification_and_carry_their_settings(monkeypatch) -> None:
    files, refs, x, labels = _problem()
    passes = []
    real = rec._agreement
    monkeypatch.setattr(rec, "_agreement", lambda runner, *a: passes.append(runner) or real(runner, *a))
    cands, runners, _ = verify_candidates(runtime="openvino", threads=2, files=files,
                                          references=refs, images=x, labels=labels, batch=4,
                                          streams=None)
    by = {c.label: c for c in cands}
    split = by["m.onnx@f32x2"]
    assert split.streams == 2 and split.verified and split.precision == "fp32"
    assert split.settings == {"INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 2, "static_batch": 2}
    assert (split.top1_agreement, split.test_accuracy) == (by["m.onnx"].top1_agreement,
                                                           by["m.onnx"].test_accuracy)
    assert runners["m.onnx@f32x2"].streams == 2 and runners["m.onnx"].streams == 1
    assert all(r.streams == 1 for r in passes)  # only the one-stream runners ran the images
    assert not any("x4" in label for label in by)  # 4 streams > 2 threads
    if "m.onnx@bf16" in by and by["m.onnx@bf16"].verified:
        assert by["m.onnx@bf16x2"].settings["INFERENCE_PRECISION_HINT"] == "bf16"
    assert not any(label.startswith("m.onnx@f16x") for label in by)
    # one thread, or one image per call: no stream candidates
    for threads, batch in ((1, 4), (2, 1)):
        cands, _, _ = verify_candidates(runtime="openvino", threads=threads, files=files,
                                        references=refs, images=x, labels=labels, batch=batch)
        assert all(c.streams == 1 for c in cands) and not any("x2" in c.label for c in cands)


@needs_ov
def test_a_chosen_stream_candidate_names_its_streams(monkeypatch) -> None:
    files, refs, x, labels = _problem()

    def timing(runners, *, batch, rounds, runs, **_):
        assert runners["m.onnx@f32x2"].at_batch(batch).get_inputs()[0].shape[0] == batch
        # the two-stream runner is the fastest in every round
        return {label: np.full((rounds, runs), 5.0 if label.endswith("x2") else 10.0)
                for label in runners}

    monkeypatch.setattr(rec, "time_candidates", timing)
    out = recommend_file(MeasuredDevice("cpu-ov-2t-b4", threads=2, batch=4, runtime="openvino"),
                         files=files,
                         references=refs, images=x, labels=labels, rounds=2, runs=2)
    assert out.chosen.streams == 2 and out.chosen.settings["NUM_STREAMS"] == 2
    assert out.chosen.settings["static_batch"] == 2 and out.speedup == pytest.approx(2.0)
    assert any(c["streams"] == 2 for c in out.as_dict()["candidates"])


@needs_ov
def test_batch_that_does_not_split_gets_no_stream_candidate() -> None:
    files, refs, x, labels = _problem()
    cands, _, notes = verify_candidates(runtime="openvino", threads=2, files=files,
                                        references=refs, images=x, labels=labels, batch=3,
                                        streams=[2])
    assert not any(c.streams > 1 for c in cands)
    assert any("m.onnx@f32x2: batch 3 does not split into 2 equal sub-batches" in n for n in notes)
