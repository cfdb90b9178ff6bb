"""A known execution variant: hwnas's ONNX exports hold no dead operations, ``MetaPredictor``
can be pinned to a variant, and ``hwnas latency adapt`` pins it for measurements of ONNX files
(or as ``--execution`` says)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hwnas.latency.predictors import MetaPredictor, load_pretrained
from hwnas.latency.predictors.features import executed, export_execution
from hwnas.latency.profiles import read_measurements
from hwnas.supernet.spaces import get_space

from hwnas.core.errors import UserError


def test_onnx_exports_run_the_export_variant():
    """The convolutions of an exported NB-201 network are exactly those of the network under
    :func:`export_execution`'s variant (the dead ones, which raw has too, are not in the file),
    and its pools at most those."""
    import onnx
    import torch
    from hwnas.supernet.onnx import onnx_bytes

    space = get_space("nb201")
    variant = export_execution(space)
    assert variant == "pruned" and export_execution(get_space("fbnet")) == "raw"
    supernet = space.build_supernet().eval()
    example = torch.zeros(1, *space.input_shape)
    rng = np.random.default_rng(0)
    differs = 0
    for _ in range(24):
        arch = space.sample(rng)
        ran, _constant = space.executed(arch, variant)
        graph = onnx.load_from_string(onnx_bytes(supernet.extract(arch), example)).graph
        convs = sum(n.op_type == "Conv" for n in graph.node)
        assert convs == sum(layer.op == "conv" for layer in space.layers(ran)), arch
        # parameter-free pools of one node on two edges are one node in the file (merged)
        pools = sum(n.op_type == "AveragePool" for n in graph.node)
        assert pools <= sum(layer.op == "pool" for layer in space.layers(ran)), arch
        differs += sum(layer.op == "conv" for layer in space.layers(arch)) != sum(
            layer.op == "conv" for layer in space.layers(ran))
    assert differs >= 3  # the sample has cells with dead operations


@pytest.fixture(scope="module")
def shipped_nb201():
    return load_pretrained("nb201")


def _alike(space, n, seed):
    """Cells without dead operations: they run alike under both variants."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        a = space.to_string(space.sample(rng))
        ran, dead = executed(space, [a], "pruned")
        if ran[0] == a and not dead[0] and a not in out:
            out.append(a)
    return out


def test_pinned_execution_decides_and_survives_save_and_load(shipped_nb201, tmp_path):
    meta = shipped_nb201
    space = meta.space
    archs = _alike(space, 10, seed=2)
    y = 1.0 + np.random.default_rng(2).uniform(0, 1, 10)
    meta.adapt(archs, y, seed=0)
    assert min(meta.explain()["execution_posterior"].values()) > 0.05  # left open
    meta.pin_execution("pruned").adapt(archs, y, seed=0)
    assert meta.explain()["execution_posterior"] == {"pruned": pytest.approx(1.0)}
    assert meta.explain()["pinned_execution"] == "pruned"
    query = [space.to_string(space.sample(np.random.default_rng(9))) for _ in range(50)]
    path = meta.save(tmp_path / "p.npz")
    again = MetaPredictor.load(path)
    assert again.pinned_execution == "pruned"
    np.testing.assert_allclose(again.predict(query), meta.predict(query))
    with pytest.raises(UserError, match="execution variant 'folded'"):
        meta.pin_execution("folded")
    meta.pin_execution(None)


def test_measurements_keep_the_file_column(tmp_path):
    space = get_space("nb201")
    archs = _alike(space, 3, seed=1)
    path = tmp_path / "m.csv"
    pd.DataFrame({"arch": archs, "latency_ms": [1.0, 2.0, 3.0],
                  "file": ["ref_01.onnx", "ref_02.onnx", "ref_03.onnx"]}).to_csv(path, index=False)
    assert read_measurements(path, space).files == ("ref_01.onnx", "ref_02.onnx", "ref_03.onnx")
    pd.DataFrame({"arch": archs, "latency_ms": [1.0, 2.0, 3.0],
                  "file": ["a.onnx", "", "c.onnx"]}).to_csv(path, index=False)
    assert read_measurements(path, space).files is None  # not every row names its file
    pd.DataFrame({"arch": archs, "latency_ms": [1.0, 2.0, 3.0]}).to_csv(path, index=False)
    assert read_measurements(path, space).files is None


def _adapt(capsys, *args):
    from hwnas.cli import main

    code = main(["latency", "adapt", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_adapt_pins_the_export_variant_for_onnx_measurements(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(tmp_path / "profiles"))
    space = get_space("nb201")
    archs = _alike(space, 10, seed=3)
    y = 1.0 + np.random.default_rng(3).uniform(0, 1, 10)
    onnx_csv, plain_csv = tmp_path / "onnx.csv", tmp_path / "plain.csv"
    pd.DataFrame({"arch": archs, "latency_ms": y,
                  "file": [f"ref_{i:02d}.onnx" for i in range(10)]}).to_csv(onnx_csv, index=False)
    pd.DataFrame({"arch": archs, "latency_ms": y}).to_csv(plain_csv, index=False)

    code, out, err = _adapt(capsys, "--device", "d1", "--space", "nb201", "--measurements",
                            str(onnx_csv))
    assert code == 0, err
    assert "run the pruned network (every measured model is an ONNX file" in out
    assert "do not settle which network" not in out
    code, out, err = _adapt(capsys, "--device", "d2", "--space", "nb201", "--measurements",
                            str(plain_csv))
    assert code == 0, err
    assert "execution:" not in out and "do not settle which network" in out
    code, out, err = _adapt(capsys, "--device", "d3", "--space", "nb201", "--measurements",
                            str(plain_csv), "--execution", "raw")
    assert code == 0, err
    assert "run the raw network (--execution raw)" in out

    code, out, err = _adapt(capsys, "--device", "d6", "--space", "nb201", "--measurements",
                            str(plain_csv), "--execution", "tflite")
    assert code == 0, err
    assert "run the pruned network (--execution tflite)" in out
    code, out, err = _adapt(capsys, "--device", "d4", "--space", "nb201", "--measurements",
                            str(plain_csv), "--execution", "folded")
    assert code == 2 and "--execution 'folded': expected auto, a runtime (onnxruntime" in err
    assert "or an execution variant of space nb201 (raw, pruned)" in err
    code, out, err = _adapt(capsys, "--device", "d5", "--space", "nb201", "--measurements",
                            str(plain_csv), "--execution", "pruned", "--predictor", "flops")
    assert code == 2 and "does not weigh execution variants" in err
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir()) == ["d1", "d2", "d3", "d6"]
