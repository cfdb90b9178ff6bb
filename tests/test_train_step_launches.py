"""Fewer kernel launches per training step on a GPU (issue 44: CCT's step is bound by per-step
overhead, not compute; ``benchmarks/train_step_overhead.md``, "Session 36"): the batch's random
numbers drawn first and copied once, the augmentation a pure function that compiles whole,
``--compile-scope step`` compiling a standalone network with its loss, the divergence guard's
snapshot as one multi-tensor copy. None of it may change what the eager CPU run computes."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

import hwnas.supernet.data.augment as augment_mod
from hwnas.supernet.data import BatchLoader, ImageSplit, augment_batch
from hwnas.supernet.data.augment import apply_augment, draw_augment
from hwnas.supernet.divergence import DivergenceGuard
from hwnas.supernet.train import TrainOptions, standalone_config, train_standalone
from hwnas.supernet.train_options import AUGMENT_KINDS

from hwnas.core.errors import UserError

#: sha1 (first 16 hex digits) of two consecutive batches of each kind: 64 random uint8 images
#: (seed 1), generator seed 7, fill (120, 121, 122); measured with the code before these changes
#: (commit ffb1d1e), which drew and moved the random numbers operation by operation
PINNED = {
    "shift": "19b6e0edc3db4327", "crop_flip": "8caec84f5d8f680b",
    "crop_flip_cutout": "cb538ff727ae5537", "trivial_crop_flip_cutout": "cd5a40bc96cc7388",
    "autoaugment_crop_flip": "b1fe0c30eb2be7ae", "none": "82408bd70ef63201",
}


def _images(n: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("kind", AUGMENT_KINDS)
def test_augment_batch_is_unchanged(kind):
    g = torch.Generator().manual_seed(7)
    out = torch.cat([augment_batch(_images(), kind, g, fill=(120, 121, 122)) for _ in range(2)])
    assert hashlib.sha1(out.numpy().tobytes()).hexdigest()[:16] == PINNED[kind]


@pytest.mark.parametrize("kind", [k for k in AUGMENT_KINDS if k != "none"])
def test_one_copy_of_random_numbers_per_batch(kind, monkeypatch):
    """All of a batch's random numbers reach the device in one copy (cutout's fill: one more)."""
    moved = []
    real = augment_mod.to_device
    monkeypatch.setattr(augment_mod, "to_device", lambda t, d: moved.append(t.shape) or real(t, d))
    images = torch.zeros(4, 3, 32, 32, dtype=torch.uint8, device="meta")
    out = augment_batch(images, kind, torch.Generator().manual_seed(0), fill=[1, 2, 3])
    assert out.shape == images.shape
    assert len(moved) == 1 + kind.endswith("cutout")
    assert moved[0][0] == 4


@pytest.mark.parametrize("kind", [k for k in AUGMENT_KINDS if k != "none"])
def test_apply_augment_compiles_as_one_graph(kind):
    """No graph break (fullgraph) and, traced eagerly, the same pixels."""
    torch._dynamo.reset()
    images = _images(16)
    params = draw_augment(kind, tuple(images.shape), torch.Generator().manual_seed(3))
    fill = torch.tensor([120, 121, 122], dtype=torch.uint8)
    compiled = torch.compile(apply_augment, fullgraph=True, backend="eager", dynamic=False)
    assert torch.equal(compiled(images, kind, params, fill), apply_augment(images, kind, params, fill))


def test_loader_compile_runs_the_compiled_functions(monkeypatch):
    """BatchLoader(compile=True) hands the augmentation and normalisation to torch.compile;
    with the eager backend the batches are the eager loader's."""
    compiled = []

    def fake_compile(fn, **kw):
        compiled.append(fn.__name__)
        return torch._dynamo.optimize("eager", dynamic=False)(fn)

    monkeypatch.setattr(torch, "compile", fake_compile)
    split = ImageSplit(_images(40), torch.arange(40) % 10)
    kw = dict(batch_size=16, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), shuffle=True,
              augment="autoaugment_crop_flip", seed=3, drop_last=True)
    eager = list(BatchLoader(split, **kw))
    fast = list(BatchLoader(split, compile=True, **kw))
    assert compiled == ["apply_augment", "_normalise"]
    assert len(eager) == len(fast) == 2
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(eager, fast))


def test_loader_compile_keeps_the_augmentation_eager_off_the_cpu(monkeypatch):
    """Off the CPU only the normalisation is compiled: the compiled AutoAugment batch differed
    from the eager one on an H100 (session 37), so the augmentation stays eager there."""
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn.__name__) or fn)
    split = ImageSplit(_images(40), torch.arange(40) % 10)
    BatchLoader(split, batch_size=16, mean=(0.5,) * 3, std=(0.25,) * 3,
                augment="autoaugment_crop_flip", device="meta", compile=True)
    assert compiled == ["_normalise"]


def _tiny_standalone(**options):
    from hwnas.supernet import get_space

    split = ImageSplit(_images(48), torch.arange(48) % 10)
    from hwnas.supernet.data import DatasetSplits

    data = DatasetSplits("t", split, split, split, [str(i) for i in range(10)], (0.5,) * 3,
                         (0.25,) * 3, "autoaugment_crop_flip")
    space = get_space("cct", in_channels=3, image_size=32, num_classes=10)
    torch.manual_seed(0)
    model = space.build_supernet().extract(space.smallest()).train()
    config = standalone_config(1, batch_size=16, optimizer="adamw", label_smoothing=0.1)
    result = train_standalone(model, data, config=config, progress=False, max_steps=2, **options)
    return model, result


def test_compile_scope_step_compiles_the_network_with_its_loss(monkeypatch):
    """--compile-scope step: one compiled function for the network and its loss, and the loader's
    two; with the eager backend the run computes what the uncompiled one does."""
    ref, r_ref = _tiny_standalone()
    compiled = []

    def fake_compile(fn, mode=None, **kw):
        compiled.append(getattr(fn, "__name__", type(fn).__name__))
        return torch._dynamo.optimize("eager", dynamic=False)(fn)

    monkeypatch.setattr(torch, "compile", fake_compile)
    torch._dynamo.reset()
    net, r = _tiny_standalone(compile=True, compile_scope="step")
    assert sorted(compiled) == ["_normalise", "apply_augment", "forward_loss"]
    assert r.history == r_ref.history or r.step == r_ref.step == 2
    sa, sb = ref.state_dict(), net.state_dict()
    assert all(torch.allclose(sa[k], sb[k], atol=1e-6) for k in sa)
    compiled.clear()
    _tiny_standalone(compile=True)  # scope model: the network alone, as before
    assert compiled == ["ViTNet"]


def test_compile_scope_is_validated():
    with pytest.raises(UserError, match="compile scope"):
        TrainOptions.of(compile_scope="everything")
    assert TrainOptions().compile_scope == "model"


def test_guard_snapshot_reuses_its_buffers():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    guard = DivergenceGuard(model, opt, torch.device("cpu"), every=1)
    guard.snapshot(0)  # before the first step: no optimizer state yet
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    guard.snapshot(1)
    buffers = [id(t) for t in guard._model_snap]
    opt_buffers = {k: id(v) for k, v in guard._opt_snap[id(model.weight)].items()}
    model(torch.ones(2, 4)).pow(2).sum().backward()
    opt.step()
    guard.snapshot(2)
    assert [id(t) for t in guard._model_snap] == buffers
    assert {k: id(v) for k, v in guard._opt_snap[id(model.weight)].items()} == opt_buffers
    assert all(torch.equal(s, t) for s, t in zip(guard._model_snap, model.state_dict().values()))
    state = opt.state[model.weight]
    assert all(torch.equal(guard._opt_snap[id(model.weight)][k], v) for k, v in state.items())
    assert all(s.data_ptr() != t.data_ptr()
               for s, t in zip(guard._model_snap, model.state_dict().values()))
