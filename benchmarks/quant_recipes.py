"""The quantization benchmark table (FP32, int8 PTQ per observer, W4A8 PTQ and QAT, mixed
precision) for the largest, a middle and the smallest subnet of a trained supernet.

Shared by ``benchmarks/quant_digits.py`` (CPU, digits) and ``benchmarks/quant_cifar10.py`` (GPU,
CIFAR-10), and by the test that runs the table on a tiny budget. Each row reports top-1 on the
test split, the policy's average weight bits and its packed model size
(:func:`hwnas.quant.cost.model_size_bytes`). Recipes (also written into each row's ``recipe``):

* ``fp32``: the subnet, BatchNorm (where it has any; a vit subnet has none) recalibrated on
  augmented training images;
* ``ptq_int8_{minmax,percentile,mse}``: every layer W8A8, per-channel min-max weights, the
  named activation observer, bias correction;
* ``ptq_w4a8``: W4A8 with the first and last layer at W8A8, per-channel MSE weights, MSE
  activations, bias correction;
* ``qat_w4a8``: that PTQ model fine-tuned with LSQ and distillation from the FP32 subnet, the
  state kept (an epoch or the PTQ start) being the best on the validation split;
* ``mixed``: per-layer weight bits in {2,3,4,6,8} (activations 8, first/last layer 8/8)
  chosen by integer programming to minimise the HAWQ-V2 Hessian sensitivity at the size of
  ``mixed_avg_bits`` average weight bits, then the same PTQ + QAT as ``qat_w4a8``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from hwnas.quant.allocate import allocate
from hwnas.quant.cost import model_size_bytes, weight_bits_budget_bytes
from hwnas.quant.policy import (
    QuantPolicy,
    apply_to_layers,
    average_weight_bits,
    first_last_8bit,
    uniform,
)
from hwnas.quant.ptq import PTQConfig, ptq
from hwnas.quant.qat import QATConfig, qat
from hwnas.quant.sensitivity import hessian_sensitivity
from hwnas.supernet.data import BatchLoader, DatasetSplits
from hwnas.supernet.evaluate import (
    accuracy,
    bn_calibration_loader,
    calibration_loader,
    eval_loader,
    recalibrate_bn,
)

from hwnas.core.errors import UserError

__all__ = [
    "METHODS",
    "ROLES",
    "QuantBenchConfig",
    "format_table",
    "machine_description",
    "merge_rows",
    "now_iso",
    "run_quant_benchmark",
    "subnet_archs",
    "write_json",
]

METHODS = ("fp32", "ptq_int8_minmax", "ptq_int8_percentile", "ptq_int8_mse", "ptq_w4a8",
           "qat_w4a8", "mixed")
ROLES = ("largest", "middle", "smallest")


@dataclass
class QuantBenchConfig:
    """What the table runs. ``qat_epochs``/``qat_max_steps`` bound each QAT fine-tune."""

    subnets: tuple[str, ...] = ROLES
    methods: tuple[str, ...] = METHODS
    calib_images: int = 512
    qat_epochs: int = 3
    qat_max_steps: int | None = None
    qat_lr: float = 3e-3
    qat_scale_lr: float = 3e-3
    qat_batch_size: int = 64
    qat_amp: bool = False
    mixed_avg_bits: float = 5.0
    mixed_weight_bits: tuple[int, ...] = (2, 3, 4, 6, 8)
    hessian_samples: int = 16
    hessian_images: int = 512
    bn_calib_batches: int = 20
    eval_batch_size: int = 256
    seed: int = 0
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        for role in self.subnets:
            if role not in ROLES:
                raise UserError(f"unknown subnet role {role!r}; expected one of {', '.join(ROLES)}")
        for method in self.methods:
            if method not in METHODS:
                raise UserError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
        if not self.subnets or not self.methods:
            raise UserError("the benchmark needs at least one subnet and one method")
        if self.qat_epochs < 1:
            raise UserError(f"qat_epochs must be positive, got {self.qat_epochs}")
        if not 2 <= self.mixed_avg_bits <= 8:
            raise UserError(f"mixed_avg_bits must be in [2, 8], got {self.mixed_avg_bits}")


def subnet_archs(space) -> dict[str, Any]:
    """largest, middle and smallest architectures of ``space``. For an MBV3-style space the
    middle one takes the middle choice of depth, kernel and expand everywhere; for another space,
    the median-FLOPs member of 101 seeded samples."""
    from hwnas.supernet.spaces.mbv3 import MBV3Arch, MBV3Space

    if isinstance(space, MBV3Space):
        c = space.cfg
        mid = lambda values: values[len(values) // 2]  # noqa: E731
        block = (mid(c.kernel_choices), mid(c.expand_choices))
        middle = MBV3Arch(tuple((block,) * mid(c.depth_choices) for _ in range(c.num_stages)))
    else:
        import numpy as np

        rng = np.random.default_rng(0)
        samples = sorted((space.sample(rng) for _ in range(101)), key=space.flops)
        middle = samples[len(samples) // 2]
    return {"largest": space.largest(), "middle": middle, "smallest": space.smallest()}


def machine_description(device: str | torch.device = "cpu") -> str:
    from hwnas.latency.machine import cpu_model

    cpu = cpu_model()
    text = f"{cpu}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        text += f", GPU {torch.cuda.get_device_name(torch.device(device))}"
    return text


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def _row(role: str, arch_str: str, method: str, policy: QuantPolicy | None, layers, top1: float,
         seconds: float, recipe: str, **extra: Any) -> dict[str, Any]:
    if policy is None:
        bits, size = 32.0, model_size_bytes(layers)
    else:
        bits = average_weight_bits(policy, layers)
        size = model_size_bytes(apply_to_layers(policy, layers))
    return {"subnet": role, "arch": arch_str, "method": method, "avg_weight_bits": round(bits, 3),
            "top1": round(top1, 3), "size_bytes": int(size), "seconds": round(seconds, 2),
            "recipe": recipe, **extra}


def _qat_fields(result: Any, validated: bool) -> tuple[str, dict[str, Any]]:
    """A QAT row's note for its recipe (which state was kept, by validation accuracy) and its
    extra JSON fields (the kept epoch, the validation accuracy of every state)."""
    note = ""
    if validated:
        note = (", PTQ start kept (no epoch validated better)" if result.kept_epoch == 0
                else f", epoch {result.kept_epoch} kept (best on the validation split)")
    return note, {"qat_kept_epoch": result.kept_epoch,
                  "qat_val_history": [round(h["val"], 3) for h in result.history if "val" in h]}


def run_quant_benchmark(supernet: torch.nn.Module, space, data: DatasetSplits,
                        config: QuantBenchConfig | None = None, *, log=print) -> list[dict[str, Any]]:
    """Run the table; returns one row per (subnet, method). The supernet is not modified."""
    config = config or QuantBenchConfig()
    config.validate()
    device = next(supernet.parameters()).device
    archs = subnet_archs(space)
    calib = calibration_loader(data, batch_size=128, seed=config.seed + 1, device=device)
    train = BatchLoader(data.train, batch_size=config.qat_batch_size, mean=data.mean, std=data.std,
                        shuffle=True, augment=data.augment, seed=config.seed, device=device,
                        drop_last=len(data.train) > config.qat_batch_size)
    test = eval_loader(data, data.test, batch_size=config.eval_batch_size, device=device)
    # QAT keeps its best epoch (or its PTQ start) by accuracy on the validation split, never test
    val = (eval_loader(data, data.val, batch_size=config.eval_batch_size, device=device)
           if len(data.val) else None)
    ptq_int8 = {m: PTQConfig(act_observer=m.rsplit("_", 1)[1], weight_observer="minmax",
                             max_images=config.calib_images, seed=config.seed)
                for m in ("ptq_int8_minmax", "ptq_int8_percentile", "ptq_int8_mse")}
    ptq_low = PTQConfig(act_observer="mse", weight_observer="mse", max_images=config.calib_images,
                        seed=config.seed)
    qat_cfg = QATConfig(epochs=config.qat_epochs, max_steps=config.qat_max_steps, lr=config.qat_lr,
                        scale_lr=config.qat_scale_lr, amp=config.qat_amp, seed=config.seed)
    rows: list[dict[str, Any]] = []
    for role in config.subnets:
        arch = archs[role]
        arch_str = space.to_string(arch)
        layers = space.layers(arch)
        model = supernet.extract(arch)
        recalibrate_bn(model, bn_calibration_loader(data, seed=config.seed, device=device),
                       config.bn_calib_batches)
        uniform(model, 8, 8).validate(layers)  # the model's layer names join with the layer list
        done: dict[str, Any] = {}

        def emit(row: dict[str, Any]) -> None:
            rows.append(row)
            log(f"  {row['subnet']:8s} {row['method']:20s} bits {row['avg_weight_bits']:6.2f}  "
                f"top1 {row['top1']:6.2f}  size {row['size_bytes']:>9d} B  ({row['seconds']:.1f} s)")

        start = time.perf_counter()
        fp32 = accuracy(model, test)
        if "fp32" in config.methods:
            has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
            emit(_row(role, arch_str, "fp32", None, layers, fp32, time.perf_counter() - start,
                      "float subnet, BN recalibrated" if has_bn else "float subnet (no BatchNorm)"))
        int8 = uniform(model, 8, 8)
        for method, cfg in ptq_int8.items():
            if method in config.methods:
                start = time.perf_counter()
                top1 = accuracy(ptq(model, int8, calib, cfg), test)
                emit(_row(role, arch_str, method, int8, layers, top1, time.perf_counter() - start,
                          f"W8A8 per-channel minmax weights, {cfg.act_observer} activations, "
                          f"bias correction, {config.calib_images} calibration images",
                          delta_vs_fp32=round(top1 - fp32, 3)))
        w4a8 = first_last_8bit(uniform(model, 4, 8))
        if {"ptq_w4a8", "qat_w4a8"} & set(config.methods):
            start = time.perf_counter()
            done["ptq_w4a8"] = ptq(model, w4a8, calib, ptq_low)
            top1_ptq = accuracy(done["ptq_w4a8"], test)
            if "ptq_w4a8" in config.methods:
                emit(_row(role, arch_str, "ptq_w4a8", w4a8, layers, top1_ptq, time.perf_counter() - start,
                          "W4A8 (first/last W8A8), per-channel MSE weights, MSE activations, "
                          "bias correction", delta_vs_fp32=round(top1_ptq - fp32, 3)))
            if "qat_w4a8" in config.methods:
                start = time.perf_counter()
                result = qat(model, w4a8, train, calib, qat_cfg, init=done["ptq_w4a8"],
                             progress=config.progress, val_batches=val)
                top1 = accuracy(result.model, test)
                note, extra = _qat_fields(result, val is not None)
                emit(_row(role, arch_str, "qat_w4a8", w4a8, layers, top1, time.perf_counter() - start,
                          f"ptq_w4a8 + LSQ/KD fine-tune, {result.steps} steps{note}",
                          delta_vs_fp32=round(top1 - fp32, 3), top1_ptq_init=round(top1_ptq, 3),
                          **extra))
        if "mixed" in config.methods:
            start = time.perf_counter()
            names = int8.layer_names
            fixed = {names[0]: (8, 8), names[-1]: (8, 8)}
            table = hessian_sensitivity(model, calib, [(w, 8) for w in config.mixed_weight_bits],
                                        max_images=config.hessian_images,
                                        n_samples=config.hessian_samples, seed=config.seed)
            table.values = {n: v for n, v in table.values.items() if n not in fixed}
            budget = weight_bits_budget_bytes(layers, config.mixed_avg_bits)
            alloc = allocate(table, layers, budget, "size", fixed=fixed)
            qmodel = ptq(model, alloc.policy, calib, ptq_low)
            top1_ptq = accuracy(qmodel, test)
            result = qat(model, alloc.policy, train, calib, qat_cfg, init=qmodel,
                         progress=config.progress, val_batches=val)
            top1 = accuracy(result.model, test)
            note, extra = _qat_fields(result, val is not None)
            bits_hist: dict[int, int] = {}
            for w, _ in alloc.policy.bits.values():
                bits_hist[w] = bits_hist.get(w, 0) + 1
            emit(_row(role, arch_str, "mixed", alloc.policy, layers, top1, time.perf_counter() - start,
                      f"HAWQ-V2 Hessian sensitivity ({config.hessian_samples} Hutchinson samples), "
                      f"ILP for {config.mixed_avg_bits} avg weight bits, PTQ (MSE) + LSQ/KD "
                      f"fine-tune, {result.steps} steps{note}",
                      delta_vs_fp32=round(top1 - fp32, 3), top1_ptq_init=round(top1_ptq, 3),
                      **extra,
                      layers_per_weight_bits={str(k): v for k, v in sorted(bits_hist.items())},
                      policy_bits=alloc.policy.to_dict()["layers"]))
    return rows


def merge_rows(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``new`` rows plus the ``old`` rows of other (subnet, method) pairs, in table order, so a
    long benchmark can run one subnet per command and build up one JSON file."""
    keys = {(r["subnet"], r["method"]) for r in new}
    rows = [r for r in old if (r.get("subnet"), r.get("method")) not in keys] + list(new)
    rank = lambda r: (ROLES.index(r["subnet"]) if r["subnet"] in ROLES else 99,  # noqa: E731
                      METHODS.index(r["method"]) if r["method"] in METHODS else 99)
    return sorted(rows, key=rank)


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of the rows (with top-1 change vs the subnet's FP32)."""
    fp32 = {r["subnet"]: r["top1"] for r in rows if r["method"] == "fp32"}
    lines = [f"{'subnet':9s} {'method':20s} {'avg w bits':>10s} {'top1 %':>8s} {'vs fp32':>8s} "
             f"{'size bytes':>11s}"]
    lines.append("-" * len(lines[0]))
    for r in rows:
        delta = f"{r['top1'] - fp32[r['subnet']]:+8.2f}" if r["subnet"] in fp32 else f"{'':8s}"
        lines.append(f"{r['subnet']:9s} {r['method']:20s} {r['avg_weight_bits']:10.2f} "
                     f"{r['top1']:8.2f} {delta} {r['size_bytes']:11d}")
    return "\n".join(lines)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command_line(argv: list[str] | None) -> str:
    """The command that ran a benchmark (``argv``: its arguments, default the process's), as
    its JSON records it."""
    return "python " + shlex.join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])


def run_script(main, prog: str) -> None:  # noqa: ANN001 - main(argv=None) -> int
    """Run a benchmark's ``main`` as a script: bad input is one ``<prog>: error:`` line, exit 2."""
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)
