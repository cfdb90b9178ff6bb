"""Mixed-precision allocation: per-layer bit-widths that minimise total sensitivity under a
budget (model size, BOPs or any per-layer cost such as a device latency).

Inputs are a :class:`SensitivityTable` (layer -> {(w_bits, a_bits): sensitivity}, from
:mod:`hwnas.quant.sensitivity`; sensitivities are assumed additive over layers, as in HAWQ-V2/V3) and
the layer list that prices each choice. Two solvers:

* ``"ilp"``: the exact multiple-choice knapsack as an integer program (one binary per layer and
  candidate, one choice per layer, total cost <= budget), with ``scipy.optimize.milp`` (HiGHS);
* ``"greedy"``: a Pareto walk from the most accurate choice of every layer, each step taking the
  move with the smallest sensitivity increase per unit of cost saved, until the budget holds —
  a baseline, and :func:`greedy_pareto_walk` returns the whole walk (policies from large to
  small), useful as seeds for the search.

This module does not import torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hwnas.quant.cost import COST_KINDS, layer_cost
from hwnas.quant.policy import QuantPolicy, check_bits
from hwnas.supernet.layers import Layer

from hwnas.core.errors import UserError

__all__ = ["Allocation", "SensitivityTable", "allocate", "greedy_pareto_walk"]

Pair = tuple[int, int]
CostFn = Callable[[Layer], float]


@dataclass
class SensitivityTable:
    """Per-layer sensitivity of each candidate (w_bits, a_bits): how much the network suffers
    when that layer alone is quantized so. ``kind`` says how it was measured ("hessian",
    "loss" or "accuracy")."""

    values: dict[str, dict[Pair, float]]
    kind: str = "hessian"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, row in self.values.items():
            if not row:
                raise UserError(f"sensitivity table: layer {name!r} has no candidates")
            for (w, a), value in row.items():
                check_bits(w, "weight", name)
                check_bits(a, "activation", name)
                if not math.isfinite(float(value)):
                    raise UserError(f"sensitivity table: layer {name!r} candidate ({w}, {a}) has "
                                    f"a non-finite value {value!r}")

    @property
    def layer_names(self) -> list[str]:
        return list(self.values)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "extra": self.extra,
                "values": {n: [[w, a, v] for (w, a), v in row.items()] for n, row in self.values.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SensitivityTable:
        return cls({n: {(int(w), int(a)): float(v) for w, a, v in rows} for n, rows in d["values"].items()},
                   d.get("kind", "hessian"), dict(d.get("extra", {})))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


@dataclass
class Allocation:
    """A chosen policy with its total cost and total sensitivity."""

    policy: QuantPolicy
    cost: float
    sensitivity: float
    budget: float | None
    method: str
    cost_name: str


def _cost_fn(cost: str | CostFn) -> tuple[CostFn, str]:
    if callable(cost):
        return cost, getattr(cost, "__name__", "custom")
    if cost not in COST_KINDS:
        raise UserError(f"unknown cost {cost!r}; expected one of {', '.join(COST_KINDS)} or a "
                        f"function of a Layer")
    return (lambda layer: layer_cost(layer, cost)), cost


def _prepare(table: SensitivityTable, layers: list[Layer], cost: str | CostFn,
             fixed: Mapping[str, Pair] | None):
    fn, cost_name = _cost_fn(cost)
    fixed = dict(fixed or {})
    by_name = {layer.name: layer for layer in layers}
    quant_names = [layer.name for layer in layers if layer.op in ("conv", "linear")]
    for name in list(table.values) + list(fixed):
        if name not in by_name:
            raise UserError(f"allocation: layer {name!r} is not in the layer list")
    for name in quant_names:
        if name not in table.values and name not in fixed:
            raise UserError(f"allocation: layer {name!r} has neither sensitivities nor a fixed "
                            f"bit-width")
    for name, (w, a) in fixed.items():
        check_bits(w, "weight", name)
        check_bits(a, "activation", name)
    free = [n for n in quant_names if n not in fixed]
    constant = 0.0
    for layer in layers:
        if layer.name in fixed:
            constant += fn(layer.with_bits(*fixed[layer.name]))
        elif layer.name not in table.values:
            constant += fn(layer)
    options = {n: [(pair, float(s), float(fn(by_name[n].with_bits(*pair))))
                   for pair, s in table.values[n].items()] for n in free}
    return fn, cost_name, fixed, free, constant, options, quant_names


def _policy(choice: Mapping[str, Pair], fixed: Mapping[str, Pair], order: list[str]) -> QuantPolicy:
    merged = {**fixed, **choice}
    return QuantPolicy({n: merged[n] for n in order})


def greedy_pareto_walk(table: SensitivityTable, layers: list[Layer], cost: str | CostFn = "size",
                       *, fixed: Mapping[str, Pair] | None = None) -> list[Allocation]:
    """The greedy walk from the least sensitive choice of every layer down to the cheapest: each
    step moves one layer to a cheaper candidate with the smallest added sensitivity per unit of
    cost saved. Returns every point of the walk (cost decreasing)."""
    _, cost_name, fixed, free, constant, options, order = _prepare(table, layers, cost, fixed)
    current = {n: min(options[n], key=lambda o: (o[1], -o[2])) for n in free}
    points = []

    def record() -> None:
        choice = {n: o[0] for n, o in current.items()}
        points.append(Allocation(_policy(choice, fixed, order), constant + sum(o[2] for o in current.values()),
                                 sum(o[1] for o in current.values()), None, "greedy", cost_name))

    record()
    while True:
        best, best_ratio = None, math.inf
        for n in free:
            _, s0, c0 = current[n]
            for option in options[n]:
                _, s1, c1 = option
                if c1 < c0 - 1e-12:
                    ratio = (s1 - s0) / (c0 - c1)
                    if ratio < best_ratio:
                        best, best_ratio = (n, option), ratio
        if best is None:
            return points
        current[best[0]] = best[1]
        record()


def allocate(table: SensitivityTable, layers: list[Layer], budget: float,
             cost: str | CostFn = "size", *, method: str = "ilp",
             fixed: Mapping[str, Pair] | None = None) -> Allocation:
    """The policy minimising total sensitivity with total cost (over all ``layers``) <=
    ``budget``. ``cost``: "size" (bytes), "bops", or a function of a Layer with bit-widths set
    (e.g. :func:`hwnas.quant.device_rules.layer_latency_fn`). ``fixed``: layers held at given widths
    (e.g. first and last at (8, 8)). UserError if no policy fits the budget.

    Examples:
        >>> from hwnas.quant import apply_to_layers, uniform
        >>> from hwnas.supernet import get_space
        >>> space = get_space("mbv3-tiny")
        >>> layers = space.layers(space.smallest())
        >>> names = [l.name for l in layers if l.op in ("conv", "linear")]
        >>> int8 = apply_to_layers(uniform(names, 8, 8), layers)
        >>> from hwnas.quant import allocate, model_size_bytes
        >>> from hwnas.quant.allocate import SensitivityTable
        >>> table = SensitivityTable({n: {(8, 8): 0.01, (4, 8): 0.1 + i / 100} for i, n in enumerate(names)})
        >>> chosen = allocate(table, layers, budget=0.8 * model_size_bytes(int8))
        >>> chosen.cost <= 0.8 * model_size_bytes(int8), sorted(set(chosen.policy.bits.values()))
        (True, [(4, 8), (8, 8)])
    """
    if method not in ("ilp", "greedy"):
        raise UserError(f"unknown allocation method {method!r}; expected 'ilp' or 'greedy'")
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
        raise UserError(f"allocation budget must be a positive number, got {budget!r}")
    _, cost_name, fixed_d, free, constant, options, order = _prepare(table, layers, cost, fixed)
    cheapest = constant + sum(min(o[2] for o in options[n]) for n in free)
    if cheapest > budget * (1 + 1e-9):
        raise UserError(f"no quant policy fits the {cost_name} budget {budget:.6g}: the cheapest "
                        f"choice of every layer costs {cheapest:.6g}")
    if method == "greedy" or not free:
        walk = greedy_pareto_walk(table, layers, cost, fixed=fixed)
        for point in walk:
            if point.cost <= budget * (1 + 1e-9):
                point.budget = budget
                return point
        raise AssertionError("greedy walk ended above a feasible budget")  # cheapest fits
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import lil_matrix
    except ImportError:  # scipy comes with scikit-learn; fall back if a slim install lacks it
        return allocate(table, layers, budget, cost, method="greedy", fixed=fixed)
    index = [(n, o) for n in free for o in options[n]]
    c = np.array([o[1] for _, o in index])
    costs = np.array([o[2] for _, o in index])
    one_hot = lil_matrix((len(free), len(index)))
    row = {n: i for i, n in enumerate(free)}
    for j, (n, _) in enumerate(index):
        one_hot[row[n], j] = 1.0
    # scale the cost row to O(1) for the solver's tolerances
    unit = max(1e-12, float(np.abs(costs).max()))
    constraints = [LinearConstraint(one_hot.tocsr(), 1.0, 1.0),
                   LinearConstraint((costs / unit)[None, :], -np.inf, (budget - constant) / unit)]
    result = milp(c, constraints=constraints, integrality=np.ones(len(index)), bounds=Bounds(0, 1))
    if result.x is None:
        raise UserError(f"integer program found no policy within the {cost_name} budget "
                        f"{budget:.6g} ({result.message})")
    chosen = {n: o for (n, o), x in zip(index, result.x) if x > 0.5}
    choice = {n: o[0] for n, o in chosen.items()}
    return Allocation(_policy(choice, fixed_d, order), constant + sum(o[2] for o in chosen.values()),
                      sum(o[1] for o in chosen.values()), budget, "ilp", cost_name)
