"""benchmarks/adaround_resume.py: an AdaRound PTQ finished in parts (paused after every layer)
gives the weights of one uninterrupted run, and counts the CPU seconds of all parts."""

from __future__ import annotations

import pytest
import torch

from benchmarks.adaround_resume import Paused, folder_of, resumable
from hwnas.core.errors import UserError


def _ptq(model, x):
    from hwnas.quant import uniform
    from hwnas.quant.ptq import PTQConfig, ptq

    config = PTQConfig(rounding="adaround", adaround_iterations=20)
    return ptq(model, uniform(model, 4, 8), [x], config)


def test_parts_give_the_uninterrupted_weights(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, groups=8), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10)).eval()
    x = torch.randn(16, 3, 8, 8)
    whole = _ptq(model, x).state_dict()
    folder = folder_of(tmp_path, "tiny", "hwnas_w4a8_adaround", 20)
    parts = 0
    while True:
        parts += 1
        try:
            with resumable(folder, budget_s=0.0) as part:  # pause after each learned layer
                got = _ptq(model, x).state_dict()
            break
        except Paused:
            assert parts < 5
    assert parts == 4 and part.kept == 3 and part.learned == 0
    assert part.earlier_cpu > 0 and (folder / "spent_seconds").is_file()
    for name, value in whole.items():
        assert torch.equal(value, got[name]), name
    with resumable(None, 0.0) as plain:  # no folder: plain AdaRound, nothing kept
        _ptq(model, x)
    assert plain.kept == plain.learned == 0
    with pytest.raises(UserError, match="another PTQ"), resumable(folder, 0.0):
        _ptq(model, 2 * x)  # other calibration images: the kept layers are refused


def test_folder_names_one_ptq(tmp_path):
    assert folder_of(tmp_path, "largest", "hwnas_w4a8_adaround", 200) == (
        tmp_path / "largest" / "hwnas_w4a8_200")
    with pytest.raises(ZeroDivisionError), resumable(tmp_path / "f", 10.0):
        1 / 0  # noqa: B018 - any error leaves the patch undone
    from hwnas.quant import adaround
    assert adaround.adaround_layer.__name__ == "adaround_layer"
