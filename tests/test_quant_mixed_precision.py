"""Mixed precision: Hutchinson trace vs the exact Hessian, HAWQ-V2 and measured sensitivities,
allocation by integer programming and by the greedy Pareto walk."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from hwnas.quant.allocate import SensitivityTable, allocate, greedy_pareto_walk
from hwnas.quant.cost import (
    bops,
    layer_cost,
    model_size_bytes,
    weight_bits_budget_bytes,
)
from hwnas.quant.policy import apply_to_layers, average_weight_bits
from hwnas.quant.sensitivity import (
    hessian_sensitivity,
    hutchinson_trace,
    measured_sensitivity,
)
from hwnas.supernet.layers import Layer
from torch import nn

from hwnas.core.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_hutchinson_matches_the_exact_hessian_trace_of_a_quadratic():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=g)
    a = a @ a.T + torch.eye(6)
    b = torch.randn(4, 4, generator=g)
    b = b @ b.T
    c = torch.randn(6, 4, generator=g)  # cross term: must not leak into the per-tensor traces
    x = torch.randn(6, generator=g, requires_grad=True)
    y = torch.randn(2, 2, generator=g, requires_grad=True)

    def loss():
        yf = y.reshape(-1)
        return 0.5 * x @ a @ x + 0.5 * yf @ b @ yf + x @ c @ yf + (x ** 3).sum() * 0.0

    traces = hutchinson_trace(loss, {"x": x, "y": y}, n_samples=600, seed=1)
    assert traces["x"] == pytest.approx(float(torch.trace(a)), rel=0.1)
    assert traces["y"] == pytest.approx(float(torch.trace(b)), rel=0.1)
    # and against autograd's full Hessian on a small network
    w = torch.randn(3, 4, generator=g, requires_grad=True)
    inp = torch.randn(16, 4, generator=g)
    target = torch.randint(0, 3, (16,), generator=g)
    fn = lambda w_: F.cross_entropy(torch.tanh(inp @ w_.T), target)  # noqa: E731
    exact = float(torch.autograd.functional.hessian(fn, w).reshape(12, 12).trace())
    est = hutchinson_trace(lambda: fn(w), {"w": w}, n_samples=600, seed=2)["w"]
    assert est == pytest.approx(exact, rel=0.15)


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 4)).eval()
    with torch.no_grad():  # confident logits, so that quantization noise moves the loss
        model[7].weight.mul_(30.0)
    return model


def _batches(n: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 1, 6, 6, generator=g), torch.randint(0, 4, (32,), generator=g))
            for _ in range(n)]


def test_batched_hessian_vector_products_give_the_one_at_a_time_traces():
    """Vectors batched into one double-backward pass (4 + 1 of 5, over 2 chunks) give what one
    pass per vector gives (the same vectors); a parameter the loss does not use has trace 0."""
    model = _tiny_model()
    one = hessian_sensitivity(model, _batches(), [(4, 8)], n_samples=5, chunk=32, probe_batch=1)
    batched = hessian_sensitivity(model, _batches(), [(4, 8)], n_samples=5, chunk=32,
                                  probe_batch=4)
    for name, trace in one.extra["traces"].items():
        assert batched.extra["traces"][name] == pytest.approx(trace, rel=1e-4, abs=1e-6)
    w = torch.randn(3, requires_grad=True)
    unused = torch.randn(2, requires_grad=True)
    traces = hutchinson_trace(lambda: (w ** 4).sum(), {"w": w, "unused": unused}, n_samples=3,
                              batch=2)
    assert traces["unused"] == 0.0 and traces["w"] == pytest.approx(float((12 * w.detach() ** 2).sum()))


def test_hessian_sensitivity_decreases_with_bits_and_is_zero_for_float():
    model = _tiny_model()
    cands = [(2, 8), (4, 8), (8, 8), (32, 32)]
    table = hessian_sensitivity(model, _batches(), cands, n_samples=8)
    assert table.kind == "hessian"
    assert table.layer_names == ["0", "3", "7"]
    for row in table.values.values():
        assert row[(32, 32)] == 0.0
        assert row[(2, 8)] > row[(4, 8)] > row[(8, 8)] >= 0.0
    assert set(table.extra["traces"]) == {"0", "3", "7"}


def test_hessian_sensitivity_by_chunks_equals_one_chunk():
    """The traces are linear in the loss: chunks of images (each chunk's graph freed before the
    next, what keeps a run's memory down) give the one-chunk estimate with the same vectors."""
    cands = [(4, 8), (8, 8)]
    whole = hessian_sensitivity(_tiny_model(), _batches(), cands, n_samples=6, chunk=64)
    for chunk in (7, 16):
        parts = hessian_sensitivity(_tiny_model(), _batches(), cands, n_samples=6, chunk=chunk)
        for name, trace in whole.extra["traces"].items():
            assert parts.extra["traces"][name] == pytest.approx(trace, rel=1e-4, abs=1e-7)
    assert whole.extra["traces"]["3"] != 0.0
    with pytest.raises(UserError, match="chunk"):
        hessian_sensitivity(_tiny_model(), _batches(), cands, n_samples=2, chunk=0)


def test_measured_sensitivity_quantizes_one_layer_at_a_time():
    model = _tiny_model()
    table = measured_sensitivity(model, _batches(seed=1), _batches(seed=2), [(2, 2), (8, 8), (32, 32)])
    assert table.kind == "loss" and table.layer_names == ["0", "3", "7"]
    for row in table.values.values():
        assert row[(32, 32)] == 0.0
        assert abs(row[(8, 8)]) < abs(row[(2, 2)]) + 1e-6
    assert any(row[(2, 2)] > 0.01 for row in table.values.values())
    acc = measured_sensitivity(model, _batches(seed=1), _batches(seed=2), [(2, 8)], metric="accuracy")
    assert acc.kind == "accuracy"
    with pytest.raises(UserError, match="unknown sensitivity metric"):
        measured_sensitivity(model, _batches(), _batches(), [(8, 8)], metric="f1")


# -- allocation ---------------------------------------------------------------------------------

LAYERS = [
    Layer("stem", "conv", 3, 16, 3, in_h=16, in_w=16, bias=True),
    Layer("a", "conv", 16, 32, 3, in_h=16, in_w=16, bias=True),
    Layer("b", "conv", 32, 64, 3, 2, in_h=16, in_w=16, bias=True),
    Layer("c", "conv", 64, 64, 1, in_h=8, in_w=8, bias=True),
    Layer("add", "add", 64, 64, in_h=8, in_w=8),
    Layer("fc", "linear", 64, 10, bias=True),
]
W_BITS = (2, 3, 4, 6, 8)


def _table(sensitive: str = "b") -> SensitivityTable:
    values = {}
    for layer in LAYERS:
        if layer.op not in ("conv", "linear"):
            continue
        weight = 1000.0 if layer.name == sensitive else 1.0
        values[layer.name] = {(w, 8): weight * 4.0 ** (-w) for w in W_BITS}
    return SensitivityTable(values, "synthetic")


def _brute_force(table: SensitivityTable, budget: float, cost: str):
    names = table.layer_names
    best = None
    for combo in itertools.product(*[list(table.values[n]) for n in names]):
        layers = [layer.with_bits(*combo[names.index(layer.name)]) if layer.name in names else layer
                  for layer in LAYERS]
        total = sum(layer_cost(layer, cost) for layer in layers)
        if total <= budget:
            s = sum(table.values[n][p] for n, p in zip(names, combo))
            if best is None or s < best[0]:
                best = (s, combo)
    return best


@pytest.mark.parametrize("cost", ["size", "bops"])
def test_ilp_is_optimal_and_respects_the_budget(cost):
    table = _table()
    full = sum(layer_cost(layer.with_bits(8, 8) if layer.op != "add" else layer, cost) for layer in LAYERS)
    budget = 0.6 * full
    alloc = allocate(table, LAYERS, budget, cost)
    priced = apply_to_layers(alloc.policy, LAYERS)
    total = model_size_bytes(priced) if cost == "size" else bops(priced)
    assert total <= budget + 1
    assert alloc.cost == pytest.approx(sum(layer_cost(layer, cost) for layer in priced))
    best, _ = _brute_force(table, budget, cost)
    assert alloc.sensitivity == pytest.approx(best, rel=1e-6)
    greedy = allocate(table, LAYERS, budget, cost, method="greedy")
    assert greedy.cost <= budget * (1 + 1e-9)
    assert greedy.sensitivity >= alloc.sensitivity - 1e-12


def test_allocation_gives_the_sensitive_layer_the_high_bits():
    budget = weight_bits_budget_bytes(LAYERS, 5.0)
    for sensitive in ("a", "c"):  # (b holds 65% of the weights: 8 bits there cannot fit 5 avg)
        alloc = allocate(_table(sensitive), LAYERS, budget, "size")
        w_sensitive = alloc.policy[sensitive][0]
        others = [alloc.policy[n][0] for n in alloc.policy.layer_names if n != sensitive]
        assert w_sensitive == 8
        assert min(others) < 8
        assert average_weight_bits(alloc.policy, LAYERS) <= 5.0 + 1e-9


def test_fixed_layers_custom_cost_and_infeasible_budgets():
    table = _table()
    table.values = {n: v for n, v in table.values.items() if n not in ("stem", "fc")}
    fixed = {"stem": (8, 8), "fc": (8, 8)}
    # a custom per-layer cost: pretend only 8-bit layers run fast on some device
    latency = lambda layer: layer.macs * (1.0 if layer.w_bits == 8 else 3.0)  # noqa: E731
    budget = sum(latency(layer.with_bits(8, 8)) for layer in LAYERS)
    alloc = allocate(table, LAYERS, budget, latency, fixed=fixed)
    assert alloc.policy["stem"] == (8, 8) and alloc.policy["fc"] == (8, 8)
    assert all(alloc.policy[n][0] == 8 for n in ("a", "b", "c"))
    with pytest.raises(UserError, match="no quant policy fits the size budget 10: the cheapest choice"):
        allocate(_table(), LAYERS, 10, "size")
    with pytest.raises(UserError, match="budget must be a positive number"):
        allocate(_table(), LAYERS, -1, "size")
    with pytest.raises(UserError, match="neither sensitivities nor a fixed"):
        allocate(table, LAYERS, 1e9, "size")
    with pytest.raises(UserError, match="unknown cost 'latency'"):
        allocate(_table(), LAYERS, 1e9, "latency")


def test_greedy_walk_is_a_pareto_sequence():
    walk = greedy_pareto_walk(_table(), LAYERS, "size")
    costs = [p.cost for p in walk]
    sens = [p.sensitivity for p in walk]
    assert costs == sorted(costs, reverse=True) and len(set(costs)) == len(costs)
    assert sens == sorted(sens)
    assert all(b == 8 for b, _ in walk[0].policy.bits.values())
    assert all(b == 2 for b, _ in walk[-1].policy.bits.values())


def test_hessian_sensitivity_through_hard_sigmoid_gates():
    """Squeeze-excite gates use hard-sigmoid, which PyTorch cannot differentiate twice."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Hardswish(), nn.Conv2d(4, 4, 1),
                          nn.Hardsigmoid(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 4)).eval()
    table = hessian_sensitivity(model, _batches(), [(2, 8), (8, 8)], n_samples=4)
    assert all(row[(2, 8)] > row[(8, 8)] > 0 for row in table.values.values())
    assert isinstance(model[3], nn.Hardsigmoid)  # the caller's model keeps its modules


@pytest.mark.parametrize("stride,padding,kernel", [(1, 1, 3), (2, 2, 5), (2, 1, 3)])
def test_depthwise_second_derivative_by_first_order_convolutions(stride, padding, kernel):
    """The sensitivity copy's depthwise convolutions (``_Depthwise2``) give F.conv2d's output,
    gradients and Hessian-vector products (w.r.t. weights and inputs, single and batched
    vectors), through first-order convolutions instead of PyTorch's per-channel double
    backward."""
    from hwnas.quant.sensitivity import _Depthwise2, _twice_differentiable

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(6, 6, kernel, stride, padding, groups=6, bias=True),
                          nn.Tanh(), nn.Conv2d(6, 6, kernel, 1, padding, groups=6, bias=False))
    swapped = _twice_differentiable(__import__("copy").deepcopy(plain), depthwise=True)
    assert not any(isinstance(m, _Depthwise2) for m in _twice_differentiable(plain))  # CPU
    assert [type(m) for m in swapped if isinstance(m, nn.Conv2d)] == [_Depthwise2] * 2
    x = torch.randn(3, 6, 9, 9, dtype=torch.float64, requires_grad=True)
    plain, swapped = plain.double(), swapped.double()
    results = []
    for model in (plain, swapped):
        ws = [model[0].weight, model[2].weight, x]
        loss = (model(x) ** 2).sum()
        grads = torch.autograd.grad(loss, ws, create_graph=True)
        gen = torch.Generator().manual_seed(1)
        vs = [torch.randn(2, *w.shape, generator=gen, dtype=torch.float64) for w in ws]
        one = torch.autograd.grad(grads, ws, [v[0] for v in vs], retain_graph=True)
        batched = torch.autograd.grad(grads, ws, vs, is_grads_batched=True)
        results.append((model(x), grads, one, batched))
    for a, b in zip(*results):
        for u, v in zip(*((a, b) if isinstance(a, (list, tuple)) else ([a], [b]))):
            torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-10)
