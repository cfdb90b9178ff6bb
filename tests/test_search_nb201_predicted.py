"""The analysis helpers of benchmarks/search_nb201_predicted.py on a small synthetic space."""

import numpy as np

from benchmarks import search_nb201_predicted as an


def test_layers_oracle_and_band():
    lat = np.array([1.0, 2.0, 3.0, 1.5, 2.5, 3.5, 2.0])
    acc = np.array([10.0, 20.0, 30.0, 9.0, 19.0, 29.0, 15.0])
    from hwnas.search.pareto import front_layers

    layers = front_layers(lat, acc, limit=100)
    assert [sorted(x.tolist()) for x in layers] == [[0, 1, 2], [3, 4, 5, 6]]
    # the oracle takes whole layers, then thins the next one evenly along the latency
    assert sorted(an.oracle_rows(lat, acc, 3).tolist()) == [0, 1, 2]
    assert sorted(an.oracle_rows(lat, acc, 5).tolist()) == [0, 1, 2, 3, 5]
    # within 1 point of the staircase at its latency: all but cell 6 (15 against 20 at 2.0,
    # a tie in latency with cell 1)
    assert np.flatnonzero(an.band(lat, acc, 1.0)).tolist() == [0, 1, 2, 3, 4, 5]
    assert np.flatnonzero(an.band(lat, acc, 0.5)).tolist() == [0, 1, 2]
    # the seen ratio of the whole space is 1, of a dominated cell alone less
    seen = type("P", (), {"seen_latency": lat, "accuracy": acc})
    assert an.seen_ratio(np.arange(7), seen) == 1.0
    assert an.seen_ratio(np.array([3]), seen) < 1.0
