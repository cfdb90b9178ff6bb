"""Noise ceilings of latency tables (benchmarks/latency_ceiling.py) and how the LOFO summary
reports the mean over families whose ceiling leaves room (benchmarks/latency_lofo.py)."""

from __future__ import annotations

import numpy as np
import pytest
from benchmarks import latency_ceiling as ceiling
from benchmarks import latency_lofo as lofo


@pytest.fixture(scope="module")
def nb201():
    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    rng = np.random.default_rng(0)
    archs = list(dict.fromkeys(space.to_string(space.sample(rng)) for _ in range(300)))
    return space, archs


def test_pair_products_one_column_per_choice_pair():
    E = np.array([[1, 0, 0, 1, 0], [0, 1, 1, 0, 0]], float)
    pos = [np.array([0, 1]), np.array([2, 3, 4])]
    from hwnas.latency.predictors.features import pair_products

    P = pair_products(E, pos, adjacent_only=False)
    assert P.shape == (2, 6)
    assert P[0].tolist() == [0, 1, 0, 0, 0, 0] and P[1].tolist() == [0, 0, 0, 1, 0, 0]


def test_split_half_tracks_the_noise(nb201):
    space, archs = nb201
    feats = ceiling.ceiling_features(space, archs)
    assert set(feats) == {"additive", "pairwise", "trees"}  # 6 edges: pairs included
    rng = np.random.default_rng(1)
    enc = np.stack([space.encode(space.from_string(a)) for a in archs])
    clean = 1.0 + enc @ rng.uniform(0, 1, enc.shape[1])
    quiet = ceiling.split_half(feats, clean * np.exp(0.01 * rng.standard_normal(len(archs))))
    loud = ceiling.split_half(feats, clean * np.exp(0.5 * rng.standard_normal(len(archs))))
    assert quiet["best"] > 0.97
    assert loud["best"] < quiet["best"] - 0.2
    assert quiet["best"] == max(v for k, v in quiet.items() if k != "best")


def test_most_fit_and_the_sessions_ceiling(nb201):
    space, archs = nb201
    feats = ceiling.ceiling_features(space, archs)
    rng = np.random.default_rng(2)
    enc = np.stack([space.encode(space.from_string(a)) for a in archs])
    y = (1.0 + enc @ rng.uniform(0, 1, enc.shape[1])) * np.exp(
        0.1 * rng.standard_normal(len(archs)))
    most, half = ceiling.most_fit(feats, y), ceiling.split_half(feats, y)
    assert most["best"] == max(v for k, v in most.items() if k != "best")
    assert most["best"] > half["best"] - 0.02  # four fifths to train on, not a half
    # one session: the ceiling is sqrt(rho); more sessions average the noise away
    assert ceiling.sessions_ceiling(1, 0.81) == pytest.approx(0.9)
    assert ceiling.sessions_ceiling(4, 0.81) > 0.97 and ceiling.sessions_ceiling(3, 1.0) == 1.0
    rows = lofo.ceiling_rows(space, "f", ["d"], {"d": (archs, y)}, {}, agreement={"d": (2, 0.9)})
    by = {r["measurements"]: r["spearman_mean"] for r in rows}
    assert set(by) == {"fit", "most", "sessions", "stated"}
    assert by["stated"] == by["sessions"] == pytest.approx(np.sqrt(1.8 / 1.9), abs=1e-4)
    rows = lofo.ceiling_rows(space, "f", ["d"], {"d": (archs, y)}, {}, most=False)
    assert {r["measurements"]: r["spearman_mean"] for r in rows}["stated"] == by["fit"]


def test_repeat_ceiling_is_one_without_noise_and_falls_with_it():
    y = np.linspace(1, 3, 200)
    assert ceiling.repeat_ceiling(y, np.zeros(200)) == pytest.approx(1.0)
    small = ceiling.repeat_ceiling(y, np.full(200, 0.02))
    large = ceiling.repeat_ceiling(y, np.full(200, 0.3))
    assert 1.0 > small > large
    # cells without a cv take the column's median
    assert ceiling.repeat_ceiling(y, np.r_[np.full(199, 0.3), np.nan]) == pytest.approx(
        large, abs=0.02)


def test_summary_reports_the_mean_over_clean_families():
    rows = [{"space": "s", "predictor": p, "measurements": m, "family": f, "device": f + "1",
             "spearman_mean": v}
            for p, m, f, v in (("ceiling", "fit", "a", 0.99), ("ceiling", "fit", "b", 0.6),
                               ("ceiling", "fit", "c", 0.96),
                               ("meta", "ref", "a", 0.9), ("meta", "ref", "b", 0.5),
                               ("meta", "ref", "c", 0.8))]
    out = {s["predictor"]: s for s in lofo.summarize(rows)}
    assert out["meta"]["clean_families"] == ["a", "c"]
    assert out["meta"]["clean_mean"] == pytest.approx(0.85)
    assert out["meta"]["spearman_mean"] == pytest.approx(0.7333, abs=1e-4)
    assert out["ceiling"]["clean_mean"] == pytest.approx(0.975)
