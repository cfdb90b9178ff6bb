"""benchmarks/merge_table_sessions.py: sessions of one table are brought to the first one's
level and averaged in log; cv falls as for a mean; the CLI writes the table, its cv and its
record; bad input is one error line and writes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from benchmarks import measure_latency_tables as mlt
from benchmarks import merge_table_sessions as mts

ARCHS = [f"a{i}" for i in range(10)]
TRUE = dict(zip(ARCHS, np.linspace(1.0, 2.0, 10)[np.random.default_rng(1).permutation(10)]))


def session(folder, level, noise, devices=("d",), archs=ARCHS, cv=0.04):
    """One session: every cell ``true * level * noise[arch]`` (no anchors)."""
    t = mlt.Tables({"nb201": list(archs)}, list(devices), None)
    for a in archs:
        t.add("nb201", a, {d: (TRUE[a] * level * noise.get(a, 1.0), cv) for d in devices}, 0)
    folder.mkdir()
    t.write(folder, "t")
    return folder


def test_level_matched_geometric_mean(tmp_path):
    # session 2 runs 3x slower overall; a4 is 20 % slow in session 1, a7 20 % fast in session 2
    s1 = session(tmp_path / "s1", 1.0, {"a4": 1.2})
    s2 = session(tmp_path / "s2", 3.0, {"a7": 0.8})
    devices, archs, ms, cv, record = mts.merge([s1, s2], "nb201", "t")
    assert devices == ["d"] and archs == ARCHS  # the first session's order
    got = dict(zip(archs, ms[:, 0]))
    assert got["a0"] == pytest.approx(TRUE["a0"], rel=1e-5)  # level of session 1, not 3x
    assert got["a4"] == pytest.approx(TRUE["a4"] * np.sqrt(1.2), rel=1e-5)
    assert got["a7"] == pytest.approx(TRUE["a7"] * np.sqrt(0.8), rel=1e-5)
    assert cv[:, 0] == pytest.approx(np.full(10, np.sqrt(2 * 0.04**2) / 2))
    row = record["devices"]["d"]
    assert row["scale_to_session_1"] == [1.0, pytest.approx(1 / 3, abs=1e-4)]
    assert row["architectures_in_every_session"] == 10
    assert 0.8 < row["spearman_between_sessions"]["1-2"] < 1.0


def test_cells_of_one_session_only_are_kept(tmp_path):
    s1 = session(tmp_path / "s1", 1.0, {}, archs=ARCHS[:6])
    s2 = session(tmp_path / "s2", 2.0, {}, archs=ARCHS[3:])
    _, archs, ms, _, record = mts.merge([s1, s2], "nb201", "t")
    assert archs == ARCHS[:6] + ARCHS[6:]
    assert dict(zip(archs, ms[:, 0]))["a9"] == pytest.approx(TRUE["a9"], rel=1e-5)
    assert record["devices"]["d"]["architectures_in_every_session"] == 3


def test_cli_writes_the_averaged_table_and_its_record(tmp_path, capsys):
    s1 = session(tmp_path / "s1", 1.0, {})
    s2 = session(tmp_path / "s2", 1.5, {})
    out = tmp_path / "out"
    assert mts.main([str(s1), str(s2), "--tag", "t", "--out", str(out), "--out-tag", "m2"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "nb201_m2.csv.gz", "nb201_m2_cv.csv.gz", "nb201_m2_sessions.json"]
    rows = mlt.read_csv_gz(out / "nb201_m2.csv.gz")
    assert rows[0] == ["arch", "d"]
    assert {r[0]: float(r[1]) for r in rows[1:]} == pytest.approx(TRUE, rel=1e-5)
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["devices", "missing", "one"])
def test_bad_sessions_are_one_error_line_and_nothing_written(tmp_path, capsys, case):
    s1 = session(tmp_path / "s1", 1.0, {})
    if case == "devices":
        others = [str(session(tmp_path / "s2", 1.0, {}, devices=("e",)))]
    elif case == "missing":
        (tmp_path / "empty").mkdir()
        others = [str(tmp_path / "empty")]
    else:
        others = []
    out = tmp_path / "out"
    assert mts.main([str(s1), *others, "--tag", "t", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("merge_table_sessions: ")
    assert {"devices": "differ", "missing": "no nb201_t.csv.gz", "one": "at least two"}[case] in err[0]
    assert not out.exists()
