"""The project's measured latency tables (``<space>_<machine>.csv.gz``) as table devices of the
registry: listing with space coverage, lookup, refusal of unmeasured architectures, gzip reading."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
from hwnas.latency.devices import (
    MEASURED_TABLES_ENV,
    TableDevice,
    available_devices,
    get_device,
    measured_tables,
    measured_tables_dir,
    reliability,
)
from hwnas.latency.profiles import check_profile_name
from hwnas.latency.tables import load_latency_table
from hwnas.supernet.spaces import get_space

from hwnas.core.errors import UserError

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "latency" / "data" / "tables"  # package data: hwnas/latency/data/tables
EVIDENCE = REPO / "benchmarks" / "results" / "latency_tables"  # cv, raw, anchors, sessions


def write_gz(path: Path, header: list[str], rows: list[list]) -> Path:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path.write_bytes(gzip.compress(buffer.getvalue().encode()))
    return path


@pytest.fixture
def tables_dir(tmp_path, monkeypatch, nb201_sample):
    """A folder with one nb201 and one mbv3 table of a machine 'box', a _cv table, a table of
    an unknown space and the machine's JSON; $HWNAS_LATENCY_TABLES points at it."""
    _, archs = nb201_sample(6, seed=3)
    mbv3 = get_space("mbv3")
    rng = np.random.default_rng(0)
    m_archs = list(dict.fromkeys(mbv3.to_string(mbv3.sample(rng)) for _ in range(4)))
    write_gz(tmp_path / "nb201_box.csv.gz", ["arch", "box-ort-1t", "box-torch-b8"],
             [[a, 1.0 + i, 10.0 + i] for i, a in enumerate(archs)])
    write_gz(tmp_path / "nb201_box_cv.csv.gz", ["arch", "box-ort-1t", "box-torch-b8"],
             [[a, 0.01, 0.02] for a in archs])
    write_gz(tmp_path / "mbv3_box.csv.gz", ["arch", "box-ort-1t"],
             [[a, 2.0 + i] for i, a in enumerate(m_archs)])
    write_gz(tmp_path / "nospace_box.csv.gz", ["arch", "box-ov-1t"], [["x", 1.0]])
    (tmp_path / "machine_box.json").write_text(json.dumps(
        {"cpu": {"cpu_model": "Test CPU 9000", "usable_cpus": 4}}))
    monkeypatch.setenv(MEASURED_TABLES_ENV, str(tmp_path))
    return tmp_path, archs, m_archs


def test_each_column_is_a_table_device_with_its_coverage(tables_dir):
    folder, archs, m_archs = tables_dir
    assert measured_tables() == {"nb201": [folder / "nb201_box.csv.gz"],
                                 "mbv3": [folder / "mbv3_box.csv.gz"]}
    infos = {i.name: i for i in available_devices()}
    assert infos["box-ort-1t"].kind == "table" and infos["box-ort-1t"].spaces == ("mbv3", "nb201")
    assert infos["box-torch-b8"].spaces == ("nb201",)
    assert "box-ov-1t" not in infos  # a table of an unknown space is not read
    text = infos["box-ort-1t"].description
    assert "Test CPU 9000, 4 cores" in text and "onnxruntime, 1 thread" in text
    assert f"mbv3 {len(m_archs)}, nb201 6 architectures" in text
    assert "PyTorch eager, batch 8 (ms per batch)" in infos["box-torch-b8"].description
    assert "box-ort-1t" in [i.name for i in available_devices("mbv3")]
    assert "box-torch-b8" not in [i.name for i in available_devices("mbv3")]


def test_descriptions_say_how_well_averaged_sessions_agree(tables_dir):
    folder, _, _ = tables_dir
    pairs = {"box-ort-1t": {"1-2": 0.9, "1-3": 0.8, "2-3": 0.85}, "box-torch-b8": {"1-2": 0.1}}
    (folder / "nb201_box_sessions.json").write_text(json.dumps(
        {"sessions": ["s1", "s2", "s3"],
         "devices": {c: {"spearman_between_sessions": p} for c, p in pairs.items()}}))
    infos = {i.name: i for i in available_devices()}
    assert "sessions rank alike at Spearman nb201 0.85 (3 sessions)" in infos["box-ort-1t"].description
    # three sessions pairwise at 0.1 average to a reliability of 0.25: called noise-level
    assert "nb201 0.10 (3 sessions, noise-level)" in infos["box-torch-b8"].description
    (folder / "nb201_box_sessions.json").write_text("{not json")  # unreadable: no claim
    infos = {i.name: i for i in available_devices()}
    assert "Spearman" not in infos["box-ort-1t"].description


def test_reliability_of_averaged_sessions():
    assert reliability(1, 0.4) == pytest.approx(0.4)
    assert reliability(4, 0.2) == pytest.approx(0.5)  # Spearman-Brown: 4 * 0.2 / (1 + 3 * 0.2)
    assert reliability(2, 1.0) == pytest.approx(1.0) and reliability(3, -0.2) == 0.0


def test_lookup_and_refusal(tables_dir):
    _, archs, m_archs = tables_dir
    device = get_device("box-ort-1t", "nb201")
    assert isinstance(device, TableDevice)
    np.testing.assert_array_equal(device.latency("nb201", archs[::-1]), [6, 5, 4, 3, 2, 1])
    np.testing.assert_array_equal(device.latency("mbv3", m_archs[:2]), [2.0, 3.0])
    space = get_space("nb201")
    other = next(s for s in (space.to_string(a) for a in space.all_architectures())
                 if s not in archs)
    with pytest.raises(UserError, match=r"not in the nb201 latency table nb201_box\.csv\.gz "
                                        r"\(6 measured.*'box-ort-1t' only knows measured"):
        device.latency(space, [archs[0], other])
    with pytest.raises(UserError, match="has no latency for space 'fbnet'"):
        get_device("box-ort-1t", "fbnet")
    with pytest.raises(UserError, match="another configuration"):
        small = get_space("nb201", image_size=16)
        device.latency(small, [small.to_string(small.largest())])
    with pytest.raises(UserError, match="is a built-in device"):
        check_profile_name("box-ort-1t")


def test_search_prices_table_architectures_with_them(tables_dir):
    """The search's evaluator asks a measured table device like any table device."""
    from hwnas.search.evaluator import device_latencies

    _, archs, _ = tables_dir
    space = get_space("nb201")
    mean, std = device_latencies(get_device("box-torch-b8", space), space,
                                 [space.from_string(a) for a in archs[:3]], [None] * 3)
    np.testing.assert_array_equal(mean, [10.0, 11.0, 12.0])
    assert std is None


def test_the_folder_can_be_switched_off(tables_dir, monkeypatch):
    monkeypatch.setenv(MEASURED_TABLES_ENV, "")
    assert measured_tables_dir() is None and measured_tables() == {}
    assert "box-ort-1t" not in [i.name for i in available_devices()]


def test_gzip_tables_are_validated_like_csv(tmp_path, nb201_sample):
    space, archs = nb201_sample(3, seed=1)
    path = write_gz(tmp_path / "nb201_m.csv.gz", ["arch", "d"], [[a, 1.5] for a in archs])
    table = load_latency_table(path, space=space)
    assert table.archs == archs and table.devices == ["d"]
    bad = write_gz(tmp_path / "nb201_bad.csv.gz", ["arch", "d"], [[archs[0], "-1"]])
    with pytest.raises(UserError, match="line 2: d is -1"):
        load_latency_table(bad, space=space)
    broken = tmp_path / "nb201_broken.csv.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match="cannot read latency table"):
        load_latency_table(broken, space=space)


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no latency/data/tables here")
def test_the_committed_tables_are_devices(monkeypatch):
    """Every column of every committed ``<space>_<machine>.csv.gz`` is a device giving the
    table's values."""
    monkeypatch.delenv(MEASURED_TABLES_ENV, raising=False)
    assert measured_tables_dir() == COMMITTED
    paths = sorted(p for p in COMMITTED.glob("*.csv.gz")
                   if not p.name.endswith(("_cv.csv.gz", "_raw.csv.gz", "_anchors.csv.gz"))
                   and not p.name.startswith("archs_"))
    assert paths
    names = {i.name for i in available_devices()}
    for path in paths:
        space_name = path.name.split("_")[0]
        rows = list(csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))
        header, body = rows[0], rows[1:][:5]
        for j, column in enumerate(header[1:], start=1):
            assert column in names
            got = get_device(column, space_name).latency(space_name, [r[0] for r in body])
            np.testing.assert_allclose(got, [float(r[j]) for r in body])


@pytest.mark.skipif(not EVIDENCE.is_dir(), reason="no benchmarks/results/latency_tables here")
def test_every_table_hwnas_reads_is_package_data():
    """A table left beside the benchmark evidence would be a device of the checkout only: every
    ``<space>_<machine>.csv.gz`` (and its ``_sessions.json``) lives in the package data, whose
    patterns in pyproject.toml ship it in the wheel."""
    import fnmatch
    import re
    import tomllib

    pattern = re.compile(r"^[A-Za-z0-9-]+_[A-Za-z0-9]+(\.csv\.gz|_sessions\.json)$")
    assert not [p.name for p in EVIDENCE.iterdir() if pattern.match(p.name)]
    shipped = tomllib.loads((REPO / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["hwnas.latency"]
    for path in COMMITTED.iterdir():
        rel = f"data/tables/{path.name}"
        assert any(fnmatch.fnmatch(rel, g) for g in shipped), rel
