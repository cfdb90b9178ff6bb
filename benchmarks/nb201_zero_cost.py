"""NASWOT scores of all 15,625 NAS-Bench-201 cells: the zero-cost accuracy prior of the search
benchmark (``search_nb201.py --accuracy-prior naswot``; ``hwnas.supernet.zero_cost``).

One seeded untrained NAS-Bench-201 supernet (HW-NAS-Bench's CIFAR-100 macro-architecture), one
batch of ``--batch`` CIFAR-10 training images (a seeded draw; the accuracy table is CIFAR-100's,
whose images this project does not have: NASWOT reads only the images' activation codes, and
CIFAR-10's are the same kind of 32x32 natural image). Writes ``arch,naswot`` as gzipped CSV and,
where the shared NAS-Bench-201 accuracy table is found, prints its Spearman with the accuracy.

    python benchmarks/nb201_zero_cost.py --device cuda --out benchmarks/results/nb201_zero_cost/naswot.csv.gz
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from hwnas.supernet.spaces.nb201 import NB201Space
from hwnas.supernet.zero_cost import naswot_scores


def batch_images(dataset: str, batch: int, seed: int) -> torch.Tensor:
    """``batch`` training images of ``dataset`` (``hwnas.supernet.load_dataset``), a seeded draw."""
    from hwnas.supernet import load_dataset

    train = load_dataset(dataset, seed=seed).train
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(len(train.images), size=batch, replace=False))
    return torch.as_tensor(train.images[idx], dtype=torch.float32)


def write_scores(path: Path, archs: list[str], scores: np.ndarray) -> None:
    """``arch,naswot`` rows, gzipped; written to a temporary name first, so nothing half-written
    is left under ``path``."""
    buf = io.StringIO()
    buf.write("arch,naswot\n")
    for a, s in zip(archs, scores):
        buf.write(f"{a},{s:.6f}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        fh.write(buf.getvalue())
    tmp.replace(path)


def read_scores(path: Path) -> dict[str, float]:
    """The ``arch -> naswot`` table written by :func:`write_scores`."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    if not lines or lines[0] != "arch,naswot":
        raise ValueError(f"{path}: expected a gzipped CSV with the header 'arch,naswot'")
    out = {}
    for line in lines[1:]:
        arch, _, value = line.rpartition(",")
        out[arch] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="cifar10", help="images: 'cifar10' (the shared npz) or a path")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="the supernet's and the batch's seed")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--limit", type=int, default=0, help="score only the first N cells (a check)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    space = NB201Space()
    archs = list(space.all_architectures())
    if args.limit:
        archs = archs[: args.limit]
    images = batch_images(args.dataset, args.batch, args.seed)
    t0 = time.perf_counter()
    bar = tqdm(total=len(archs), desc="NASWOT", unit="cell", file=sys.stderr)
    scores = naswot_scores(space, archs, images, seed=args.seed, device=args.device,
                           progress=lambda done, _: bar.update(1))
    bar.close()
    seconds = time.perf_counter() - t0
    names = [space.to_string(a) for a in archs]
    write_scores(args.out, names, scores)
    print(f"{len(archs)} cells in {seconds:.0f} s on {args.device}: {args.out}")
    try:
        from hwnas.supernet.data import shared_data_dir

        import pandas as pd
        from scipy.stats import spearmanr

        acc = pd.read_csv(shared_data_dir() / "nb201" / "nb201_cifar100_accuracy.csv")
        acc = acc.set_index("arch")["cifar100_test_acc"]
        keep = [n in acc.index for n in names]
        rho = spearmanr(scores[keep], acc.loc[[n for n, k in zip(names, keep) if k]])[0]
        print(f"Spearman with the NAS-Bench-201 CIFAR-100 accuracy: {rho:.3f} ({sum(keep)} cells)")
    except Exception as exc:  # the shared data is optional here
        print(f"(no accuracy check: {exc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
