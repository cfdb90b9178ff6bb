"""A QDQ file whose top-1 agreement with its fake-quant reference is low only because float
rounding flipped near-tied logits passes, said so (``parity_note``); a systematic difference
still fails (export.onnx_export.divergence_of, export.verify.verify_qdq)."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.export.model_export import ExportSettings, export_model
from hwnas.export.onnx_export import divergence_of
from hwnas.export.passes import ImagePasses
from hwnas.export.run_export import _summary_line
from hwnas.quant.policy import uniform


def _logits(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Reference logits of a weak model (mostly near-tied, a few confident) and labels."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(0.0, 0.2, (n, 10))
    ref[:40, 3] += 3.0  # 40 confident predictions of class 3
    labels = ref.argmax(1)
    labels[40:] = rng.integers(0, 10, n - 40)  # the near-tied rest: about chance
    return ref, labels


def _flip_near_ties(ref: np.ndarray, rows: int) -> np.ndarray:
    """The top two logits swapped on the ``rows`` least confident images: what a one-level
    rounding flip amplified by the layers after it does."""
    got = ref.copy()
    s = np.sort(ref, 1)
    for i in np.argsort(s[:, -1] - s[:, -2])[:rows]:
        a, b = np.argsort(ref[i])[-2:]
        got[i, a], got[i, b] = ref[i, b], ref[i, a]
    return got


def test_rounding_flips_on_near_ties_are_told_from_export_errors() -> None:
    ref, labels = _logits()
    flipped = _flip_near_ties(ref, 10)  # 95% top-1 agreement
    assert np.mean(flipped.argmax(1) == ref.argmax(1)) == pytest.approx(0.95)
    why = divergence_of(flipped, ref, labels)
    assert why.rounding and why.exact_share == pytest.approx(0.95) and why.confident >= 35
    assert abs(why.accuracy_delta) <= 2.0
    assert why.confident_agreement == 1.0 and "95.0% of images exact" in why.describe()
    # a wrong scale moves every image: not rounding, whatever the agreement
    assert not divergence_of(ref * 1.02 + 0.01, ref, labels).rounding
    # confident predictions changed: not rounding
    wrong = flipped.copy()
    wrong[:5, 3] -= 5.0
    assert not divergence_of(wrong, ref, labels).rounding
    # accuracy lost beyond max_accuracy_drop: not rounding
    worse = ref.copy()
    hit = np.flatnonzero(ref.argmax(1) == labels)[:12]
    worse[hit, labels[hit]] -= 10.0
    why = divergence_of(worse, ref, labels, max_accuracy_drop=2.0)
    assert why.accuracy_delta < -2.0 and not why.rounding


@pytest.mark.parametrize("broken", [False, True])
def test_qdq_check_passes_rounding_flips_and_fails_a_systematic_difference(
        qdq_net, qdq_images, tmp_path, monkeypatch, broken: bool) -> None:
    """The QDQ file's onnxruntime logits altered: near-tied flips on 5% of the images pass with
    a note; every image moved fails, with the diagnosis in the error."""
    calib, test = qdq_images
    real = ImagePasses.onnx

    def altered(self, path, data):
        got = real(self, path, data)
        if not path.startswith("qdq/"):
            return got
        flipped = _flip_near_ties(got, max(1, len(got) // 20))
        if broken:  # e.g. a wrong scale somewhere: every image moves a little
            spread = float(np.median(got.max(1) - got.min(1)))
            noise = np.random.default_rng(0).normal(0.0, 0.01 * spread, got.shape)
            return (flipped + noise).astype(got.dtype)
        return flipped

    monkeypatch.setattr(ImagePasses, "onnx", altered)
    result = export_model(qdq_net, name="m", out_dir=tmp_path, example=test[:1], test_images=test,
                          policy=uniform(qdq_net, 8, 8), calibration=[calib],
                          settings=ExportSettings(warmup=1, rounds=1))
    report = {f.path: f for f in result.files}["qdq/m.onnx"]
    assert report.top1_agreement < 0.99
    if broken:
        assert not report.ok and "quantized parity failed" in report.error
        assert "of images exact" in report.error
    else:
        assert report.ok and report.written, report.error
        assert "near-tied logits" in report.parity_note and "% of images exact" in report.parity_note
        assert "qdq/m.onnx agrees" in _summary_line(result)  # the line the CLI prints says so
