"""GPU probe (issue 44): images/s of CCT-7/3x2 and CCT-2/3x2 standalone training steps as
``hwnas train --space cct --standalone largest|smallest --compile`` runs them (the real loop:
augmentation, forward, loss, backward, gradient norm, fused AdamW, divergence guard), for the
compile settings before session 36 and each new option; writes JSON after every variant.

    python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
    python3 benchmarks/results/supernet_cifar10/cct_speed_probe.py --device cuda \\
        --json $OUT/cct_speed_probe.json            # about 4 minutes on an H100
    python3 benchmarks/results/supernet_cifar10/cct_speed_probe.py --device cpu --steps 3 \\
        --json /tmp/probe.json                      # a check of this script (eager backend)

Variants (``--runs ROLE:VARIANT``): ``before`` (``--compile`` with the host side of the loop
before session 36: per-operation copies of the random numbers, per-tensor guard snapshots),
``eager`` (no compile), ``model`` (``--compile``: the network only, the setting of the runs so
far), ``step`` (``--compile --compile-scope step``: also the loss, the
augmentation and the normalisation), ``model-cg`` / ``step-cg`` (the same with
``--compile reduce-overhead``: CUDA graphs). Each: ``--warmup`` steps (compilation, CUDA-graph
recording, the guard's first check), ``--steps`` timed steps (synchronised at both ends), then
``--profile-steps`` steps under torch.profiler for launches, copies and synchronisations per
step and the GPU's busy share. First, ``augment_check``: the compiled augmentation's pixels
against the eager ones (CPU and GPU). Data: 45,000 random CIFAR-sized images (the step's cost does not
depend on the pixels; one epoch is 351 steps, as on CIFAR-10). ``--budget-s``: no variant
starts after this many seconds (the rest are recorded as skipped); compilation dominates a
variant's time (the first CCT-7 graph about a minute, later ones partly from the caches).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
import traceback
from datetime import datetime, timezone

import torch

import hwnas.supernet.data.loader as loader_mod
import hwnas.supernet.train as train_mod
from hwnas.supernet.data import DatasetSplits, ImageSplit
from hwnas.supernet.data.augment import apply_augment, draw_augment
from hwnas.supernet.auto_augment import FILL
from hwnas.supernet.divergence import DivergenceGuard
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train_run import CONFIG_KEYS, resolve_arch, train_config
from hwnas.supernet.trivial_augment import OPS, apply_scaled

#: name -> (compile mode or None, compile scope)
VARIANTS = {
    "before": ("default", "model"),  # + the pre-session-36 copies and guard snapshot (legacy())
    "eager": (None, "model"),
    "model": ("default", "model"),
    "step": ("default", "step"),
    "model-cg": ("reduce-overhead", "model"),
    "step-cg": ("reduce-overhead", "step"),
}
#: the order of the default runs: the most telling first, so a cut budget loses the least
DEFAULT_RUNS = ["largest:before", "largest:model", "largest:step", "largest:step-cg",
                "smallest:before", "smallest:step", "largest:model-cg", "smallest:step-cg",
                "largest:eager"]
#: host-side CUDA API calls counted per step in the profiled steps
API_CALLS = {
    "launches": ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"),
    "graph_launches": ("cudaGraphLaunch",),
    "memcpy": ("cudaMemcpyAsync", "cudaMemcpy"),
    "syncs": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"),
}


def synthetic(n: int) -> DatasetSplits:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    split = ImageSplit(images, torch.arange(n) % 10)
    small = ImageSplit(images[:100], split.labels[:100])
    return DatasetSplits("synthetic-cifar10", split, small, small, [str(i) for i in range(10)],
                         (0.49, 0.48, 0.45), (0.25, 0.24, 0.26), "crop_flip")


def cct_job(role: str, batch: int):
    """(model, space, arch, TrainConfig) as ``hwnas train --space cct --standalone ROLE
    --epochs 200`` builds them (CCT's recipe: AdamW, AutoAugment + crop + flip, ...)."""
    space = get_space("cct", in_channels=3, image_size=32, num_classes=10)
    settings = dict.fromkeys(CONFIG_KEYS, None)
    settings.update(epochs=200, standalone=role, seed=0, batch_size=batch)
    config = train_config(settings, space)
    torch.manual_seed(config.seed)
    arch = resolve_arch(space, role)
    model = train_mod.reinitialize(space.build_supernet().extract(arch).train(), seed=config.seed)
    return model, space, arch, config


@contextlib.contextmanager
def legacy():
    """The host side of the loop before session 36, for the ``before`` variant: the batch's
    random numbers copied one per operation from pageable memory (7 copies a batch for
    AutoAugment + crop + flip) and the divergence guard's snapshot cloned tensor by tensor."""
    def augment_batch(images, kind, generator, fill=None, apply=None):
        dev = images.device
        params = draw_augment(kind, tuple(images.shape), generator)
        params = torch.stack([params[:, i].clone().to(dev, non_blocking=True)
                              for i in range(params.shape[1])], dim=1)
        value = None
        if kind.endswith("cutout"):
            value = torch.tensor(list(fill), dtype=images.dtype).to(dev, non_blocking=True)
        return apply_augment(images, kind, params, value)

    def snapshot(self, step, extra=None):
        tensors = list(self.model.state_dict().values())
        if len(self._model_snap) != len(tensors):
            self._model_snap = [t.detach().clone() for t in tensors]
        else:
            for saved, t in zip(self._model_snap, tensors):
                saved.copy_(t)
        self._opt_snap = {id(p): {k: v.detach().clone() if torch.is_tensor(v) else v
                                  for k, v in state.items()}
                          for p, state in self.optimizer.state.items()}
        self.snapshot_step, self.extra = step, extra

    saved = (loader_mod.augment_batch, DivergenceGuard.snapshot)
    loader_mod.augment_batch, DivergenceGuard.snapshot = augment_batch, snapshot
    try:
        yield
    finally:
        loader_mod.augment_batch, DivergenceGuard.snapshot = saved


def augment_check(device: torch.device, kind: str = "autoaugment_crop_flip",
                  batch: int = 128) -> dict:
    """The compiled augmentation against the eager one (CPU and ``device``) on the same random
    numbers: the share of pixels that differ and the largest difference (grey levels). Eager CPU
    and eager GPU should agree to within rounding; compiled, likewise, or the training would
    learn from other images than the eager recipe's."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, 3, 32, 32), generator=g, dtype=torch.uint8)
    params = draw_augment(kind, tuple(images.shape), torch.Generator().manual_seed(1))
    cpu = apply_augment(images, kind, params).long()
    on_dev = images.to(device)
    eager = apply_augment(on_dev, kind, params.to(device)).cpu().long()
    compiled = torch.compile(apply_augment, dynamic=False)(on_dev, kind, params.to(device))
    compiled = compiled.cpu().long()

    def diff(a, b):
        d = (a - b).abs()
        return {"pixels_differing": round(float((d > 0).float().mean()), 6), "max": int(d.max())}
    # which operation compiles differently: each one alone on the whole batch, magnitudes -1..1
    signed = torch.linspace(-1, 1, batch, device=device)
    apply_one = torch.compile(apply_scaled, dynamic=False)
    per_op = {}
    for i, name in enumerate(OPS):
        op = torch.full((batch,), i, device=device, dtype=torch.long)
        per_op[name] = diff(apply_one(on_dev, op, signed, fill=FILL).cpu().long(),
                            apply_scaled(on_dev, op, signed, fill=FILL).cpu().long())
    return {"kind": kind, "eager_device_vs_cpu": diff(eager, cpu),
            "compiled_device_vs_eager_device": diff(compiled, eager), "per_op": per_op}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profile_summary(prof, steps: int, wall_s: float) -> dict:
    calls = {k: 0 for k in API_CALLS}
    kernels_us, kernels = 0.0, 0
    for e in prof.key_averages():
        for k, names in API_CALLS.items():
            if e.key in names:
                calls[k] += e.count
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            kernels += e.count
            kernels_us += float(getattr(e, "self_device_time_total", 0.0)
                                or getattr(e, "self_cuda_time_total", 0.0) or 0.0)
    out = {f"{k}_per_step": round(v / steps, 1) for k, v in calls.items()}
    out["gpu_kernels_per_step"] = round(kernels / steps, 1)
    out["gpu_busy_ms_per_step"] = round(kernels_us / 1000 / steps, 3)
    out["profiled_ms_per_step"] = round(1000 * wall_s / steps, 3)
    return out


def measure(role: str, variant: str, device: torch.device, data: DatasetSplits, batch: int,
            warmup: int, steps: int, profile_steps: int, precision: str = "auto") -> dict:
    """Train warmup + steps + profile_steps steps of one (model, variant); time the middle."""
    mode, scope = VARIANTS[variant]
    torch._dynamo.reset()
    try:  # the previous variant's CUDA graphs and their memory pool
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
        reset_cudagraph_trees()
    except Exception:  # noqa: BLE001 - older or newer torch: dynamo's reset suffices
        pass
    if device.type == "cuda":
        torch.cuda.empty_cache()
    from torch._dynamo.utils import counters
    counters.clear()
    model, space, arch, config = cct_job(role, batch)
    marks: dict[str, float] = {}
    prof_box: list = []
    original = train_mod._Loop._step
    count = [0]

    def step(self, *args):
        i = count[0]
        if i == warmup:
            _sync(device)
            marks["t0"] = time.perf_counter()
        if i == warmup + steps:
            _sync(device)
            marks["t1"] = time.perf_counter()
            if profile_steps:
                acts = [torch.profiler.ProfilerActivity.CPU]
                if device.type == "cuda":
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                try:
                    prof = torch.profiler.profile(activities=acts)
                    prof.start()
                    prof_box.append(prof)
                except Exception as exc:  # noqa: BLE001 - the timing above must survive
                    marks["profile_error"] = repr(exc)
                marks["p0"] = time.perf_counter()
        count[0] += 1
        return original(self, *args)

    start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train_mod._Loop._step = step
    try:
        opts = dict(device=device, progress=False, max_steps=warmup + steps + profile_steps,
                    compile=mode or False, compile_scope=scope, precision=precision)
        with legacy() if variant == "before" else contextlib.nullcontext():
            result = train_mod.train_standalone(model, data, config=config, space=space,
                                                arch=arch, **opts)
    finally:
        train_mod._Loop._step = original
        _sync(device)
        marks["p1"] = time.perf_counter()  # before the profiler's own post-processing
        if prof_box:
            try:
                prof_box[0].stop()
            except Exception as exc:  # noqa: BLE001
                marks["profile_error"] = repr(exc)
                prof_box.clear()
    end = time.perf_counter()
    if "t1" not in marks:  # no profiled steps: the run's end is the timed window's
        marks["t1"] = marks["p1"]
    seconds = marks["t1"] - marks["t0"]
    row = {"role": role, "arch": space.to_string(arch), "variant": variant, "compile": mode,
           "compile_scope": scope, "precision": precision, "batch": batch, "steps": steps,
           "seconds": round(seconds, 3), "ms_per_step": round(1000 * seconds / steps, 3),
           "images_per_s": round(steps * batch / seconds, 1),
           "warmup_seconds": round(marks["t0"] - start, 1), "total_seconds": round(end - start, 1),
           "final_step": result.step}
    if device.type == "cuda":
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    if prof_box:
        try:
            row.update(_profile_summary(prof_box[0], profile_steps, marks["p1"] - marks["p0"]))
        except Exception as exc:  # noqa: BLE001
            row["profile_error"] = repr(exc)
    if "profile_error" in marks:
        row["profile_error"] = marks["profile_error"]
    row["graph_breaks"] = sum(counters["graph_break"].values())
    row["unique_graphs"] = counters["stats"].get("unique_graphs")
    skips = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
    if skips:
        row["cudagraph_counters"] = skips
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", nargs="+", default=None,
                    help=f"ROLE:VARIANT (default {' '.join(DEFAULT_RUNS)})")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                    help="auto = bf16 autocast on CUDA, as the CCT-7 runs so far")
    ap.add_argument("--warmup", type=int, default=None, help="default 30 (cuda), 1 (cpu)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--profile-steps", type=int, default=None, help="default 10 (cuda), 1 (cpu)")
    ap.add_argument("--train-images", type=int, default=None, help="default 45000 (cuda), 512 (cpu)")
    ap.add_argument("--budget-s", type=float, default=240.0,
                    help="start no variant after this many seconds (the one running finishes)")
    ap.add_argument("--cpu-backend", default="eager",
                    help="torch.compile backend on the CPU check (eager: plumbing only, fast)")
    ap.add_argument("--json", default="cct_speed_probe.json")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    warmup = args.warmup if args.warmup is not None else (30 if cuda else 1)
    profile_steps = args.profile_steps if args.profile_steps is not None else (10 if cuda else 1)
    n = args.train_images or (45000 if cuda else 512)
    if cuda:  # as hwnas train sets them for a standalone network
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif args.cpu_backend != "inductor":
        real = torch.compile

        def compile_on_cpu(fn=None, *, mode=None, **kw):  # the plumbing, without inductor
            return real(fn, backend=args.cpu_backend, dynamic=kw.get("dynamic"))
        torch.compile = compile_on_cpu
    data = synthetic(n)
    out = {"command": "python3 " + " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(),
           "torch": torch.__version__, "device": str(device),
           "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor(),
           "host": platform.node(), "batch": args.batch, "warmup": warmup,
           "profile_steps": profile_steps, "train_images": n,
           "cpu_backend": None if cuda else args.cpu_backend, "rows": []}
    begin = time.perf_counter()
    try:
        out["augment_check"] = augment_check(device)
    except Exception as exc:  # noqa: BLE001 - the timings matter more
        out["augment_check"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({"augment_check": out["augment_check"]}), flush=True)
    for run in args.runs or DEFAULT_RUNS:
        role, variant = run.split(":")
        elapsed = time.perf_counter() - begin
        if elapsed > args.budget_s:
            out["rows"].append({"role": role, "variant": variant, "skipped": "budget",
                                "elapsed_s": round(elapsed, 1)})
            continue
        t = time.perf_counter()
        try:
            row = measure(role, variant, device, data, args.batch, warmup, args.steps,
                          profile_steps, args.precision)
        except Exception as exc:  # noqa: BLE001 - one failing variant must not lose the others
            row = {"role": role, "variant": variant, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-2000:]}
        row["variant_seconds"] = round(time.perf_counter() - t, 1)
        out["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    out["seconds"] = round(time.perf_counter() - begin, 1)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    ok = [r for r in out["rows"] if "images_per_s" in r]
    print("| model | variant | images/s | ms/step | warm-up s | launches/step | GPU busy ms/step |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in ok:
        print(f"| {r['arch']} | {r['variant']} | {r['images_per_s']} | {r['ms_per_step']} | "
              f"{r['warmup_seconds']} | {r.get('launches_per_step')} | "
              f"{r.get('gpu_busy_ms_per_step')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
