"""The quantization benchmark table on the digits default, on a tiny budget (a CI test of every
pass: PTQ with each observer, W4A8 PTQ and QAT, Hessian sensitivity + ILP mixed precision)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from hwnas.supernet.data import load_dataset
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import (
    TrainConfig,
    TrainStage,
    save_checkpoint,
    train_supernet,
)

from benchmarks.quant_recipes import (
    METHODS,
    QuantBenchConfig,
    format_table,
    run_quant_benchmark,
    subnet_archs,
)
from hwnas.core.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def trained():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    data = load_dataset("digits", seed=0)
    space = get_space("mbv3-tiny")
    supernet = space.build_supernet()
    train_supernet(supernet, space, data, TrainConfig(stages=[TrainStage("s", 1, num_random=0)], lr=0.1),
                   progress=False)
    yield data, space, supernet
    torch.set_num_threads(threads)


TINY = dict(subnets=("smallest",), calib_images=128, qat_max_steps=4, hessian_samples=2,
            hessian_images=128, progress=False)


def test_table_on_a_tiny_budget(trained):
    data, space, supernet = trained
    before = {k: v.clone() for k, v in supernet.state_dict().items()}
    rows = run_quant_benchmark(supernet, space, data, QuantBenchConfig(**TINY), log=lambda *_: None)
    assert [r["method"] for r in rows] == list(METHODS)
    by = {r["method"]: r for r in rows}
    assert by["fp32"]["top1"] > 25.0  # one epoch: the subnet has learned something (~40 %)
    for method in ("ptq_int8_minmax", "ptq_int8_percentile", "ptq_int8_mse"):
        assert by[method]["avg_weight_bits"] == 8
        assert abs(by[method]["top1"] - by["fp32"]["top1"]) <= 3.0
        assert by[method]["size_bytes"] < by["fp32"]["size_bytes"] / 3
    assert 4 < by["ptq_w4a8"]["avg_weight_bits"] < 5  # first/last layers at 8 bits
    assert by["ptq_w4a8"]["size_bytes"] == by["qat_w4a8"]["size_bytes"] < by["ptq_int8_minmax"]["size_bytes"]
    assert by["mixed"]["avg_weight_bits"] <= 5.0 + 1e-6
    quant_layers = {layer.name for layer in space.layers(space.smallest()) if layer.op in ("conv", "linear")}
    assert set(by["mixed"]["policy_bits"]) == quant_layers
    for method in ("qat_w4a8", "mixed"):  # QAT kept its best state on the validation split
        vals, kept = by[method]["qat_val_history"], by[method]["qat_kept_epoch"]
        assert len(vals) == 2 and vals[kept] == max(vals)  # PTQ start + the one (capped) epoch
        assert ("PTQ start kept" if kept == 0 else f"epoch {kept} kept") in by[method]["recipe"]
    for r in rows:
        assert 0.0 <= r["top1"] <= 100.0 and r["subnet"] == "smallest"
    assert all(torch.equal(v, supernet.state_dict()[k]) for k, v in before.items())
    assert "ptq_int8_minmax" in format_table(rows)


def test_benchmark_script_writes_the_json(trained, tmp_path):
    data, space, supernet = trained
    ckpt = save_checkpoint(tmp_path / "sn.pt", supernet, space, dataset="digits")
    spec = importlib.util.spec_from_file_location("quant_digits", ROOT / "benchmarks" / "quant_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "quant_digits.json"
    argv = ["--checkpoint", str(ckpt), "--subnets", "smallest", "--methods", "fp32,ptq_int8_minmax,ptq_w4a8",
            "--calib-images", "64", "--out", str(out), "--quiet"]
    assert module.main(argv) == 0
    payload = json.loads(out.read_text())
    assert {"command", "machine", "date", "results"} <= set(payload)
    assert "--checkpoint" in payload["command"]
    assert [r["method"] for r in payload["results"]] == ["fp32", "ptq_int8_minmax", "ptq_w4a8"]
    for r in payload["results"]:
        assert {"subnet", "method", "avg_weight_bits", "top1", "size_bytes"} <= set(r)


def test_config_errors_and_subnet_roles():
    with pytest.raises(UserError, match="unknown method 'int4'"):
        QuantBenchConfig(methods=("int4",)).validate()
    with pytest.raises(UserError, match="unknown subnet role 'huge'"):
        QuantBenchConfig(subnets=("huge",)).validate()
    space = get_space("mbv3-tiny")
    archs = subnet_archs(space)
    assert space.to_string(archs["middle"]) == "k5e4-k5e4_k5e4-k5e4_k5e4-k5e4"
    assert space.flops(archs["smallest"]) < space.flops(archs["middle"]) < space.flops(archs["largest"])
