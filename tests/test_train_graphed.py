"""A supernet step under a CUDA-graph compile mode (``reduce-overhead``, ``max-autotune``).

Inductor's cudagraph trees hand each backward replay's gradients out of one static memory
pool; autograd takes a parameter's first gradient of a step over as ``.grad`` (no copy), and the
next replay in the same step overwrites it (PyTorch issue 169545). A sandwich step has several
backward passes, so on an H100 the CCT supernet diverged at its first sandwich epoch (session
41). CUDA graphs need a GPU; the CPU stand-in below keeps the mechanism that matters: every
compiled pass returns its parameter gradients in the same static buffers.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

import hwnas.supernet.train as train_mod
from hwnas.supernet import TrainOptions, get_space, load_dataset, sandwich_config, train_supernet
from hwnas.supernet.train import standalone_config, train_standalone
from hwnas.supernet.train_options import CUDA_GRAPH_MODES


class _StaticGradients(torch.nn.Module):
    """``module`` whose parameters' gradients leave each backward pass in one buffer per
    parameter, shared by all passes, as a replayed CUDA graph's outputs do."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.buffers_ = {n: torch.zeros_like(p) for n, p in module.named_parameters()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = {n: _Static.apply(p, self.buffers_[n]) for n, p in self.module.named_parameters()}
        return functional_call(self.module, params, (x,))


class _Static(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, buf):
        ctx.buf = buf
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad):
        ctx.buf.copy_(grad)
        return ctx.buf.detach(), None   # an alias of the static buffer, as the graph's output


def _train(monkeypatch, compile_mode=None):
    """Two sandwich steps of mbv3-tiny on digits; the compiled runner is the stand-in."""
    data = load_dataset("digits", seed=0)
    space = get_space("mbv3-tiny", in_channels=data.in_channels,
                      image_size=data.image_size[0], num_classes=data.num_classes)
    torch.manual_seed(0)
    supernet = space.build_supernet()
    monkeypatch.setattr(train_mod.torch, "compile", lambda m, mode=None: _StaticGradients(m))
    train_supernet(supernet, space, data, sandwich_config(epochs=1, batch_size=8),
                   TrainOptions(progress=False, max_steps=2, compile=compile_mode))
    return {n: p.detach().clone() for n, p in supernet.named_parameters()}


def _differs(a, b):
    return any(not torch.allclose(a[n], b[n], rtol=1e-5, atol=1e-6) for n in a)


def test_the_stand_in_overwrites_a_taken_over_gradient():
    """The stand-in has the failure: the first pass's gradient is the buffer itself."""
    w = torch.nn.Parameter(torch.ones(3))
    buf = torch.zeros(3)
    (_Static.apply(w, buf) * 2).sum().backward()
    (_Static.apply(w, buf) * 5).sum().backward()
    assert w.grad.tolist() == [10.0, 10.0, 10.0]   # not 7: the second pass overwrote the first


@pytest.mark.parametrize("mode", sorted(CUDA_GRAPH_MODES))
def test_a_graphed_sandwich_step_keeps_every_subnets_gradient(monkeypatch, mode):
    eager = _train(monkeypatch)                     # no compiled runner: autograd's own sums
    unguarded = _train(monkeypatch, "default")      # the stand-in where no copy is made
    graphed = _train(monkeypatch, mode)
    assert _differs(eager, unguarded), "the stand-in no longer reproduces the failure"
    assert not _differs(eager, graphed), "a CUDA-graph mode lost a subnet's gradient"


class _PooledOutputs(torch.nn.Module):
    """``fn`` whose output leaves each call in one buffer per shape, shared by every compiled
    runner of the run, as CUDA-graph replays hand out outputs of one memory pool: a call
    without gradients (the teacher's) gets the buffer itself, and any later call overwrites
    it."""

    def __init__(self, fn, pool: dict) -> None:
        super().__init__()
        self.fn, self.pool = fn, pool

    def forward(self, *args):
        out = self.fn(*args)
        buf = self.pool.setdefault(tuple(out.shape), torch.empty(out.shape, dtype=out.dtype))
        buf.copy_(out.detach())
        return out if out.requires_grad else buf


def _train_taught(monkeypatch, kind, compile_mode=None, unguarded=False):
    """Two steps of mbv3-tiny on digits (the supernet's sandwich, or its largest subnet alone)
    with an external teacher (an untrained subnet: its logits differ from the student's); the
    compiled runners are the stand-in."""
    data = load_dataset("digits", seed=0)
    space = get_space("mbv3-tiny", in_channels=data.in_channels,
                      image_size=data.image_size[0], num_classes=data.num_classes)
    torch.manual_seed(0)
    supernet = space.build_supernet()
    teacher = space.build_supernet().extract(space.smallest())
    pool: dict = {}
    taught = {"teacher": "untrained", "teacher_weight": 1.0}
    options = TrainOptions(progress=False, max_steps=2, compile=compile_mode)
    with monkeypatch.context() as m:
        m.setattr(train_mod.torch, "compile", lambda fn, mode=None: _PooledOutputs(fn, pool))
        if unguarded:   # the teacher's logits as they were before session 44: no copy
            m.setattr(train_mod, "_teacher_logits",
                      lambda t, x, amp: None if t is None else t(x).float())
        if kind == "supernet":
            train_supernet(supernet, space, data,
                           sandwich_config(epochs=1, batch_size=8, **taught), options,
                           teacher=teacher)
            trained = supernet
        else:
            trained = supernet.extract(space.largest())
            train_standalone(trained, data, config=standalone_config(1, batch_size=8, **taught),
                             options=options, teacher=teacher)
    return {n: p.detach().clone() for n, p in trained.named_parameters()}


@pytest.mark.parametrize("kind", ["supernet", "standalone"])
def test_a_graphed_step_reads_the_teachers_own_logits(monkeypatch, kind):
    """Session 44: with --compile reduce-overhead the student's replay overwrote the compiled
    teacher's logits before the loss read them (an H100 raised at the first step)."""
    eager = _train_taught(monkeypatch, kind)
    unguarded = _train_taught(monkeypatch, kind, "reduce-overhead", unguarded=True)
    graphed = _train_taught(monkeypatch, kind, "reduce-overhead")
    assert _differs(eager, unguarded), "the stand-in no longer reproduces the failure"
    assert not _differs(eager, graphed), "the loss read logits the student's pass overwrote"
