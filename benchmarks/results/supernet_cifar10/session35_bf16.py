"""bf16 autocast against fp32 in a CCT network's forward and backward (issue 44, session 35):
logits, loss, and per-parameter-tensor gradient cosine on augmented training batches; one JSON.

The GPU runs train under ``torch.autocast(dtype=bfloat16)``; this measures on the CPU what the
same autocast does to one training step of a returned network (and of a freshly initialised
one, the start of training): the label-smoothed loss of the recipe on batches of 128 drawn as
training draws them (the run's augmentation). Eval mode is deterministic (no dropout, no drop
path); train mode reseeds before each pass, and reports whether a dropout mask drawn under one
seed is the same for bf16 and fp32 tensors. Scales to read the cosines against: fp32 against
fp64 (fp32's own rounding) and fp32 of one batch against fp32 of another (batch noise).
CPU autocast's op lists differ from CUDA's, so this is the CPU's bf16, not the H100's.

    OMP_NUM_THREADS=1 python benchmarks/results/supernet_cifar10/session35_bf16.py \
        /work/dev35/cct2drop.model.pt --batches 4
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time

import torch
import torch.nn.functional as F
from hwnas.supernet.data import BatchLoader, load_dataset
from hwnas.supernet.train import load_network, reinitialize


def grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, bf16: bool, train: bool,
          seed: int, smoothing: float) -> tuple[torch.Tensor, float, dict[str, torch.Tensor]]:
    """Logits (float32), loss and gradients of one pass, reseeded so dropout draws alike."""
    model.train(train)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with amp:
        logits = model(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=smoothing)
    loss.backward()
    g = {n: p.grad.detach().double().flatten() for n, p in model.named_parameters()
         if p.grad is not None}
    return logits.detach().double(), float(loss.detach()), g


def cosines(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    return {n: float(F.cosine_similarity(a[n], b[n], dim=0, eps=1e-30)) for n in a}


def rel_err(a: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    return {n: float((a[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)) for n in a}


def summary(values: dict[str, float], low: bool = True, show: int = 3) -> dict:
    t = torch.tensor(list(values.values()), dtype=torch.float64)
    order = sorted(values, key=values.get, reverse=not low)[:show]
    return {"min": round(float(t.min()), 6), "median": round(float(t.median()), 6),
            "max": round(float(t.max()), 6),
            "worst": {n: round(values[n], 6) for n in order}}


def dropout_masks_agree(rate: float = 0.1, n: int = 100_000) -> bool:
    """Whether F.dropout under one seed zeroes the same elements of fp32 and bf16 tensors."""
    masks = []
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        masks.append(F.dropout(torch.ones(n, dtype=dtype), rate) == 0)
    return bool(torch.equal(*masks))


def compare(model: torch.nn.Module, batches: list, *, train: bool, smoothing: float) -> dict:
    """bf16 vs fp32 (and fp32 vs fp64) over ``batches``; per batch and per tensor."""
    rows = []
    model64 = copy.deepcopy(model).double()
    for i, (x, y) in enumerate(batches):
        l32, loss32, g32 = grads(model, x, y, bf16=False, train=train, seed=i,
                                 smoothing=smoothing)
        l16, loss16, g16 = grads(model, x, y, bf16=True, train=train, seed=i,
                                 smoothing=smoothing)
        _, _, g64 = grads(model64, x.double(), y, bf16=False, train=train, seed=i,
                          smoothing=smoothing)
        rows.append({
            "loss_fp32": round(loss32, 6), "loss_bf16": round(loss16, 6),
            "logits_max_abs_diff": round(float((l16 - l32).abs().max()), 5),
            "logits_rel_err": round(float((l16 - l32).norm() / l32.norm()), 6),
            "argmax_agree_pct": round(100 * float((l16.argmax(1) == l32.argmax(1)).double()
                                                  .mean()), 2),
            "grad_cos_bf16_fp32": cosines(g16, g32), "grad_rel_err_bf16_fp32": rel_err(g16, g32),
            "grad_cos_fp32_fp64": cosines(g32, g64), "grad_norm_fp32": float(
                torch.cat(list(g32.values())).norm()), "_g32": g32, "_g64": g64})
    # batch noise: fp32 gradient of batch i against batch i+1 (same weights, same mode)
    for a, b in zip(rows, rows[1:] + rows[:1]):
        a["grad_cos_fp32_next_batch"] = cosines(a["_g32"], b["_g32"])
    # tensors whose exact gradient is zero (sequence pooling's score bias: a softmax does not
    # see a shift common to all tokens) hold rounding noise only; left out of the summaries
    top = max(float(g.norm()) for r in rows for g in r["_g64"].values())
    zero = sorted(n for n in rows[0]["_g64"]
                  if max(float(r["_g64"][n].norm()) for r in rows) <= 1e-9 * top)
    for r in rows:
        del r["_g32"], r["_g64"]
        for k in [k for k in r if k.startswith("grad_") and isinstance(r[k], dict)]:
            r[k] = {n: v for n, v in r[k].items() if n not in zero}
    keys = ("grad_cos_bf16_fp32", "grad_cos_fp32_fp64", "grad_cos_fp32_next_batch")
    mean = {k: {n: sum(r[k][n] for r in rows) / len(rows) for n in rows[0][k]} for k in keys}
    whole = {k: round(sum(r[k] for r in rows) / len(rows), 6)
             for k in ("loss_fp32", "loss_bf16", "logits_rel_err", "argmax_agree_pct")}
    return {"mode": "train" if train else "eval", **whole, "zero_gradient_tensors": zero,
            "logits_max_abs_diff": max(r["logits_max_abs_diff"] for r in rows),
            "summary_over_tensors": {k: summary(mean[k]) for k in keys},
            "grad_rel_err_bf16_fp32": summary(
                {n: sum(r["grad_rel_err_bf16_fp32"][n] for r in rows) / len(rows)
                 for n in rows[0]["grad_rel_err_bf16_fp32"]}, low=False),
            "per_batch": [{k: v for k, v in r.items() if not k.startswith("grad_")}
                          for r in rows]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="a standalone .model.pt of the cct space")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)
    start = time.process_time()
    _, arch, model, payload = load_network(args.checkpoint)
    config = payload.get("train_config") or {}
    smoothing = float(config.get("label_smoothing", 0.1))
    data = load_dataset(args.dataset, seed=0)
    loader = BatchLoader(data.train, batch_size=args.batch_size, mean=data.mean, std=data.std,
                         shuffle=True, augment=config.get("augment") or data.augment, seed=1)
    batches = [b for _, b in zip(range(args.batches), loader)]
    fresh = copy.deepcopy(model)
    with torch.no_grad():
        reinitialize(fresh, seed=0)
    result = {"checkpoint": args.checkpoint, "arch": str(arch), "batches": args.batches,
              "batch_size": args.batch_size, "label_smoothing": smoothing,
              "augment": config.get("augment"), "torch": torch.__version__,
              "dropout_masks_agree_bf16_fp32": dropout_masks_agree(), "results": {}}
    for name, net in (("returned", model), ("fresh_init", fresh)):
        for train in (False, True):
            result["results"][f"{name}_{'train' if train else 'eval'}"] = compare(
                net, batches, train=train, smoothing=smoothing)
    result["cpu_seconds"] = round(time.process_time() - start, 1)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
