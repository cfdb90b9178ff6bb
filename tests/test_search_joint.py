"""benchmarks/search_joint.py: its hypervolume, its front, and a lookup-only search of a table."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
from hwnas.search.bits import DEFAULT_BIT_CHOICES, ArchBitsSpace
from hwnas.search.config import SearchConfig
from hwnas.supernet.spaces import get_space

ROOT = Path(__file__).resolve().parent.parent
#: the run's default objectives as the table's columns, and their directions
COLS = ["accuracy", "latency_ms:cpu-ort-1t", "size_bytes"]
DIRS = ["maximize", "minimize", "minimize"]


def _bench():
    name = "search_joint_benchmark"
    if name not in sys.modules:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "search_joint.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _box_volume(losses, ref, n=200_000, seed=0):
    """Monte-Carlo hypervolume, an independent check of the exact one."""
    rng = np.random.default_rng(seed)
    lo = losses.min(0)
    pts = lo + rng.random((n, losses.shape[1])) * (ref - lo)
    dominated = np.zeros(n, dtype=bool)
    for p in losses:
        dominated |= np.all(pts >= p, axis=1)
    return dominated.mean() * np.prod(ref - lo)


def test_hypervolume_3d_is_exact():
    bench = _bench()
    rng = np.random.default_rng(1)
    losses = rng.random((40, 3))
    ref = np.array([1.1, 1.2, 1.05])
    exact = bench.hypervolume(losses, ref)
    assert exact == pytest.approx(_box_volume(losses, ref), rel=0.01)
    # one box, and the front alone gives the same volume
    assert bench.hypervolume(np.array([[0.5, 0.5, 0.5]]), np.ones(3)) == pytest.approx(0.125)
    front = losses[bench.nondominated(losses)]
    assert bench.hypervolume(front, ref) == pytest.approx(exact)
    assert len(front) < len(losses)
    # points beyond the reference add nothing
    assert bench.hypervolume(np.vstack([losses, [[0.0, 0.0, 2.0]]]), ref) == pytest.approx(exact)


def _table(n=60):
    joint = ArchBitsSpace(get_space("mbv3-tiny"), DEFAULT_BIT_CHOICES)
    rng = np.random.default_rng(0)
    keys = list(dict.fromkeys(joint.to_string(joint.sample(rng)) for _ in range(n)))
    cands = [joint.from_string(k) for k in keys]
    lat = np.array([1.0 + len(joint.space.to_string(c.arch)) / 1000 + rng.random() / 10
                    for c in cands])
    size = np.array([sum(c.bits) * 100.0 for c in cands])
    acc = 90 + 5 * np.tanh(lat - lat.mean()) + np.log(size) + rng.normal(0, 0.5, len(keys))
    seeds = ["largest-float", "smallest-int8"] + [""] * (len(keys) - 2)
    return joint, {"candidate": keys, "seed": seeds, "accuracy": acc,
                   "latency_ms:cpu-ort-1t": lat, "size_bytes": size}


def test_front_and_scores():
    bench = _bench()
    _, table = _table()
    cols, dirs = COLS, DIRS
    front = bench.true_front(table, cols, dirs)
    losses = bench.to_losses(np.stack([table[c] for c in cols], 1), dirs)
    idx = bench.nondominated(losses)
    assert front.size == len(idx)
    assert front.ref[0] == pytest.approx(losses[idx, 0].max() + 1.0)  # 1 point below the worst
    assert front.ref[2] == pytest.approx(losses[idx, 2].max() * 1.01)
    assert bench.hv_ratio(idx, table, front, dirs) == pytest.approx(1.0)
    assert bench.hv_ratio(list(idx) * 2, table, front, dirs) == pytest.approx(1.0)
    assert bench.hv_ratio(idx[:-1], table, front, dirs) < 1.0
    assert bench.hv_ratio([], table, front, dirs) == 0.0
    # two objectives: the scoring of search_nb201.py (BENCHMARKS.md), to the digit
    rows = [3, 5, 8, 13, 21, 34]
    two = bench.true_front(table, cols[:2], dirs[:2])
    lat, acc = table[cols[1]], table["accuracy"]
    nb = bench.nb201.true_front(lat, acc)
    assert (two.size, two.hypervolume) == (nb.size, pytest.approx(nb.hypervolume))
    assert bench.hv_ratio(rows, table, two, dirs[:2]) == pytest.approx(
        bench.nb201.hv_ratio(rows, lat, acc, nb))


def test_table_space_snaps_suggestions_to_members():
    bench = _bench()
    joint, table = _table()
    space = bench.TableSpace(joint, table["candidate"])
    member = space.members[7]
    assert space.suggest(optuna.trial.FixedTrial(space.to_params(member))) == member
    other = joint.sample(np.random.default_rng(123))
    assert joint.to_string(other) not in space.index
    snapped = space.suggest(optuna.trial.FixedTrial(joint.to_params(other)))
    assert space.to_string(snapped) in space.index
    assert len(list(space.all_architectures())) == len(table["candidate"])
    assert not hasattr(bench.TableSpace(joint, table["candidate"], enumerable=False),
                       "all_architectures")


@pytest.mark.parametrize("sampler", ["auto", "random"])
def test_a_lookup_only_search_starts_from_the_seeds(sampler):
    bench = _bench()
    joint, table = _table()
    problem = bench.make_problem(table, joint, SearchConfig())
    assert [lab for _, lab in problem.seeds] == ["largest-float", "smallest-int8"]
    traj = bench.run_search(problem, sampler, 0, 16)
    assert len(traj) == 16 and traj[:2] == [0, 1]  # the seeds first, as the run enqueues them
    assert all(0 <= i < len(table["candidate"]) for i in traj)
    if sampler == "auto":
        assert len(set(traj)) == 16  # the screening sampler never pays twice
    front = bench.true_front(table, problem.columns, problem.directions)
    assert 0.0 < bench.hv_ratio(traj, table, front, problem.directions) <= 1.0


def test_plan_is_stratified_and_reproducible():
    bench = _bench()
    joint = ArchBitsSpace(get_space("mbv3-tiny"), DEFAULT_BIT_CHOICES)
    plan = bench.plan_candidates(joint, 24, 3, 0, bins=6, pool_factor=20)
    again = bench.plan_candidates(joint, 24, 3, 0, bins=6, pool_factor=20)
    assert [joint.to_string(c) for c in plan] == [joint.to_string(c) for c in again]
    archs = list(dict.fromkeys(joint.space.to_string(c.arch) for c in plan))
    assert len(archs) == 24 and len(plan) <= 72
    # every uniform width is present; the FLOPs spread beats that of as many random draws
    uniform = {c.bits[0] for c in plan if len(set(c.bits)) == 1}
    assert uniform == set(DEFAULT_BIT_CHOICES)
    flops = np.log([joint.space.flops(joint.space.from_string(a)) for a in archs])
    rng = np.random.default_rng(0)
    rand = np.log([joint.space.flops(joint.space.sample(rng)) for _ in range(24)])
    assert flops.std() > rand.std()


def test_bad_table_is_one_error_line(tmp_path, capsys):
    bench = _bench()
    path = tmp_path / "t.csv.gz"
    with gzip.open(path, "wt", newline="") as fh:
        csv.writer(fh).writerows([["candidate", "seed", "accuracy"], ["x", "", "1"]])
    assert bench.main(["--table", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("search_joint: error: ") and err.count("\n") == 1
    # objectives the table has no column for: one line, before any search
    assert bench.main(["--objectives", "accuracy,latency:cpu-ov-1t", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("search_joint: error: ") and err.count("\n") == 1
    assert bench.main(["--build-table", "--supernet", str(tmp_path / "none.pt")]) == 2
    assert "needs --supernet" in capsys.readouterr().err
    # a screening variant that is not a ScreeningConfig field, or out of its range
    for bad in ("reference=2", "reference_sd=-1"):
        assert bench.main(["--screening-option", bad, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("search_joint: error: ") and err.count("\n") == 1, bad


def test_a_screening_variant_changes_the_search_and_not_the_seeds():
    """``--screening-option`` reaches the sampler ``auto`` resolves to (the previous EHVI
    reference, ``reference_sd = 0``, of session 56's comparison) after the same seeds."""
    bench = _bench()
    joint, table = _table()
    problem = bench.make_problem(table, joint, SearchConfig())
    base = bench.run_search(problem, "auto", 0, 24)
    same = bench.run_search(problem, "auto", 0, 24, {"reference_sd": 2.0})
    assert same == base
    other = bench.run_search(problem, "auto", 0, 24, {"n_startup_trials": 1})
    assert other[:2] == base[:2] and other != base


def test_front_misses_split_by_what_the_search_lacked():
    bench = _bench()
    _, table = _table()
    cols, dirs = COLS, DIRS
    front = bench.true_front(table, cols, dirs)
    idx = [int(i) for i in bench.nondominated(bench.to_losses(
        np.stack([table[c] for c in cols], 1), dirs))]
    assert bench.front_misses(idx, table, front, dirs) == {"policy": [], "architecture": []}
    missed, other = idx[0], next(i for i in range(len(table["seed"])) if i not in idx)
    rows = [i for i in idx if i != missed]
    assert bench.front_misses(rows, table, front, dirs) == {"policy": [],
                                                            "architecture": [missed]}
    # an evaluated row with the missed point's architecture (another policy): a policy miss
    sep = bench.ArchBitsSpace.SEPARATOR
    table = dict(table, candidate=list(table["candidate"]))
    table["candidate"][other] = (table["candidate"][missed].partition(sep)[0] + sep
                                 + table["candidate"][other].partition(sep)[2])
    assert bench.front_misses([*rows, other], table, front, dirs) == {
        "policy": [missed], "architecture": []}


def test_a_sharded_build_writes_the_table_of_every_shard(tmp_path, digits_checkpoint):
    """Two shards (after a first call that computes the seeds and stops at once) evaluate disjoint
    slices; the call that finds every candidate evaluated writes the table, in plan order,
    with the settings it was built with, which the scoring then reads; estimator devices
    only, so the rows are exact."""
    bench = _bench()
    table, work = tmp_path / "t.csv.gz", tmp_path / "work"
    kw = dict(work=work, progress=False, objectives="accuracy,latency:edgetpu-est,size",
              devices=["edgetpu-est"])
    first = bench.build_table(table, digits_checkpoint, 2, 2, 0, max_minutes=1e-6, **kw)
    assert first["left"] == first["pairs"] and not table.exists()
    a = bench.build_table(table, digits_checkpoint, 2, 2, 0, max_minutes=5, shard=(0, 2), **kw)
    assert a["left"] > 0 and not table.exists()  # shard 1's slice is still to do
    part = next(work.glob("*shard0of2.csv"))
    whole = part.read_text()
    part.write_text(whole + "cut-off,row")  # a call killed mid-row: the next one drops it
    again = bench.build_table(table, digits_checkpoint, 2, 2, 0, max_minutes=5, shard=(0, 2), **kw)
    assert part.read_text() == whole and again["left"] == a["left"]
    b = bench.build_table(table, digits_checkpoint, 2, 2, 0, max_minutes=5, shard=(1, 2), **kw)
    assert b["left"] == 0 and table.is_file()
    assert [c["evaluations"] for c in b["calls"]] == [0, a["pairs"] - a["left"], 0, a["left"]]
    assert [c["shard"] for c in b["calls"]] == ["all", "shard0of2", "shard0of2", "shard1of2"]
    settings = bench.build_settings(table)
    assert settings["objectives"] == kw["objectives"] and settings["devices"] == ["edgetpu-est"]
    rows = bench.load_table(table, ["accuracy", "latency_ms:edgetpu-est", "size_bytes"])
    assert len(rows["candidate"]) == b["pairs"] and rows["seed"][0]  # the seeds first
    with pytest.raises(bench.UserError, match="expected I/N"):
        bench.parse_shard("2/2")
