"""benchmarks/nb201_zero_cost.py: NASWOT scores of NAS-Bench-201 cells and their table."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from hwnas.supernet.spaces.nb201 import NB201Config, NB201Space

from benchmarks import nb201_zero_cost as zc
from hwnas.core.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
SMALL = NB201Config(init_channels=4, cells_per_stage=1, num_classes=10)
naswot_scores = zc.naswot_scores


def _images(n=16, seed=0):
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_naswot_is_deterministic_and_ranks_a_dead_cell_last():
    space = NB201Space(SMALL)
    archs = [space.from_string(s) for s in (
        "|none~0|+|none~0|none~1|+|none~0|none~1|none~2|",  # the output depends on nothing
        "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_3x3~1|"
        "nor_conv_3x3~2|",
        "|skip_connect~0|+|none~0|skip_connect~1|+|none~0|none~1|skip_connect~2|",
    )]
    a = naswot_scores(space, archs, _images(), seed=3)
    b = naswot_scores(space, archs, _images(), seed=3)
    assert a.shape == (3,) and np.all(np.isfinite(a)) and np.array_equal(a, b)
    assert a[0] == a.min() and a[0] < a[1]  # the singular kernel gets the floor
    assert not np.array_equal(a[1:], naswot_scores(space, archs, _images(), seed=4)[1:])
    # the caller's global RNG is untouched by the seeded supernet
    torch.manual_seed(0)
    x = torch.rand(1)
    torch.manual_seed(0)
    naswot_scores(space, archs[1:2], _images(), seed=5)
    assert torch.equal(torch.rand(1), x)


def test_naswot_refuses_bad_inputs_with_one_line():
    space = NB201Space(SMALL)
    arch = [space.largest()]
    with pytest.raises(UserError, match="N x C x H x W with N >= 2"):
        naswot_scores(space, arch, torch.rand(1, 3, 32, 32))
    with pytest.raises(UserError, match="NaN"):
        naswot_scores(space, arch, torch.full((4, 3, 32, 32), float("nan")))

    class NoSupernet:
        name = "bare"

    with pytest.raises(UserError, match="builds no supernet"):
        naswot_scores(NoSupernet(), arch, _images())
    assert naswot_scores(space, [], _images()).shape == (0,)


def test_score_table_round_trips_and_the_committed_one_covers_the_space(tmp_path):
    out = tmp_path / "s.csv.gz"
    zc.write_scores(out, ["a", "b"], np.array([1.25, -2.0]))
    assert zc.read_scores(out) == {"a": 1.25, "b": -2.0}
    assert not list(tmp_path.glob("*.tmp"))
    bad = tmp_path / "bad.csv.gz"
    with gzip.open(bad, "wt") as fh:
        fh.write("x,y\n")
    with pytest.raises(ValueError, match="header"):
        zc.read_scores(bad)
    committed = zc.read_scores(ROOT / "benchmarks" / "results" / "nb201_zero_cost" / "naswot.csv.gz")
    space = NB201Space()
    assert set(committed) == {space.to_string(a) for a in space.all_architectures()}
    assert all(np.isfinite(v) for v in committed.values())
