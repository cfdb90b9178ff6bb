"""The test session's thread default (tests/conftest.py): torch runs the suite's tiny networks on
one OpenMP thread unless the caller set ``OMP_NUM_THREADS``; the setting reaches torch because
conftest sets it before any test module imports torch."""

from __future__ import annotations

import os


def test_torch_uses_the_sessions_thread_setting() -> None:
    import torch

    assert os.environ.get("OMP_NUM_THREADS"), "tests/conftest.py sets a default of 1"
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
