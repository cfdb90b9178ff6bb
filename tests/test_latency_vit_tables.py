"""The ``vit`` space's latency table, ready to measure and meta-train on: the committed sample
(with the space's extremes), ``benchmarks/measure_latency_tables.py --spaces vit`` end to end on
a small vit, and ``benchmarks/latency_metatrain_mbv3.py --spaces vit --tables ...`` shipping a
meta predictor from a fake measured table."""

from __future__ import annotations

import csv
import gzip
import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from benchmarks import latency_metatrain_mbv3 as lmt
from benchmarks import measure_latency_tables as mlt
from hwnas.supernet.layers import total_flops
from hwnas.supernet.spaces import ViTConfig, ViTSpace, get_space

SMALL = ViTConfig(tokenizer_channels=(8,), embed_choices=(16, 32), depth_choices=(1, 2),
                  heads_choices=(1, 2), mlp_ratio_choices=(1.0, 2.0), head_dim=8)


def _read(path: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))


def test_committed_vit_sample_holds_the_extremes() -> None:
    space = get_space("vit")
    archs = mlt.read_sample("vit", 10**6)
    assert len(archs) == len(set(archs)) == mlt.DEFAULT_N["vit"] == 300
    assert [space.to_string(space.from_string(a)) for a in archs] == archs  # canonical
    corners = mlt.corner_archs(space)
    assert len(corners) == 16 and set(corners) <= set(archs)
    assert {space.to_string(space.smallest()), space.to_string(space.largest())} <= set(corners)
    assert archs[:16] != corners  # in the sample's random order, not at the front
    # vit is measured on request, the default spaces stay the convolutional ones
    assert "vit" not in mlt.DEFAULT_SPACES


@pytest.fixture
def small_vit(monkeypatch, tmp_path):  # noqa: ANN201 - the registered "vit", shrunk
    from hwnas.supernet import spaces

    def factory(*, in_channels=None, image_size=None, num_classes=None, config=None):
        given = {"in_channels": in_channels, "image_size": image_size, "num_classes": num_classes}
        return ViTSpace(replace(SMALL, **{k: v for k, v in given.items() if v is not None}),
                        name="vit")

    monkeypatch.setitem(spaces.SPACES._entries, "vit", factory)  # restored after the test
    monkeypatch.setattr(mlt, "TABLES_DIR", tmp_path / "tables")
    return get_space("vit")


def test_measure_latency_tables_measures_a_vit_sample(small_vit, tmp_path,
                                                      one_torch_thread) -> None:
    assert mlt.main(["--write-samples", "--spaces", "vit", "--n", "20"]) == 0
    sample = mlt.read_sample("vit", 100)
    assert len(sample) == 20 and set(mlt.corner_archs(small_vit)) <= set(sample)
    out = tmp_path / "out"
    assert mlt.main(["--out", str(out), "--spaces", "vit", "--n", "2", "--threads", "1",
                     "--repeats", "1", "--warmup", "0", "--runtimes", "cpu", "--no-openvino",
                     "--tag", "t", "--no-anchors"]) == 0
    rows = _read(out / "vit_t.csv.gz")
    assert rows[0] == ["arch", "t-ort-1t", "t-torch-1t", "t-ts-1t"]
    assert [r[0] for r in rows[1:]] == sample[:2]
    assert all(float(v) > 0 for r in rows[1:] for v in r[1:])
    doc = json.loads((out / "machine_t.json").read_text())
    assert doc["spaces"]["vit"]["architectures"] == 2


def _fake_tables(folder: Path, n: int = 26) -> tuple[list[str], list[Path]]:
    """A CPU and a GPU table as measure_latency_tables.py writes them, with latencies that
    follow the FLOPs and the depth (plus noise), on the first ``n`` sampled architectures."""
    space = get_space("vit")
    archs = mlt.read_sample("vit", n)
    rng = np.random.default_rng(0)
    gflops = np.array([total_flops(space.layers(space.from_string(a))) for a in archs]) / 1e9
    depth = np.array([space.from_string(a).depth for a in archs])
    tables = {
        "vit_t.csv.gz": {"t-ort-1t": 20 * gflops * rng.uniform(0.95, 1.05, n),
                         "t-ort-4t": 6 * gflops + 0.3 * depth, "t-torch-1t": 25 * gflops + 0.5},
        # the GPU table lacks the last architecture (a budget that stopped early)
        "vit_h200.csv.gz": {"h200-cudagraph-b1": 0.05 * depth + 0.01 * gflops,
                            "h200-torch-b1": rng.uniform(2.0, 3.0, n)},
    }
    paths = []
    for name, cols in tables.items():
        keep = n - 1 if "h200" in name else n
        lines = ["arch," + ",".join(cols)]
        lines += [a + "," + ",".join(f"{c[i]:.6g}" for c in cols.values())
                  for i, a in enumerate(archs[:keep])]
        paths.append(folder / name)
        paths[-1].write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return archs[: n - 1], paths


def test_metatrain_ships_a_vit_predictor_from_measured_tables(tmp_path) -> None:
    from hwnas.latency.predictors import MetaPredictor

    archs, paths = _fake_tables(tmp_path)
    out = tmp_path / "out.json"
    assert lmt.main(["--spaces", "vit", "--tables", *map(str, paths), "--seeds", "1",
                     "--predictors", "flops", "meta", "--results-dir", str(tmp_path),
                     "--ship-dir", str(tmp_path), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())["spaces"][0]
    assert doc["space"] == "vit" and doc["architectures"] == len(archs)
    assert doc["held_out_device"] == "t-ort-1t"  # the first onnxruntime column
    measured = {"t-ort-1t", "t-ort-4t", "t-torch-1t", "h200-cudagraph-b1", "h200-torch-b1"}
    assert measured <= set(doc["devices"]) and len(doc["devices"]) > len(measured)  # + estimators
    # eager PyTorch on the GPU is kept in the table, not meta-trained on; the CPU's is
    assert "h200-torch-b1" not in doc["meta_trained_devices"]
    assert "t-torch-1t" in doc["meta_trained_devices"]
    variants = {r["split"] for r in doc["results"]}
    assert variants == {"holdout-t-ort-1t", "estimators-only"}
    meta10 = next(r for r in doc["results"] if r["split"] == "holdout-t-ort-1t"
                  and r["predictor"] == "meta" and r["n_measurements"] == 10)
    assert meta10["spearman_mean"] > 0.8  # the fake latency follows the FLOPs
    shipped = MetaPredictor.load(tmp_path / "vit_meta.npz")
    assert len(shipped.reference_archs) > 0 and set(shipped.reference_archs) <= set(archs)
    pred = shipped.adapt(archs[:10], np.linspace(1.0, 2.0, 10), seed=0).predict(archs)
    assert pred.shape == (len(archs),) and np.isfinite(pred).all()
    with open(tmp_path / "vit.csv", newline="") as fh:  # the table it meta-trained on
        assert [r["arch"] for r in csv.DictReader(fh)] == archs


def test_metatrain_refuses_vit_without_tables_and_an_unknown_held_out(tmp_path) -> None:
    with pytest.raises(SystemExit):
        lmt.main(["--spaces", "vit", "--out", str(tmp_path / "x.json")])
    _, paths = _fake_tables(tmp_path)
    with pytest.raises(SystemExit, match="not a measured device"):
        lmt.main(["--spaces", "vit", "--tables", *map(str, paths), "--held-out", "nope",
                  "--results-dir", str(tmp_path), "--ship-dir", str(tmp_path),
                  "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "vit_meta.npz").exists() and not (tmp_path / "x.json").exists()


def test_held_out_tables_score_a_machine_none_of_whose_devices_is_meta_trained(tmp_path) -> None:
    _, paths = _fake_tables(tmp_path)
    cpu, gpu = paths
    out = tmp_path / "out.json"
    assert lmt.main(["--spaces", "vit", "--tables", str(cpu), "--held-out-tables", str(gpu),
                     "--seeds", "1", "--predictors", "flops", "meta[random]",
                     "--results-dir", str(tmp_path), "--ship-dir", str(tmp_path),
                     "--out", str(out)]) == 0
    doc = json.loads(out.read_text())["spaces"][0]
    assert doc["held_out_tables"] == [str(gpu)]
    assert not any(d.startswith("h200") for d in doc["meta_trained_devices"])
    held = [r for r in doc["results"] if r["split"] == "held-out-machine"]
    assert {r["device"] for r in held} == {"h200-cudagraph-b1", "h200-torch-b1"}
    assert {r["predictor"] for r in held} == {"flops", "meta[random]"}
    # the fake GPU latency follows the depth, not the FLOPs: the adapted predictor sees it
    graph = {r["predictor"]: r["spearman_mean"] for r in held
             if r["device"] == "h200-cudagraph-b1" and r["n_measurements"] == 10}
    assert graph["meta[random]"] > graph["flops"]
    with pytest.raises(SystemExit):
        lmt.main(["--spaces", "vit", "--held-out-tables", str(gpu), "--out", str(out)])


def test_held_out_tables_need_a_meta_training_set(tmp_path, capsys) -> None:
    """Without --tables or --from-csv there is nothing to meta-train on: one argparse error
    naming both ways."""
    with pytest.raises(SystemExit):
        lmt.main(["--spaces", "mbv3", "--held-out-tables", str(tmp_path / "t.csv.gz"),
                  "--out", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    assert "--held-out-tables needs the meta-training set" in err and "--from-csv" in err
