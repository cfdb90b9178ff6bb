"""Picture of what ``--augment trivial_crop_flip_cutout`` feeds the network: 12 CIFAR-10
training images spread over the split (top row) and four augmented draws of each (rows below), as the
training loader makes them (TrivialAugment, then crop, flip and cutout with the mean pixel).

    python benchmarks/results/supernet_cifar10/trivial_augment_preview.py [--data cifar10]
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from hwnas.supernet.data import augment_batch, load_dataset  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="cifar10")
    p.add_argument("--out", default=str(HERE / "trivial_augment_preview.png"))
    args = p.parse_args()
    data = load_dataset(args.data, seed=0)
    n = len(data.train.labels)
    images = data.train.images[torch.linspace(0, n - 1, 12).long()]
    fill = [int(round(255.0 * m)) for m in data.mean]
    rows = [images] + [augment_batch(images, "trivial_crop_flip_cutout",
                                     torch.Generator().manual_seed(s), fill=fill)
                       for s in range(4)]
    fig, axes = plt.subplots(len(rows), len(images), figsize=(len(images) * 0.9, len(rows) * 0.95))
    for r, batch in enumerate(rows):
        for c in range(len(images)):
            ax = axes[r, c]
            ax.imshow(batch[c].permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r, 0].set_ylabel("original" if r == 0 else f"draw {r}", fontsize=7)
    fig.suptitle("trivial_crop_flip_cutout on CIFAR-10 training images", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
