"""What the shared JPEG CIFAR-10 costs, measured against a published network of known recipe.

The shared ``cifar10-jpeg.npz`` holds CIFAR-10 re-encoded as JPEG (quality 75, 4:2:0 chroma),
and issue 44's CCT runs stay ~5 points under the published figures (PNG training). This trains
ResNet-20 (He et al. 2016, the CIFAR variant with option-A shortcuts: 0.27 M parameters,
published 91.25 % test) with the paper's recipe: SGD lr 0.1, momentum 0.9, weight decay 1e-4
on every parameter, batch 128, 64k iterations, lr /10 at 32k and 48k, pad-4 crop and flip
(``crop_flip``), He-normal init, plain cross-entropy. ``--quality Q`` first re-encodes every
training, validation and test image at JPEG quality Q (Pillow, 4:2:0), so runs at the shared
data's own quality and a lower one give the slope of accuracy against compression.

The data come through hwnas (``load_dataset``: 45,000 training images, 5,000 held out;
``BatchLoader``: augmentation and normalisation on the device). A checkpoint (weights, SGD
state, scheduler, torch RNG, step) is written to ``OUT/checkpoint.pt`` every
``--checkpoint-every-s`` seconds and when ``--max-minutes`` / ``--max-steps`` stop the run;
the same command again resumes from it, bit for bit on the CPU (each epoch's order and crops
come from ``(seed, epoch)``; a resumed epoch replays its first batches). When all iterations
are done ``OUT/result.json`` gets test and validation top-1, seconds and images/s.

    python benchmarks/jpeg_reference.py --out runs/r20_q75 --device cuda --bf16 --compile \
        --max-minutes 9
    python benchmarks/jpeg_reference.py --out runs/r20_q50 --quality 50 --device cuda --bf16 \
        --compile --max-minutes 9
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hwnas.core.errors import UserError
from hwnas.core.io import write_atomic, write_json
from hwnas.supernet.checkpoint_io import rng_state, set_rng_state
from hwnas.supernet.data import BatchLoader, DatasetSplits, ImageSplit, load_dataset
from hwnas.supernet.data.splits import _channel_stats
from hwnas.supernet.evaluate import accuracy, eval_loader
from hwnas.supernet.fingerprint import dataset_fingerprint
from hwnas.supernet.train import check_torch_device
from torch import nn

__all__ = ["ResNetCifar", "degrade", "main", "reencode"]

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"
WARMUP_STEPS = 20  # steps of a part left out of its steady images/s (compilation, caches)
#: settings a resumed run must share with the checkpoint it resumes (not the dataset's path,
#: which may differ between machines: the images' fingerprint must match instead)
SAME_ON_RESUME = ("quality", "depth", "iterations", "milestones", "batch_size", "lr",
                  "momentum", "weight_decay", "seed", "bf16")


# -- the network ------------------------------------------------------------------------------

class _Block(nn.Module):
    """Two 3x3 conv-BN layers; option-A shortcut: identity, or stride-2 subsampling with the
    new channels zero-padded (no parameters), as the paper's CIFAR networks."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        short = x[:, :, ::self.stride, ::self.stride] if self.stride > 1 else x
        if self.pad:
            short = F.pad(short, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + short)


class ResNetCifar(nn.Module):
    """He et al.'s CIFAR ResNet of depth 6n+2 (20: n = 3): 16-32-64 channels, global average
    pooling, one linear layer; conv and linear weights He-normal (fan-in), BN 1/0."""

    def __init__(self, depth: int = 20, num_classes: int = 10) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise UserError(f"--depth must be 6n+2 (20, 32, 44, 56, 110), got {depth}")
        n = (depth - 2) // 6
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        blocks, cin = [], 16
        for stage, cout in enumerate((16, 32, 64)):
            for i in range(n):
                blocks.append(_Block(cin, cout, 2 if stage and not i else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


# -- the data ---------------------------------------------------------------------------------

def reencode(images: torch.Tensor, quality: int) -> tuple[torch.Tensor, int]:
    """uint8 ``(N, 3, H, W)`` images through a JPEG of ``quality`` (Pillow, 4:2:0 chroma) and
    back; also the encoded bytes of all of them."""
    from PIL import Image

    arr = images.permute(0, 2, 3, 1).contiguous().numpy()
    out = np.empty_like(arr)
    size = 0
    for i, img in enumerate(arr):
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=quality, subsampling=2)
        size += buf.tell()
        buf.seek(0)
        with Image.open(buf) as im:
            out[i] = np.asarray(im.convert("RGB"))
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous(), size


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float((a.double() - b.double()).pow(2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def degrade(data: DatasetSplits, quality: int) -> tuple[DatasetSplits, dict]:
    """``data`` with every image re-encoded at ``quality`` (the same images in the same
    splits; mean/std of the new training images) and what it did: bytes per image and the
    PSNR against the images given."""
    if not 1 <= quality <= 95:
        raise UserError(f"--quality must be 1..95 (Pillow's useful range), got {quality}")
    splits, sizes, psnr = {}, 0, {}
    for name in ("train", "val", "test"):
        split = getattr(data, name)
        images, size = reencode(split.images, quality)
        sizes += size
        psnr[name] = round(_psnr(split.images, images), 3)
        splits[name] = ImageSplit(images, split.labels)
    mean, std = _channel_stats(splits["train"].images)
    n = sum(len(s) for s in splits.values())
    return (dataclasses.replace(data, **splits, mean=mean, std=std),
            {"quality": quality, "bytes_per_image": round(sizes / n, 1), "psnr_db": psnr})


# -- training ---------------------------------------------------------------------------------

def _settings(args: argparse.Namespace) -> dict:
    return {"dataset": args.dataset, "quality": args.quality, "depth": args.depth,
            "iterations": args.iterations, "milestones": list(args.milestones),
            "batch_size": args.batch_size, "lr": args.lr, "momentum": args.momentum,
            "weight_decay": args.weight_decay, "seed": args.seed, "bf16": args.bf16}


def _check_resume(ckpt: dict, settings: dict, fingerprint: str, path: Path) -> None:
    diff = [k for k in SAME_ON_RESUME if ckpt["settings"].get(k) != settings[k]]
    if diff:
        raise UserError(f"{path} was trained with other settings ({', '.join(diff)}: "
                        f"{[ckpt['settings'].get(k) for k in diff]}); use another --out")
    if ckpt["fingerprint"] != fingerprint:
        raise UserError(f"{path} was trained on other images (data fingerprint "
                        f"{ckpt['fingerprint']} vs {fingerprint}); use another --out")


def train(args: argparse.Namespace) -> dict:
    """Train (or resume) the run in ``args.out``; its progress or final result."""
    out = Path(args.out)
    if (out / RESULT).is_file():
        return json.loads((out / RESULT).read_text())
    device = check_torch_device(args.device)
    settings = _settings(args)
    data = load_dataset(args.dataset, seed=0)
    degraded = None
    if args.quality:
        data, degraded = degrade(data, args.quality)
    fingerprint = dataset_fingerprint(data)
    torch.manual_seed(args.seed)
    model = ResNetCifar(args.depth, data.num_classes).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(
        optimizer, [round(f * args.iterations) for f in args.milestones], gamma=0.1)
    loader = BatchLoader(data.train, batch_size=args.batch_size, mean=data.mean, std=data.std,
                         shuffle=True, augment="crop_flip", seed=args.seed, device=device,
                         drop_last=True)
    step, history, prior_s, parts, partial = 0, [], 0.0, [], [0.0, 0.0]
    ckpt_path = out / CHECKPOINT
    if ckpt_path.is_file():
        # on the CPU: RNG states must stay CPU tensors; load_state_dict moves the rest
        # weights only (a carried file never executes); MultiStepLR's milestones are a Counter
        with torch.serialization.safe_globals([collections.Counter]):
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        _check_resume(ckpt, settings, fingerprint, ckpt_path)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        set_rng_state(ckpt["rng"], device)
        step, history, prior_s, parts, partial = (ckpt["step"], ckpt["history"],
                                                  ckpt["seconds"], ckpt["parts"], ckpt["partial"])
    run = torch.compile(model) if args.compile else model
    amp = (torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16
           else contextlib.nullcontext())
    steps_per_epoch = len(loader)
    # this epoch's summed loss and correct predictions (augmented batches), carried on resume
    sums = torch.tensor(partial, dtype=torch.float64, device=device)
    start = last_save = time.perf_counter()
    cpu_start, first = time.process_time(), step
    warm = None  # (step, clock) once WARMUP_STEPS are done: images/s without compilation
    model.train()

    def save() -> None:
        part = {"device": str(device), "steps": step - first,
                "seconds": round(time.perf_counter() - start, 3),
                "cpu_seconds": round(time.process_time() - cpu_start, 3)}
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "rng": rng_state(device), "step": step,
                 "history": history, "seconds": prior_s + time.perf_counter() - start,
                 "parts": parts + [part], "partial": sums.tolist(), "settings": settings,
                 "fingerprint": fingerprint}
        write_atomic(ckpt_path, lambda tmp: torch.save(state, tmp))

    stop = False
    while step < args.iterations and not stop:
        epoch, skip = divmod(step, steps_per_epoch)
        loader.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(skip):  # replay the epoch's random stream up to where it stopped
            next(batches)
        for x, y in batches:
            if device.type == "cuda":
                x = x.contiguous(memory_format=torch.channels_last)
            with amp:
                logits = run(x)
                loss = F.cross_entropy(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step - first == WARMUP_STEPS:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                warm = (step, time.perf_counter())
            sums += torch.stack([loss.detach().double() * y.numel(),
                                 (logits.argmax(1) == y).sum().double()])
            if step % steps_per_epoch == 0:
                n = steps_per_epoch * args.batch_size
                history.append({"epoch": epoch + 1, "step": step,
                                "loss": round(float(sums[0]) / n, 5),
                                "train_top1_augmented": round(100 * float(sums[1]) / n, 3),
                                "seconds": round(prior_s + time.perf_counter() - start, 2)})
                sums.zero_()
            now = time.perf_counter()
            if (step >= args.iterations
                    or (args.max_steps is not None and step >= args.max_steps)
                    or (args.max_minutes is not None and now - start >= 60 * args.max_minutes)):
                stop = True
                break
            if now - last_save >= args.checkpoint_every_s:
                save()
                last_save = now
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    save()
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    this_part = {"steps": step - first, "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3),
                 "images_per_s": round((step - first) * args.batch_size / max(seconds, 1e-9), 1),
                 "images_per_cpu_s": round((step - first) * args.batch_size / max(cpu, 1e-9), 1)}
    if warm is not None and step > warm[0]:
        this_part["images_per_s_after_warmup"] = round(
            (step - warm[0]) * args.batch_size / max(time.perf_counter() - warm[1], 1e-9), 1)
    if step < args.iterations:
        return {"completed": False, "step": step, "iterations": args.iterations,
                "this_part": this_part, "data": degraded, "checkpoint": str(ckpt_path)}
    total_s = prior_s + seconds
    result = {
        "completed": True, "network": f"resnet{args.depth}",
        "params": sum(p.numel() for p in model.parameters()), "settings": settings,
        "data": degraded or {"quality": "as stored (JPEG 75, 4:2:0)"},
        "fingerprint": fingerprint, "device": str(device),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else "cpu"), "torch": torch.__version__,
        "test_top1": round(accuracy(model, eval_loader(data, data.test, device=device)), 2),
        "val_top1": round(accuracy(model, eval_loader(data, data.val, device=device)), 2),
        "seconds": round(total_s, 1),
        "images_per_s": round(args.iterations * args.batch_size / max(total_s, 1e-9), 1),
        "parts": parts + [{**this_part, "device": str(device)}], "history": history,
    }
    write_json(out / RESULT, result)
    return result


def _milestones(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions like 0.5,0.75, got {text!r}")
    if not values or any(not 0 < v < 1 for v in values) or list(values) != sorted(values):
        raise argparse.ArgumentTypeError(f"milestones must rise within (0, 1), got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="run folder (resumed when it holds one)")
    ap.add_argument("--dataset", default="cifar10", help="hwnas dataset name or .npz path")
    ap.add_argument("--quality", type=int, default=0,
                    help="re-encode every image at this JPEG quality first (0: as stored)")
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--iterations", type=int, default=64000)
    ap.add_argument("--milestones", type=_milestones, default=(0.5, 0.75),
                    help="lr /10 at these fractions of --iterations (the paper: 32k, 48k)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (the CCT runs' precision)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the network")
    ap.add_argument("--checkpoint-every-s", type=float, default=90.0)
    ap.add_argument("--max-minutes", type=float, default=None)
    ap.add_argument("--max-steps", type=int, default=None,
                    help="stop (with a checkpoint) once this many steps are done in all")
    args = ap.parse_args(argv)
    try:
        print(json.dumps({k: v for k, v in train(args).items() if k != "history"}), flush=True)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
