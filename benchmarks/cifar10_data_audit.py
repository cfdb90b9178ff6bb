"""Issue 44 audit: does hwnas's CIFAR-10 data path hand the network what a torchvision recipe
would, and what does the shared JPEG data cost a network trained on the original PNG images?

Every check compares hwnas (``load_dataset``, ``BatchLoader``, ``eval_loader``) against an
independent path written here: each JPEG decoded again with Pillow, images matched back to
their file index by pixel hash, torchvision's ``RandomCrop(32, padding=4)`` +
``RandomHorizontalFlip`` semantics applied per image in numpy, statistics in float64.
``--akamaster DIR`` also scores the pretrained CIFAR ResNets of akamaster/pytorch_resnet_cifar10
(``pretrained_models/resnetNN-*.th``, trained on the original 50k images; weights mapped into
``jpeg_reference.ResNetCifar``) on the JPEG images as stored and re-encoded at quality 50.
``--psnr-proxy`` alone sizes the first encode against the second on stand-in originals.
Prints one JSON object.

    OMP_NUM_THREADS=1 python benchmarks/cifar10_data_audit.py \
        --dataset ../shared/data/cifar10/cifar10-jpeg.npz --akamaster DIR --out audit.json
    OMP_NUM_THREADS=1 python benchmarks/cifar10_data_audit.py --psnr-proxy
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from hwnas.supernet.data import BatchLoader, ImageSplit, load_dataset
from hwnas.supernet.evaluate import accuracy, eval_loader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jpeg_reference import ResNetCifar, reencode  # noqa: E402

#: Per-channel mean/std of the original 50k training images (RGB, [0, 1]), the values quoted
#: throughout the CIFAR literature.
PNG_MEAN = (0.4914, 0.4822, 0.4465)
PNG_STD = (0.2470, 0.2435, 0.2616)
#: The normalisation akamaster's trainer.py uses (ImageNet's statistics).
AKAMASTER_MEAN, AKAMASTER_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
AKAMASTER_PUBLISHED = {20: 91.73, 32: 92.63, 44: 93.10, 56: 93.39}  # README, original test set


def decode_raw(npz: dict, prefix: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """Every image of ``prefix`` decoded by Pillow, (N, 32, 32, 3) RGB, its labels, and what
    the first 200 JPEG headers say (mode, chroma sampling, luma quantisation table)."""
    from PIL import Image, JpegImagePlugin

    jpeg, off, labels = npz[f"{prefix}_jpeg"], npz[f"{prefix}_offsets"], npz[f"{prefix}_labels"]
    out = np.empty((len(labels), 32, 32, 3), np.uint8)
    modes, samplings, luma = set(), set(), set()
    for i in range(len(labels)):
        with Image.open(io.BytesIO(jpeg[off[i]:off[i + 1]].tobytes())) as im:
            if i < 200:
                modes.add(im.mode)
                samplings.add(JpegImagePlugin.get_sampling(im))
                luma.add(tuple(im.quantization[0])[:8])
            out[i] = np.asarray(im.convert("RGB"))
    header = {"modes": sorted(modes), "sampling": sorted(samplings),
              "luma_qtable_first8": [list(t) for t in sorted(luma)]}
    return out, labels.astype(np.int64), header


def ijg_luma_first8(quality: int) -> list[int]:
    """The first row of libjpeg's luma table scaled to ``quality`` (Pillow's order)."""
    base = [16, 11, 10, 16, 24, 40, 51, 61]  # the first row of the standard (Annex K) table
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return [min(max((b * scale + 50) // 100, 1), 255) for b in base]


def index_by_hash(images: np.ndarray) -> dict[bytes, list[int]]:
    table: dict[bytes, list[int]] = {}
    for i, img in enumerate(images):
        table.setdefault(hashlib.blake2b(img.tobytes(), digest_size=16).digest(), []).append(i)
    return table


def match_indices(split_images: torch.Tensor, table: dict[bytes, list[int]]) -> np.ndarray:
    """The raw index of each hwnas image (NCHW) by pixel hash; identical images take their
    indices in turn."""
    used: dict[bytes, int] = {}
    idx = np.empty(len(split_images), np.int64)
    for k, img in enumerate(split_images.permute(0, 2, 3, 1).contiguous().numpy()):
        h = hashlib.blake2b(img.tobytes(), digest_size=16).digest()
        n = used.get(h, 0)
        idx[k] = table[h][n]
        used[h] = n + 1
    return idx


def reference_crop_flip(img: np.ndarray, top: int, left: int, flip: bool) -> np.ndarray:
    """torchvision semantics on one HWC image: zero-pad 4, crop 32x32 at (top, left), then
    mirror left-right if ``flip``."""
    padded = np.pad(img, ((4, 4), (4, 4), (0, 0)))
    crop = padded[top:top + 32, left:left + 32]
    return crop[:, ::-1] if flip else crop


def coded_split(n: int) -> ImageSplit:
    """Images whose pixels name their row (channel 0: row + 1), column (channel 1: col + 1)
    and label = index, so a crop's offsets and flip can be read back from any batch."""
    rows = torch.arange(1, 33, dtype=torch.uint8).view(1, 32, 1).expand(1, 32, 32)
    cols = torch.arange(1, 33, dtype=torch.uint8).view(1, 1, 32).expand(1, 32, 32)
    one = torch.cat([rows, cols, torch.full((1, 32, 32), 7, dtype=torch.uint8)])
    return ImageSplit(one.expand(n, 3, 32, 32).contiguous(), torch.arange(n, dtype=torch.int64))


def read_crop(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(top, left, flip) of each augmented coded image (B, 3, 32, 32 uint8)."""
    b = x.shape[0]
    top, left, flip = np.empty(b, int), np.empty(b, int), np.empty(b, bool)
    for k in range(b):
        r, c = np.argwhere(x[k, 0] > 0)[0]  # a pixel of the image, not of the padding
        top[k] = int(x[k, 0, r, c]) - 1 - r + 4
        row = x[k, 1, r]
        nz = np.flatnonzero(row)
        flip[k] = len(nz) > 1 and row[nz[1]] < row[nz[0]]
        c0 = nz[0]
        left[k] = int(row[c0]) + 3 - (31 - c0 if flip[k] else c0)
    return top, left, flip


def channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and population std of uint8 HWC images in [0, 1], float64 sums over
    chunks (numpy, not hwnas's routine)."""
    s = np.zeros(3)
    sq = np.zeros(3)
    for start in range(0, len(images), 5000):
        x = images[start:start + 5000].astype(np.float64) / 255
        s += x.sum((0, 1, 2))
        sq += (x * x).sum((0, 1, 2))
    n = images.shape[0] * images.shape[1] * images.shape[2]
    mean = s / n
    return mean, np.sqrt(sq / n - mean * mean)


def log(msg: str) -> None:
    print(f"[{time.process_time():.0f} cpu-s] {msg}", file=sys.stderr, flush=True)


def chi2_uniform(counts: np.ndarray) -> float:
    exp = counts.sum() / len(counts)
    return float(((counts - exp) ** 2 / exp).sum())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="../shared/data/cifar10/cifar10-jpeg.npz")
    p.add_argument("--epochs", type=int, default=2, help="training epochs checked end to end")
    p.add_argument("--akamaster", default=None, help="folder with resnetNN-*.th (pretrained)")
    p.add_argument("--grid", default=None, help="write a PNG of test images per label here")
    p.add_argument("--out", default=None)
    p.add_argument("--psnr-proxy", action="store_true",
                   help="only the PSNR proxy for the first encode (no CIFAR-10 needed)")
    args = p.parse_args(argv)
    if args.psnr_proxy:
        res = psnr_proxy()
        print(json.dumps(res, indent=1))
        return res
    t0 = time.process_time()
    res: dict = {"dataset": args.dataset}
    with np.load(args.dataset) as z:
        npz = {k: z[k] for k in z.files}
    raw_train, raw_train_y, hdr_train = decode_raw(npz, "train")
    raw_test, raw_test_y, hdr_test = decode_raw(npz, "test")
    res["jpeg_headers"] = {"train": hdr_train, "test": hdr_test,
                           "ijg_luma_first8_q75": ijg_luma_first8(75)}
    res["classes"] = [str(c) for c in npz["classes"]]
    # the release's order (train begins 6 9 9 4 1 ..., test 3 8 8 0 6 ...) is not kept: the
    # file is sorted by label, so alignment is judged by a network trained on the originals
    res["file_sorted_by_label"] = {"train": bool((np.diff(raw_train_y) >= 0).all()),
                                   "test": bool((np.diff(raw_test_y) >= 0).all())}
    res["class_counts"] = {"train": np.bincount(raw_train_y).tolist(),
                           "test": np.bincount(raw_test_y).tolist()}
    mean50, std50 = channel_stats(raw_train)
    res["channel_stats_50k_train"] = {
        "mean": mean50.round(4).tolist(), "std": std50.round(4).tolist(),
        "png_release_mean": PNG_MEAN, "png_release_std": PNG_STD}
    lum = raw_train.mean(3, dtype=np.float32) / 255
    res["orientation"] = {  # natural images: sky on top, left-right symmetric on average
        "top_minus_bottom_half": round(float(lum[:, :16].mean() - lum[:, 16:].mean()), 4),
        "left_minus_right_half": round(float(lum[:, :, :16].mean() - lum[:, :, 16:].mean()), 4)}
    del lum

    log("decoded and checked the raw file")
    # -- hwnas's splits against the raw decode -------------------------------------------
    data = load_dataset(args.dataset, seed=0)
    table = index_by_hash(raw_train)
    tr = match_indices(data.train.images, table)
    va = match_indices(data.val.images, table)
    res["splits"] = {
        "sizes": [len(data.train), len(data.val), len(data.test)],
        "train_val_disjoint": len(np.intersect1d(tr, va)) == 0,
        "train_val_cover_50k": len(np.union1d(tr, va)) == len(raw_train),
        "train_pixels_equal_pillow": bool(np.array_equal(
            data.train.images.permute(0, 2, 3, 1).numpy(), raw_train[tr])),
        "train_labels_aligned": bool(np.array_equal(data.train.labels.numpy(), raw_train_y[tr])),
        "val_labels_aligned": bool(np.array_equal(data.val.labels.numpy(), raw_train_y[va])),
        "val_class_counts": np.bincount(data.val.labels.numpy()).tolist(),
        "test_pixels_equal_pillow_in_order": bool(np.array_equal(
            data.test.images.permute(0, 2, 3, 1).numpy(), raw_test)),
        "test_labels_aligned_in_order": bool(np.array_equal(data.test.labels.numpy(),
                                                            raw_test_y)),
        "exact_duplicate_images_within_train50k": int(sum(len(v) - 1 for v in table.values())),
        "test_images_identical_to_a_train_image": int(sum(
            hashlib.blake2b(img.tobytes(), digest_size=16).digest() in table
            for img in raw_test)),
    }
    mean45, std45 = channel_stats(raw_train[tr])
    res["normalisation"] = {
        "hwnas_mean": [round(v, 6) for v in data.mean],
        "hwnas_std": [round(v, 6) for v in data.std],
        "independent_mean_45k": mean45.round(6).tolist(),
        "independent_std_45k": std45.round(6).tolist(),
        "max_abs_diff": float(max(np.abs(np.array(data.mean) - mean45).max(),
                                  np.abs(np.array(data.std) - std45).max()))}

    log("splits checked")
    # -- evaluation batches: no augmentation, one normalisation, file order ----------------
    ref_test = ((raw_test.astype(np.float32) / 255 - mean45.astype(np.float32))
                / std45.astype(np.float32)).transpose(0, 3, 1, 2)
    got = torch.cat([xb for xb, _ in eval_loader(data, data.test)]).numpy()
    res["test_batches"] = {"max_abs_diff_vs_reference": float(np.abs(got - ref_test).max()),
                           "augment": eval_loader(data, data.test).augment}
    del got, ref_test

    # -- training batches, end to end, for the first epochs of jpeg_reference's loader -----
    kw = dict(batch_size=128, mean=data.mean, std=data.std, shuffle=True, augment="crop_flip",
              seed=0, drop_last=True)
    real, coded = BatchLoader(data.train, **kw), BatchLoader(coded_split(len(data.train)),
                                                           **{**kw, "mean": (0, 0, 0),
                                                              "std": (1, 1, 1)})
    m32, s32 = mean45.astype(np.float32), std45.astype(np.float32)
    train_hwc = data.train.images.permute(0, 2, 3, 1).numpy()
    tops, lefts, flips, seen, worst = [], [], [], [], 0.0
    for epoch in range(args.epochs):
        real.set_epoch(epoch)
        coded.set_epoch(epoch)
        e_top, e_left, e_flip, e_idx = (np.full(len(data.train), -1) for _ in range(4))
        for (xr, yr), (xc, yc) in zip(real, coded):
            idx = yc.numpy()
            t, l_, f = read_crop((xc * 255).round().to(torch.uint8).numpy())
            e_top[idx], e_left[idx], e_flip[idx] = t, l_, f
            e_idx[idx] = epoch
            assert np.array_equal(yr.numpy(), data.train.labels.numpy()[idx])
            ref = np.stack([reference_crop_flip(train_hwc[i], t[k], l_[k], f[k])
                            for k, i in enumerate(idx)])
            ref = ((ref.astype(np.float32) / 255 - m32) / s32).transpose(0, 3, 1, 2)
            worst = max(worst, float(np.abs(xr.numpy() - ref).max()))
        log(f"epoch {epoch} checked end to end")
        tops.append(e_top)
        lefts.append(e_left)
        flips.append(e_flip)
        seen.append(e_idx >= 0)
    seen_a, top_a, left_a, flip_a = (np.stack(v) for v in (seen, tops, lefts, flips))
    both = seen_a.all(0)
    res["train_batches"] = {
        "epochs_checked": args.epochs, "steps_per_epoch": len(real),
        "max_abs_diff_vs_torchvision_semantics": worst,
        "images_seen_per_epoch": seen_a.sum(1).tolist(),
        "images_never_seen_in_all_epochs": int((~seen_a.any(0)).sum()),
        "top_counts_0_to_8": np.bincount(top_a[seen_a], minlength=9).tolist(),
        "left_counts_0_to_8": np.bincount(left_a[seen_a], minlength=9).tolist(),
        "chi2_top_8dof": round(chi2_uniform(np.bincount(top_a[seen_a], minlength=9)), 2),
        "chi2_left_8dof": round(chi2_uniform(np.bincount(left_a[seen_a], minlength=9)), 2),
        "flip_rate": round(float(flip_a[seen_a].mean()), 4),
        "corr_top_vs_left": round(float(np.corrcoef(top_a[seen_a], left_a[seen_a])[0, 1]), 4),
        "corr_top_epoch0_vs_1": (round(float(np.corrcoef(top_a[0][both], top_a[1][both])[0, 1]), 4)
                                 if args.epochs > 1 else None),
        "corr_flip_epoch0_vs_1": (round(float(np.corrcoef(flip_a[0][both],
                                                          flip_a[1][both])[0, 1]), 4)
                                  if args.epochs > 1 else None),
    }

    # -- a network trained on the original images, scored on these ------------------------
    if args.akamaster:
        res["akamaster"] = score_pretrained(Path(args.akamaster), data)
    if args.grid:
        write_grid(Path(args.grid), raw_test, raw_test_y, res["classes"])
    res["cpu_seconds"] = round(time.process_time() - t0, 1)
    text = json.dumps(res, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return res


def akamaster_state(path: Path, depth: int) -> dict:
    """akamaster's ``module.`` state dict renamed to :class:`ResNetCifar`'s parameter names."""
    sd = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    n = (depth - 2) // 6
    out = {}
    for k, v in sd.items():
        k = k.removeprefix("module.")
        head, _, rest = k.partition(".")
        if head == "conv1":
            out[f"stem.0.{rest}"] = v
        elif head == "bn1":
            out[f"stem.1.{rest}"] = v
        elif head == "linear":
            out[f"fc.{rest}"] = v
        else:  # layerL.j.name
            stage, j, name = int(head[-1]) - 1, *rest.split(".", 1)
            out[f"blocks.{stage * n + int(j)}.{name}"] = v
    return out


def score_pretrained(folder: Path, data) -> dict:
    out = {}
    test_q50 = None
    for depth in (20, 32, 44, 56):
        files = sorted(folder.glob(f"resnet{depth}-*.th"))
        if not files:
            continue
        model = ResNetCifar(depth)
        missing, unexpected = model.load_state_dict(akamaster_state(files[0], depth), strict=False)
        assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
        d = dataclasses.replace(data, mean=AKAMASTER_MEAN, std=AKAMASTER_STD)
        with torch.no_grad():
            row = {"published_png_test": AKAMASTER_PUBLISHED[depth],
                   "jpeg75_test": round(accuracy(model, eval_loader(d, d.test)), 2)}
            if depth == 20:
                # images it was trained on (as PNG), here as JPEG: hwnas's 5,000 validation
                # images (a stratified share; the file is sorted by label)
                row["jpeg75_val_seen_in_training"] = round(
                    accuracy(model, eval_loader(d, d.val)), 2)
                row["test_confusions"] = confusions(model, d, list(data.classes))
                if test_q50 is None:
                    test_q50 = ImageSplit(reencode(data.test.images, 50)[0], data.test.labels)
                row["jpeg50_test"] = round(accuracy(model, eval_loader(d, test_q50)), 2)
        out[f"resnet{depth}"] = row
        log(f"resnet{depth}: {row}")
    return out


def confusions(model, d, classes: list[str]) -> dict:
    """Where a network trained on the originals errs on the JPEG test images: the largest
    (true -> predicted) cells and how many of the 90 cells stay empty. Misaligned labels would
    spread errors over every cell; image degradation confuses similar classes."""
    preds, labels = [], []
    with torch.no_grad():
        for x, y in eval_loader(d, d.test):
            preds.append(model(x).argmax(1))
            labels.append(y)
    cm = np.zeros((len(classes), len(classes)), np.int64)
    np.add.at(cm, (torch.cat(labels).numpy(), torch.cat(preds).numpy()), 1)
    off = sorted(((int(cm[i, j]), f"{classes[i]}->{classes[j]}") for i in range(len(classes))
                  for j in range(len(classes)) if i != j), reverse=True)
    return {"errors": int(cm.sum() - np.trace(cm)), "largest": off[:6],
            "cells_under_5_of_90": sum(c < 5 for c, _ in off),
            "per_class_acc": np.round(100 * np.diag(cm) / cm.sum(1), 1).tolist()}


def _jpeg(img: np.ndarray, quality: int) -> np.ndarray:
    buf = io.BytesIO()
    from PIL import Image

    Image.fromarray(img).save(buf, "JPEG", quality=quality, subsampling=2)
    buf.seek(0)
    with Image.open(buf) as im:
        return np.asarray(im.convert("RGB"))


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255.0 ** 2 / ((a.astype(float) - b.astype(float)) ** 2).mean()))


def psnr_proxy() -> dict:
    """How large the first encode (clean -> quality 75) is next to the second that the
    quality-50 run added (75 -> 50), on stand-ins for the missing originals: 32x32 crops of
    scikit-learn's two sample photographs, area-averaged 4x and 8x (which also washes out
    their own JPEG blocks)."""
    from sklearn.datasets import load_sample_images

    crops = []
    for img in load_sample_images().images:
        for f in (4, 8):
            s = 32 * f
            for y in range(0, img.shape[0] - s + 1, s // 2):
                for x in range(0, img.shape[1] - s + 1, s // 2):
                    c = img[y:y + s, x:x + s].astype(float).reshape(32, f, 32, f, 3).mean((1, 3))
                    crops.append(c.round().astype(np.uint8))
    clean = np.stack(crops)
    q75 = np.stack([_jpeg(c, 75) for c in clean])
    q50 = np.stack([_jpeg(c, 50) for c in q75])
    def ycc(a: np.ndarray) -> np.ndarray:  # JPEG's (BT.601 full-range) Y, Cb, Cr
        m = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5],
                      [0.5, -0.418688, -0.081312]])
        return a.astype(float) @ m.T

    def parts(a: np.ndarray, b: np.ndarray) -> dict:
        d = (ycc(a) - ycc(b)) ** 2
        return {"rgb_db": round(_psnr(a, b), 2),
                "luma_db": round(float(10 * np.log10(255.0 ** 2 / d[..., 0].mean())), 2),
                "chroma_db": round(float(10 * np.log10(255.0 ** 2 / d[..., 1:].mean())), 2)}

    return {"crops": len(clean), "q75_vs_clean": parts(clean, q75),
            "q50_of_q75_vs_q75": parts(q75, q50), "q50_of_q75_vs_clean": parts(clean, q50)}


def write_grid(path: Path, images: np.ndarray, labels: np.ndarray, classes: list[str]) -> None:
    """Eight test images per label, one row per class (for a human look at label alignment
    and orientation)."""
    from PIL import Image

    rows = [np.concatenate(list(images[labels == c][:8]), 1) for c in range(len(classes))]
    Image.fromarray(np.concatenate(rows, 0)).resize((8 * 96, len(classes) * 96),
                                                    Image.NEAREST).save(path)


if __name__ == "__main__":
    main()
