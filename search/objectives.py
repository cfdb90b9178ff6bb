"""Objectives and constraints of a search, parsed from the command line's small language.

=====================  ===========================  =========  ==========================
spelled                column                       direction  unit
=====================  ===========================  =========  ==========================
``accuracy``           ``accuracy``                 maximize   % (validation split)
``latency:DEVICE``     ``latency_ms:DEVICE``        minimize   ms, batch 1, on DEVICE
``size``               ``size_bytes``               minimize   bytes of weights (+ biases)
``bops``               ``bops``                     minimize   bit operations
``flops``              ``flops``                    minimize   2 x multiply-accumulates
``params``             ``params``                   minimize   parameters
=====================  ===========================  =========  ==========================

Each metric is a column of ``trials.csv``; objectives as :func:`parse_objectives`, constraints
(any metric, with units) as :func:`parse_constraint`. This module does not import torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hwnas.core.errors import UserError

#: metric name -> (column, direction, unit)
METRICS: dict[str, tuple[str, str, str]] = {
    "accuracy": ("accuracy", "maximize", "%"),
    "latency": ("latency_ms", "minimize", "ms"),
    "size": ("size_bytes", "minimize", "B"),
    "bops": ("bops", "minimize", "BOPs"),
    "flops": ("flops", "minimize", "FLOPs"),
    "params": ("params", "minimize", ""),
}

_UNITS = {
    "latency": {"": 1.0, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "s": 1e3},
    "size": {"": 1.0, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024.0, "mib": 1024.0 ** 2},
    "accuracy": {"": 1.0, "%": 1.0},
    "count": {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9},
}


@dataclass(frozen=True)
class Metric:
    """One measured quantity of a trial: ``name`` is ``accuracy``, ``size`` ... or
    ``latency`` with its ``device``."""

    name: str
    device: str | None = None

    @property
    def key(self) -> str:
        """As spelled on the command line: ``latency:DEVICE`` or the name."""
        return f"{self.name}:{self.device}" if self.device else self.name

    @property
    def column(self) -> str:
        base = METRICS[self.name][0]
        return f"{base}:{self.device}" if self.device else base

    @property
    def direction(self) -> str:
        return METRICS[self.name][1]

    @property
    def unit(self) -> str:
        return METRICS[self.name][2]

    @property
    def label(self) -> str:
        """Axis label for plots."""
        text = {"accuracy": "accuracy (%)", "latency": f"latency on {self.device} (ms)",
                "size": "model size (KiB)", "bops": "BOPs", "flops": "FLOPs",
                "params": "parameters"}[self.name]
        return text


@dataclass(frozen=True)
class Constraint:
    """``metric <= bound`` or ``metric >= bound`` (bound in the metric's base unit)."""

    metric: Metric
    op: str
    bound: float
    text: str

    def violation(self, value: float) -> float:
        """Optuna's convention: <= 0 feasible, > 0 by how much it is violated."""
        return value - self.bound if self.op == "<=" else self.bound - value

    def satisfied(self, value: float) -> bool:
        return self.violation(value) <= 0


#: metrics priced from the layer list alone (quant/ cost models)
COST_METRIC_NAMES = ("size", "bops", "flops", "params")


def is_cheap(metric: Metric) -> bool:
    """Whether a candidate's value of ``metric`` is known before it is evaluated, at no cost:
    the cost-model metrics, and latency on a device that looks it up, estimates or predicts it
    (kinds table, estimated, adapted). Accuracy and latency measured here need the model."""
    if metric.name in COST_METRIC_NAMES:
        return True
    if metric.name == "latency":
        from hwnas.latency.devices import get_device

        return get_device(metric.device).kind != "measured"
    return False


def parse_metric(text: str, *, what: str = "objective") -> Metric:
    """``accuracy`` / ``latency:DEVICE`` / ``size`` ... -> :class:`Metric`."""
    text = text.strip()
    name, _, device = text.partition(":")
    name = name.strip().lower()
    if name not in METRICS:
        raise UserError(f"unknown {what} {text!r}; expected one of accuracy, latency:DEVICE, "
                        f"size, bops, flops, params")
    if name == "latency":
        if not device.strip():
            raise UserError(f"{what} {text!r} names no device; write latency:DEVICE "
                            f"(see `hwnas latency devices`)")
        return Metric("latency", device.strip())
    if device:
        raise UserError(f"{what} {text!r}: only latency takes a device (latency:DEVICE)")
    return Metric(name)


def parse_objectives(spec: str | Sequence[str]) -> list[Metric]:
    """Comma-separated text or a list of metric spellings; at least one, none twice, e.g.
    ``accuracy,latency:cpu-ort-1t,size``. More than three objectives are better expressed as
    constraints (multi-objective samplers lose their edge as the front grows with the number of
    objectives)."""
    items = [s for s in (spec.split(",") if isinstance(spec, str) else spec) if str(s).strip()]
    if not items:
        raise UserError("no objectives given; expected e.g. --objectives accuracy,latency:cpu-ort-1t,size")
    metrics = [parse_metric(str(s)) for s in items]
    keys = [m.key for m in metrics]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise UserError(f"objective {dupes[0]!r} is named twice in {','.join(keys)}")
    return metrics


_CONSTRAINT = re.compile(r"^\s*(?P<metric>[A-Za-z][\w.:-]*?)\s*(?P<op><=|>=)\s*"
                         r"(?P<value>[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)\s*(?P<unit>[A-Za-zµ%]*)\s*$")


def parse_constraint(text: str) -> Constraint:
    """``latency:edgetpu-est<=5ms`` -> :class:`Constraint` (bound converted to ms/bytes/...).

    Also ``size<=2MB``, ``accuracy>=90``. Units: ``us ms s`` for latency, ``B kB MB KiB MiB``
    for size, ``%`` optional for accuracy, ``k M G`` suffixes for counts. A constraint's metric
    need not be an objective."""
    m = _CONSTRAINT.match(text)
    if not m:
        raise UserError(f"constraint {text!r} is not of the form METRIC<=VALUE[UNIT] or "
                        f"METRIC>=VALUE[UNIT] (e.g. latency:edgetpu-est<=5ms, size<=2MB)")
    metric = parse_metric(m["metric"], what="constraint metric")
    family = metric.name if metric.name in ("latency", "size", "accuracy") else "count"
    units = _UNITS[family]
    unit = m["unit"].lower() if family != "latency" else m["unit"]
    if unit not in units:
        raise UserError(f"constraint {text!r}: unknown unit {m['unit']!r} for {metric.name}; "
                        f"expected one of {', '.join(u for u in units if u) or 'none'}")
    bound = float(m["value"]) * units[unit]
    if not math.isfinite(bound):
        raise UserError(f"constraint {text!r}: the bound is not a finite number")
    constraint = Constraint(metric, m["op"], bound, re.sub(r"\s+", "", text))
    _check_possible(constraint)
    return constraint


def _check_possible(c: Constraint) -> None:
    """UserError for a constraint no model can meet whatever the search does: a cost or
    latency at most zero or less, an accuracy above 100 % or below 0 %."""
    if c.metric.name == "accuracy":
        if (c.op == ">=" and c.bound > 100) or (c.op == "<=" and c.bound < 0):
            raise UserError(f"constraint {c.text!r} cannot be met: accuracy is a percentage "
                            f"from 0 to 100")
    elif c.op == "<=" and c.bound <= 0:
        raise UserError(f"constraint {c.text!r} cannot be met: {c.metric.name} is always "
                        f"positive; expected a bound > 0")


def parse_constraints(specs: Iterable[str] | None) -> list[Constraint]:
    """Parsed constraints, written without spaces; UserError when one is given twice (in any
    spelling or unit) or two of one metric leave no value between them."""
    out = [parse_constraint(s) for s in (specs or [])]
    for i, a in enumerate(out):
        for b in out[:i]:
            if (a.metric, a.op, a.bound) == (b.metric, b.op, b.bound):
                raise UserError(f"constraint {a.text!r} is given twice (as {b.text!r})")
            if a.metric == b.metric and a.op != b.op:
                low, high = (a, b) if a.op == ">=" else (b, a)
                if low.bound > high.bound:
                    raise UserError(f"constraints {high.text!r} and {low.text!r} cannot both be "
                                    f"met: no {a.metric.key} is at most {high.bound:g} and at "
                                    f"least {low.bound:g}")
    return out


def devices_of(objectives: Iterable[Metric], constraints: Iterable[Constraint]) -> list[str]:
    """Devices named by objectives and constraints, in order of appearance."""
    seen: list[str] = []
    for m in [*objectives, *(c.metric for c in constraints)]:
        if m.device and m.device not in seen:
            seen.append(m.device)
    return seen
