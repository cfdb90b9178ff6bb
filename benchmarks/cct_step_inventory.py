"""Inventory of one CCT standalone training step as ``hwnas train --standalone`` runs it (issue 44):
aten operator calls per step by part (data/augmentation, forward, loss, backward, gradient norm,
optimizer, the loop's bookkeeping, the divergence guard's check every 25 steps) and host reads
per step, counted on the CPU with torch.profiler. A leaf aten call that is not a view or an
allocation is one kernel launch (or more) on CUDA, when the part runs eagerly.
Findings: ``train_step_overhead.md``, "Session 36".

    OMP_NUM_THREADS=1 python benchmarks/cct_step_inventory.py [--arch largest] [--batch 128]
        [--steps 3] [--compile-scope model|step] [--json FILE]
    OMP_NUM_THREADS=1 [PYTHONPATH=OLD_TREE] python benchmarks/cct_step_inventory.py \
        --arch smallest --timing 10 [--compile-scope model|step]    # paired CPU timing
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import hwnas.supernet.data.loader as loader_mod
import hwnas.supernet.train as train_mod
from hwnas.supernet.data import DatasetSplits, ImageSplit
from hwnas.supernet.divergence import DivergenceGuard
from hwnas.supernet.host_sync import count_host_syncs
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train_run import resolve_arch, train_config

#: aten calls that launch no kernel: views, metadata, allocations
NO_KERNEL = {
    "aten::view", "aten::_unsafe_view", "aten::as_strided", "aten::t", "aten::transpose",
    "aten::permute", "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::select",
    "aten::slice", "aten::alias", "aten::reshape", "aten::unflatten", "aten::flatten",
    "aten::detach", "aten::detach_", "aten::lift_fresh", "aten::empty", "aten::empty_strided",
    "aten::empty_like", "aten::resize_", "aten::numpy_T", "aten::_reshape_alias",
    "aten::expand_as", "aten::view_as", "aten::contiguous", "aten::result_type",
    "aten::is_nonzero", "aten::set_", "aten::to", "aten::_to_copy", "aten::lift",
    "aten::_local_scalar_dense", "aten::item", "aten::unbind", "aten::split", "aten::chunk",
    "aten::narrow", "aten::diagonal", "aten::real", "aten::conj", "aten::resolve_conj",
    "aten::resolve_neg", "aten::zeros_like", "aten::ones_like", "aten::full_like",
}
#: aten calls that read a value back to the host (a synchronisation on CUDA)
SYNCING = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero",
           "aten::masked_select", "aten::nonzero_static", "aten::unique", "aten::_unique2",
           "aten::equal", "aten::allclose"}
PARTS = ("data", "augment", "forward", "loss", "backward", "grad_norm", "guard_observe",
         "optimizer_step", "zero_grad", "guard_check", "loop")


def synthetic(n: int = 1024, seed: int = 0) -> DatasetSplits:
    """CIFAR-10-shaped random uint8 images (the step's cost does not depend on their content)."""
    g = torch.Generator().manual_seed(seed)
    imgs = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    labels = torch.arange(n) % 10
    split = ImageSplit(imgs, labels)
    small = ImageSplit(imgs[:20], labels[:20])
    return DatasetSplits("synthetic-cifar10", split, small, small, [str(i) for i in range(10)],
                         (0.49, 0.48, 0.45), (0.25, 0.24, 0.26), "crop_flip")


def cct_job(arch_role: str, epochs: int = 200, **overrides):
    """(model, space, arch, TrainConfig) of ``hwnas train --space cct --standalone ROLE``."""
    space = get_space("cct", in_channels=3, image_size=32, num_classes=10)
    settings = {k: None for k in ("batch_size", "lr", "weight_decay", "label_smoothing",
                                  "warmup_epochs", "grad_clip", "subnet_loss", "augment",
                                  "optimizer", "mixup", "cutmix", "teacher_weight",
                                  "teacher_mode", "decay_all")}
    settings.update(epochs=epochs, standalone=arch_role, seed=0, **overrides)
    config = train_config(settings, space)
    torch.manual_seed(config.seed)
    arch = resolve_arch(space, arch_role)
    model = train_mod.reinitialize(space.build_supernet().extract(arch).train(), seed=config.seed)
    return model, space, arch, config


class _Region:
    """record_function entered in a forward pre-hook and left in the forward hook."""

    def __init__(self, module: torch.nn.Module, name: str) -> None:
        self.stack: list = []
        self.handles = [module.register_forward_pre_hook(self.enter),
                        module.register_forward_hook(self.leave)]
        self.name = name

    def enter(self, *_):
        r = record_function(self.name)
        r.__enter__()
        self.stack.append(r)

    def leave(self, *_):
        self.stack.pop().__exit__(None, None, None)


@contextlib.contextmanager
def labelled(model: torch.nn.Module):
    """Label the parts of the loop with record_function (patched for the block's duration)."""
    saved = []

    def patch(obj, name, label):
        original = getattr(obj, name)
        saved.append((obj, name, original))

        def call(*args, **kwargs):
            with record_function(label):
                return original(*args, **kwargs)
        setattr(obj, name, call)

    patch(train_mod, "label_loss", "loss")
    patch(torch.Tensor, "backward", "backward")
    patch(torch.nn.utils, "get_total_norm", "grad_norm")
    patch(torch.nn.utils, "clip_grad_norm_", "grad_norm")
    patch(DivergenceGuard, "observe", "guard_observe")
    patch(DivergenceGuard, "check", "guard_check")
    patch(loader_mod, "augment_batch", "augment")
    original_batches = loader_mod.BatchLoader._batches

    def batches(self, generator):
        it = original_batches(self, generator)
        while True:
            with record_function("data"):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item
    saved.append((loader_mod.BatchLoader, "_batches", original_batches))
    loader_mod.BatchLoader._batches = batches
    region = _Region(model, "forward")
    try:
        yield
    finally:
        for h in region.handles:
            h.remove()
        for obj, name, original in reversed(saved):
            setattr(obj, name, original)


def _part(event) -> str | None:
    """The innermost labelled part around ``event``; "loop" for the step's own bookkeeping,
    None outside the steps, their batches and the guard's checks (set-up, finish)."""
    part, e = None, event.cpu_parent
    while e is not None:
        name = e.name
        if part is None:
            if name in PARTS:
                part = name
            elif name.startswith("Optimizer.step"):
                part = "optimizer_step"
            elif name.startswith("Optimizer.zero_grad"):
                part = "zero_grad"
        if name in ("step", "data", "guard_check"):
            return part or "loop"
        e = e.cpu_parent
    return None


def _launches(e) -> bool:
    """Whether aten call ``e`` is one kernel: not a view/allocation, and no aten call below it is
    (``linalg_vector_norm`` whose only child is ``empty`` is one; ``cross_entropy`` is not)."""
    if e.name in NO_KERNEL:
        return False
    stack = list(e.cpu_children)
    while stack:
        c = stack.pop()
        if c.name.startswith("aten::") and c.name not in NO_KERNEL:
            return False
        stack.extend(c.cpu_children)
    return True


def count_ops(prof) -> dict[str, dict[str, int]]:
    """Aten calls by part: leaves (no aten call below), and kernels (:func:`_launches`)."""
    leaf = collections.Counter()
    kernels = collections.Counter()
    syncing = collections.Counter()
    names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        part = _part(e)
        if part is None:
            continue
        if e.name in SYNCING:
            syncing[f"{part}:{e.name}"] += 1
        if not any(c.name.startswith("aten::") for c in e.cpu_children):
            leaf[part] += 1
        if _launches(e):
            kernels[part] += 1
            names[part][e.name] += 1
    return {"leaf_calls": dict(leaf), "kernel_calls": dict(kernels), "syncing": dict(syncing),
            "top_kernels": {p: dict(c.most_common(8)) for p, c in names.items()}}


class _DeviceOps(TorchDispatchMode):
    """Counts the operators that touch a ``meta`` tensor (the stand-in for the GPU), views and
    allocations excluded, and the host-to-device copies among them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        name = func.overloadpacket.__name__
        if (any(t.device.type == "meta" for t in flat) and not func.is_view
                and name not in ("empty", "empty_strided", "empty_like", "lift_fresh", "detach")):
            self.ops[name] += 1
            self.copies += name == "_to_copy" and any(t.device.type == "cpu" for t in flat)
        return out


def augment_device_ops(kind: str, batch: int) -> dict:
    """Device operators (~ CUDA launches, eager) and host-to-device copies of one batch's
    augmentation: the images on ``meta``, so the host-side drawing of random numbers is told
    apart from the work on the images' device."""
    images = torch.zeros(batch, 3, 32, 32, dtype=torch.uint8, device="meta")
    with _DeviceOps() as mode:
        loader_mod.augment_batch(images, kind, torch.Generator().manual_seed(0), fill=(1, 2, 3))
    return {"device_ops": sum(mode.ops.values()), "host_to_device_copies": mode.copies}


def inventory(arch_role: str, batch: int, steps: int, compile_scope: str | None,
              fused: bool = True) -> dict:
    """Train ``steps + 1`` steps; profile all but the first (compilation, first allocations)."""
    model, space, arch, config = cct_job(arch_role, batch_size=batch)
    data = synthetic(max(4 * batch, 1024))
    per_step_syncs: list[dict] = []
    original_step = train_mod._Loop._step
    prof = profile(activities=[ProfilerActivity.CPU])

    def step(self, *args):
        with count_host_syncs(where=True) as counts, record_function("step"):
            lr = original_step(self, *args)
        per_step_syncs.append({f"{k[0]}@{k[1].split('/')[-1]}:{k[2]}" if isinstance(k, tuple)
                               else k: v for k, v in counts.items()})
        if len(per_step_syncs) == 1:
            prof.start()
        return lr

    opts = dict(progress=False, max_steps=steps + 1)
    original_make = train_mod._make_optimizer

    def make_fused(m, cfg):  # AdamW fused, as _make_optimizer makes it on CUDA
        opt = original_make(m, cfg)
        if cfg.optimizer == "adamw" and fused:
            groups = [{"params": g["params"], "weight_decay": g["weight_decay"]}
                      for g in opt.param_groups]
            opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), fused=True)
        return opt
    train_mod._make_optimizer = make_fused
    if compile_scope is not None:
        opts.update(compile=True, compile_scope=compile_scope)
    train_mod._Loop._step = step
    try:
        with labelled(model):
            train_mod.train_standalone(model, data, config=config, space=space, arch=arch, **opts)
    finally:
        train_mod._Loop._step = original_step
        train_mod._make_optimizer = original_make
        prof.stop()
    ops = count_ops(prof)
    per = {k: round(v / steps, 1) for k, v in ops["kernel_calls"].items() if k != "guard_check"}
    return {"arch": space.to_string(arch), "role": arch_role, "batch": batch,
            "profiled_steps": steps,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 3),
            "augment": config.augment, "optimizer": config.optimizer,
            "grad_clip": config.grad_clip, "compile_scope": compile_scope, "fused_adamw": fused,
            "kernel_calls_per_step": per, "kernel_calls_per_step_total": round(sum(per.values()), 1),
            "kernel_calls_per_guard_check": ops["kernel_calls"].get("guard_check", 0),
            "leaf_calls_per_step": {k: round(v / steps, 1) for k, v in ops["leaf_calls"].items()
                                    if k != "guard_check"},
            "augment_per_batch": augment_device_ops(config.augment, batch),
            "top_kernels_total": ops["top_kernels"],
            "syncing_aten_calls_total": ops["syncing"],
            "host_reads_per_step": per_step_syncs[1:]}


def timing(arch_role: str, batch: int, steps: int, compile_scope: str | None) -> dict:
    """CPU seconds per training iteration (batch fetch + augmentation + step, from one
    ``_Loop._step`` entry to the next, ``time.process_time``) over ``steps`` steps, the first two
    left out, and a hash of the weights after them: run it with this branch's code and, through
    ``PYTHONPATH``, an older tree's, for a paired comparison (``compile_scope`` None: no compile;
    "model" passes only ``compile=True``, which older code also takes)."""
    model, space, arch, config = cct_job(arch_role, batch_size=batch, epochs=1)
    data = synthetic(max(16 * batch, 1024))
    marks: list[float] = []
    original = train_mod._Loop._step

    def step(self, *args):
        marks.append(time.process_time())
        return original(self, *args)

    opts: dict = {}
    if compile_scope is not None:
        opts["compile"] = True
        if compile_scope != "model":
            opts["compile_scope"] = compile_scope
    train_mod._Loop._step = step
    try:
        result = train_mod.train_standalone(model, data, config=config, space=space, arch=arch,
                                            progress=False, max_steps=steps, **opts)
    finally:
        train_mod._Loop._step = original
    iters = [b - a for a, b in zip(marks, marks[1:])][2:]
    weights = hashlib.sha1(b"".join(v.detach().contiguous().numpy().tobytes()
                                    for v in model.state_dict().values())).hexdigest()[:16]
    return {"code": train_mod.__file__, "arch": space.to_string(arch), "steps": result.step,
            "compile_scope": compile_scope, "weights_sha1": weights,
            "iter_cpu_s": [round(x, 3) for x in iters],
            "median_iter_cpu_s": round(statistics.median(iters), 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="largest", help="largest (CCT-7/3x2) or smallest (CCT-2)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--compile-scope", default=None, choices=["model", "step"],
                    help="profile with --compile (inductor on the CPU) at this scope")
    ap.add_argument("--unfused", action="store_true",
                    help="the CPU's own AdamW (for-loop), not the fused one CUDA runs")
    ap.add_argument("--timing", type=int, default=None, metavar="STEPS",
                    help="instead: CPU seconds per iteration over STEPS steps (timing())")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.timing is not None:
        print(json.dumps(timing(args.arch, args.batch, args.timing, args.compile_scope)))
        return
    row = inventory(args.arch, args.batch, args.steps, args.compile_scope, not args.unfused)
    row["command"] = "python " + " ".join(sys.argv)
    row["torch"] = torch.__version__
    text = json.dumps(row, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
