"""benchmarks/nb201_estimator_table.py: every cell's latency under hwnas's estimators."""

from __future__ import annotations

from benchmarks import nb201_estimator_table as bench


def test_estimator_columns_rank_convolutions_slower():
    light = "|skip_connect~0|+|skip_connect~0|skip_connect~1|+|skip_connect~0|skip_connect~1|skip_connect~2|"
    heavy = "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|nor_conv_3x3~0|nor_conv_3x3~1|nor_conv_3x3~2|"
    cols = bench.estimator_columns([light, heavy], ["fpga-zcu102-est", "raspi4-est"])
    assert set(cols) == {"fpga-zcu102-est", "raspi4-est"}
    for v in cols.values():
        assert v.shape == (2,) and (v > 0).all() and v[1] > v[0]
