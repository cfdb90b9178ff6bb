#!/usr/bin/env python3
"""The sensitivity seeds' Hessian-vector products on one device: PyTorch's own double backward
of a depthwise convolution (one convolution per channel) against ``quant.sensitivity``'s
``_Depthwise2`` (first-order convolutions; the default off the CPU), on the largest subnet of
the shipped CIFAR-10 mbv3 supernet; then ``sensitivity_seeds`` as ``hwnas run`` calls it. Seconds (wall, synchronized)
and the traces' largest relative difference; JSON to ``--out``.

    python benchmarks/hessian_depthwise_probe.py --device cuda --out /tmp/res/hessian_probe.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from hwnas.quant.fold import fold_bn
from hwnas.quant.policy import quantizable_layer_names
from hwnas.quant.sensitivity import _labelled, _twice_differentiable, hutchinson_trace
from hwnas.supernet.checkpoint_io import load_checkpoint
from hwnas.supernet.data import load_dataset
from hwnas.supernet.evaluate import calibration_loader, recalibrated_subnet


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def traces(model, x, y, variant: str, batch: int, device: torch.device) -> tuple[float, dict]:
    folded = _twice_differentiable(fold_bn(model).eval(), depthwise=variant == "function")
    mods = dict(folded.named_modules())
    params = {n: mods[n].weight for n in quantizable_layer_names(folded)}
    for p in folded.parameters():
        p.requires_grad_(False)
    for p in params.values():
        p.requires_grad_(True)
    _sync(device)
    t = time.perf_counter()
    chunks = [lambda i=i: F.cross_entropy(folded(x[i:i + 32]), y[i:i + 32], reduction="sum")
              / x.shape[0] for i in range(0, x.shape[0], 32)]
    tr = hutchinson_trace(chunks, params, n_samples=4, batch=batch)
    _sync(device)
    return time.perf_counter() - t, tr


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    device = torch.device(a.device)
    space, supernet, _ = load_checkpoint("supernet/checkpoints/mbv3_cifar10.pt")
    supernet.to(device)
    data = load_dataset("cifar10", seed=0)
    model = recalibrated_subnet(supernet, space.largest(), data, seed=0, calib_batches=1)
    x, y = _labelled(calibration_loader(data, batch_size=128, seed=0), a.images, device)
    batch = 1 if device.type == "cpu" else 8
    res: dict = {"device": str(device), "images": int(x.shape[0]), "vectors": 4, "rounds": {}}
    if device.type == "cuda":
        res["device_name"] = torch.cuda.get_device_name(device)
    got = {}
    for rnd in range(2):  # the first round includes kernel loading and allocator warm-up
        for variant in ("native", "function"):
            s, got[variant] = traces(model, x, y, variant, batch, device)
            res["rounds"].setdefault(variant, []).append(round(s, 3))
            print(f"round {rnd} {variant}: {s:.2f} s", flush=True)
    a_, b_ = got["native"], got["function"]
    res["max_rel_trace_diff"] = max(abs(a_[k] - b_[k]) / max(abs(a_[k]), 1e-30) for k in a_)
    from hwnas.search.bits import DEFAULT_BIT_CHOICES, sensitivity_seeds
    _sync(device)
    t = time.perf_counter()
    seeds = sensitivity_seeds(space, supernet, data, DEFAULT_BIT_CHOICES, seed=0)
    _sync(device)
    res["sensitivity_seeds_s"] = round(time.perf_counter() - t, 2)
    res["seeds"] = len(seeds)
    print(json.dumps(res), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
