"""The int8/float choice and the recommendation do not follow timing noise: float layers are
kept only where float clearly pays, and near-equal files tie towards the smaller one."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.export.device_policy import Candidate, choose_float_layers, prefer_int8
from hwnas.export.recommend import DeviceCandidate, choose_fastest
from hwnas.latency.onnx_measure import MAX_MARGIN, MIN_MARGIN, clearly_faster, paired_margin


def _drifting(base: dict[str, float], rng: np.random.Generator, *, noise: float,
              rounds: int = 5, runs: int = 5, start: float = 1.0) -> dict[str, np.ndarray]:
    """Paired timings of ``base`` ms each: the machine's speed drifts from round to round (a
    common factor), and every call has its own relative noise of up to ``noise``."""
    drift = start * np.linspace(1.0, 1.3, rounds)[:, None]
    return {label: ms * drift * (1.0 + rng.uniform(-noise, noise, (rounds, runs)))
            for label, ms in base.items()}


def test_paired_margin_measures_the_noise_not_the_drift() -> None:
    drift = np.linspace(1.0, 2.0, 5)[:, None] * np.ones((5, 3))
    assert paired_margin(10 * drift, 9 * drift) == MIN_MARGIN  # drift cancels in the ratio
    noisy = 10 * drift * np.array([1.0, 1.2, 1.0, 0.8, 1.0])[:, None]  # +-20 % per round
    assert paired_margin(noisy, 9 * drift) == pytest.approx(MAX_MARGIN)  # 20 % noise, capped
    mild = 10 * drift * np.array([1.0, 1.05, 1.0, 0.95, 1.0])[:, None]  # +-5 % per round
    assert paired_margin(mild, 9 * drift) == pytest.approx(0.05)
    assert paired_margin(np.ones((1, 3)), np.ones((1, 3)), floor=0.05) == 0.05  # one round
    assert clearly_faster(9 * drift, 10 * drift)  # 10 % faster, no noise
    assert not clearly_faster(9.8 * drift, 10 * drift)  # 2 %: below the 3 % minimum
    assert not clearly_faster(9.2 * drift, noisy)  # 8 % faster, but 20 % noise
    assert clearly_faster(8 * drift, noisy)  # 20 % faster: noise cannot tie that away


def test_prefer_int8_keeps_int8_unless_float_clearly_pays() -> None:
    cands = [Candidate("all-int8", []), Candidate("profile", ["a"]),
             Candidate("dense-only-int8", ["a", "b"])]
    rng = np.random.default_rng(0)
    near = _drifting({"all-int8": 10.0, "profile": 9.85, "dense-only-int8": 9.78}, rng,
                    noise=0.01)
    assert prefer_int8(cands, near).label == "all-int8"
    far = _drifting({"all-int8": 10.0, "profile": 9.85, "dense-only-int8": 8.0}, rng, noise=0.01)
    assert prefer_int8(cands, far).label == "dense-only-int8"
    # the fastest clearly beats all-int8 but not profile: profile keeps more int8 layers
    mid = _drifting({"all-int8": 10.0, "profile": 8.1, "dense-only-int8": 8.0}, rng, noise=0.005)
    assert prefer_int8(cands, mid).label == "profile"


def _fake_models(monkeypatch, true_ms: dict[tuple[str, ...], float], seed: int) -> None:
    """``choose_float_layers``'s profiles and timings on fake models: layer ``c`` loses in
    int8 in the profile; a model's time is ``true_ms`` of its float layers, drifting and
    noisy (1.5 %), different in every call."""
    import hwnas.export.device_policy as dp

    rng = np.random.default_rng(seed)
    calls = []

    def fake_time(models, *, rounds=5, runs=5, **kw):  # noqa: ANN001, ANN202
        calls.append(1)
        base = {}
        for label, blob in models.items():
            text = blob.decode()
            layers = () if text in ("fp32", "q:") else tuple(text[2:].split(","))
            base[label] = 12.0 if text == "fp32" else true_ms[layers]
        return _drifting(base, rng, noise=0.015, rounds=rounds, runs=runs,
                         start=1.0 + 0.5 * len(calls))

    def fake_per_layer(index, model, **kw):  # noqa: ANN001, ANN202
        return ({"a": 1.0, "b": 1.0, "c": 1.0} if model == b"fp32"
                else {"a": 0.5, "b": 0.5, "c": 1.4})

    monkeypatch.setattr(dp, "time_rounds", fake_time)
    monkeypatch.setattr(dp, "_per_layer", fake_per_layer)


def _choose():  # noqa: ANN202
    return choose_float_layers(lambda fl: ("q:" + ",".join(sorted(fl))).encode(), b"fp32",
                               ["a", "b", "c"], {"a": "pointwise", "b": "pointwise",
                                                 "c": "depthwise"},
                               fp32_index=None, qdq_index=None, refine=1)


@pytest.mark.parametrize("float_c_ms, chosen", [(9.85, []), (8.0, ["c"])])
def test_the_choice_is_the_same_in_every_noisy_run(monkeypatch, float_c_ms, chosen) -> None:
    """Keeping ``c`` float is 1.5 % faster (within noise): all-int8, in every run. 20 % faster:
    float ``c``, in every run. (Choosing the fastest median flips between runs on the first.)"""
    true_ms = {(): 10.0, ("c",): float_c_ms, ("a",): 10.5, ("a", "c"): float_c_ms + 0.5}
    got = []
    for seed in range(12):
        _fake_models(monkeypatch, true_ms, seed)
        choice = _choose()
        got.append(choice.float_layers)
        assert choice.quantized_faster  # every variant beats FP32's 12 ms
    assert all(g == chosen for g in got), got


def _cand(label: str, precision: str, size: int, runtime_precision: str = "f32"
          ) -> DeviceCandidate:
    return DeviceCandidate(label, label.split("@")[0], precision, verified=True,
                           size_bytes=size, runtime_precision=runtime_precision)


def test_recommendation_ties_towards_the_smaller_file_and_never_a_slower_one() -> None:
    rng = np.random.default_rng(3)
    for _ in range(10):
        fp32, qdq, dev = (_cand("m.onnx", "fp32", 400), _cand("qdq/m.onnx", "int8", 120),
                          _cand("qdq-cpu/m.onnx", "mixed", 100))
        bf16 = _cand("m.onnx@bf16", "bf16", 400, "bf16")
        times = _drifting({"m.onnx": 10.0, "qdq/m.onnx": 7.9, "qdq-cpu/m.onnx": 8.0,
                           "m.onnx@bf16": 7.85}, rng, noise=0.01)
        chosen = choose_fastest([fp32, qdq, dev, bf16], times, "m.onnx")
        assert chosen is dev  # within noise of the fastest, and the smallest file
        assert chosen.median_ms < fp32.median_ms
        assert "within the paired timing's noise" in qdq.note
    # clearly faster wins over smaller; a tie that is slower than FP32 is not a candidate
    fp32, qdq, dev = (_cand("m.onnx", "fp32", 400), _cand("qdq/m.onnx", "int8", 120),
                      _cand("qdq-cpu/m.onnx", "mixed", 100))
    times = _drifting({"m.onnx": 10.0, "qdq/m.onnx": 6.0, "qdq-cpu/m.onnx": 8.0}, rng,
                      noise=0.005)
    assert choose_fastest([fp32, qdq, dev], times, "m.onnx") is qdq
    slow = _cand("slow.onnx", "int8", 10)
    times = _drifting({"m.onnx": 10.0, "qdq/m.onnx": 9.95, "slow.onnx": 10.1}, rng, noise=0.001)
    fp32, qdq = _cand("m.onnx", "fp32", 400), _cand("qdq/m.onnx", "int8", 120)
    chosen = choose_fastest([fp32, qdq, slow], times, "m.onnx")
    assert chosen is not slow and chosen.median_ms <= fp32.median_ms


def test_one_wild_round_does_not_tie_a_much_faster_file_away() -> None:
    """The Xeon's case: a bf16 FP32 file ~20 % faster than the int8 file, one round 40 % off.
    Half the range of the round ratios is then ~25 %, but the tie margin stops at MAX_MARGIN,
    so the faster file is recommended, not the smaller one."""
    drift = np.linspace(1.0, 1.3, 5)[:, None] * np.ones((5, 5))
    wild = np.array([1.0, 1.0, 1.4, 1.0, 1.0])[:, None]
    times = {"m.onnx": 27.0 * drift, "qdq/m.onnx@x4": 20.6 * drift,
             "m.onnx@bf16x8": 16.3 * drift * wild}
    assert paired_margin(times["m.onnx@bf16x8"], times["qdq/m.onnx@x4"]) == MAX_MARGIN
    fp32, bf16 = _cand("m.onnx", "fp32", 400), _cand("m.onnx@bf16x8", "bf16", 400, "bf16")
    qdq = _cand("qdq/m.onnx@x4", "int8", 120)
    assert choose_fastest([fp32, qdq, bf16], times, "m.onnx") is bf16
    # within MAX_MARGIN and within the noise: the smaller file still wins the tie
    times["m.onnx@bf16x8"] = 19.2 * drift * wild
    fp32, bf16 = _cand("m.onnx", "fp32", 400), _cand("m.onnx@bf16x8", "bf16", 400, "bf16")
    qdq = _cand("qdq/m.onnx@x4", "int8", 120)
    assert choose_fastest([fp32, qdq, bf16], times, "m.onnx") is qdq
