"""Returned networks on the test images re-encoded at lower JPEG qualities (issue 44, session
35): test-time sensitivity to compression, beside each quality's bytes and PSNR against the
stored images. A shift at test time only; what training on such images costs is
``benchmarks/jpeg_reference.py``'s to measure.

    OMP_NUM_THREADS=1 PYTHONPATH=. python \
        benchmarks/results/supernet_cifar10/session35_jpeg_eval.py \
        /work/dev35/cct2drop.model.pt /work/dev35/cct2dropwd.model.pt
"""

from __future__ import annotations

import json
import sys
import time

from benchmarks.jpeg_reference import _psnr, reencode
from hwnas.supernet.data import ImageSplit, load_dataset
from hwnas.supernet.evaluate import accuracy, eval_loader
from hwnas.supernet.train import load_network

QUALITIES = (None, 95, 75, 50, 30)  # None: as stored (JPEG 75, 4:2:0)


def main(paths: list[str]) -> int:
    data = load_dataset("cifar10", seed=0)
    nets = {p.rsplit("/", 1)[-1]: load_network(p)[2] for p in paths}
    test = data.test
    for q in QUALITIES:
        start = time.process_time()
        images, size = (test.images, None) if q is None else reencode(test.images, q)
        split = ImageSplit(images, test.labels)
        row = {"quality": q or "as stored",
               "bytes_per_image": size and round(size / len(test), 1),
               "psnr_vs_stored_db": None if q is None else round(_psnr(test.images, images), 2)}
        for name, model in nets.items():
            row[name] = round(accuracy(model, eval_loader(data, split)), 2)
        row["cpu_s"] = round(time.process_time() - start, 1)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
