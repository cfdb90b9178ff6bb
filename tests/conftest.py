"""Fixtures shared by the test modules."""

from __future__ import annotations

import os

import pytest

# One OpenMP thread for torch (and the processes the tests start) unless the caller chose a
# number: set here, before any test module imports torch. The tests' networks are tiny, and on a
# small machine two intra-op threads competing with other processes make them many times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")


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
def small_digits():
    """320 digits training images: 5 steps of 64 per epoch."""
    from hwnas.supernet.decoded import load_training_data

    return load_training_data("digits", limit_train=320, limit_eval=100)


@pytest.fixture(scope="module")
def two_step_digits():
    """128 digits training images: 2 steps of 64 per epoch, for tests that follow the steps of
    a training (counts, resumption), not what it learns."""
    from hwnas.supernet.decoded import load_training_data

    return load_training_data("digits", limit_train=128, limit_eval=100)


@pytest.fixture(scope="module")
def digits():
    """The built-in digits dataset (seed 0 split)."""
    from hwnas.supernet.data import load_dataset

    return load_dataset("digits")


def _tiny_qdq_net():  # an nn.Module; torch is imported inside, as everywhere in this file
    """Stem conv+BN+ReLU, expand 1x1 + ReLU, depthwise 3x3 + h-swish, project 1x1 with a
    residual add, pooling and a classifier: the patterns the QDQ exporter has to handle."""
    import torch
    from torch import nn

    class TinyNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.stem_bn = nn.BatchNorm2d(8)
            self.expand = nn.Conv2d(8, 16, 1, bias=False)
            self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
            self.dw_bn = nn.BatchNorm2d(16)
            self.project = nn.Conv2d(16, 8, 1)
            self.fc = nn.Linear(8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.stem_bn(self.stem(x)))
            y = torch.relu(self.expand(x))
            y = nn.functional.hardswish(self.dw_bn(self.dw(y)))
            x = x + self.project(y)
            return self.fc(x.mean((2, 3)))

    return TinyNet()


@pytest.fixture(scope="module")
def qdq_net():
    """A tiny eval-mode CNN for the export tests (test_export_*.py), BatchNorm statistics
    non-trivial so that folding matters."""
    import torch

    torch.manual_seed(0)
    model = _tiny_qdq_net()
    with torch.no_grad():
        for bn in (model.stem_bn, model.dw_bn):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture(scope="module")
def qdq_images():
    """(calibration, test) images for :func:`qdq_net`: 128 and 64 of shape (3, 8, 8)."""
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(128, 3, 8, 8, generator=g), torch.randn(64, 3, 8, 8, generator=g)


@pytest.fixture()
def profile_dir(tmp_path, monkeypatch):
    """Device profiles go to a temporary directory ($HWNAS_DEVICE_DIR), never the user's."""
    root = tmp_path / "devices"
    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(root))
    return root


@pytest.fixture()
def onnx_models(tmp_path):
    """A folder of three tiny ONNX models with arch metadata and one without (its arch is the
    file stem), plus a file that is not a model: (folder, the three archs)."""
    from latency_support import sample_archs, tiny_onnx

    d = tmp_path / "models"
    d.mkdir()
    archs = sample_archs(3)
    for i, arch in enumerate(archs):
        (d / f"trial_{i:04d}.onnx").write_bytes(tiny_onnx(arch, width=8 * (i + 1),
                                                          accuracy="97.5"))
    (d / "plain_model.onnx").write_bytes(tiny_onnx(None))
    (d / "notes.txt").write_text("not a model")
    return d, archs


@pytest.fixture(scope="module")
def vit_tiny():
    """A small member of the ``vit`` family, for the slower checks (ONNX, training,
    quantization)."""
    from hwnas.supernet.spaces import ViTConfig, ViTSpace

    return ViTSpace(ViTConfig(tokenizer_channels=(8,), embed_choices=(16, 24),
                              depth_choices=(1, 2), heads_choices=(1, 2),
                              mlp_ratio_choices=(1.0, 2.0), head_dim=8))


@pytest.fixture(scope="session")
def fitted_digits_checkpoint(tmp_path_factory):
    """An mbv3-tiny digits supernet whose smallest subnet had a few hundred SGD steps (about a
    second), as a checkpoint: an untrained network's logits are near-ties, and top-1 agreement
    between two numerically different implementations of it (fake-quant vs integer kernels) is
    then meaningless. The export tests copy it into their run directories."""
    import torch
    from hwnas.supernet.data import BatchLoader, load_dataset
    from hwnas.supernet.spaces import get_space
    from hwnas.supernet.train import save_checkpoint

    space = get_space("mbv3-tiny", in_channels=1, image_size=8, num_classes=10)
    torch.manual_seed(0)
    supernet = space.build_supernet()
    data = load_dataset("digits", seed=0)
    supernet.set_active(space.smallest())
    supernet.train()
    opt = torch.optim.SGD(supernet.parameters(), lr=0.05, momentum=0.9)
    loader = BatchLoader(data.train, batch_size=64, mean=data.mean, std=data.std, shuffle=True,
                         seed=0)
    for _ in range(6):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(supernet(x), y).backward()
            opt.step()
    supernet.eval()
    path = tmp_path_factory.mktemp("fitted") / "supernet.pt"
    save_checkpoint(path, supernet, space, dataset="digits")
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails because a subprocess ran past its fixed timeout says how loaded the
    machine was (issue 50): on a busy CI machine that is the likely cause, not the code."""
    outcome = yield
    report = outcome.get_result()
    import subprocess

    if report.failed and call.excinfo is not None \
            and call.excinfo.errisinstance(subprocess.TimeoutExpired):
        try:
            load = os.getloadavg()
        except OSError:
            return
        report.sections.append((
            "machine load", f"a subprocess ran past its timeout while the load average was "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 minutes) on "
            f"{os.cpu_count()} cores: on a loaded machine that, not the code, may be the cause"))
