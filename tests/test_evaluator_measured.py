"""search.evaluator: a device measured here times each architecture's float subnet once, and
every policy of that architecture scales the same timing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hwnas.quant.policy import uniform
from hwnas.search.evaluator import EvalSettings, TrialEvaluator
from hwnas.supernet.spaces import get_space


def test_policies_of_one_architecture_share_its_float_timing(digits, monkeypatch):
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    supernet = space.build_supernet()
    evaluator = TrialEvaluator(space, supernet, digits, ["cpu-ort-1t"],
                               EvalSettings(calib_batches=1, ptq_images=64, seed=0))
    device = evaluator.devices["cpu-ort-1t"]
    timed = []

    def noisy(space_, archs):  # every timing differs, as on a busy machine
        timed.append(space_.to_string(archs[0]) if not isinstance(archs[0], str) else archs[0])
        return np.array([5.0 + len(timed)]), np.array([0.5])

    monkeypatch.setattr(device, "latency_with_std", noisy)
    small, large = space.smallest(), space.largest()
    names = [n for n, m in supernet.extract(small).named_modules()
             if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    rows = [evaluator(small, None), evaluator(small, uniform(names, 8, 8)),
            evaluator(small, uniform(names, 4, 8))]
    assert len(timed) == 1  # one timing for the three candidates of one architecture
    # onnxruntime CPU families assume no int8 gain: all three report that one timing
    assert [r["latency_ms:cpu-ort-1t"] for r in rows] == [6.0, 6.0, 6.0]
    assert rows[1]["latency_std_ms:cpu-ort-1t"] == pytest.approx(0.5)
    evaluator(large, None)
    assert len(timed) == 2  # another architecture is timed
