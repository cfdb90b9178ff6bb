"""Latency tables: loading, validation errors, and the HELP protocol as data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hwnas.latency.tables import (
    HELP_PROTOCOLS,
    LatencyTable,
    help_protocol,
    load_latency_table,
    load_shared_table,
)
from hwnas.supernet.data import shared_data_dir
from hwnas.supernet.spaces import get_space

from hwnas.core.errors import UserError

A1 = ("|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|"
      "+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|")
A2 = "|none~0|+|none~0|none~1|+|skip_connect~0|none~1|none~2|"
A3 = "|nor_conv_1x1~0|+|nor_conv_1x1~0|none~1|+|skip_connect~0|none~1|avg_pool_3x3~2|"


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_valid_table(tmp_path: Path) -> None:
    path = write(tmp_path, f"arch_idx,arch,dev_a,dev_b\n0,{A1},1.5,2\n1,{A2},0.25,3\n2,{A3},1,4\n")
    table = load_latency_table(path, space=get_space("nb201"))
    assert table.devices == ["dev_a", "dev_b"]
    assert len(table) == 3 and A2 in table
    np.testing.assert_allclose(table.column("dev_a"), [1.5, 0.25, 1.0])
    assert list(table.arch_idx) == [0, 1, 2]
    assert list(table.rows([A3, A1])) == [2, 0]
    assert set(table.columns(["dev_b"])) == {"dev_b"}
    only = load_latency_table(path, devices=["dev_b"])
    assert only.devices == ["dev_b"] and only.latency_ms.shape == (3, 1)


def test_canonicalises_architecture_strings(tmp_path: Path) -> None:
    path = write(tmp_path, f"arch,dev\n {A1} ,1\n")
    table = load_latency_table(path, space=get_space("nb201"))
    assert table.archs == [A1]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("dev_a,dev_b\n1,2\n", "no 'arch' column"),
        (f"arch\n{A1}\n", "no device column"),
        (f"arch,dev\n{A1},nan\n", "line 2: dev is nan"),
        (f"arch,dev\n{A1},\n", "line 2: dev is empty"),
        (f"arch,dev\n{A1},fast\n", "'fast' is not a number"),
        (f"arch,dev\n{A1},1\n{A2},2\n{A1},3\n", "line 4: architecture"),
        (f"arch,dev\n{A1},0\n", "expected a latency in ms > 0"),
        (f"arch,dev\n{A1},-2.5\n", "dev is -2.5"),
        (f"arch,dev\n{A1},inf\n", "finite"),
        (f"arch,dev\n{A1},1,2\n", "3 fields"),
        ("arch,dev\n", "no rows"),
        ("", "is empty"),
        ("arch,dev\n|bogus~0|,1\n", "not in space nb201"),
        (f"arch,dev,dev\n{A1},1,2\n", "repeats column"),
        (f"arch_idx,arch,dev\nx,{A1},1\n", "arch_idx 'x'"),
        (f"arch_idx,arch,dev\n3,{A1},1\n3,{A2},1\n", "repeats an arch_idx"),
    ],
)
def test_validation_errors(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UserError, match=None) as exc:
        load_latency_table(path, space=get_space("nb201"))
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_unknown_device_and_missing_file(tmp_path: Path) -> None:
    path = write(tmp_path, f"arch,dev\n{A1},1\n")
    with pytest.raises(UserError, match="no device column 'gpu'"):
        load_latency_table(path, devices=["gpu"])
    table = load_latency_table(path)
    with pytest.raises(UserError, match="no device column 'gpu'.*'dev'"):
        table.column("gpu")
    with pytest.raises(UserError, match="not in the"):
        table.rows([A2])
    with pytest.raises(UserError, match="does not exist"):
        load_latency_table(tmp_path / "missing.csv")
    with pytest.raises(UserError, match="is a directory"):
        load_latency_table(tmp_path)


def test_help_query_set_is_middle_80_percent() -> None:
    proto = help_protocol("nb201")
    n = 3000
    rng = np.random.default_rng(0)
    lat = rng.uniform(1, 10, n)
    table = LatencyTable([f"a{i}" for i in range(n)], ["d"], lat[:, None], np.arange(n))
    q = proto.query_rows(table, "d")
    assert len(q) == 800 and np.all((q >= 900) & (q < 1900))
    window = np.sort(lat[900:1900])
    assert lat[q].min() >= window[100] and lat[q].max() <= window[899]
    train = proto.meta_train_rows(table)
    assert len(train) == n - 1000 and not set(train) & set(q)
    with pytest.raises(UserError, match="no few-shot protocol"):
        help_protocol("mbv3-tiny")


def test_protocol_data_is_consistent() -> None:
    for name, proto in HELP_PROTOCOLS.items():
        splits = [set(proto.meta_train), set(proto.validation), set(proto.test)]
        assert not (splits[0] & splits[1] or splits[0] & splits[2] or splits[1] & splits[2])
        assert len(proto.reference_arch_idx) == 10
        assert set(proto.published) == set(proto.test) | {"mean"}
        assert proto.published["mean"] == pytest.approx(
            np.mean([proto.published[d] for d in proto.test]), abs=5e-3), name


@pytest.mark.parametrize("space_name", ["nb201", "fbnet"])
def test_shared_tables_match_protocol(space_name: str) -> None:
    if shared_data_dir() is None or not (shared_data_dir() / "latency").is_dir():
        pytest.skip("shared latency data not available (set HWNAS_SHARED_DATA)")
    proto = help_protocol(space_name)
    table = load_shared_table(space_name)
    assert len(table) == {"nb201": 15625, "fbnet": 5000}[space_name]
    table.check_devices([*proto.meta_train, *proto.validation, *proto.test])
    assert len(proto.reference_rows(table)) == 10
    for device in proto.test:
        assert len(proto.query_rows(table, device)) == 800
