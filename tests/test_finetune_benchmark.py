"""benchmarks/finetune_cifar10.py's pieces on CPU: the three models of a front, the policy
label, the table, and one fine-tuned model end to end on the small digits run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

fb = pytest.importorskip("benchmarks.finetune_cifar10")


def test_pick_models_by_latency() -> None:
    front = pd.DataFrame({"trial": [4, 9, 2, 7, 5], "latency_ms:d": [3.0, 1.0, 5.0, 2.0, 4.0]})
    assert fb.pick_models(front, "d") == [("largest", 2), ("middle", 4), ("smallest", 9)]
    two = pd.DataFrame({"trial": [1, 3], "latency_ms:d": [2.0, 1.0]})
    assert fb.pick_models(two, "d") == [("largest", 1), ("smallest", 3)]
    assert fb.pick_models(two.iloc[:1], "d") == [("largest", 1)]
    from hwnas.core.errors import UserError

    with pytest.raises(UserError, match="latency_ms:other"):
        fb.pick_models(front, "other")


def test_policy_label() -> None:
    def policy(*bits):
        return {"layers": {f"l{i}": {"w_bits": w, "a_bits": a} for i, (w, a) in enumerate(bits)}}
    assert fb.policy_label(None) == "float"
    assert fb.policy_label(policy((8, 8), (8, 8))) == "w8a8"
    assert fb.policy_label(policy((4, 8), (8, 8), (2, 6))) == "mixed w2-8 a6-8"


def test_one_model_end_to_end(small_run: Path, tmp_path: Path, capsys, one_torch_thread) -> None:
    run = Path(shutil.copytree(small_run, tmp_path / "run"))
    out = tmp_path / "bench.json"
    assert fb.main([str(run), "--models", "smallest", "--epochs", "1", "--device", "cpu",
                    "--out", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert {"command", "machine", "date", "results"} <= set(doc)
    assert doc["command"].startswith("python benchmarks/finetune_cifar10.py")
    (row,) = doc["results"]
    assert row["model"] == "smallest" and row["export"] == "ok" and row["gpu_minutes"] is None
    assert row["test_after"] > 0 and row["val_after"] >= row["val_before"]
    assert (Path(row["out_dir"]) / "model.pt").is_file()
    text = capsys.readouterr().out
    assert "| smallest |" in text and str(out) in text
    assert fb.main([str(run), "--models", "biggest", "--out", str(out)]) == 2
    assert fb.main([str(run), "--device", "cpu", "--devices", "edgetpu-est", "--out",
                    str(out)]) == 2
    assert "cannot be measured on this CPU" in capsys.readouterr().err
    assert fb.main([str(run), "--front", "nowhere", "--device", "cpu", "--out", str(out)]) == 2
    assert "front for device 'nowhere'" in capsys.readouterr().err
