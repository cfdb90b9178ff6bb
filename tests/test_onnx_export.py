"""Tests for export.onnx_export: valid ONNX, metadata, dynamic batch, parity, atomic writes."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from hwnas.export import ParityReport, check_parity, export_onnx, onnx_bytes
from hwnas.latency.onnx_measure import make_session
from torch import nn

from hwnas.core.errors import UserError


def _small_cnn() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.Hardswish(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),  # depthwise
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )
    # Non-trivial BatchNorm statistics, so eval-mode export actually matters.
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    return model.eval()


class _Broken(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom in forward")


@pytest.fixture(scope="module")
def cnn() -> nn.Module:
    return _small_cnn()


@pytest.fixture(scope="module")
def example() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def exported(tmp_path: Path, cnn: nn.Module, example: torch.Tensor) -> Path:
    return export_onnx(cnn, example, tmp_path / "sub" / "dir" / "model.onnx", metadata={"arch": "k3_e4"})


def test_export_writes_valid_model(exported: Path) -> None:
    assert exported.is_file()
    model = onnx.load(str(exported))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["logits"]
    assert model.opset_import[0].version == 17
    assert [p.name for p in exported.parent.iterdir()] == ["model.onnx"]  # no temp files left


def test_metadata_round_trips(tmp_path: Path, cnn: nn.Module, example: torch.Tensor) -> None:
    meta = {"arch": "k3_e4", "params": 1234, "widths": [8, 16], "cfg": {"b": 1, "a": "x"}}
    path = export_onnx(cnn, example, tmp_path / "m.onnx", metadata=meta)  # type: ignore[arg-type]
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert props["arch"] == "k3_e4"
    assert props["params"] == "1234"
    assert json.loads(props["widths"]) == [8, 16]
    assert json.loads(props["cfg"]) == {"a": "x", "b": 1}


def test_dynamic_batch(exported: Path) -> None:
    session = make_session(exported)
    for batch in (1, 7):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16), dtype=np.float32)
        (logits,) = session.run(None, {"input": x})
        assert logits.shape == (batch, 10)


def test_parity_passes(exported: Path, cnn: nn.Module) -> None:
    inputs = torch.randn(20, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    report = check_parity(exported, cnn, inputs, batch_size=8)  # 8+8+4: uneven last chunk
    assert isinstance(report, ParityReport)
    assert report.passed
    assert report.max_abs_diff <= 1e-4
    assert report.top1_agreement == 1.0
    assert report.n == 20 and report.atol == 1e-4
    assert report.as_dict()["passed"] is True


def test_parity_from_bytes_restores_training_mode(cnn: nn.Module, example: torch.Tensor) -> None:
    model = copy.deepcopy(cnn).train()
    data = onnx_bytes(model, example)
    assert model.training  # export ran in eval mode but left the caller's mode alone
    report = check_parity(data, model, torch.randn(5, 3, 16, 16))
    assert report.passed and model.training


def test_parity_detects_different_model(exported: Path, cnn: nn.Module) -> None:
    other = copy.deepcopy(cnn)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))
    report = check_parity(exported, other, torch.randn(16, 3, 16, 16))
    assert not report.passed
    assert report.max_abs_diff > 1e-4


def test_failed_export_leaves_nothing(tmp_path: Path, example: torch.Tensor) -> None:
    target = tmp_path / "out" / "broken.onnx"
    with pytest.raises(RuntimeError, match="boom in forward"):
        export_onnx(_Broken(), example, target)
    assert not target.exists()
    assert not target.parent.exists() or list(target.parent.iterdir()) == []


def test_failed_write_keeps_old_file_and_no_temp(
    tmp_path: Path, cnn: nn.Module, example: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")

    def failing_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        export_onnx(cnn, example, target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_user_errors(tmp_path: Path, cnn: nn.Module, example: torch.Tensor, exported: Path) -> None:
    with pytest.raises(UserError, match="is a directory"):
        export_onnx(cnn, example, tmp_path)
    with pytest.raises(UserError, match="model must be a torch.nn.Module"):
        onnx_bytes("not a model", example)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="does not exist"):
        check_parity(tmp_path / "missing.onnx", cnn, example)
    with pytest.raises(UserError, match="batch_size must be an integer >= 1"):
        check_parity(exported, cnn, example, batch_size=0)
    with pytest.raises(UserError, match="atol must be >= 0"):
        check_parity(exported, cnn, example, atol=-1.0)


def test_set_metadata_merges_encodes_and_leaves_out_none():
    from hwnas.supernet.onnx import set_metadata
    from onnx import helper

    graph = helper.make_graph([], "g", [], [])
    proto = helper.make_model(graph)
    helper.set_model_props(proto, {"arch": "old", "keep": "1"})
    assert set_metadata(proto, {"arch": "new", "cfg": {"b": 2, "a": 1}, "n": 3,
                                "gone": None}) is proto
    props = {p.key: p.value for p in proto.metadata_props}
    assert props == {"arch": "new", "keep": "1", "cfg": '{"a": 1, "b": 2}', "n": "3"}
