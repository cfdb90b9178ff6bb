"""``ViTSupernet.forward_masked``: every subnet at the largest one's shapes, masked, computes
what the sliced subnet computes (outputs and weight gradients), for the vit and cct spaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hwnas.supernet import get_space


def _pair(space_name):
    space = get_space(space_name, in_channels=3, image_size=32, num_classes=10)
    torch.manual_seed(0)
    supernet = space.build_supernet().eval()
    rng = np.random.default_rng(1)
    archs = [space.smallest(), space.largest()] + [space.sample(rng) for _ in range(4)]
    return space, supernet, archs


@pytest.mark.parametrize("space_name", ["vit", "cct"])
def test_masked_subnets_compute_the_sliced_ones(space_name):
    space, supernet, archs = _pair(space_name)
    x = torch.randn(3, 3, 32, 32)
    for arch in archs:
        supernet.set_active(space.largest())   # the masked pass does not depend on it
        masked = supernet.forward_masked(x, supernet.arch_masks(arch))
        supernet.zero_grad(set_to_none=True)
        masked.square().sum().backward()
        masked_grads = {n: p.grad.clone() for n, p in supernet.named_parameters()
                        if p.grad is not None}
        supernet.set_active(arch)
        sliced = supernet(x)
        supernet.zero_grad(set_to_none=True)
        sliced.square().sum().backward()
        torch.testing.assert_close(masked, sliced, rtol=1e-4, atol=1e-5, msg=str(arch))
        for n, p in supernet.named_parameters():
            want = p.grad if p.grad is not None else torch.zeros_like(p)
            torch.testing.assert_close(masked_grads.get(n, torch.zeros_like(p)), want,
                                       rtol=1e-3, atol=1e-6, msg=f"{arch}: {n}")


def test_training_masks_drop_only_the_subnets_blocks():
    """In training, a block outside the subnet never changes the stream (its rate is 0 and it
    is skipped), and the masked channels stay zero through dropout."""
    space, supernet, _ = _pair("cct")
    supernet.train()
    arch = space.smallest()
    masks = supernet.arch_masks(arch)
    m, n, active = masks[0], masks[1], masks[2]
    assert int(n) == arch.embed and int(m.sum()) == arch.embed
    assert active.tolist() == [1.0] * arch.depth + [0.0] * (space.cfg.max_depth - arch.depth)
    torch.manual_seed(0)
    out = supernet.forward_masked(torch.randn(4, 3, 32, 32), masks)
    assert out.shape == (4, 10) and torch.isfinite(out).all()


def _train_vit(monkeypatch, scope):
    import hwnas.supernet.train as train_mod
    from hwnas.supernet import TrainOptions, load_dataset, sandwich_config, train_supernet

    calls = []

    def compile_(fn, mode=None):  # the compiled callables as they are, counted
        def run(*args):
            calls.append(getattr(fn, "__name__", type(fn).__name__))
            return fn(*args)
        return run

    monkeypatch.setattr(train_mod.torch, "compile", compile_)
    data = load_dataset("digits", seed=0)
    space = get_space("vit", in_channels=data.in_channels, image_size=data.image_size[0],
                      num_classes=data.num_classes)   # no dropout: the two paths draw alike
    torch.manual_seed(0)
    supernet = space.build_supernet()
    train_supernet(supernet, space, data, sandwich_config(epochs=1, batch_size=8),
                   TrainOptions(progress=False, max_steps=2, compile=True, compile_scope=scope))
    return {n: p.detach().clone() for n, p in supernet.named_parameters()}, calls


def test_compile_scope_subnets_trains_the_random_subnets_masked(monkeypatch):
    sliced, calls_model = _train_vit(monkeypatch, "model")
    masked, calls_subnets = _train_vit(monkeypatch, "subnets")
    assert "forward_masked" not in calls_model
    assert calls_subnets.count("forward_masked") == 2 * 2   # 2 random subnets x 2 steps
    for n in sliced:
        torch.testing.assert_close(masked[n], sliced[n], rtol=1e-4, atol=1e-5, msg=n)


def test_compile_scope_subnets_needs_a_masked_supernet():
    from hwnas.core.errors import UserError
    from hwnas.supernet import TrainOptions, load_dataset, sandwich_config, train_supernet

    data = load_dataset("digits", seed=0)
    space = get_space("mbv3-tiny", in_channels=data.in_channels,
                      image_size=data.image_size[0], num_classes=data.num_classes)
    with pytest.raises(UserError, match="forward_masked"):
        train_supernet(space.build_supernet(), space, data, sandwich_config(epochs=1),
                       TrainOptions(progress=False, max_steps=1, compile=True,
                                    compile_scope="subnets"))


def test_one_graph_serves_every_subnet():
    """The point of the masks: torch.compile traces forward_masked once (no graph break, no
    recompilation) for subnets of every depth, width and head count, in training."""
    from torch._dynamo.testing import CompileCounter

    space, supernet, archs = _pair("cct")
    supernet.train()
    counter = CompileCounter()
    run = torch.compile(supernet.forward_masked, backend=counter, fullgraph=True)
    for arch in archs:
        run(torch.randn(2, 3, 32, 32), supernet.arch_masks(arch)).sum().backward()
    assert counter.frame_count == 1
