"""benchmarks/results/supernet_cifar10/cct46_rule.py, session 46's rule for a lever on the CCT
supernet: it ships only when all three lines hold, and refuses evaluations that do not compare."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks/results/supernet_cifar10/cct46_rule.py"


def _load():
    spec = importlib.util.spec_from_file_location("cct46_rule", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rule = _load()  # once for the module: the script holds no state


def _eval(tmp_path: Path, name: str, top1: dict[str, float], **changes) -> Path:
    reference = json.loads(rule.REFERENCE.read_text())
    for row in reference["subnets"]:
        row["top1"] = top1.get(row["role"], row["top1"])
        row["arch"] = changes.get("arch", {}).get(row["role"], row["arch"])
    reference["training_completed"] = changes.get("completed", True)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(reference))
    return path


def test_the_rule_ships_only_when_smallest_largest_and_mean_all_hold(tmp_path):
    ship, lines = rule.decide(_eval(tmp_path, "ship", {"smallest": 84.73, "largest": 89.86,
                                                      "random3": 89.5}))
    assert ship and lines[-1] == "SHIP"
    # the shipped run itself: its smallest is under item 2's line
    assert rule.main([str(rule.REFERENCE)]) == 1
    # a smallest that passes, bought with the mean of the five
    ship, lines = rule.decide(_eval(tmp_path, "mean", {"smallest": 85.0, "random1": 85.0}))
    assert not ship and "mean of five: 86.82 >= 86.91: NO" in lines
    ship, _ = rule.decide(_eval(tmp_path, "largest", {"smallest": 85.0, "largest": 89.85,
                                                      "random1": 87.0}))
    assert not ship


@pytest.mark.parametrize("changes, message", [
    ({"completed": False}, "training_completed is not true"),
    ({"arch": {"random2": "e128_h2m1-h2m1"}}, "random2 is e128_h2m1-h2m1, expected"),
])
def test_the_rule_refuses_evaluations_that_do_not_compare(tmp_path, capsys, changes, message):
    path = _eval(tmp_path, "other", {"smallest": 86.0}, **changes)
    assert rule.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
