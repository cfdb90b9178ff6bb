"""Per-part ablation of the `cct` space (issue 44): which CCT part carries the 6.5 points that
`cct`'s network gains over `vit`'s at equal recipe (benchmarks/supernet_cifar10.md).

Registers one space per part, ``cct-no-<part>``: `cct` (its recipe included) with that part
switched back to `vit`'s, then runs the `hwnas` command line with the arguments given, so the
ablations train, resume and evaluate exactly as `hwnas train` does:

    python benchmarks/cct_ablation.py train --space cct-no-seq_pool --standalone largest \
        --epochs 50 --dataset data/c10/cifar10-jpeg.npz --out DIR --device cuda --compile --eval
    python benchmarks/cct_ablation.py train --out DIR --resume --device cuda --compile --eval
"""

from __future__ import annotations

import sys
from dataclasses import replace

from hwnas.cli import main
from hwnas.supernet import register_space
from hwnas.supernet.spaces.vit import CCT_CONFIG, CCTSpace, ViTConfig

#: part -> the ViTConfig fields that switch it back to `vit`'s
PARTS: dict[str, dict] = {
    "seq_pool": {"seq_pool": False},
    "pos_embed": {"pos_embed": False},
    "cct_norm": {"cct_norm": False},
    "regularisers": {"drop_path": 0.0, "attn_drop": 0.0, "dropout": 0.0},
    "dropout": {"dropout": 0.0},  # `cct` before session 34 (CCT's dropout_rate 0.1 missing)
}


def _factory(name: str, off: dict):
    def make(*, in_channels=None, image_size=None, num_classes=None, config=None) -> CCTSpace:
        cfg = ViTConfig.from_dict(config) if config else replace(CCT_CONFIG, **off)
        given = dict(in_channels=in_channels, image_size=image_size, num_classes=num_classes)
        return CCTSpace(replace(cfg, **{k: v for k, v in given.items() if v is not None}),
                        name=name)
    return make


def register() -> list[str]:
    """Register the ablation spaces; their names."""
    names = []
    for part, off in PARTS.items():
        name = f"cct-no-{part}"
        register_space(name, _factory(name, off))
        names.append(name)
    return names


if __name__ == "__main__":
    register()
    sys.exit(main(sys.argv[1:]))
