"""NASWOT scores of all 15,625 NAS-Bench-201 cells: a zero-cost accuracy prior (Mellor et al.,
"Neural Architecture Search without Training", ICML 2021), for development only.

Session 55 tried it as a guess of accuracy for the screening sampler (``search_nb201.md``,
"Issue 47, session 55"): three variants, none passed its rule, so the package has no such
option (their code: commits ``73c6cbd``, ``e2e52ae``, ``0979601``). The table stays for later
levers, ``results/nb201_zero_cost/naswot.csv.gz``: 179 s on an H100, about 50 min on a CPU.

NASWOT: one batch through the *untrained* network; each unit of an activation module gives
every image a binary code (active where > 0), and the score is ``log|K|`` of the
Hamming-agreement kernel ``K = C C^T + (1-C)(1-C)^T``: high when the untrained network already
separates the images. All cells share one seeded supernet (HW-NAS-Bench's CIFAR-100
macro-architecture; ``set_active`` picks the cell): the paper initialises each network afresh,
and a shared draw keeps one source of noise out of the ranking. The batch is ``--batch``
CIFAR-10 training images (a seeded draw): the accuracy table is CIFAR-100's, whose images this
project lacks, and NASWOT reads only the activation codes of 32x32 natural images. Writes
``arch,naswot`` as gzipped CSV and, where the shared accuracy table is found, prints the
Spearman with it.

    python benchmarks/nb201_zero_cost.py --device cuda --out benchmarks/results/nb201_zero_cost/naswot.csv.gz
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hwnas.supernet.spaces.nb201 import NB201Space
from torch import nn
from tqdm import tqdm

from hwnas.core.errors import UserError

_ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.GELU, nn.SiLU)


def _standardised(images: torch.Tensor | np.ndarray) -> torch.Tensor:
    x = torch.as_tensor(images, dtype=torch.float32)
    if x.ndim != 4 or x.shape[0] < 2:
        raise UserError(f"zero-cost scores need a batch of images N x C x H x W with N >= 2, "
                        f"got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise UserError("zero-cost scores: the images hold NaN or infinite values")
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    std = x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return (x - mean) / std  # per-channel standardised, as a trained pipeline would feed them


def naswot_scores(space: Any, archs: Sequence[Any], images: torch.Tensor | np.ndarray, *,
                  seed: int = 0, device: str = "cpu",
                  progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """NASWOT score of each of ``archs`` (higher: more accurate once trained, expected).

    ``space`` builds the supernet (``space.build_supernet()``, seeded by ``seed``), whose
    ``set_active`` selects each candidate; ``images`` is one batch (N x C x H x W, standardised
    per channel here). Candidates whose kernel is singular (e.g. a cell whose output does not
    depend on its input, so every image gets the same codes) get the lowest finite score of
    the call less 1, or 0 when none is finite. ``progress(done, total)`` is called after each.
    """
    if not archs:
        return np.zeros(0)
    build = getattr(space, "build_supernet", None)
    if not callable(build):
        raise UserError(f"space {getattr(space, 'name', space)!r} builds no supernet; "
                        "zero-cost scores need one (space.build_supernet())")
    x = _standardised(images).to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        net = build()
    net = net.to(device).train()  # batch statistics, as the untrained network has no others
    n = x.shape[0]
    kernel = torch.zeros(n, n, dtype=torch.float64, device=device)

    def hook(_m: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        c = (out.detach().flatten(1) > 0).to(torch.float64)
        kernel.add_(c @ c.T).add_((1 - c) @ (1 - c).T)

    handles = [m.register_forward_hook(hook) for m in net.modules()
               if isinstance(m, _ACTIVATIONS)]
    out = np.empty(len(archs))
    try:
        with torch.no_grad():
            for i, arch in enumerate(archs):
                kernel.zero_()
                net.set_active(arch)
                net(x)
                sign, logdet = torch.linalg.slogdet(kernel)
                out[i] = float(logdet) if float(sign) > 0 else -np.inf
                if progress is not None:
                    progress(i + 1, len(archs))
    finally:
        for h in handles:
            h.remove()
    finite = np.isfinite(out)
    floor = float(out[finite].min()) - 1.0 if finite.any() else 0.0
    out[~finite] = floor
    return out


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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        fh.write("arch,naswot\n")
        fh.writelines(f"{a},{v:.6f}\n" for a, v in zip(archs, scores))
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
    from hwnas.supernet.data import shared_data_dir

    root = shared_data_dir()
    table = None if root is None else root / "nb201" / "nb201_cifar100_accuracy.csv"
    if table is None or not table.is_file():
        print("(no accuracy check: the shared NAS-Bench-201 accuracy table is absent)")
        return 0
    import pandas as pd
    from scipy.stats import spearmanr

    acc = pd.read_csv(table).set_index("arch")["cifar100_test_acc"]
    keep = [n in acc.index for n in names]
    rho = spearmanr(scores[keep], acc.loc[[n for n, k in zip(names, keep) if k]])[0]
    print(f"Spearman with the NAS-Bench-201 CIFAR-100 accuracy: {rho:.3f} ({sum(keep)} cells)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
