"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run torch single-threaded in a module: on a small shared machine two intra-op threads
    that compete with other processes make tiny forward passes many times slower."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def nb201_sample():
    """``sample(n, seed)`` -> (the nb201 space, ``n`` of its architecture strings drawn without
    replacement with ``seed``); the space is enumerated once per session."""
    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    everything = [space.to_string(a) for a in space.all_architectures()]

    def sample(n: int, seed: int):
        import numpy as np

        rng = np.random.default_rng(seed)
        return space, [everything[i] for i in rng.choice(len(everything), n, replace=False)]

    return sample


@pytest.fixture(scope="session")
def digits_checkpoint(tmp_path_factory):
    """A one-epoch mbv3-tiny supernet on digits (a few seconds), trained by ``hwnas train``."""
    from hwnas.cli import main

    path = tmp_path_factory.mktemp("ckpt") / "supernet.pt"
    assert main(["train", "--epochs", "1", "--out", str(path), "--quiet"]) == 0
    return path


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, digits_checkpoint):
    """A finished ``hwnas search`` (the four seed trials, on an estimated device, no
    sensitivity seeds): the run directory."""
    from hwnas import search

    out = tmp_path_factory.mktemp("runs")
    search.run(supernet=str(digits_checkpoint), devices=["edgetpu-est"],
               objectives="accuracy,latency:edgetpu-est", trials=4, out=str(out), name="small",
               sensitivity_seeds=False, progress=False, log=lambda *a: None)
    return out / "small"


@pytest.fixture(scope="session")
def fuzz_checkpoint(digits_checkpoint):
    """The fuzz suite's supernet (tests/test_fuzz_*.py): the shared one-epoch digits one."""
    return digits_checkpoint


@pytest.fixture(scope="module")
def digits():
    """The built-in digits dataset (seed 0 split)."""
    from hwnas.supernet.data import load_dataset

    return load_dataset("digits")
