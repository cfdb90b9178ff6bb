"""Bytes, PSNR and mean colour shift of the stored CIFAR-10 test images re-encoded at a range
of JPEG qualities (Pillow, 4:2:0), on every fifth test image (2,000): whether one quality is
an outlier of the re-encoding itself (issue 44, session 35).

    OMP_NUM_THREADS=1 PYTHONPATH=. python \
        benchmarks/results/supernet_cifar10/session35_jpeg_scan.py
"""

from __future__ import annotations

import json

from benchmarks.jpeg_reference import _psnr, reencode
from hwnas.supernet.data import load_dataset

QUALITIES = (30, 40, 45, 48, 50, 52, 55, 60, 65, 70, 75, 85, 95)

if __name__ == "__main__":
    images = load_dataset("cifar10", seed=0).test.images[::5]
    for q in QUALITIES:
        out, size = reencode(images, q)
        shift = (out.double() - images.double()).mean((0, 2, 3))
        print(json.dumps({"quality": q, "bytes_per_image": round(size / len(images), 1),
                          "psnr_db": round(_psnr(images, out), 2),
                          "mean_shift_rgb": [round(float(v), 3) for v in shift]}), flush=True)
