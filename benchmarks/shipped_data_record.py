"""Record in the shipped CIFAR-10 supernet which images it trained on, and check the record.

The shipped ``supernet/checkpoints/mbv3_cifar10.pt`` was trained (``supernet.train_cifar``, now
``hwnas train``) on the train split of ``load_dataset(<cifar10-jpeg.npz>, seed=0)``: 45,000 of
the npz's 50,000 training images, the other 5,000 held out for validation. This script
recomputes that seeded split, and with ``--write`` adds its
:func:`hwnas.supernet.fingerprint.training_record` to the checkpoint (weights untouched: they
are compared bit for bit after the rewrite).

The check (always run): the largest and smallest subnets' accuracy and cross-entropy on
``--images`` images of the recorded training split, of the held-out validation split and of the
test set. Memorised images score clearly better than unseen ones, and the validation split must
score like the test set, not like the training split::

    python benchmarks/shipped_data_record.py [--space mbv3|vit] [--write] [--images 1000]
    python benchmarks/shipped_data_record.py --space vit --checkpoint other.pt   # check only
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hwnas.supernet.checkpoints import CIFAR10_CLASSES, shipped_checkpoint
from hwnas.supernet.data import ImageSplit, load_dataset, shared_data_dir
from hwnas.supernet.evaluate import eval_loader, recalibrated_subnet
from hwnas.supernet.fingerprint import read_record, training_record
from hwnas.supernet.train import load_checkpoint, with_training_augment

from hwnas.core.io import write_atomic

LIMIT_BYTES = 20 * 2**20


def _sample(split: ImageSplit, n: int, seed: int) -> ImageSplit:
    idx = torch.from_numpy(np.sort(np.random.default_rng(seed).permutation(len(split))[:n]))
    return ImageSplit(split.images[idx].contiguous(), split.labels[idx].contiguous())


def _scores(model, data, split) -> tuple[float, float]:
    correct, loss, n = 0, 0.0, 0
    with torch.no_grad():
        for x, y in eval_loader(data, split):
            logits = model(x)
            correct += int((logits.argmax(1) == y).sum())
            loss += float(F.cross_entropy(logits, y, reduction="sum"))
            n += len(y)
    return 100.0 * correct / n, loss / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="add the record to the checkpoint")
    p.add_argument("--images", type=int, default=1000, help="images per split for the check")
    p.add_argument("--space", default="mbv3", help="the shipped CIFAR-10 supernet's space (mbv3, vit)")
    p.add_argument("--checkpoint", help="check this supernet instead of the shipped one "
                   "(a candidate trained on the same split; not with --write)")
    args = p.parse_args()
    if args.checkpoint and args.write:
        raise SystemExit("--write records the split in the shipped checkpoint; drop --checkpoint")
    if args.checkpoint and not Path(args.checkpoint).is_file():
        raise SystemExit(f"--checkpoint {args.checkpoint}: no such file")
    CHECKPOINT = (Path(args.checkpoint) if args.checkpoint
                  else shipped_checkpoint(args.space, CIFAR10_CLASSES))
    if CHECKPOINT is None:
        raise SystemExit(f"no shipped CIFAR-10 checkpoint for space {args.space!r}")
    base = shared_data_dir()
    if base is None:
        raise SystemExit("shared data not found: set HWNAS_SHARED_DATA")
    data = load_dataset(str(base / "cifar10" / "cifar10-jpeg.npz"), seed=0)
    record = training_record(data)
    print(f"split: {len(data.train)} train / {len(data.val)} val / {len(data.test)} test; "
          f"fingerprint {record['fingerprint']}")

    if args.write:
        payload = torch.load(CHECKPOINT, map_location="cpu", weights_only=True)
        before = {k: v.clone() for k, v in payload["state_dict"].items()}
        payload["data_record"] = record
        write_atomic(CHECKPOINT, lambda tmp: torch.save(payload, tmp))
        after = torch.load(CHECKPOINT, map_location="cpu", weights_only=True)
        assert after["state_dict"].keys() == before.keys()
        assert all(torch.equal(after["state_dict"][k], v) and after["state_dict"][k].dtype == v.dtype
                   for k, v in before.items()), "weights changed"
        size = CHECKPOINT.stat().st_size
        assert size < LIMIT_BYTES, f"{CHECKPOINT} is {size} bytes"
        print(f"wrote the record: {CHECKPOINT} {size / 1e6:.2f} MB, weights bit-identical")

    space, supernet, payload = load_checkpoint(CHECKPOINT)
    stored = read_record(payload, str(CHECKPOINT))
    if stored is not None:
        same = np.array_equal(stored.train_hashes, np.sort(record["train_hashes"].numpy().view(np.uint64)))
        print(f"checkpoint's record matches the recomputed split: {same}")
    data = with_training_augment(data, payload.get("train_config"))
    for role, arch in (("largest", space.largest()), ("smallest", space.smallest())):
        t0 = time.perf_counter()
        model = recalibrated_subnet(supernet, arch, data).eval()
        row = []
        for name in ("train", "val", "test"):
            acc, loss = _scores(model, data, _sample(getattr(data, name), args.images, 1))
            half = 100 * 1.96 * math.sqrt(acc / 100 * (1 - acc / 100) / args.images)
            row.append(f"{name} {acc:5.1f} % (±{half:.1f}) loss {loss:.3f}")
        print(f"{role:8s} " + " | ".join(row) + f"  [{time.perf_counter() - t0:.0f} s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
