"""Richer ceiling models and session evidence (benchmarks/latency_ceiling.py,
benchmarks/latency_ceiling_models.py) and the richer residual learners of
benchmarks/latency_growth_variants.py (issue 48)."""

from __future__ import annotations

import numpy as np
import pytest
from benchmarks import latency_ceiling as ceiling
from benchmarks import latency_ceiling_models as models


@pytest.fixture(scope="module")
def device(nb201_sample):
    """A synthetic NB-201 device whose latency is additive per operation times a cell-graph
    term (convolutions on the costliest live path), which no additive model holds."""
    space, archs = nb201_sample(300, 3)
    rng = np.random.default_rng(4)
    enc = np.stack([space.encode(space.from_string(a)) for a in archs])
    paths = ceiling.path_features(space, archs)
    y = (1.0 + enc @ rng.uniform(0, 0.2, enc.shape[1])) * 1.6 ** paths[:, 2]
    return space, archs, y


def test_sessions_ceiling_per_arch_counts_each_architectures_sessions():
    assert ceiling.sessions_ceiling_per_arch(np.full(10, 4), 0.81) == pytest.approx(
        ceiling.sessions_ceiling(4, 0.81))
    # a quarter of the cells measured once: noisier than the four-session count says
    mixed = ceiling.sessions_ceiling_per_arch(np.r_[np.full(30, 4), np.full(10, 1)], 0.81)
    assert ceiling.sessions_ceiling(1, 0.81) < mixed < ceiling.sessions_ceiling(4, 0.81) - 0.01
    assert ceiling.sessions_ceiling_per_arch(np.full(5, 2), 0.0) == 0.0


def test_rich_models_learn_a_cell_graph_term_the_additive_ridge_misses(device):
    space, archs, y = device
    rich = ceiling.rich_features(space, archs)
    assert rich["onehot"].shape[0] == rich["terms"].shape[0] == rich["pairs"].shape[0] == 300
    preds = ceiling.rich_most_fit(space, archs, y, folds=3, models=("gp",), with_base=False)
    assert set(preds) == {"gp", "ens"}
    additive = ceiling.most_fit(ceiling.ceiling_features(space, archs), y)["additive"]
    sp = models.lofo.spearman
    assert sp(preds["gp"], y) > 0.99 > additive + 0.01


def test_session_evidence_tells_reproducible_misses_from_noise(device):
    space, archs, y = device
    rng = np.random.default_rng(5)
    hidden = np.exp(0.3 * rng.standard_normal(len(y)))  # reproducible, not in the features

    def sessions(truth):
        return [dict(zip(archs, truth * np.exp(0.05 * rng.standard_normal(len(y)))))
                for _ in range(3)]

    rounds = [{a: i // 20 for i, a in enumerate(archs)}] * 3
    exact = models.session_evidence(space, archs, np.log(y), sessions(y), rounds)
    missed = models.session_evidence(space, archs, np.log(y), sessions(y * hidden), rounds)
    assert exact["model_vs_truth"] > 0.97 and abs(exact["residual_r_between_sessions"]) < 0.2
    assert missed["residual_r_between_sessions"] > 0.8 and missed["model_vs_truth"] < 0.95
    assert exact["same_rounds_share"] == 1.0 and exact["session_counts"] == {3: 300}
    # a round's shared slowdown (every session) shows in its other cells' residuals
    slow = np.array([1.5 if i // 20 % 2 else 1.0 for i in range(len(y))])
    shared = models.session_evidence(space, archs, np.log(y), sessions(y * slow), rounds)
    assert np.mean(shared["round_residual_r"]) > 0.5 > np.mean(exact["round_residual_r"])
    assert shared["round_mean_r_between_sessions"] > 0.8 > exact["round_mean_r_between_sessions"]


def test_rich_residual_learner_takes_weight_on_a_missed_term(device, monkeypatch):
    from benchmarks import latency_growth_variants as var

    monkeypatch.setitem(ceiling.RICH_TREES, "max_iter", 60)  # 600 rounds take 20 s here
    monkeypatch.setitem(ceiling.RICH_TREES, "learning_rate", 0.3)

    space, archs, y = device
    fit, query = archs[:100], archs[100:]
    prior = y / 1.6 ** ceiling.path_features(space, archs)[:, 2]  # misses the path term
    sp = models.lofo.spearman
    for name in ("gp+", "trees+"):
        w, factor = var._residual(space, None, fit, y[:100], prior[:100], 0, name)
        assert w > 0.5, name
        assert sp(prior[100:] * factor(query), y[100:]) > sp(prior[100:], y[100:]) + 0.05, name
    # nothing to learn: no weight
    assert var._residual(space, None, fit, y[:100], y[:100], 0, "gp+") == (0.0, None)
