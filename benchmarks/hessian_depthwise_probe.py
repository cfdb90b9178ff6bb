#!/usr/bin/env python3
"""grad + HVPs of the largest mbv3 subnet on 32 CIFAR-10 images: PyTorch's grouped double
backward against quant.sensitivity's depthwise Function; CPU seconds and differences."""
import sys, time
import torch
import torch.nn.functional as F
from hwnas.supernet.checkpoint_io import load_checkpoint
from hwnas.supernet.data import load_dataset
from hwnas.supernet.evaluate import recalibrated_subnet, calibration_loader
from hwnas.quant.sensitivity import hutchinson_trace, _twice_differentiable, _labelled, _Depthwise2
from hwnas.quant.fold import fold_bn
from hwnas.quant.policy import quantizable_layer_names
batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1
space, supernet, _ = load_checkpoint("supernet/checkpoints/mbv3_cifar10.pt")
data = load_dataset("cifar10", seed=0)
model = recalibrated_subnet(supernet, space.largest(), data, seed=0, calib_batches=1)
x, y = _labelled(calibration_loader(data, batch_size=128, seed=0), 32, "cpu")
out = {}
for variant in ("native", "function"):
    folded = _twice_differentiable(fold_bn(model).eval())
    if variant == "native":
        for m in folded.modules():
            if isinstance(m, _Depthwise2):
                m.__class__ = torch.nn.Conv2d
    mods = dict(folded.named_modules())
    params = {n: mods[n].weight for n in quantizable_layer_names(folded)}
    for p in folded.parameters():
        p.requires_grad_(False)
    for p in params.values():
        p.requires_grad_(True)
    with torch.no_grad():
        logits = folded(x)
    t = time.process_time()
    tr = hutchinson_trace(lambda: F.cross_entropy(folded(x), y), params, n_samples=2, batch=batch)
    print(f"{variant}: grad + 2 HVPs (batch {batch}) on 32 images: {time.process_time() - t:.2f} CPU s")
    out[variant] = (logits, tr)
print("logits equal:", torch.equal(out["native"][0], out["function"][0]))
a, b = out["native"][1], out["function"][1]
rel = max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-30) for k in a)
print(f"traces: {len(a)} layers, max rel diff {rel:.2e}, equal {a == b}")
