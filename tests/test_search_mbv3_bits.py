"""benchmarks/search_mbv3_bits.py: the table as a search space, and a search over it."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
from hwnas.search.bits import DEFAULT_BIT_CHOICES, ArchBitsSpace
from hwnas.supernet.spaces import get_space

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    name = "search_mbv3_bits_benchmark"
    if name not in sys.modules:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        spec = importlib.util.spec_from_file_location(name,
                                                      ROOT / "benchmarks" / "search_mbv3_bits.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _table(n=60):
    joint = ArchBitsSpace(get_space("mbv3-tiny"), DEFAULT_BIT_CHOICES)
    rng = np.random.default_rng(0)
    keys = list(dict.fromkeys(joint.to_string(joint.sample(rng)) for _ in range(n)))
    cands = [joint.from_string(k) for k in keys]
    lat = np.array([1.0 + sum(c.bits) / 100 + len(joint.space.to_string(c.arch)) / 1000
                    for c in cands])
    acc = 90 + 5 * np.tanh(lat - lat.mean()) + rng.normal(0, 0.5, len(keys))
    return joint, {"candidate": keys, "accuracy": acc, "latency_ms": lat,
                   "size_bytes": np.ones(len(keys))}


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
def test_a_search_of_the_table_is_scored(sampler):
    bench = _bench()
    joint, table = _table()
    space = bench.TableSpace(joint, table["candidate"], enumerable=sampler != "auto-pool")
    traj = bench.run_search(space, table, sampler, 0, 20)
    assert len(traj) == 20 and all(0 <= i < len(table["candidate"]) for i in traj)
    if sampler.startswith("auto"):
        assert len(set(traj)) == 20  # the screening sampler never pays twice
    front = bench.nb201.true_front(table["latency_ms"], table["accuracy"])
    score = bench.nb201.hv_ratio(traj, table["latency_ms"], table["accuracy"], front)
    assert 0.0 < score <= 1.0


def test_table_round_trip_and_errors(tmp_path, capsys):
    bench = _bench()
    path = tmp_path / "t.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("candidate,accuracy\nx,1\n")
    assert bench.main(["--table", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("search_mbv3_bits: error: ") and err.count("\n") == 1
