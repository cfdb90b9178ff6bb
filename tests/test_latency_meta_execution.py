"""Execution variants (dead-code pruning) and the robust fit of the meta latency predictor."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.latency.predictors import MetaPredictor, load_pretrained
from hwnas.latency.predictors.features import (
    executed,
    execution_prior,
    execution_variants,
    features,
)
from hwnas.latency.predictors.meta import greedy_design
from hwnas.supernet.spaces import get_space

from hwnas.core.errors import UserError
from hwnas.core.maths import spearman as rho


@pytest.fixture(scope="module")
def nb201(nb201_sample):
    return nb201_sample(1500, seed=5)


def synthetic_devices(space, archs, pruning: list[bool], seed: int) -> dict[str, np.ndarray]:
    """Additive devices (non-negative per-(edge, op) costs mixed from 3 hidden factors); a
    pruning device runs the cell without its dead operations and a constant-output network in
    0.05 ms."""
    rng = np.random.default_rng(seed)
    raw = features(space, archs, "encode")
    pruned_keys, flag = executed(space, archs, "pruned")
    pruned = features(space, pruned_keys, "encode")
    factors = rng.uniform(0, 1, (3, raw.shape[1]))
    out = {}
    for d, prunes in enumerate(pruning):
        cost = rng.uniform(0, 1, 3) @ factors
        lat = 1.0 + (pruned if prunes else raw) @ cost
        out[f"dev{d}"] = np.where(flag > 0, 0.05, lat) if prunes else lat
    return out


def test_executed_nb201_cells() -> None:
    space = get_space("nb201")
    assert execution_variants(space) == ("raw", "pruned")
    dead = "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_1x1~1|+|skip_connect~0|none~1|none~2|"
    const = "|nor_conv_3x3~0|+|none~0|none~1|+|none~0|none~1|nor_conv_1x1~2|"
    live = "|nor_conv_3x3~0|+|none~0|avg_pool_3x3~1|+|none~0|none~1|skip_connect~2|"
    keys, flag = executed(space, [dead, const, live], "pruned")
    # nodes 1 and 2 reach the output by no path: their three convolutions are dead code
    assert keys[0] == "|none~0|+|none~0|none~1|+|skip_connect~0|none~1|none~2|"
    # node 1 is dead; node 2 has no input, so the output is a constant (flag 1)
    assert keys[1] == "|none~0|+|none~0|none~1|+|none~0|none~1|nor_conv_1x1~2|"
    assert keys == [keys[0], keys[1], live] and list(flag) == [0.0, 1.0, 0.0]
    assert executed(space, [dead], "raw") == ([dead], pytest.approx(np.zeros(1)))
    fbnet = get_space("fbnet")
    assert execution_variants(fbnet) == ("raw",)
    with pytest.raises(UserError, match="execution variant 'pruned' does not exist"):
        executed(fbnet, [], "pruned")


def test_greedy_design_continues_after_chosen_rows() -> None:
    F = np.random.default_rng(0).standard_normal((200, 6))
    free = greedy_design(F, 5, 0.1)
    assert len(set(free)) == 5
    forced = greedy_design(F, 5, 0.1, chosen=[7, 3])
    assert forced[:2] == [7, 3] and len(set(forced)) == 5
    assert greedy_design(F, 5, 0.1, chosen=free[:2]) == free  # greedy is greedy


@pytest.mark.parametrize("new_prunes", [True, False])
def test_meta_learns_which_network_a_device_runs(nb201, new_prunes: bool) -> None:
    """Meta-training tells the pruning device from the others, the design measures cells that
    tell the variants apart, and adaptation picks the right one; a predictor that only knows
    the raw network mis-ranks a pruning device (dead convolutions predicted to cost time)."""
    space, archs = nb201
    table = synthetic_devices(space, archs, [False, False, False, True, False, new_prunes],
                              seed=3)
    new = table.pop("dev5")
    where = {a: i for i, a in enumerate(archs)}
    meta = MetaPredictor(space, pool_size=600).meta_fit(space, archs, table, seed=0)
    assert meta.device_execution_ == ["raw", "raw", "raw", "pruned", "raw"]
    assert meta.execution_prior_ == pytest.approx({"raw": 5 / 7, "pruned": 2 / 7})
    refs = meta.reference_archs[:10]
    _, flag = executed(space, refs, "pruned")
    assert any(k != r for k, r in zip(executed(space, refs, "pruned")[0], refs)) or flag.any()
    meta.adapt(refs, new[[where[a] for a in refs]], seed=0)
    post = meta.explain()["execution_posterior"]
    assert post["pruned" if new_prunes else "raw"] > 0.95
    assert rho(meta.predict(archs), new) > 0.99
    raw_only = MetaPredictor(space, pool_size=600, execution=["raw"]).meta_fit(
        space, archs, table, seed=0)
    refs = raw_only.reference_archs[:10]
    raw_only.adapt(refs, new[[where[a] for a in refs]], seed=0)
    if new_prunes:
        assert rho(raw_only.predict(archs), new) < rho(meta.predict(archs), new) - 0.02


def test_execution_prior_weighs_devices_or_groups() -> None:
    """Each device one vote by default; with groups each group one vote, split among its
    devices (fifteen raw GPUs of one family do not outvote two pruning CPU runtimes)."""
    chosen = ["raw"] * 15 + ["pruned", "pruned", "raw"]
    assert execution_prior(chosen, ("raw", "pruned")) == pytest.approx(
        {"raw": 17 / 20, "pruned": 3 / 20})
    groups = ["gpu"] * 15 + ["cpu-a", "cpu-b", "cpu-c"]
    assert execution_prior(chosen, ("raw", "pruned"), groups) == pytest.approx(
        {"raw": 3 / 6, "pruned": 3 / 6})
    # a group split between variants gives each its share of the one vote
    assert execution_prior(["raw", "pruned"], ("raw", "pruned"), ["g", "g"]) == pytest.approx(
        {"raw": 0.5, "pruned": 0.5})


def test_meta_fit_groups_set_the_execution_prior(nb201) -> None:
    space, archs = nb201
    table = synthetic_devices(space, archs[:400], [False, False, False, True], seed=2)
    groups = {"dev0": "a", "dev1": "a", "dev2": "a", "dev3": "b"}
    meta = MetaPredictor(space, pool_size=300).meta_fit(space, archs[:400], table, seed=0,
                                                        groups=groups)
    assert meta.device_execution_ == ["raw", "raw", "raw", "pruned"]
    assert meta.execution_prior_ == pytest.approx({"raw": 0.5, "pruned": 0.5})
    with pytest.raises(UserError, match="groups names device 'nope'"):
        MetaPredictor(space).meta_fit(space, archs[:400], table, seed=0, groups={"nope": "a"})


def test_adapt_notes_measurements_that_leave_the_execution_variant_open(nb201) -> None:
    """Measured cells without dead operations run alike under both variants, so they cannot
    tell a pruning device from the rest: ``execution_note`` says so; the reference
    architectures settle it and the note stays silent; a predictor without variants has none."""
    from hwnas.latency.fewshot import execution_note
    from hwnas.latency.predictors import FlopsPredictor

    space, archs = nb201
    table = synthetic_devices(space, archs, [False, False, True, True, False], seed=4)
    new = table.pop("dev4")
    where = {a: i for i, a in enumerate(archs)}
    meta = MetaPredictor(space, pool_size=600).meta_fit(space, archs, table, seed=0)
    pruned, flag = executed(space, archs, "pruned")
    alike = [a for a, k, f in zip(archs, pruned, flag) if k == a and not f][:10]
    meta.adapt(alike, new[[where[a] for a in alike]], seed=0)
    note = execution_note(meta, "nb201")
    assert note is not None and "execution variants raw" in note and "pruned" in note
    assert "hwnas latency reference --space nb201" in note
    # the architectures that would settle it are ones the variants run differently
    settle = meta.settling_archs(archs[:400], 5)
    assert len(settle) == 5 and not set(settle) & set(alike)
    ran, dead = executed(space, settle, "pruned")
    assert all(k != a or f for a, k, f in zip(settle, ran, dead))
    refs = meta.reference_archs[:10]
    meta.adapt(refs, new[[where[a] for a in refs]], seed=0)
    assert meta.explain()["execution_posterior"]["raw"] > 0.9
    assert execution_note(meta, "nb201") is None
    flops = FlopsPredictor(space).adapt(refs, new[[where[a] for a in refs]], seed=0)
    assert execution_note(flops, "nb201") is None


def test_robust_fit_survives_an_outlier(nb201) -> None:
    """One measurement 8x too slow (a glitch) on the fastest of 12 measured cells: the
    Student-t fit (the default) discounts it; the Gaussian fit (``robust_iterations=0``) bends
    towards it so far that the ranking comes out wrong."""
    space, archs = nb201
    table = synthetic_devices(space, archs, [False] * 7, seed=11)
    new = table.pop("dev6")
    where = {a: i for i, a in enumerate(archs)}
    scores = {}
    for iters in (0, 10):
        meta = MetaPredictor(space, pool_size=600, robust_iterations=iters).meta_fit(
            space, archs, table, seed=0)
        refs = meta.reference_archs[:12]
        y = new[[where[a] for a in refs]].copy()
        y[int(np.argmin(y))] *= 8.0
        meta.adapt(refs, y, seed=0)
        scores[iters] = rho(meta.predict(archs), new)
    assert scores[10] > 0.98 and scores[0] < 0.9


def test_bad_options(nb201) -> None:
    space, archs = nb201
    table = synthetic_devices(space, archs[:300], [False, False], seed=1)
    with pytest.raises(UserError, match="expected 'raw' first"):
        MetaPredictor(space, execution=["pruned"]).meta_fit(space, archs[:300], table, seed=0)
    with pytest.raises(UserError, match="expected 'raw' first"):
        MetaPredictor(space, execution=["raw", "folded"]).meta_fit(space, archs[:300], table,
                                                                   seed=0)
    with pytest.raises(UserError, match="robust_iterations"):
        MetaPredictor(space, robust_iterations=-1)


def test_shipped_nb201_predictor_knows_the_pruning_device() -> None:
    pre = load_pretrained("nb201")
    assert pre.variants == ("raw", "pruned")
    assert dict(zip(pre.devices_, pre.device_execution_))["pixel3"] == "pruned"
    assert sum(e == "pruned" for e in pre.device_execution_) == 1
    assert load_pretrained("fbnet").variants == ("raw",)
