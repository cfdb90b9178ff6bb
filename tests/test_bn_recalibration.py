"""benchmarks/bn_recalibration.py's ranking figures: Kendall/Spearman, the flipped pairs with
their reference gaps, and the session-32 rule that keeps or changes the default setting."""

from __future__ import annotations

import pytest

from benchmarks import bn_recalibration as bn


def test_ranking_agreement_counts_flips_and_their_gaps() -> None:
    ref = [90.0, 91.0, 91.1, 93.0]
    x = [90.2, 91.3, 91.2, 92.0]          # one flip: subnets 1 and 2, 0.1 apart in ref
    g = bn.ranking_agreement(x, ref, spread=0.1)
    assert g["pairs"] == 6 and [(i, j) for i, j, _ in g["flips"]] == [(1, 2)]
    assert g["max_flip_gap"] == pytest.approx(0.1) and g["flips_beyond_spread"] == 0
    assert g["kendall_tau"] == pytest.approx(4 / 6) and g["spearman"] == pytest.approx(0.8)
    assert bn.ranking_agreement(x, ref, spread=0.05)["flips_beyond_spread"] == 1
    tied = bn.ranking_agreement([90.0, 91.0, 91.0, 92.0], ref)   # a tie is not a flip
    assert tied["flips"] == [] and tied["flips_beyond_spread"] is None
    assert bn.ranking_agreement(ref[::-1], ref)["max_flip_gap"] == pytest.approx(3.0)


def test_decide_keeps_a_default_whose_flips_the_reference_could_make() -> None:
    ref = {"a": 90.0, "b": 91.0, "c": 91.1, "d": 93.0}
    ref1 = {"a": 90.04, "b": 91.0, "c": 91.12, "d": 93.0}    # spread 0.04, tau 1
    close = {"a": 89.8, "b": 91.1, "c": 91.0, "d": 92.8}     # flips b/c, 0.1 apart
    d = bn.decide(ref, (ref1, ref), [close, close], min_tau_subnets=4)
    assert (d["tau_ref"], d["d_ref"]) == (pytest.approx(1.0), pytest.approx(0.04))
    assert d["default_tau_mean_on_noise_subnets"] == pytest.approx(4 / 6)
    assert d["default_flips"] == [1, 1] and d["default_flips_beyond_d_ref"] == 2
    assert not d["keep_default"] and d["verdict"] == "change"
    assert d["flipped"][0]["a"] == "b" and d["flipped"][0]["ref_gap"] == pytest.approx(0.1)
    wide = dict(ref1, b=91.2)                                 # the reference flips b/c itself
    d = bn.decide(ref, (wide, ref), [close], proxy=True, min_tau_subnets=4)
    assert d["default_flips_beyond_d_ref"] == 0 and d["verdict"] == "keep (provisional)"
    assert bn.decide(ref, (ref1, ref), [dict(ref)], min_tau_subnets=4)["keep_default"]  # tau 1


def test_decide_takes_the_spread_from_fewer_subnets_than_it_counts_flips_on() -> None:
    ref = {"a": 90.0, "b": 91.0, "c": 91.1, "d": 93.0}
    ref1 = {"a": 90.15, "b": 91.05}                           # the reference's noise on two subnets
    close = {"a": 89.8, "b": 91.1, "c": 91.0, "d": 92.8}
    d = bn.decide(ref, (ref1, ref), [close])
    assert (d["subnets"], d["noise_subnets"], d["d_ref"]) == (4, 2, pytest.approx(0.15))
    assert d["tau_ref"] is None and d["default_flips_beyond_d_ref"] == 0 and d["keep_default"]
    assert not bn.decide(ref, (dict(ref1, a=90.05), ref), [close])["keep_default"]  # spread 0.05
    # only the subnets every default seed has count
    assert bn.decide(ref, (ref1, ref), [close, {k: v for k, v in close.items() if k != "d"}])["subnets"] == 3
