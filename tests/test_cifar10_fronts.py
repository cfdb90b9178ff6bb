"""benchmarks/cifar10_fronts.py: the subnets it picks, its scoring on a small untrained digits
supernet, and the committed JSON that notebook 04 plots (its fronts are those of its rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hwnas.search.evaluator import EvalSettings
from hwnas.supernet.data import load_dataset, subsample_eval
from hwnas.supernet.spaces import get_space

from benchmarks import cifar10_fronts as cf
from hwnas.core.errors import UserError

COMMITTED = Path(cf.__file__).with_suffix(".json")


def test_pick_subnets_largest_smallest_then_distinct_random() -> None:
    space = get_space("vit")
    picks = cf.pick_subnets(space, 6, seed=0)
    assert [role for role, _ in picks] == ["largest", "smallest"] + ["random"] * 4
    assert picks[0][1] == space.largest() and picks[1][1] == space.smallest()
    assert len({space.to_string(a) for _, a in picks}) == 6
    assert [space.to_string(a) for _, a in cf.pick_subnets(space, 6, seed=0)] == \
        [space.to_string(a) for _, a in picks]
    with pytest.raises(UserError, match="at least 2"):
        cf.pick_subnets(space, 1, seed=0)


def test_measure_and_fronts_on_digits(one_torch_thread) -> None:
    space = get_space("mbv3-tiny")
    data = subsample_eval(load_dataset("digits", seed=0), 60, seed=0)
    picks = cf.pick_subnets(space, 3, seed=1)
    rows = cf.measure(space, space.build_supernet().eval(), data, picks, ["pixel7-cpu-est"],
                      EvalSettings(calib_batches=2), log=lambda *_: None)
    assert [r["role"] for r in rows] == ["largest", "smallest", "random"]
    for r, (_, arch) in zip(rows, picks):
        assert r["arch"] == space.to_string(arch) and 0 <= r["top1"] <= 100
        assert r["params"] == space.params(arch) and r["flops"] == space.flops(arch)
        assert r["latency_ms:pixel7-cpu-est"] > 0
    # a copy of the smallest that is more accurate takes its place on the front
    rows.append({**rows[1], "arch": "better", "top1": rows[1]["top1"] + 1})
    rows.append({**rows[0], "space": "other", "top1": 50.0})
    front = cf.fronts(rows, ["params", "latency_ms:pixel7-cpu-est"])
    for cost in ("params", "latency_ms:pixel7-cpu-est"):
        assert set(front[cost]) == {"mbv3-tiny", "other"}
        assert front[cost]["mbv3-tiny"][0] == "better"
        assert rows[1]["arch"] not in front[cost]["mbv3-tiny"]
        assert front[cost]["other"] == [rows[0]["arch"]]


def test_committed_json_is_complete_and_its_fronts_are_its_rows() -> None:
    doc = json.loads(COMMITTED.read_text())
    for key in ("command", "machine", "date", "images", "images_per_class", "devices", "results",
                "fronts", "subnets_per_space"):
        assert key in doc, key
    assert sum(doc["images_per_class"]) == doc["images"] and len(doc["images_per_class"]) == 10
    rows = doc["results"]
    for space in cf.SPACES:
        mine = [r for r in rows if r["space"] == space]
        assert len(mine) == doc["subnets_per_space"], space
        assert [r["role"] for r in mine[:2]] == ["largest", "smallest"]
        assert len({r["arch"] for r in mine}) == len(mine)
    assert doc["devices"] == list(cf.DEVICES) and list(doc["fronts"]) == list(cf.COSTS)
    assert doc["fronts"] == cf.fronts(rows, cf.COSTS)


def test_committed_json_scored_the_checkpoints_shipped_now() -> None:
    """Each space's rows were scored on the file ``--space NAME --dataset cifar10`` finds now,
    by name and by bytes: shipping another (``cct_cifar10.pt`` for vit, or a retrained file under
    the same name) means running cifar10_fronts.py again."""
    from hwnas.core.io import file_sha256
    from hwnas.supernet.checkpoints import CIFAR10_CLASSES, shipped_checkpoint

    doc = json.loads(COMMITTED.read_text())
    for space in cf.SPACES:
        path = shipped_checkpoint(space, CIFAR10_CLASSES)
        assert path is not None and Path(doc["checkpoints"][space]).name == path.name, (
            f"{COMMITTED.name}'s {space} rows were scored on {doc['checkpoints'][space]}; "
            f"{space} now finds {path}: run benchmarks/cifar10_fronts.py again")
        assert doc["checkpoint_sha256"][space] == file_sha256(path), (
            f"{COMMITTED.name}'s {space} rows were scored on another {path.name}: run "
            f"benchmarks/cifar10_fronts.py again")


def test_render_prints_the_committed_json_tables(capsys) -> None:
    """``--render`` prints cifar10_fronts.md's tables from the json, evaluating nothing."""
    assert cf.main(["--render"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(COMMITTED.read_text())
    for r in doc["results"]:
        assert f"`{r['arch']}`" in out
    assert all(f"| {cost} |" in out for cost in cf.COSTS)
