"""Where returned standalone networks stand on CIFAR-10 (issue 44, session 35): clean accuracy
and cross-entropy on random training, validation and test images, per-class test accuracy and
the confusions that cost most; one JSON line per network.

Session 34's "Where the returned networks stand" table, as a committed script: the network in
eval mode, no augmentation, the training split's mean/std (``eval_loader``). The splits are
stored sorted by class, so subsets are drawn at random (seeded), never the first N.

    OMP_NUM_THREADS=1 python benchmarks/results/supernet_cifar10/session35_fit.py \
        /work/dev35/cct2drop.model.pt /work/dev35/cct2dropwd.model.pt --train 5000 --test 0
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from hwnas.supernet.data import ImageSplit, load_dataset
from hwnas.supernet.evaluate import eval_loader
from hwnas.supernet.train import load_network


def random_subset(split: ImageSplit, count: int, seed: int) -> ImageSplit:
    """``count`` images of ``split`` drawn at random (0 or more than it holds: all of them)."""
    if count <= 0 or count >= len(split):
        return split
    idx = torch.from_numpy(np.sort(np.random.default_rng(seed).permutation(len(split))[:count]))
    return ImageSplit(split.images[idx].contiguous(), split.labels[idx].contiguous())


@torch.no_grad()
def predictions(model: torch.nn.Module, data, split: ImageSplit) -> tuple[torch.Tensor, ...]:
    """Logits (float32) and labels of every image of ``split``, in order."""
    model.eval()
    logits, labels = [], []
    for x, y in eval_loader(data, split, batch_size=250):
        logits.append(model(x).float())
        labels.append(y)
    return torch.cat(logits), torch.cat(labels)


def scores(logits: torch.Tensor, labels: torch.Tensor, classes: list[str]) -> dict:
    """Top-1 (%), mean cross-entropy, per-class accuracy and the confusion matrix."""
    pred = logits.argmax(1)
    k = len(classes)
    confusion = torch.bincount(labels * k + pred, minlength=k * k).view(k, k)
    per_class = (confusion.diag().double() / confusion.sum(1).clamp_min(1) * 100).tolist()
    return {"images": int(labels.numel()),
            "top1": round(100.0 * float((pred == labels).double().mean()), 2),
            "cross_entropy": round(float(F.cross_entropy(logits, labels)), 4),
            "per_class": {c: round(v, 2) for c, v in zip(classes, per_class)},
            "confusion": confusion.tolist()}


def worst_pairs(confusion: list[list[int]], classes: list[str], top: int) -> list[dict]:
    """The ``top`` unordered class pairs with the most images confused either way."""
    k = len(classes)
    pairs = [(confusion[a][b] + confusion[b][a], a, b) for a in range(k) for b in range(a + 1, k)]
    pairs.sort(reverse=True)
    return [{"pair": f"{classes[a]}/{classes[b]}", "errors": n,
             f"{classes[a]}->{classes[b]}": confusion[a][b],
             f"{classes[b]}->{classes[a]}": confusion[b][a]} for n, a, b in pairs[:top]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", nargs="+", help="standalone .model.pt files")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--train", type=int, default=5000, help="random training images (0: all)")
    ap.add_argument("--val", type=int, default=0, help="random validation images (0: all)")
    ap.add_argument("--test", type=int, default=0, help="random test images (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the random subsets")
    ap.add_argument("--pairs", type=int, default=5, help="confusion pairs to list")
    args = ap.parse_args(argv)
    data = load_dataset(args.dataset, seed=0)
    splits = {"train": random_subset(data.train, args.train, args.seed),
              "val": random_subset(data.val, args.val, args.seed + 1),
              "test": random_subset(data.test, args.test, args.seed + 2)}
    for path in args.checkpoints:
        _, arch, model, _ = load_network(path)
        row: dict = {"checkpoint": path, "arch": str(arch)}
        start = time.process_time()
        for name, split in splits.items():
            s = scores(*predictions(model, data, split), data.classes)
            if name == "test":
                s["worst_pairs"] = worst_pairs(s["confusion"], data.classes, args.pairs)
            else:
                del s["per_class"], s["confusion"]
            row[name] = s
        row["cpu_seconds"] = round(time.process_time() - start, 1)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
